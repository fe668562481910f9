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

import fleet_plugin
import pytest
import yaml
from conftest import ROOT, doctor_env, signal_once_started
from kube_api_stand_in import StandIn
from kube_api_stand_in import node as stand_in_node

from doctor.core.datafile import read_toml
from doctor.core.settings import resolve
from doctor.service.fleet import DATA_FILE

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
    if orig != back and str(orig) != str(back) and _when(orig) != _when(back):  # a quantity or an int-or-string
        return [f"{path}: {orig!r} read as {back!r}"]  # may come back as text, a time in another notation
    return []


def _when(value: Any) -> Any:
    import datetime

    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return object()


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


def schema_problems(doc: dict[str, Any]) -> list[str]:
    """Why ``doc`` does not validate against the API's published OpenAPI schemas (``kubernetes-validate``, strict:
    no unknown field), for the oldest Kubernetes the manifests are for and the newest the package knows."""
    import kubernetes_validate

    out = []
    for version in ("1.30.0", kubernetes_validate.latest_version()):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            out.append(f"{version}: {exc.message}")
    return out


def test_every_object_and_field_is_known_to_the_kubernetes_models_and_schemas() -> None:
    kinds = []
    for path in (SERVER, NODE):
        for doc in load(path):
            assert problems(doc) == [], (path.name, doc["kind"])
            assert schema_problems(doc) == [], (path.name, doc["kind"])
            kinds.append(doc["kind"])
    assert sorted(kinds) == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Deployment", "Secret", "Service",
                             "ServiceAccount"]
    bad = json.loads(json.dumps(by_kind(NODE)["DaemonSet"]))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = "no"
    assert schema_problems(bad)  # the schemas catch what they should


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
    # a quantity written as a number: the client reads it back as the string the API would hold, and says so
    assert mutated(lambda d: spec(d)["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": 8})) == []
    assert quantities_not_strings(mutated_doc(dep, lambda d: spec(d)["containers"][0]["resources"]["limits"]
                                              .update({"nvidia.com/gpu": 8}))) == [
        "containers[0].resources.limits.nvidia.com/gpu: 8 (int)"]
    assert mutated(lambda d: d["spec"].update(replicas="one"))  # not an integer
    assert mutated(lambda d: spec(d)["initContainers"][0].pop("name"))  # required
    assert mutated(lambda d: d.update(apiVersion="apps/v9"))


