"""sglang.ddtree: the patched SGLang's start-up gate, judged before a start as the server will judge it.

The gate starts DDTREE only on a site validation record of this host (``k26-doctor validate``) whose every key
equals the running configuration, or in any configuration with SGLANG_DDTREE_UNVALIDATED_WORKER=1; the shipped
``validated`` list no longer opens it. The inputs here are real: records written by the doctor's own writer and
read by the real ``ddtree_site`` collector; the shipped manifest;
the real H200 recording (tests/fixtures/snapshots/h200x1-all-facts.json, recorded on
a lent H200) and the synthetic B300 one (b300x8-healthy.json, derived from a real H200 reading) for the GPUs;
for the validated stack a real interpreter whose path holds the released torch 2.11.0 wheel's metadata and
``torch/version.py`` and the released SGLang 0.5.23 wheel with the patch set applied (``validated_python``);
the patched ``ddtree_worker.py`` itself and SGLang's own argument parser for what the doctor must agree with.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import doctor_env, make_context, run_check, run_doctor

SNAPS = Path(__file__).resolve().parent / "fixtures" / "snapshots"
H200 = json.loads((SNAPS / "h200x1-all-facts.json").read_text())["facts"]  # real: a lent 1x H200
B300_NVML = json.loads((SNAPS / "b300x8-healthy.json").read_text())["facts"]["nvml"]  # synthetic 8x B300
GPULESS_NVML = json.loads((SNAPS / "gpuless-fresh-venv.json").read_text())["facts"]["nvml"]  # real: no driver


def verdict(*args: str, **env: str) -> dict:
    out = run_doctor("check", "--only", "sglang.ddtree", "--format", "json", *args, env=doctor_env(**env))
    return json.loads(out.stdout)["results"][0]


@pytest.mark.network  # the validated stack (validated_python)
def test_ddtree_profile_without_the_opt_in_fails(validated_python: str) -> None:
    res = verdict("--python", validated_python)
    assert res["status"] == "fail" and res["summary"].endswith("SGLANG_DDTREE_UNVALIDATED_WORKER=1 not set")
    assert "DFLASH" in res["remediation"]["text"] and "k26-doctor validate" in res["remediation"]["text"]
    assert "UNVALIDATED_WORKER" not in " ".join(res["remediation"]["commands"])  # never "set the opt-in"


@pytest.mark.network
def test_opt_in_is_a_warning_never_a_pass(validated_python: str) -> None:
    assert verdict("--python", validated_python, SGLANG_DDTREE_UNVALIDATED_WORKER="1")["status"] == "warn"
    res = verdict("--python", validated_python, SGLANG_DDTREE_UNVALIDATED_WORKER="yes")
    assert res["status"] == "fail", "the patch accepts exactly 1"
    assert res["summary"].endswith("SGLANG_DDTREE_UNVALIDATED_WORKER='yes' set, which the gate does not take "
                                   "(exactly 1 opens it)")


def test_opt_in_from_the_env_file(tmp_path: Path) -> None:
    envf = tmp_path / "sglang.env"
    envf.write_text("SGLANG_DDTREE_UNVALIDATED_WORKER=1\n")
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server]\nenv_file = "{envf}"\n')
    assert verdict("--config", str(cfg))["status"] == "warn"


def test_dflash_profile_skips(tmp_path: Path) -> None:
    assert verdict("--profile", "b200-tp8")["status"] == "skip"
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[server]\nspeculative_algorithm = "DFLASH"\n')
    assert verdict("--config", str(cfg))["status"] == "skip"


def test_without_sglang_it_does_not_speak_of_the_patched_sglang(tmp_path: Path) -> None:
    """A service interpreter with no SGLang (a bare venv): the gate is still the news, but not "the patched SGLang
    refuses it" of an SGLang that is not there; with SGLang installed, that is what it says."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=300)
    res = verdict("--python", str(bare / "bin" / "python"))
    assert res["status"] == "fail"
    assert res["summary"].startswith("DDTREE needs SGLang with the ddtree-0.5.23 patch set (not installed), and no "
                                     "site validation record of this host under ")
    assert res["remediation"]["text"].startswith("Install SGLang and apply the ddtree-0.5.23 patch set")
    site = bare / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang-0.5.23.dist-info").mkdir()
    (site / "sglang-0.5.23.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    res = verdict("--python", str(bare / "bin" / "python"))
    assert res["summary"].startswith("the patched SGLang refuses DDTREE at start: it opens only on a site validation "
                                     "record of this exact configuration, and no site validation record of this host")
    assert res["remediation"]["commands"] == ["k26-doctor validate --profile b300-tp8-ddtree"]


# -- the validated stack: a real interpreter with the released torch 2.11.0 and the patched SGLang 0.5.23 --------

@pytest.fixture(scope="module")
def validated_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv whose path holds the torch 2.11.0 wheel's metadata and ``torch/version.py`` ("2.11.0+cu130") and the
    SGLang 0.5.23 wheel with the DDTree patch set applied (its dist-info and the patched files): the stack the
    H200 validation ran (the ``stack`` probe reads them as it reads any install; nothing is imported)."""
    from ddtree_support import patched_tree
    from kernel_wheels import torch_site

    root = tmp_path_factory.mktemp("validated") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "validated-stack.pth").write_text(f"{torch_site()}\n{patched_tree()}\n")
    return str(root / "bin" / "python")


def gate(python: str, profile: str, nvml: dict | None, tmp_path: Path, *, tp: int | None = None,
         args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Any:
    """sglang.ddtree run by the real runner: ``python``'s stack read live, the recorded ``nvml`` (None: not
    recorded), the profile with a config whose ``[server] args`` are ``args``, the process environment ``env``."""
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server]\nenv_file = "{tmp_path / "absent.env"}"\n'
                   f"args = {json.dumps(list(args))}\n")
    flags: dict[str, Any] = {"python": python, "profile": profile, "config": str(cfg)}
    if tp:
        flags["tp"] = tp
    from doctor.core.registry import load

    # nvml not recorded: no collector for it, so that this machine's GPUs are not read instead
    collectors = {k: v for k, v in load(plugins=False).collectors.items() if nvml is not None or k != "nvml"}
    ctx = make_context(flags, facts={"nvml": nvml} if nvml is not None else {}, live=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **(env or {})}, collectors=collectors)
    return run_check("sglang.ddtree", ctx)


@pytest.mark.network  # the torch 2.11.0 and SGLang 0.5.23 wheels (tests/downloads.py)
def test_the_shipped_list_alone_no_longer_opens_the_gate(validated_python: str, tmp_path: Path) -> None:
    """TP 1 on the real H200 recording with the validated stack -- an entry of the shipped list -- but no record of
    this host: refused, naming `k26-doctor validate` for the profile."""
    res = gate(validated_python, "h200-tp8", H200["nvml"], tmp_path, tp=1)
    assert res.status.value == "fail" and [f.code for f in res.findings] == ["sglang.ddtree.refused"]
    assert "no site validation record of this host" in res.summary
    assert res.remediation.commands == ["k26-doctor validate --config " + str(tmp_path / "k26.toml")
                                        + " --profile h200-tp8"]
    conf = res.details["configuration"]
    assert {k: conf[k] for k in ("sglang", "tp_size", "attention_backend", "cuda_graph", "overlap_schedule",
                                 "compute_capability", "torch")} == {
        "sglang": "0.5.23", "tp_size": 1, "attention_backend": "triton", "cuda_graph": True, "overlap_schedule": True,
        "compute_capability": "9.0", "torch": "2.11.0"}


@pytest.mark.network
def test_tp8_on_b300_fails_naming_k26_doctor_validate(validated_python: str, tmp_path: Path) -> None:
    """The deployment's own profile (TP 8 on 8x B300, sm 10.3) on the validated stack: refused until validated."""
    res = gate(validated_python, "b300-tp8-ddtree", B300_NVML, tmp_path)
    assert res.status.value == "fail"
    assert res.details["configuration"]["tp_size"] == 8 and res.details["configuration"]["gpu_count"] == 8
    assert res.remediation.commands[0].startswith("k26-doctor validate ")
    assert res.remediation.commands[0].endswith("--profile b300-tp8-ddtree")


