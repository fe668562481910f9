"""The site validation record (``doctor.sglang.validation.record``) and the patched server's matcher
(``sglang/srt/speculative/ddtree_site.py``, read from the patch set's 0005 diff and run in a child interpreter
over a site-packages holding it): a record the doctor writes is the record the server opens on; a changed key,
a hand edit, another host's record and a corrupt file are refused with their reason; a write that fails half-way
(the file size limit, as a full disk fails it) leaves nothing half-written and an older record whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from doctor.core.fileio import leftover_tmp_files
from doctor.sglang.validation import record as rec

PATCH = Path(__file__).resolve().parents[1] / "sglang_patches" / "ddtree-0.5.23" / "0005-ddtree-site-validation.patch"
SITE_FILE = "sglang/srt/speculative/ddtree_site.py"


def created_file(patch: Path, path: str) -> str:
    """The content of a file the diff creates (its ``+`` lines)."""
    lines, inside = [], False
    for line in patch.read_text().splitlines():
        if line.startswith("+++ "):
            inside = line[4:].strip().endswith(path)
            continue
        if line.startswith("diff --git"):
            inside = False
        if inside and line.startswith("+"):
            lines.append(line[1:])
    assert lines, f"{path} is not created by {patch.name}"
    return "\n".join(lines) + "\n"


def site_packages(tmp_path: Path) -> Path:
    """A site-packages with the patched server's ddtree_site.py and one more patched file."""
    root = tmp_path / "site"
    spec = root / "sglang" / "srt" / "speculative"
    spec.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (spec / "ddtree_site.py").write_text(created_file(PATCH, SITE_FILE))
    (spec / "ddtree_worker.py").write_text("# patched\n")
    return root