def mutated_doc(doc: dict[str, Any], change: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    change(out)
    return out


def quantities_not_strings(doc: dict[str, Any]) -> list[str]:
    """Resource quantities written as YAML numbers (the Python client 37 refuses ``nvidia.com/gpu: 8``)."""
    pod = doc["spec"]["template"]["spec"]
    out = []
    for group in ("initContainers", "containers"):
        for i, c in enumerate(pod.get(group, [])):
            for kind in ("requests", "limits"):
                for name, qty in (c.get("resources", {}).get(kind) or {}).items():
                    if not isinstance(qty, str):
                        out.append(f"{group}[{i}].resources.{kind}.{name}: {qty!r} ({type(qty).__name__})")
    for v in pod.get("volumes", []):
        size = (v.get("emptyDir") or {}).get("sizeLimit")
        if size is not None and not isinstance(size, str):
            out.append(f"volumes.{v['name']}.emptyDir.sizeLimit: {size!r}")
    return out


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
    from doctor.host.shm import estimate

    for c in (init, server):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == str(settings.tp) == "8"  # the GPU device plugin
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
        # sized for the TP group (host.shm's own estimate, and at least its 1 GiB floor), and well inside the
        # memory it is counted against
        need = max(estimate(settings.tp)[0], 1 << 30)
        assert shm["medium"] == "Memory" and need <= _gib(shm["sizeLimit"]) * 2**30 <= _gib(
            c["resources"]["limits"]["memory"]) * 2**30 / 2
        sec = c["securityContext"]
        assert sec["allowPrivilegeEscalation"] is False and sec["capabilities"]["drop"] == ["ALL"]
        config = _env(c)["K26_DOCTOR_CONFIG"]
        secret = volumes[mounts[os.path.dirname(config)]["name"]]["secret"]["secretName"]
        assert secret == docs["Secret"]["metadata"]["name"]
        models = next(m for p, m in mounts.items() if str(settings.model_path).startswith(p + "/"))
        assert models["readOnly"] and str(settings.draft_model_path).startswith(models["mountPath"] + "/")
    port = int(settings.server.port)
    assert server["ports"][0]["containerPort"] == port
    assert server["startupProbe"]["httpGet"]["path"] == "/health"
    assert docs["Service"]["spec"]["ports"][0]["port"] == port
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["template"]["metadata"]["labels"]


def qos_class(pod: dict[str, Any]) -> str:
    """The pod's QoS class as the kubelet computes it (``GetPodQOS``): requests default to limits; Guaranteed when
    every container, init containers included, has cpu and memory limits equal to its requests."""
    from kubernetes.utils import parse_quantity

    containers = pod.get("initContainers", []) + pod["containers"]
    seen, guaranteed = False, True
    for c in containers:
        limits = (c.get("resources") or {}).get("limits") or {}
        requests = {**limits, **((c.get("resources") or {}).get("requests") or {})}
        for res in ("cpu", "memory"):
            seen = seen or res in limits or res in requests
            if res not in limits or parse_quantity(requests[res]) != parse_quantity(limits[res]):
                guaranteed = False
    return "BestEffort" if not seen else "Guaranteed" if guaranteed else "Burstable"


def test_the_server_pod_is_guaranteed_qos_with_string_quantities() -> None:
    from kubernetes.utils import parse_quantity

    dep = by_kind(SERVER)["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert qos_class(pod) == "Guaranteed"  # the pod that holds the GPUs is evicted last
    assert quantities_not_strings(dep) == []
    for c in pod["initContainers"] + pod["containers"]:
        res = c["resources"]
        assert set(res["requests"]) == set(res["limits"]) == {"cpu", "memory", "nvidia.com/gpu"}
        assert all(parse_quantity(res["requests"][k]) == parse_quantity(res["limits"][k]) for k in res["limits"])
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    # the rule is the kubelet's: a container without limits, or asking less than its limit, is not Guaranteed
    assert qos_class(mutated_doc(pod, lambda p: p["initContainers"][0]["resources"].pop("limits"))) == "Burstable"
    assert qos_class(mutated_doc(pod, lambda p: p["containers"][0]["resources"]["requests"].update(cpu="1"))) == \
        "Burstable"
    assert qos_class({"containers": [{"name": "x"}]}) == "BestEffort"


BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def pod_security_level(pod: dict[str, Any]) -> str:
    """The Pod Security Standards level a pod spec meets (the controls these manifests can touch): hostPath, host
    namespaces, privileged, added capabilities keep it out of baseline; root, privilege escalation, capabilities
    not dropped and no seccomp profile keep it out of restricted."""
    containers = pod.get("initContainers", []) + pod["containers"]
    psc = pod.get("securityContext") or {}
    baseline = not (any("hostPath" in v for v in pod.get("volumes", []))
                    or any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
                    or any((c.get("securityContext") or {}).get("privileged") for c in containers)
                    or any(set((c.get("securityContext") or {}).get("capabilities", {}).get("add", [])) - BASELINE_CAPS
                           for c in containers))
    if not baseline:
        return "privileged"
    for c in containers:
        sc = c.get("securityContext") or {}
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if not (non_root and sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities", {}).get("drop")
                == ["ALL"] and seccomp in ("RuntimeDefault", "Localhost")):
            return "baseline"
    return "restricted"


def test_the_pod_security_level_each_manifest_states_is_the_one_it_meets() -> None:
    for path, kind in ((SERVER, "Deployment"), (NODE, "DaemonSet")):
        stated = re.search(r"^# Pod Security level: (\w+)", path.read_text(), re.M)
        assert stated, path.name
        pod = by_kind(path)[kind]["spec"]["template"]["spec"]
        assert pod_security_level(pod) == stated.group(1), path.name
    # the server's pod is privileged only for the weights' hostPath: on a volume claim it meets restricted
    pod = by_kind(SERVER)["Deployment"]["spec"]["template"]["spec"]

    def to_claim(p: dict[str, Any]) -> None:
        for v in p["volumes"]:
            if v["name"] == "models":
                v.pop("hostPath")
                v["persistentVolumeClaim"] = {"claimName": "k26-models"}

    on_claim = mutated_doc(pod, to_claim)
    assert pod_security_level(on_claim) == "restricted"
    assert pod_security_level(mutated_doc(on_claim, lambda p: p["securityContext"].pop("runAsNonRoot"))) == "baseline"


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
    assert re.search(r"\b\d+ passed; \d+ checks in ", res.stdout), res.stdout  # the report's tally
    res = subprocess.run([*pod["containers"][0]["command"], "--dry-run", "--no-flag-check"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    argv = res.stdout.splitlines()
    assert argv[argv.index("--port") + 1] == str(pod["containers"][0]["ports"][0]["containerPort"])
    assert argv[argv.index("--model-path") + 1] == settings.model_path


def test_the_daemonset_exports_and_marks_the_node_without_taking_a_gpu() -> None:
    from doctor.service.kube import node_table

    docs = by_kind(NODE)
    ds = docs["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {}))  # the server's pod has all 8
    assert pod["runtimeClassName"] == "nvidia"  # the GPU operator's RuntimeClass mounts the driver and the GPUs
    env = _env(c)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    node_name = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    textdir = volumes[mounts[os.path.dirname(env["TEXTFILE"])]["name"]]["hostPath"]["path"]
    assert textdir == os.path.dirname(read_toml(DATA_FILE)["textfile"]["path"])  # where node_exporter reads
    assert env["TEXTFILE"].endswith(".prom")
    assert "/dev/shm" not in mounts  # host.shm is left out by --node-pod, not judged on this pod's 64 MiB
    server = by_kind(SERVER)
    secret = next(v["secret"]["secretName"] for v in volumes.values() if "secret" in v)
    assert secret == server["Secret"]["metadata"]["name"]
    assert c["image"] == server["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    script = c["args"][0]
    assert "kube-node --mark --node-pod" in script and '--format openmetrics --output "$TEXTFILE"' in script
    assert not re.search(r"--skip|--only", script)  # the checks' applies= say what is left out, not the script
    assert pod["nodeSelector"] == server["Deployment"]["spec"]["template"]["spec"]["nodeSelector"]
    # it tolerates its own taint (to take it off again); the server's pod does not (it leaves a broken node)
    key = node_table()["taint_key"]
    assert any(t["key"] == key and t["operator"] == "Exists" and "effect" not in t for t in pod["tolerations"])
    assert key not in json.dumps(server["Deployment"])
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == docs["ServiceAccount"]["metadata"]["name"]
    sec = c["securityContext"]
    assert sec["allowPrivilegeEscalation"] is False and sec["readOnlyRootFilesystem"] is True
    assert sec["capabilities"]["drop"] == ["ALL"] and pod["securityContext"]["seccompProfile"]["type"] == \
        "RuntimeDefault"


def api_calls() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every call ``doctor/service/kube.py`` makes: each is one ``self._call`` with
    a literal method and path, read from the source's syntax tree."""
    import ast

    verbs = {"GET": "get", "PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}
    source = (ROOT / "doctor" / "service" / "kube.py").read_text()
    out = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_call"):
            continue
        method, path = node.args[0], node.args[1]
        assert isinstance(method, ast.Constant), ast.unparse(node)
        if isinstance(path, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in path.values)
        else:
            assert isinstance(path, ast.Constant), ast.unparse(node)
            text = path.value
        parts = text.strip("/").split("/")
        assert parts[:2] == ["api", "v1"], text  # the core group
        resource = "/".join(p for i, p in enumerate(parts[2:]) if i % 2 == 0)  # nodes, nodes/status
        out.add(("", resource, verbs[method.value]))
    assert source.count("http.request(") == 1  # every request goes through _call
    return out


def test_the_rbac_role_grants_exactly_the_calls_the_code_makes() -> None:
    role = by_kind(NODE)["ClusterRole"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert api_calls() == granted == {("", "nodes", "get"), ("", "nodes", "patch"), ("", "nodes/status", "patch")}


def _api_env(tmp_path: Path, api: StandIn, token_text: str | None = None) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text((token_text or api.token) + "\n")
    return {"K26_DOCTOR_KUBE_API": api.url, "K26_DOCTOR_KUBE_TOKEN_FILE": str(token)}


def test_the_daemonsets_loop_refreshes_the_textfile_marks_the_node_and_stops_on_sigterm(tmp_path: Path) -> None:
    from doctor.report import openmetrics
    from doctor.service.kube import node_table

    (c,) = by_kind(NODE)["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    cfg, _ = _config(tmp_path)
    textfile = tmp_path / "textfile" / "k26-doctor.prom"
    textfile.parent.mkdir()
    kind = node_table()["condition"]
    with StandIn(stand_in_node("gpu07")) as api:
        env = {**_shim(tmp_path), **_env(c), **_api_env(tmp_path, api)}  # the container's, with this machine's paths
        env.update(K26_DOCTOR_CONFIG=str(cfg), TEXTFILE=str(textfile), INTERVAL="60", NODE_NAME="gpu07")
        proc = subprocess.Popen([*c["command"], *c["args"]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and (openmetrics.LAST_RUN not in (
                    textfile.read_text() if textfile.exists() else "") or api.condition(kind) is None):
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.2)
            text = textfile.read_text()
            assert openmetrics.LAST_RUN in text and text.endswith("# EOF\n")
            for left_out in ("gpu.idle", "host.env", "host.shm", "host.exposure"):  # this pod is not the server's
                assert f'check="{left_out}"' not in text, left_out
            assert 'check="model.shards"' in text
            # the Node carries the verdict: the condition, and the taint exactly when a node failure is there
            cond = api.condition(kind)
            assert cond is not None and cond["status"] in ("True", "False", "Unknown"), cond
            tainted = any(t["key"] == node_table()["taint_key"] for t in api.node["spec"]["taints"])
            assert tainted == (cond["status"] == "True"), (cond, api.node["spec"])
            os.kill(proc.pid, signal.SIGTERM)  # the kubelet stopping the pod
            _, err = proc.communicate(timeout=10)
            assert proc.returncode == 0, err
            with pytest.raises(ProcessLookupError):  # its sleep went with it, reaped: nothing left behind
                os.killpg(proc.pid, 0)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


# -- node-problem-detector's custom plugin ---------------------------------------------------------------------
NPD_CONFIG = MANIFESTS / "k26-doctor-npd.json"
# The fields of NPD's custom plugin monitor config (pkg/custompluginmonitor/types: their json tags).
NPD_FIELDS = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
NPD_PLUGIN_FIELDS = {"invoke_interval", "timeout", "max_output_length", "concurrency",
                     "enable_message_change_based_condition_update", "skip_initial_status"}
NPD_RULE_FIELDS = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}
NPD_BUFFER = 4096  # maxCustomPluginBufferBytes: what NPD reads of a plugin's stdout


def go_duration(text: str) -> float:
    """A Go ``time.ParseDuration`` string, in seconds (the units NPD's configs use)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text!r}"
    return sum(float(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


def npd_config_problems(cfg: dict[str, Any]) -> list[str]:
    """What NPD's ApplyConfiguration and Validate refuse, and fields its types do not have."""
    out = [f"unknown field {k}" for k in set(cfg) - NPD_FIELDS]
    out += [f"pluginConfig: unknown field {k}" for k in set(cfg.get("pluginConfig", {})) - NPD_PLUGIN_FIELDS]
    if cfg.get("plugin") != "custom":
        out.append("plugin must be custom")
    glob = go_duration(cfg["pluginConfig"].get("timeout", "5s"))
    go_duration(cfg["pluginConfig"].get("invoke_interval", "30s"))
    defaults = {c["type"] for c in cfg.get("conditions", [])}
    for rule in cfg.get("rules", []):
        out += [f"rule: unknown field {k}" for k in set(rule) - NPD_RULE_FIELDS]
        if "timeout" in rule and go_duration(rule["timeout"]) > glob:
            out.append("plugin timeout is greater than global timeout")
        if rule["type"] == "permanent" and rule["condition"] not in defaults:
            out.append(f"Permanent problem {rule['condition']} does not have preset default condition.")
    return out


def run_as_npd(cfg: dict[str, Any], rule: dict[str, Any], env: dict[str, str]) -> tuple[str, str]:
    """One invocation as NPD's plugin.run does it: the rule's timeout (capped by the global one), then the group
    killed; stdout read up to 4 KiB, trimmed, cut at max_output_length bytes; exit 0 OK, 1 NonOK, else Unknown."""
    timeout = min(go_duration(rule.get("timeout", "1h")), go_duration(cfg["pluginConfig"]["timeout"]))
    proc = subprocess.Popen([rule["path"], *rule["args"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    killed = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        killed = True
        out, _ = proc.communicate(timeout=30)
    output = out[:NPD_BUFFER].decode("utf-8", "replace").strip()
    if killed:
        output = f"Timeout when running plugin {rule['path']!r}: output - {output!r}"
    output = output.encode()[: cfg["pluginConfig"]["max_output_length"]].decode("utf-8", "replace")
    status = {0: "OK", 1: "NonOK"}.get(proc.returncode, "Unknown")
    with pytest.raises(ProcessLookupError):  # nothing of the plugin's left behind
        os.killpg(proc.pid, 0)
    return status, output


def test_the_npd_config_is_one_node_problem_detector_accepts_and_fails_when_broken() -> None:
    from doctor.service.kube import REASONS, max_output, node_table

    cfg = json.loads(NPD_CONFIG.read_text())
    assert npd_config_problems(cfg) == []
    assert cfg["pluginConfig"]["max_output_length"] == max_output() == 80
    (cond,) = cfg["conditions"]
    (rule,) = cfg["rules"]
    assert cond["type"] == rule["condition"] == node_table()["condition"]
    assert (cond["reason"], rule["reason"]) == (REASONS["ok"], REASONS["problem"])
    assert rule["args"][:2] == ["kube-node", "--node-pod"]
    # the fast tier within the plugin's deadline, and the interval of the timer and the DaemonSet
    assert go_duration(cfg["pluginConfig"]["invoke_interval"]) == read_toml(DATA_FILE)["timer"]["interval_s"]
    assert go_duration(rule["timeout"]) < go_duration(cfg["pluginConfig"]["invoke_interval"])
    assert npd_config_problems({**cfg, "rules": [{**rule, "timeout": "10m"}]}) == [
        "plugin timeout is greater than global timeout"]
    assert npd_config_problems({**cfg, "conditions": []})
    assert npd_config_problems({**cfg, "pluginConfig": {**cfg["pluginConfig"], "max_output": 80}})


def test_the_plugin_speaks_npds_protocol_as_npd_runs_it(tmp_path: Path) -> None:
    cfg = json.loads(NPD_CONFIG.read_text())
    (rule,) = cfg["rules"]
    config, _ = _config(tmp_path)
    env = _shim(tmp_path)
    site = fleet_plugin.install(tmp_path)
    env.update(PYTHONPATH=os.pathsep.join([env.get("PYTHONPATH", ""), str(site)]),
               K26_FLEET_VERDICT=str(tmp_path / "verdict"))
    args = [str(config) if a == "/etc/k26-doctor/config.toml" else a for a in rule["args"]]
    ours = {**rule, "path": str(tmp_path / "bin" / "k26-doctor"), "args": [*args, "--only", "fleet.*"]}

    def npd(verdict: str, **change: Any) -> tuple[str, str]:
        fleet_plugin.verdict_file(tmp_path, verdict)
        return run_as_npd(cfg, {**ours, **change}, env)

    assert npd("fail on purpose") == ("NonOK", "fleet.verdict: the test asks for a failure: on purpose")
    status, line = npd("fail " + "x" * 300)
    assert status == "NonOK" and len(line) <= 80 and line.startswith("fleet.verdict: ") and line.endswith("...")
    assert npd("pass") == ("OK", "node healthy")
    # the deployment's configuration is not the node's: OK, and said
    assert npd("config-fail") == ("OK", "node healthy; config fails fleet.config")
    assert npd("unjudged") == ("Unknown", "not judged: fleet.verdict")
    status, line = npd("sleep 60", timeout="3s")  # a hung plugin: killed at its timeout, Unknown
    assert status == "Unknown" and line.startswith("Timeout when running plugin")
    status, line = npd("pass", args=[*ours["args"], "--only", "no.such.check"])
    assert status == "Unknown" and "Traceback" not in line  # an invalid invocation is no verdict


# -- the taint, the label and the condition through the API ---------------------------------------------------
def kube_node_call(tmp_path: Path, api: StandIn, verdict: str, *extra: str,
                   token: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``kube-node --mark`` on node gpu07 against the stand-in, the plugin's check
    giving ``verdict``."""
    site = fleet_plugin.install(tmp_path)
    fleet_plugin.verdict_file(tmp_path, verdict)
    env = {**_shim(tmp_path), **_api_env(tmp_path, api, token)}
    env.update(PYTHONPATH=os.pathsep.join([env.get("PYTHONPATH", ""), str(site)]),
               K26_FLEET_VERDICT=str(tmp_path / "verdict"), NODE_NAME="gpu07")
    return [str(tmp_path / "bin" / "k26-doctor"), "kube-node", "--mark", "--only", "fleet.*", *extra], env


def kube_node(tmp_path: Path, api: StandIn, verdict: str, *extra: str,
              token: str | None = None) -> subprocess.CompletedProcess[str]:
    argv, env = kube_node_call(tmp_path, api, verdict, *extra, token=token)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def valid_node(obj: dict[str, Any]) -> None:
    assert problems(obj) == [] and schema_problems(obj) == [], obj


def test_a_node_failure_taints_and_labels_the_node_and_a_pass_removes_them(tmp_path: Path) -> None:
    from doctor.service.kube import node_table

    table = node_table()
    kind, key, label = table["condition"], table["taint_key"], table["label_key"]
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    with StandIn(stand_in_node("gpu07", [gpu_taint])) as api:
        res = kube_node(tmp_path, api, "fail on purpose")
        assert res.returncode == 1, res.stderr
        assert res.stdout == "fleet.verdict: the test asks for a failure: on purpose\n"  # NPD's one line, here too
        assert api.node["spec"]["taints"] == [gpu_taint, {"key": key, "value": "fleet.verdict",
                                                          "effect": table["taint_effect"]}]
        assert api.node["metadata"]["labels"][label] == "fleet.verdict"
        cond = api.condition(kind)
        assert (cond["status"], cond["reason"]) == ("True", "K26DoctorNodeFailing") and "on purpose" in cond["message"]
        since = cond["lastTransitionTime"]
        valid_node(api.node)
        again = kube_node(tmp_path, api, "fail on purpose")  # nothing new: the taint is not written again
        assert again.returncode == 1 and [r["method"] for r in api.requests[-2:]] == ["GET", "PATCH"]
        assert api.condition(kind)["lastTransitionTime"] == since
        # not judged: the condition is Unknown and the taint is neither set nor removed
        res = kube_node(tmp_path, api, "unjudged")
        assert res.returncode == 2 and api.condition(kind)["status"] == "Unknown"
        assert any(t["key"] == key for t in api.node["spec"]["taints"])
        # a failure of the deployment's configuration is not the node's: the taint and label go, the condition
        # says the node is healthy and names the configuration
        res = kube_node(tmp_path, api, "config-fail")
        assert res.returncode == 0, res.stderr
        assert api.node["spec"]["taints"] == [gpu_taint] and label not in api.node["metadata"]["labels"]
        cond = api.condition(kind)
        assert (cond["status"], cond["message"]) == ("False", "node healthy; config fails fleet.config")
        valid_node(api.node)
        kube_node(tmp_path, api, "fail on purpose")
        assert kube_node(tmp_path, api, "pass").returncode == 0
        assert api.node["spec"]["taints"] == [gpu_taint] and api.condition(kind)["status"] == "False"
        assert api.node["status"]["conditions"][0]["type"] == "Ready"  # the kubelet's conditions untouched
        # every request: the service account's token, the content types the API takes for each patch, bodies the
        # client's models read, and only the calls the ClusterRole grants
        calls = api_calls()
        for req in api.requests:
            assert req["headers"]["Authorization"] == f"Bearer {api.token}"
            resource = "nodes/status" if req["path"].endswith("/status") else "nodes"
            assert ("", resource, req["method"].lower()) in calls, req
            if req["body"] is not None:
                valid_node({"apiVersion": "v1", "kind": "Node", **req["body"]})


def test_another_writers_taint_in_between_is_kept_and_a_refusing_api_is_said(tmp_path: Path) -> None:
    from doctor.service.kube import node_table

    key = node_table()["taint_key"]
    other = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    with StandIn(stand_in_node("gpu07")) as api:
        api.interfere = lambda n: n["spec"]["taints"].append(other)  # between our read and our write
        res = kube_node(tmp_path, api, "fail on purpose")
        assert res.returncode == 1, res.stderr
        assert [r["method"] for r in api.requests] == ["GET", "PATCH", "GET", "PATCH", "PATCH"]  # 409, read again
        assert [t["key"] for t in api.node["spec"]["taints"]] == [other["key"], key]
        res = kube_node(tmp_path, api, "pass", token="expired")  # the API refuses the token
        assert res.returncode == 1 and "could not mark the node 'gpu07'" in res.stderr and "HTTP 401" in res.stderr
        assert "Traceback" not in res.stderr and res.stdout == "node healthy\n"
    res = kube_node(tmp_path, api, "pass")  # the API is gone: a deadline, then said
    assert res.returncode == 1 and "could not mark" in res.stderr and "Traceback" not in res.stderr
    res = kube_node(tmp_path, api, "pass", "--node", "Not_A_Node")
    assert res.returncode == 1 and "is not a node name" in res.stderr
    res = kube_node(tmp_path, api, "pass", "--from-snapshot",
                    str(ROOT / "tests" / "fixtures" / "snapshots" / "b300x8-healthy.json"))
    assert res.returncode == 2 and "--mark writes the live node" in res.stderr


def test_an_interrupted_run_writes_nothing_on_the_node_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C while a check runs: no verdict on the node, so its taint, label and condition stay as the last
    finished run left them (not one call to the API); the one line says so; exit 130 (NPD: Unknown)."""
    from doctor.service.kube import node_table

    with StandIn(stand_in_node("gpu07")) as api:
        assert kube_node(tmp_path, api, "fail on purpose").returncode == 1
        before, calls = json.loads(json.dumps(api.node)), len(api.requests)
        argv, env = kube_node_call(tmp_path, api, "sleep 100")
        started = tmp_path / "verdict.started"
        # the checks are running once fleet.verdict has started
        proc = signal_once_started(argv, started, signal.SIGINT, env=env, what="fleet.verdict")
        out, err = proc.stdout, proc.stderr
        assert proc.returncode == 130, out + err
        assert out == "interrupted before it finished: nothing was changed\n"
        assert len(api.requests) == calls and api.node == before
        assert api.node["spec"]["taints"] and api.condition(node_table()["condition"])["status"] == "True"


def test_recorded_gpu_facts_taint_a_broken_node_and_untaint_a_healthy_one() -> None:
    """The real GPU checks on recorded B300 nodes: a degraded NVLink marks the node, the healthy node's facts take
    the mark off (the wire level is the stand-in's)."""
    from doctor.app import run, settings_from_flags
    from doctor.service import kube

    def verdict(name: str) -> kube.NodeMark:
        snap = ROOT / "tests" / "fixtures" / "snapshots" / f"{name}.json"
        report, _ = run(settings_from_flags({"from_snapshot": str(snap), "only": ["gpu.*"], "node_pod": True}))
        return kube.node_mark(report)

    down, healthy = verdict("b300x8-link-down"), verdict("b300x8-healthy")
    assert (down.state, down.check) == ("problem", "gpu.nvlink") and healthy.state == "ok"
    with StandIn(stand_in_node("gpu07")) as api:
        target = kube.KubeApi(api.url, api.token)
        kube.mark(target, "gpu07", down)
        assert [t["value"] for t in api.node["spec"]["taints"]] == ["gpu.nvlink"]
        assert api.condition(kube.node_table()["condition"])["message"].startswith("gpu.nvlink: ")
        kube.mark(target, "gpu07", healthy)
        assert api.node["spec"]["taints"] == [] and api.condition(kube.node_table()["condition"])["status"] == "False"
        valid_node(api.node)