def test_the_b300_recording_names_k26_doctor_validate(tmp_path: Path) -> None:
    """The synthetic B300 recording replayed under the deployment's profile, as a user runs it: refused, the fix
    is the command that validates this profile; what the recording cannot tell is said, never a pass."""
    res = verdict("--from-snapshot", str(SNAPS / "b300x8-healthy.json"), "--profile", "b300-tp8-ddtree")
    assert res["status"] == "fail"
    assert res["remediation"]["commands"] == ["k26-doctor validate --profile b300-tp8-ddtree"]
    assert res["details"]["not_judged"]["sglang"] == "the stack fact is not recorded"
    assert "no site validation record" in res["summary"]
    assert res["summary"].endswith("SGLANG_DDTREE_UNVALIDATED_WORKER=1 not recorded (the env fact)")


@pytest.mark.network
def test_opted_in_warns_and_says_whether_a_record_holds(validated_python: str, tmp_path: Path) -> None:
    opt_in = {"SGLANG_DDTREE_UNVALIDATED_WORKER": "1"}
    res = gate(validated_python, "b300-tp8-ddtree", B300_NVML, tmp_path, env=opt_in)
    assert res.status.value == "warn" and [f.code for f in res.findings] == ["sglang.ddtree.opted_in"]
    assert "no record of this host holds for this one" in res.summary
    assert "k26-doctor validate" in res.remediation.text


