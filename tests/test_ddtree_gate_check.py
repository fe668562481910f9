"""sglang.ddtree: the patched SGLang's start-up gate, judged before a start as the server will judge it.

The gate starts DDTREE only in a configuration of the patch set's ``validated`` list (the shipped manifest, the
copy of ``ddtree_worker.VALIDATED``), or in any with SGLANG_DDTREE_UNVALIDATED_WORKER=1. The inputs here are
real: the shipped manifest; the real H200 recording (tests/fixtures/snapshots/h200x1-all-facts.json, recorded on
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
    assert "DFLASH" in res["remediation"]["text"]


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
    assert res["summary"] == ("DDTREE needs SGLang with the ddtree-0.5.23 patch set (not installed), in a validated "
                              "configuration: tp_size 8 (validated: 1), torch not installed (validated: 2.11.0)")
    assert res["remediation"]["text"].startswith("Install SGLang and apply the ddtree-0.5.23 patch set")
    site = bare / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang-0.5.23.dist-info").mkdir()
    (site / "sglang-0.5.23.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    res = verdict("--python", str(bare / "bin" / "python"))
    assert res["summary"].startswith("the patched SGLang refuses DDTREE at start: the ddtree-0.5.23 patch set starts "
                                     "only in a configuration validated inside a real server, and this one is not: "
                                     "tp_size 8 (validated: 1), torch not installed (validated: 2.11.0)")


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
def test_the_validated_h200_configuration_passes_naming_its_entry(validated_python: str, tmp_path: Path) -> None:
    """TP 1 on the real H200 recording, Triton, decode graphs and the overlap scheduler on (the profile's own
    server arguments), SGLang 0.5.23 + torch 2.11.0: the first validated entry, named with its date, GPU and run."""
    res = gate(validated_python, "h200-tp8", H200["nvml"], tmp_path, tp=1)
    assert res.status.value == "pass", res.summary
    assert res.summary == ("DDTREE starts without the opt-in: this configuration (sglang 0.5.23, tp_size 1, "
                           "attention_backend triton, cuda_graph on, overlap_schedule on, compute_capability 9.0, "
                           "torch 2.11.0) was validated 2026-12-01 on NVIDIA H200 (driver 580.159.04), run "
                           "validate-graph-4 (call 4)")
    assert res.details["configuration"] == {"sglang": "0.5.23", "tp_size": 1, "attention_backend": "triton",
                                            "cuda_graph": True, "overlap_schedule": True, "compute_capability": "9.0",
                                            "torch": "2.11.0"}
    assert res.details["not_judged"] == {} and [f.code for f in res.findings] == ["sglang.ddtree.validated"]


@pytest.mark.network
@pytest.mark.parametrize("args, graphs, overlap", [
    (("--disable-cuda-graph",), False, True),
    (("--disable-decode-cuda-graph",), False, True),
    (("--disable-cuda-graph", "--disable-overlap-schedule"), False, False),
])
def test_eager_servers_pass_as_validated(validated_python: str, tmp_path: Path, args: tuple[str, ...],
                                         graphs: bool, overlap: bool) -> None:
    """Decode graphs off (either flag the server reads), with or without the overlap scheduler: each is an entry of
    its own (validated in calls 3 and 4)."""
    res = gate(validated_python, "h200-tp8", H200["nvml"], tmp_path, tp=1, args=args)
    assert res.status.value == "pass", res.summary
    assert (res.details["configuration"]["cuda_graph"], res.details["configuration"]["overlap_schedule"]) == (
        graphs, overlap)
    assert res.summary.endswith("run validate-graph-3 and -4 (calls 3, 4)")


@pytest.mark.network
def test_graphs_without_the_overlap_scheduler_fail_as_not_validated(validated_python: str, tmp_path: Path) -> None:
    res = gate(validated_python, "h200-tp8", H200["nvml"], tmp_path, tp=1, args=("--disable-overlap-schedule",))
    assert res.status.value == "fail" and [f.code for f in res.findings] == ["sglang.ddtree.refused"]
    assert res.summary == ("the patched SGLang refuses DDTREE at start: the ddtree-0.5.23 patch set starts only in a "
                           "configuration validated inside a real server, and this one is not: overlap_schedule off "
                           "(validated: on); SGLANG_DDTREE_UNVALIDATED_WORKER=1 not set")
    assert res.details["nearest"].endswith("run validate-graph-4 (call 4)")
    assert "DFLASH" in res.remediation.text and "opt in knowingly" in res.remediation.text
    assert res.remediation.commands == [f"echo 'SGLANG_DDTREE_UNVALIDATED_WORKER=1' | sudo tee -a "
                                        f"{tmp_path / 'absent.env'}"]
    assert res.details["server_refusal"].startswith("DDTREE: this revision of the ddtree-0.5.23 patch set starts")
    assert "overlap_schedule=False" in res.details["server_refusal"]


@pytest.mark.network
def test_tp8_on_b300_fails_naming_tp_size_and_compute_capability(validated_python: str, tmp_path: Path) -> None:
    """The deployment's own profile (TP 8 on 8x B300, sm 10.3) on the validated stack: refused, naming exactly the
    two keys that differ from the nearest validated entry."""
    res = gate(validated_python, "b300-tp8-ddtree", B300_NVML, tmp_path)
    assert res.status.value == "fail"
    assert res.details["differs"] == ["tp_size 8 (validated: 1)", "compute_capability 10.3 (validated: 9.0)"]
    assert "this one is not: tp_size 8 (validated: 1), compute_capability 10.3 (validated: 9.0);" in res.summary


def test_the_b300_recording_is_not_validated_without_a_stack(tmp_path: Path) -> None:
    """The synthetic B300 recording replayed under the deployment's profile, as a user runs it: refused naming
    tp_size and compute_capability; SGLang's and torch's versions not recorded there, so not judged (said)."""
    res = verdict("--from-snapshot", str(SNAPS / "b300x8-healthy.json"), "--profile", "b300-tp8-ddtree")
    assert res["status"] == "fail"
    assert res["details"]["differs"] == ["tp_size 8 (validated: 1)", "compute_capability 10.3 (validated: 9.0)"]
    assert res["details"]["not_judged"] == {"sglang": "the stack fact is not recorded",
                                            "torch": "the stack fact is not recorded"}
    assert res["summary"].endswith("not judged: sglang, torch (the stack fact is not recorded); "
                                   "SGLANG_DDTREE_UNVALIDATED_WORKER=1 not recorded (the env fact)")


@pytest.mark.network
def test_opted_in_warns_and_says_whether_the_configuration_is_validated(validated_python: str,
                                                                        tmp_path: Path) -> None:
    opt_in = {"SGLANG_DDTREE_UNVALIDATED_WORKER": "1"}
    res = gate(validated_python, "h200-tp8", H200["nvml"], tmp_path, tp=1, env=opt_in)
    assert res.status.value == "warn" and [f.code for f in res.findings] == ["sglang.ddtree.opted_in"]
    assert res.summary.endswith("this one is validated (2026-12-01 on NVIDIA H200 (driver 580.159.04), run "
                                "validate-graph-4 (call 4)): the opt-in is not needed")
    assert res.remediation.text.startswith("Remove SGLANG_DDTREE_UNVALIDATED_WORKER=1")
    res = gate(validated_python, "b300-tp8-ddtree", B300_NVML, tmp_path, env=opt_in)
    assert res.status.value == "warn"
    assert res.summary.endswith("this one is not validated: tp_size 8 (validated: 1), compute_capability 10.3 "
                                "(validated: 9.0)")
    res = gate(validated_python, "h200-tp8", None, tmp_path, tp=1, env=opt_in)
    assert res.status.value == "warn"
    assert res.summary.endswith("whether this one is validated is not judged: compute_capability (no GPU reading is "
                                "recorded (the nvml fact))")


@pytest.mark.network
def test_a_missing_fact_is_not_judged_never_a_pass(validated_python: str, tmp_path: Path) -> None:
    """Every key read matches the first validated entry; what the gate would also compare cannot be known."""
    res = gate(validated_python, "h200-tp8", None, tmp_path, tp=1)
    assert res.status.value == "skip" and res.unjudged
    assert res.summary == ("DDTREE's start-up gate not judged: compute_capability (no GPU reading is recorded (the "
                           "nvml fact)); the keys read match the configuration validated 2026-12-01 on NVIDIA H200 "
                           "(driver 580.159.04), run validate-graph-4 (call 4)")
    res = gate(validated_python, "h200-tp8", GPULESS_NVML, tmp_path, tp=1)  # a host without the NVIDIA driver
    assert res.status.value == "skip" and res.unjudged
    assert res.details["not_judged"] == {"compute_capability": "NVML is not available (see gpu.driver)"}


def test_a_recording_without_a_stack_or_gpus_is_not_judged() -> None:
    """The real H200 recording's facts without ``stack`` and ``nvml`` (a recording made before them), under TP 1:
    sglang, torch and the compute capability not judged, the result never a pass."""
    ctx = make_context({"profile": "h200-tp8", "tp": 1}, facts={"env": H200["env"]})
    res = run_check("sglang.ddtree", ctx)
    assert res.status.value == "skip" and res.unjudged
    assert res.details["not_judged"] == {"sglang": "the stack fact is not recorded",
                                         "compute_capability": "no GPU reading is recorded (the nvml fact)",
                                         "torch": "the stack fact is not recorded"}
    # the real H200 stack (torch 2.11.0+cu130, no SGLang in that venv): SGLang's absence is a fact, not a gap
    ctx = make_context({"profile": "h200-tp8", "tp": 1}, facts=H200)
    res = run_check("sglang.ddtree", ctx)
    assert res.status.value == "fail" and res.details["not_judged"] == {}
    assert res.details["differs"] == ["sglang not installed (validated: 0.5.23)"]
    assert res.details["configuration"]["torch"] == "2.11.0"


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
    table = manifest.resolve("ddtree-0.5.23").validated
    assert ddtree.CONFIG_KEYS == tuple(worker.CONFIG_KEYS)
    seen = {"validated": 0, "refused": 0}
    for graphs in (True, False):
        for overlap in (True, False):
            for tp, cc in ((1, "9.0"), (8, "9.0"), (1, "10.3"), (8, "10.3")):
                config = {"sglang": "0.5.23", "tp_size": tp, "attention_backend": "triton", "cuda_graph": graphs,
                          "overlap_schedule": overlap, "compute_capability": cc, "torch": "2.11.0"}
                assert ddtree.validated_entry(config, table) == worker.validated_entry(config)
                if worker.validated_entry(config) is not None:
                    seen["validated"] += 1
                    assert worker.check_ddtree_worker_available(config) is None
                    continue
                seen["refused"] += 1
                with pytest.raises(NotImplementedError) as exc:
                    worker.check_ddtree_worker_available(config)
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
    assert res["details"]["differs"] == ["attention_backend fa3 (validated: triton)",
                                         "compute_capability 10.3 (validated: 9.0)"]
