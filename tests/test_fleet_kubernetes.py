"""Kubernetes: the manifests under deploy/kubernetes/, loaded with the official Kubernetes Python client's models
(every field must be one the API knows: the client's ApiClient deserializes each object and serializes it back,
and whatever did not survive is a field the API does not have), then held to what they are for: the init
container gates the SGLang server as ExecStartPre does, with the GPU device plugin's resources and the /dev/shm
TP8 needs; the DaemonSet exports the node's checks to node_exporter without taking a GPU. Their commands are run
here for real."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, doctor_env

from doctor.core.datafile import read_toml
from doctor.core.settings import resolve
from doctor.service.fleet import DATA_FILE, serving_table

# Found, not imported: the client's import (1.3 s) is paid by the worker that runs problems(), not by every
# worker's collection.
if importlib.util.find_spec("kubernetes") is None:
    pytest.skip("the kubernetes client (test extra): pip install -e '.[test]'", allow_module_level=True)

MANIFESTS = ROOT / "deploy" / "kubernetes"
SERVER = MANIFESTS / "sglang-k26.yaml"
NODE = MANIFESTS / "k26-doctor-node.yaml"


class _Response:
    """What ApiClient.deserialize reads: the body of an API answer."""

    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj)


def model_name(doc: dict[str, Any]) -> str:
    """``apps/v1`` + ``DaemonSet`` -> ``V1DaemonSet``: the client's model class."""
    version = str(doc.get("apiVersion", "")).split("/")[-1]
    return version[:1].upper() + version[1:] + str(doc.get("kind", ""))


def _lost(orig: Any, back: Any, path: str) -> list[str]:
    if isinstance(orig, dict):
        if not isinstance(back, dict):
            return [f"{path}: not an object"]
        out = []
        for key, val in orig.items():
            if key not in back:
                out.append(f"{path}.{key}: unknown field" if path else f"{key}: unknown field")
            else:
                out += _lost(val, back[key], f"{path}.{key}" if path else key)
        return out
    if isinstance(orig, list):
        if not isinstance(back, list) or len(back) != len(orig):
            return [f"{path}: not a list"]
        return [p for i, (a, b) in enumerate(zip(orig, back, strict=True)) for p in _lost(a, b, f"{path}[{i}]")]
    if orig != back and str(orig) != str(back):  # a quantity or an int-or-string may come back as text
        return [f"{path}: {orig!r} read as {back!r}"]
    return []


def problems(doc: dict[str, Any]) -> list[str]:
    """Why the Kubernetes API would not take ``doc`` as it is written: unknown kind, field or type."""
    import kubernetes.client

    client = kubernetes.client.ApiClient()
    name = model_name(doc)
    if not hasattr(kubernetes.client, name):
        return [f"no model {name} for apiVersion {doc.get('apiVersion')} kind {doc.get('kind')}"]
    try:
        obj = client.deserialize(_Response(doc), name)
    except (ValueError, TypeError, AttributeError) as exc:
        return [f"{name}: {exc}"]
    return _lost(doc, client.sanitize_for_serialization(obj), "")


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(path: Path) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in load(path)}


def test_every_object_and_field_is_known_to_the_kubernetes_models() -> None:
    kinds = []
    for path in (SERVER, NODE):
        for doc in load(path):
            assert problems(doc) == [], (path.name, doc["kind"])
            kinds.append(doc["kind"])
    assert sorted(kinds) == ["DaemonSet", "Deployment", "Secret", "Service"]


def test_the_validation_rejects_unknown_fields_wrong_types_and_missing_names() -> None:
    dep = by_kind(SERVER)["Deployment"]

    def mutated(change: Any) -> list[str]:
        doc = json.loads(json.dumps(dep))
        change(doc)
        return problems(doc)

    spec = lambda d: d["spec"]["template"]["spec"]  # noqa: E731
    assert mutated(lambda d: spec(d)["containers"][0].update(gpus=8)) == [
        "spec.template.spec.containers[0].gpus: unknown field"]
    assert mutated(lambda d: spec(d)["volumes"][2]["emptyDir"].update(medium_type="Memory")) == [
        "spec.template.spec.volumes[2].emptyDir.medium_type: unknown field"]
    assert mutated(lambda d: d["spec"].update(replicas="one"))  # not an integer
    assert mutated(lambda d: spec(d)["initContainers"][0].pop("name"))  # required
    assert mutated(lambda d: d.update(apiVersion="apps/v9"))