def test_a_recording_without_a_stack_or_gpus_is_never_a_pass() -> None:
    """The real H200 recording's facts without ``stack`` and ``nvml`` (a recording made before them): the keys
    they feed not judged, and without any record the gate is shut anyway."""
    ctx = make_context({"profile": "h200-tp8", "tp": 1}, facts={"env": H200["env"]})
    res = run_check("sglang.ddtree", ctx)
    assert res.status.value == "fail"
    assert res.details["not_judged"]["sglang"] == "the stack fact is not recorded"
    assert res.details["not_judged"]["compute_capability"] == "no GPU reading is recorded (the nvml fact)"


# -- the site validation record: written by the doctor's writer, read by the real ddtree_site collector ---------

PROFILE = Path(__file__).resolve().parents[1] / "bench" / "ddtree" / "profiles" / "h200-trained-validate.toml"
PATCHED = {"sglang/srt/speculative/ddtree_worker.py": "a" * 64, "sglang/srt/speculative/ddtree_site.py": "b" * 64}


def h200_stack(torch: str = "2.11.0") -> dict:
    """The real H200 recording's stack with SGLang 0.5.23, sglang-kernel 0.4.5 and FlashInfer 0.7.2 beside it
    (the validation payload's stack)."""
    stack = json.loads(json.dumps(H200["stack"]))
    for name, version in (("sglang", "0.5.23"), ("sglang-kernel", "0.4.5"), ("flashinfer-python", "0.7.2")):
        stack["distributions"][name] = {"name": name, "version": version, "location": "/site", "requires": []}
    stack["torch"]["version_py"]["__version__"] = torch + "+cu130"
    stack["distributions"]["torch"]["version"] = torch
    return stack


def site_gate(tmp_path: Path, *, server: str = "", stack: dict | None = None, env: dict | None = None) -> Any:
    """sglang.ddtree on the trained pair's validate profile (TP 1, H200 recording), records under
    ``tmp_path/state`` collected live; ``server``: more of the config's [server] table."""
    for name in ("model", "drafter"):
        if not (tmp_path / name).exists():
            (tmp_path / name).mkdir()
            (tmp_path / name / "config.json").write_text(f'{{"model_type": "{name}"}}')
    cfg = tmp_path / "k26.toml"
    cfg.write_text(f'[server]\nenv_file = "{tmp_path / "absent.env"}"\n{server}')
    flags = {"profile": str(PROFILE), "config": str(cfg), "state_dir": str(tmp_path / "state"),
             "model_path": str(tmp_path / "model"), "draft_model_path": str(tmp_path / "drafter")}
    facts = {"env": {"vars": dict(env or {}), "env_file": None}, "stack": stack or h200_stack(),
             "nvml": H200["nvml"], "sglang_patches": {"files": {p: {"sha256": h} for p, h in PATCHED.items()}}}
    return run_check("sglang.ddtree", make_context(flags, facts=facts, live=True))