def model_dirs(tmp_path: Path) -> tuple[Path, Path]:
    model, drafter = tmp_path / "model", tmp_path / "drafter"
    for d, shards in ((model, 2), (drafter, 1)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": d.name}))
        for i in range(shards):
            save_file({f"w{i}": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(d / f"model-{i}.safetensors"))
    (model / "model.safetensors.index.json").write_text('{"weight_map": {"w0": "model-0.safetensors"}}')
    return model, drafter


SERVER = textwrap.dedent("""
    import json, os, sys, types
    from sglang.srt.speculative import ddtree_site as s
    from doctor.sglang.validation import record as rec
    args = json.loads(sys.argv[1])
    out = {}

    def cfg(budget=16):
        return types.SimpleNamespace(**args["cfg"], speculative_ddtree_budget=budget)

    def check(c, where=None):
        os.environ.pop(s.RECORD_ENV, None)
        if where:
            os.environ[s.RECORD_ENV] = str(where)
        try:
            return {"opened": s.check_site_record(c, args["gate"])}
        except NotImplementedError as e:
            return {"refused": str(e)}

    def record(conf, state, host=None):
        body = {"kind": rec.KIND, "schema_version": 1, "key": "", "outcome": "pass",
                "configuration": {**conf, "patch_set": "ddtree-0.5.23"}, "host": host or rec.host_identity([]),
                "figures": {}, "date": "2026-12-02T08:00:00+00:00", "command": "k26-doctor validate"}
        return str(rec.write_record(state, body))

    conf = s.running_configuration(cfg(), args["gate"], args["files"])
    conf.pop("_uuids")
    out["configuration"] = conf
    out["model"] = s.model_identity(cfg().model_path)
    out["machine_id"] = s.machine_id()
    path = out["record"] = record(conf, args["tmp"] + "/state")
    out["opened"] = check(cfg(), path)
    out["in_dir"] = check(cfg(), os.path.dirname(path))
    out["budget"] = check(cfg(32), os.path.dirname(path))
    out["none"] = check(cfg())
    edited = record(dict(conf, ddtree_budget=32), args["tmp"] + "/edited")
    data = json.load(open(edited))
    data["configuration"]["ddtree_budget"] = 16
    open(edited, "w").write(json.dumps(data))
    out["edited"] = check(cfg(), edited)
    other = record(conf, args["tmp"] + "/other", {"machine_id": "0" * 64, "hostname": "elsewhere", "gpu_uuids": []})
    out["copied"] = check(cfg(), other)
    open(args["worker"], "w").write("# another revision\\n")
    out["upgraded"] = check(cfg(), path)
    print(json.dumps(out))
""")
GATE = {"sglang": "0.5.23", "tp_size": 1, "attention_backend": "triton", "cuda_graph": True,
        "overlap_schedule": True, "compute_capability": "9.0", "torch": "2.11.0"}
FILES = ["sglang/srt/speculative/ddtree_worker.py"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    """The patched server's matcher over records the doctor writes, in one child interpreter (torch imported
    once): the running configuration, then the gate with the record, its directory, a changed budget, no record,
    a hand-edited record, another host's, and after an upgrade of a patched file."""
    tmp = tmp_path_factory.mktemp("site-record")
    root = site_packages(tmp)
    model, drafter = model_dirs(tmp)
    cfg = {"model_path": str(model), "speculative_draft_model_path": str(drafter), "ep_size": 1,
           "moe_a2a_backend": "none", "attn_cp_size": 1, "enable_prefill_cp": False}
    args = {"cfg": cfg, "gate": GATE, "files": FILES, "tmp": str(tmp), "worker": str(root / FILES[0])}
    out = subprocess.run([sys.executable, "-c", SERVER, json.dumps(args)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join((str(root), str(REPO)))})
    assert out.returncode == 0, out.stderr
    return {**json.loads(out.stdout), "model_dir": model, "drafter_dir": drafter}


def test_the_doctor_and_the_server_compute_the_same_identities(served):
    assert served["model"] == rec.model_identity(served["model_dir"]) and served["model"]["weights_sha256"]
    assert served["configuration"]["drafter"] == rec.model_identity(served["drafter_dir"])
    assert served["machine_id"] == rec.machine_id()
    assert set(served["configuration"]) == set(rec.site_keys()) - {"patch_set"}
    assert rec.read_record(served["record"]).get("record")  # the server's configuration is a record's


def test_the_server_opens_on_the_doctors_record_and_names_a_changed_key(served):
    assert served["opened"] == served["in_dir"] == {"opened": served["record"]}  # the record, or its directory
    assert "ddtree_budget 32 (validated: 16)" in served["budget"]["refused"]
    assert "k26-doctor validate" in served["budget"]["refused"]
    assert "none is named" in served["none"]["refused"]
    assert "patched_files: sglang/srt/speculative/ddtree_worker.py changed" in served["upgraded"]["refused"]


def test_a_record_edited_by_hand_or_from_another_host_is_refused_by_the_server(served):
    assert "integrity" in served["edited"]["refused"]
    assert "another host" in served["copied"]["refused"]


def test_a_record_edited_by_hand_is_refused_by_the_doctor(tmp_path):
    path = make_record(small_conf(tmp_path), tmp_path / "state")
    data = json.loads(path.read_text())
    data["configuration"]["ddtree_budget"] = 64
    path.write_text(json.dumps(data))
    assert "edited after" in rec.read_record(path)["error"]
    data["integrity"] = rec.integrity_of(data)  # re-sealed by hand: then its key no longer names it
    path.write_text(json.dumps(data))
    assert "does not match its configuration" in rec.read_record(path)["error"]


def test_the_doctor_refuses_another_hosts_record_and_other_gpus(tmp_path):
    record = {"host": {"machine_id": "0" * 64, "hostname": "elsewhere", "gpu_uuids": []}}
    problem = rec.host_problem(record, {**rec.host_identity([]), "gpu_uuids": []})
    assert problem and "another host" in problem
    gpus = rec.host_problem({"host": rec.host_identity(["GPU-aaaa"])}, rec.host_identity(["GPU-bbbb"]))
    assert gpus and "other GPUs" in gpus
    assert rec.host_problem({"host": rec.host_identity(["GPU-AAAA"])}, rec.host_identity(["aaaa"])) is None


def make_record(conf: dict, state: Path, host: dict | None = None) -> Path:
    conf = {**conf, "patch_set": "ddtree-0.5.23"}
    record = {"kind": rec.KIND, "schema_version": 1, "key": "", "outcome": "pass", "configuration": conf,
              "host": host or rec.host_identity([]), "figures": {"greedy": {"outcome": "pass"}},
              "date": "2026-12-02T08:00:00+00:00", "command": "k26-doctor validate --profile p"}
    return rec.write_record(state, record)


def small_conf(tmp_path: Path) -> dict:
    model, drafter = model_dirs(tmp_path)
    return {k: None for k in rec.site_keys()} | {
        "tp_size": 1, "cuda_graph": True, "overlap_schedule": True, "ep_size": 1, "attn_cp_size": 1,
        "enable_prefill_cp": False, "gpu_count": 1, "ddtree_budget": 16, "patched_files": {},
        "model": rec.model_identity(model), "drafter": rec.model_identity(drafter)}


@pytest.mark.parametrize("content, words", [
    (b"{not json", "not JSON"),
    (b'{"kind": "something else"}', "not a site validation record"),
    (b"", "not JSON"),
])
def test_a_corrupt_record_is_a_reason_never_a_traceback(tmp_path, content, words):
    folder = rec.records_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "0123456789abcdef.json").write_bytes(content)
    found = rec.read_records(tmp_path)
    assert len(found["records"]) == 1 and words in found["records"][0]["error"]


def test_a_record_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    folder = rec.records_dir(tmp_path)
    folder.mkdir(parents=True)
    os.mkfifo(folder / "0123456789abcdef.json")
    assert "unreadable" in rec.read_records(tmp_path)["records"][0]["error"]


def test_a_write_that_fails_halfway_leaves_the_old_record_whole(tmp_path):
    """RLIMIT_FSIZE makes the record's write fail with EFBIG as a full disk fails it with ENOSPC."""
    path = make_record(small_conf(tmp_path), tmp_path / "state")
    before = path.read_bytes()
    script = textwrap.dedent(f"""
        import json, resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))
        from doctor.sglang.validation import record as rec
        r = json.loads(open({str(path)!r}).read())
        r["figures"] = {{"padding": "x" * 4000}}
        try:
            rec.write_record({str(tmp_path / 'state')!r}, r)
        except OSError as e:
            print("refused:", e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.startswith("refused:"), (out.stdout, out.stderr)
    assert path.read_bytes() == before
    assert not leftover_tmp_files(path)
    assert rec.read_record(path).get("record")


def test_the_schema_is_the_format(tmp_path):
    """The record's JSON Schema, checked by jsonschema itself, accepts what the doctor writes and refuses what
    ``shape_problems`` refuses."""
    jsonschema = pytest.importorskip("jsonschema")
    written = json.loads(make_record(small_conf(tmp_path), tmp_path).read_text())
    jsonschema.validate(written, rec.schema())
    assert rec.shape_problems(written) == []
    bad = {**written, "outcome": "fail"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, rec.schema())
    assert rec.shape_problems(bad)