def _config(tmp_path: Path) -> tuple[Path, Any]:
    """The doctor's config the Secret carries, as the pods read it."""
    secret = by_kind(SERVER)["Secret"]
    path = tmp_path / "config.toml"
    path.write_text(secret["stringData"]["config.toml"])
    return path, resolve({"config": str(path)}, environ={})


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _gib(quantity: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, mult in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * mult / 2**30
    return float(quantity) / 2**30


def test_the_init_container_gates_the_server_with_the_pods_gpus_and_shm(tmp_path: Path) -> None:
    docs = by_kind(SERVER)
    _, settings = _config(tmp_path)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert docs["Deployment"]["spec"]["strategy"]["type"] == "Recreate"  # never two pods for the same GPUs
    (init,) = pod["initContainers"]
    (server,) = pod["containers"]
    assert init["command"][:2] == ["k26-doctor", "check"] and "--import-sglang" in init["command"]
    assert server["command"] == ["k26-doctor", "launch", "--no-check"]  # the argv the checks judged
    assert init["image"] == server["image"]  # the doctor judges the server's own interpreter
    volumes = {v["name"]: v for v in pod["volumes"]}
    for c in (init, server):
        assert int(c["resources"]["limits"]["nvidia.com/gpu"]) == settings.tp == 8  # the GPU device plugin
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
        assert shm["medium"] == "Memory" and _gib(shm["sizeLimit"]) >= 16
        config = _env(c)["K26_DOCTOR_CONFIG"]
        secret = volumes[mounts[os.path.dirname(config)]["name"]]["secret"]["secretName"]
        assert secret == docs["Secret"]["metadata"]["name"]
        models = next(m for p, m in mounts.items() if str(settings.model_path).startswith(p + "/"))
        assert models["readOnly"] and str(settings.draft_model_path).startswith(models["mountPath"] + "/")
    port = int(settings.get("server.port"))
    assert server["ports"][0]["containerPort"] == port
    assert server["startupProbe"]["httpGet"]["path"] == "/health"
    assert docs["Service"]["spec"]["ports"][0]["port"] == port
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["template"]["metadata"]["labels"]


def _shim(tmp_path: Path) -> dict[str, str]:
    """``k26-doctor`` on PATH, as the image has it: this checkout's doctor."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "k26-doctor"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m doctor \"$@\"\n")
    shim.chmod(0o755)
    return doctor_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def test_the_pods_commands_are_ones_the_doctor_accepts(tmp_path: Path) -> None:
    pod = by_kind(SERVER)["Deployment"]["spec"]["template"]["spec"]
    cfg, settings = _config(tmp_path)
    env = dict(_shim(tmp_path), K26_DOCTOR_CONFIG=str(cfg))
    res = subprocess.run([*pod["initContainers"][0]["command"], "--only", "host.*"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode in (0, 1), res.stderr  # a verdict, not a usage error
    assert re.search(r"\b\d+ passed, \d+ warnings?, \d+ failed", res.stdout), res.stdout
    res = subprocess.run([*pod["containers"][0]["command"], "--dry-run", "--no-flag-check"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    argv = res.stdout.splitlines()
    assert argv[argv.index("--port") + 1] == str(pod["containers"][0]["ports"][0]["containerPort"])
    assert argv[argv.index("--model-path") + 1] == settings.model_path


def test_the_daemonset_exports_the_node_checks_without_taking_a_gpu() -> None:
    ds = by_kind(NODE)["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {}))  # the server's pod has all 8
    env = _env(c)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    textdir = volumes[mounts[os.path.dirname(env["TEXTFILE"])]["name"]]["hostPath"]["path"]
    assert textdir == os.path.dirname(read_toml(DATA_FILE)["textfile"]["path"])  # where node_exporter reads
    assert env["TEXTFILE"].endswith(".prom")
    server = by_kind(SERVER)
    secret = next(v["secret"]["secretName"] for v in volumes.values() if "secret" in v)
    assert secret == server["Secret"]["metadata"]["name"]
    assert c["image"] == server["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    script = c["args"][0]
    assert "--while-serving" in script and '--format openmetrics --output "$TEXTFILE"' in script
    assert set(serving_table()["skip"]) & set(script.split()) == set()  # --while-serving names them, not the script
    assert pod["nodeSelector"] == server["Deployment"]["spec"]["template"]["spec"]["nodeSelector"]


def test_the_daemonsets_loop_refreshes_the_textfile_and_stops_on_sigterm(tmp_path: Path) -> None:
    from doctor.report import openmetrics

    (c,) = by_kind(NODE)["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    cfg, _ = _config(tmp_path)
    textfile = tmp_path / "textfile" / "k26-doctor.prom"
    textfile.parent.mkdir()
    env = {**_shim(tmp_path), **_env(c)}  # the container's environment, with the paths of this machine
    env.update(K26_DOCTOR_CONFIG=str(cfg), TEXTFILE=str(textfile), INTERVAL="60")
    proc = subprocess.Popen([*c["command"], *c["args"]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and openmetrics.LAST_RUN not in (
                textfile.read_text() if textfile.exists() else ""):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        text = textfile.read_text()
        assert openmetrics.LAST_RUN in text and text.endswith("# EOF\n")
        assert 'check="gpu.idle"' not in text and 'check="host.env"' not in text  # left out beside the server
        assert 'check="model.shards"' in text
        os.kill(proc.pid, signal.SIGTERM)  # the kubelet stopping the pod
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        with pytest.raises(ProcessLookupError):  # its sleep went with it, reaped: nothing left behind
            os.killpg(proc.pid, 0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