def record_of(result: Any, tmp_path: Path, *, outcome: str = "pass", host: dict | None = None, **change: Any) -> Path:
    from doctor.sglang.validation.record import KIND, host_identity, write_record
    from doctor.sglang.validation.siteconfig import gpu_uuids

    body = {"kind": KIND, "schema_version": 1, "key": "", "outcome": outcome,
            "configuration": {**result.details["configuration"], **change},
            "host": host or host_identity(gpu_uuids(H200["nvml"])),
            "figures": {"worth": {"vs_dflash_at_concurrency": 0.97, "concurrency": "c32"}},
            "date": "2026-12-02T08:00:00+00:00", "command": "k26-doctor validate --profile h200-trained-validate"}
    return write_record(tmp_path / "state", body)


def test_no_record_fails_naming_the_command_that_makes_one(tmp_path: Path) -> None:
    res = site_gate(tmp_path)
    assert res.status.value == "fail" and res.details["not_judged"] == {}
    assert f"no site validation record of this host under {tmp_path / 'state' / 'ddtree' / 'validated'}" in res.summary
    assert res.remediation.commands == [f"k26-doctor validate --config {tmp_path / 'k26.toml'} --profile {PROFILE}"]
    assert "k26-doctor validate" in res.remediation.text and "UNVALIDATED" not in res.remediation.text


def test_an_exact_record_opens_the_gate_naming_it(tmp_path: Path) -> None:
    path = record_of(site_gate(tmp_path), tmp_path)
    res = site_gate(tmp_path)
    assert res.status.value == "pass" and [f.code for f in res.findings] == ["sglang.ddtree.validated"]
    assert res.details["record"] == str(path) and str(path) in res.summary
    assert res.details["configuration"]["ddtree_budget"] == 16 and res.details["configuration"]["gpu_name"] == \
        "NVIDIA H200"


@pytest.mark.parametrize("server, differs", [
    ("ddtree_budget = 32\n", "ddtree_budget 32 (validated: 16)"),
    ('args = ["--skip-tokenizer-init", "--disable-overlap-schedule"]\n', "overlap_schedule off (validated: on)"),
    ('args = ["--skip-tokenizer-init", "--ep-size", "2"]\n', "ep_size 2 (validated: 1)"),
])
def test_one_changed_key_is_refused_naming_it(tmp_path: Path, server: str, differs: str) -> None:
    base = site_gate(tmp_path, server='args = ["--skip-tokenizer-init"]\n')
    path = record_of(base, tmp_path)
    res = site_gate(tmp_path, server=server)
    assert res.status.value == "fail" and res.details["nearest"] == str(path)
    assert res.details["differs"] == [differs], res.details["differs"]
    assert f"differs from the nearest record {path}" in res.summary and differs in res.summary
    assert res.remediation.commands[0].startswith("k26-doctor validate")


def test_an_upgrade_makes_the_record_stale_and_says_what_changed(tmp_path: Path) -> None:
    record_of(site_gate(tmp_path), tmp_path)
    res = site_gate(tmp_path, stack=h200_stack(torch="2.14.1"))
    assert res.status.value == "fail" and res.details["differs"] == ["torch 2.14.1 (validated: 2.11.0)"]
    other = {**PATCHED, "sglang/srt/speculative/ddtree_site.py": "c" * 64}
    record_of(site_gate(tmp_path), tmp_path, patched_files=other)
    res = site_gate(tmp_path, stack=h200_stack(torch="2.14.1"))
    assert res.status.value == "fail"  # the nearest of two records, each one key away
    assert len(res.details["differs"]) == 1


def test_a_hand_edited_or_copied_record_is_refused_with_its_reason(tmp_path: Path) -> None:
    base = site_gate(tmp_path)
    path = record_of(base, tmp_path)
    data = json.loads(path.read_text())
    data["configuration"]["ddtree_budget"] = 16
    data["outcome"] = "pass"
    data["figures"] = {"edited": True}
    path.write_text(json.dumps(data))
    res = site_gate(tmp_path)
    assert res.status.value == "fail" and "edited after" in res.summary and str(path) in res.summary
    path.unlink()
    copied = record_of(base, tmp_path, host={"machine_id": "f" * 64, "hostname": "node-7", "gpu_uuids": []})
    res = site_gate(tmp_path)
    assert res.status.value == "fail"
    assert res.details["refused_records"] == [{"path": str(copied), "why": res.details["refused_records"][0]["why"]}]
    assert "another host" in res.details["refused_records"][0]["why"]


def test_a_corrupt_record_is_a_verdict_never_a_traceback(tmp_path: Path) -> None:
    folder = tmp_path / "state" / "ddtree" / "validated"
    folder.mkdir(parents=True)
    (folder / "0123456789abcdef.json").write_bytes(b"\x00{ truncated")
    res = site_gate(tmp_path)
    assert res.status.value == "fail" and "not JSON" in res.summary and res.traceback is None


def test_lossless_but_not_faster_warns_naming_dflash(tmp_path: Path) -> None:
    record_of(site_gate(tmp_path), tmp_path, outcome="lossless-not-faster")
    res = site_gate(tmp_path)
    assert res.status.value == "warn" and [f.code for f in res.findings] == ["sglang.ddtree.not_faster"]
    assert "NOT faster than DFLASH" in res.summary and "DFLASH" in res.remediation.text


def test_the_opt_in_with_a_record_says_it_is_not_needed(tmp_path: Path) -> None:
    record_of(site_gate(tmp_path), tmp_path)
    res = site_gate(tmp_path, env={"SGLANG_DDTREE_UNVALIDATED_WORKER": "1"})
    assert res.status.value == "warn" and "the opt-in is not needed" in res.summary


def test_keys_not_read_with_a_record_that_matches_the_rest_are_not_judged(tmp_path: Path) -> None:
    base = site_gate(tmp_path)
    record_of(base, tmp_path)
    for name in ("model", "drafter"):
        (tmp_path / name / "config.json").unlink()
    res = site_gate(tmp_path)
    assert res.status.value == "skip" and res.unjudged
    assert set(res.details["not_judged"]) == {"model", "drafter"}


# -- agreement with the patched server itself -------------------------------------------------------------------

@pytest.fixture()
def worker():
    import ci_requirements
    from ddtree_support import patched_worker

    ci_requirements.require("torch", needed_for="by the patched ddtree_worker")
    yield from patched_worker()


@pytest.mark.network
def test_the_doctor_matches_and_words_as_the_patched_gate(worker, monkeypatch) -> None:
    """The doctor's keys, matching and refusal text are the patched ``ddtree_worker``'s: over every mode, TP size
    and GPU below, the same entry is found in the shipped manifest as in ``VALIDATED``, and where none is, the
    doctor's ``server_refusal`` is the very message ``check_ddtree_worker_available`` raises."""
    from doctor.sglang import ddtree
    from doctor.sglang.patching import manifest

    monkeypatch.delenv(worker.UNVALIDATED_WORKER_ENV, raising=False)
    monkeypatch.delenv("SGLANG_DDTREE_SITE_RECORD", raising=False)
    table = manifest.resolve("ddtree-0.5.23").validated
    assert ddtree.CONFIG_KEYS == tuple(worker.CONFIG_KEYS)
    seen = {"validated": 0, "refused": 0}
    for graphs in (True, False):
        for overlap in (True, False):
            for tp, cc in ((1, "9.0"), (8, "9.0"), (1, "10.3"), (8, "10.3")):
                config = {"sglang": "0.5.23", "tp_size": tp, "attention_backend": "triton", "cuda_graph": graphs,
                          "overlap_schedule": overlap, "compute_capability": cc, "torch": "2.11.0"}
                assert ddtree.validated_entry(config, table) == worker.validated_entry(config)
                with pytest.raises(NotImplementedError, match="site validation record"):
                    worker.check_ddtree_worker_available(config)  # the list alone opens nothing (0005)
                if worker.validated_entry(config) is not None:
                    seen["validated"] += 1
                    assert worker.check_ddtree_worker_available(config, worker.VALIDATED) is None
                    continue
                seen["refused"] += 1
                with pytest.raises(NotImplementedError) as exc:
                    worker.check_ddtree_worker_available(config, worker.VALIDATED)
                assert ddtree.refusal(config, table, "ddtree-0.5.23") == str(exc.value)
    assert seen == {"validated": 3, "refused": 13}


@pytest.mark.network  # the patched SGLang 0.5.23 (its parser), imported in the bare-package probe
def test_the_server_arguments_are_read_as_sglangs_own_parser_reads_them(tmp_path_factory) -> None:
    """For each argv of the probe's GATE_ARGVS (the launcher's, aliases, ``--opt=value``, a unique prefix, a flag
    given twice, each graph and overlap switch), the patched server's ``server_configuration`` of the argv parsed
    by SGLang's ServerArgs parser equals what sglang.ddtree reads from it."""
    from ddtree_bare_probe import GATE_ARGVS
    from ddtree_support import bare_part

    from doctor.sglang import ddtree
    from doctor.sglang.patching import manifest

    server = bare_part(tmp_path_factory, "gate_argv", "to parse server arguments with SGLang's ServerArgs")
    options = ddtree.release_options(manifest.resolve("ddtree-0.5.23"))
    assert set(server) == set(GATE_ARGVS)
    for name, argv in GATE_ARGVS.items():
        values, unread = ddtree.argv_keys(argv, None, options)
        assert unread == {} and values == server[name], name
    assert server["no overlap, prefix"]["overlap_schedule"] is False and server["tp alias"]["tp_size"] == 2


@pytest.mark.network  # the patched SGLang 0.5.23 (its parser), imported in the bare-package probe
def test_the_records_argument_keys_are_read_as_the_patched_server_derives_them(tmp_path_factory) -> None:
    """EP size (and its aliases), the MoE all-to-all backend, attention CP, prefill CP and the budget of each argv
    of the probe's SITE_ARGVS: the patched server's ``ddtree_site`` over SGLang's parsed arguments, and
    ``doctor.sglang.validation.siteconfig`` over the argv, agree (SGLang's defaults where a flag is absent)."""
    from ddtree_bare_probe import SITE_ARGVS
    from ddtree_support import bare_part

    from doctor.sglang import ddtree
    from doctor.sglang.patching import manifest
    from doctor.sglang.validation.siteconfig import argv_site_keys

    server = bare_part(tmp_path_factory, "site_argv", "to parse server arguments with SGLang's ServerArgs")
    options = ddtree.release_options(manifest.resolve("ddtree-0.5.23"))
    assert set(server) == set(SITE_ARGVS)
    for name, argv in SITE_ARGVS.items():
        values, unread = argv_site_keys(argv, None, options)
        assert unread == {} and values == server[name], (name, values, server[name])
    assert server["ep alias"]["ep_size"] == 4 and server["budget later"]["ddtree_budget"] == 16


def test_the_launchers_argv_is_the_one_judged(tmp_path: Path) -> None:
    """The check reads the argv ``launch`` builds (``launcher.planned_args``, the probe's LAUNCHER_B300 for the
    deployment's profile): a ``[server] args`` alias given later replaces the profile's TP, and ``--opt=value``
    its backend, as the server's parser takes them."""
    from ddtree_bare_probe import LAUNCHER_B300

    from doctor.core.settings import resolve
    from doctor.service.launcher import planned_args

    assert planned_args(resolve({"profile": "b300-tp8-ddtree"}, environ={})) == (LAUNCHER_B300, None)
    cfg = tmp_path / "k26.toml"
    cfg.write_text('[server]\nargs = ["--tensor-parallel-size", "1", "--attention-backend=fa3"]\n')
    res = verdict("--from-snapshot", str(SNAPS / "b300x8-healthy.json"), "--profile", "b300-tp8-ddtree",
                  "--config", str(cfg))
    assert res["status"] == "fail"
    conf = res["details"]["configuration"]
    assert (conf["tp_size"], conf["attention_backend"], conf["compute_capability"]) == (1, "fa3", "10.3")
