"""Diagnosis of failed starts on real log text: the H200 Triton traceback recorded on a lent host,
errors produced here by the real libraries (safetensors, argparse, the socket layer), and messages
quoted verbatim from real tools (ptxas, torch, NCCL, SGLang 0.5.23's sources)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import struct
from pathlib import Path

import pytest
from conftest import run_doctor

from doctor.core.registry import load
from doctor.service.diagnose import SignatureError, diagnose_lines, load_signatures

REFERENCE = Path(__file__).resolve().parent / "fixtures" / "reference" / "h200-triton-missing-python-h.txt"
CONTRACT_IDS = {"gpu.driver", "gpu.count", "gpu.arch", "gpu.memory", "gpu.idle", "gpu.health", "gpu.nvlink",
                "gpu.fabric", "cuda.compat", "torch.arch", "stack.versions", "triton.jit", "triton.ptxas",
                "python.venv", "sglang.install", "sglang.patches", "model.shards", "model.config",
                "model.tokenizer", "model.drafter", "model.fit", "host.disk", "host.port", "host.env"}
# CONTRACT.md "Additions (round 2)": kept ids and the ids new in this round
ROUND2_IDS = {"gpu.p2p_bandwidth", "model.shards.deep", "model.drafter.deep", "sglang.flags", "sglang.ddtree",
              "cuda.libcuda", "stack.kernels", "host.exposure"}


def found(text: str) -> list[tuple[str, str | None]]:
    return [(f.signature.id, f.signature.check) for f in diagnose_lines(text.splitlines(), load_signatures())]


def test_every_signature_points_at_a_real_check() -> None:
    known = CONTRACT_IDS | ROUND2_IDS | {c.id for c in load(plugins=False).sorted_checks()}
    for sig in load_signatures():
        assert sig.check in known or (sig.check is None and sig.consequence), (sig.id, sig.check)


def test_h200_triton_missing_python_h() -> None:
    text = REFERENCE.read_text()
    got = diagnose_lines(text.splitlines(), load_signatures())
    assert got[0].signature.check == "triton.jit"
    assert "Python.h: No such file or directory" in got[0].line
    assert got[0].line_no == text.splitlines().index(
        next(ln for ln in text.splitlines() if "Python.h: No such file" in ln)) + 1


def test_real_safetensors_errors(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors")
    shard = tmp_path / "model-00001-of-000064.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    shard.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    messages = []
    for bad in (struct.pack("<Q", len(header)) + header[:10],      # truncated header
                struct.pack("<Q", 2**40) + b"{}"):                  # header length beyond any file
        shard.write_bytes(bad)
        with pytest.raises(Exception) as exc:
            safetensors.safe_open(str(shard), framework="numpy")
        messages.append(f"{type(exc.value).__module__}.{type(exc.value).__name__}: {exc.value}")
    for msg in messages:
        assert found(msg)[0] == ("safetensors-corrupt", "model.shards"), msg


def test_real_argparse_errors() -> None:
    parser = argparse.ArgumentParser(prog="launch_server.py")
    parser.add_argument("--cuda-graph-max-bs-decode", type=int)
    parser.add_argument("--cuda-graph-max-bs-prefill", type=int)
    for argv in (["--cuda-graph-max-bs", "8"], ["--speculative-ddtree-budget", "64"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert found(err.getvalue())[0][1] == "sglang.flags", err.getvalue()


def test_real_address_in_use() -> None:
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        a.listen(1)
        where = a.getsockname()
        with pytest.raises(OSError) as exc:
            b.bind(where)
    # uvicorn's wording around the real errno text; and the plain exception as Python prints it
    line = f"ERROR:    [Errno {exc.value.errno}] error while attempting to bind on address {where}: " \
           f"{exc.value.strerror.lower()}"
    assert found(line) == [("port-in-use", "host.port")]
    assert found(f"OSError: {exc.value}") == [("port-in-use", "host.port")]


@pytest.mark.parametrize("line, check", [
    ("ptxas fatal   : Value 'sm_103a' is not defined for option 'gpu-name'", "triton.ptxas"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
     "139.81 GiB of which 1.06 GiB is free.", "model.fit"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "model.fit"),
    ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
     "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized", "gpu.fabric"),
    ("ValueError: Unknown speculative algorithm name: DDTREE", "sglang.patches"),
    # bare: whichever package's kernel it was (stack.kernels names it); torch's own warning -> torch.arch
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "stack.kernels"),
    ("UserWarning: NVIDIA B300 SXM6 AC with CUDA capability sm_103 is not compatible with the current PyTorch "
     "installation.", "torch.arch"),
    ("/opt/k26/venv/bin/python: bad interpreter: No such file or directory", "python.venv"),
    ("OSError: [Errno 28] No space left on device: '/root/.triton/cache/x'", "host.disk"),
    ("torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", "gpu.idle"),
    ("RuntimeError: No CUDA GPUs are available", "gpu.count"),
    ("torch.AcceleratorError: CUDA error: invalid device ordinal", "gpu.count"),
    ("NCCL WARN Cuda failure 'peer access is not supported between these two devices'", "gpu.nvlink"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "gpu.health"),
])
def test_quoted_real_messages(line: str, check: str) -> None:
    got = found(f"[2026-11-29 10:00:00 TP3] {line}")
    assert got and got[0][1] == check, got


NCCL_RAISED = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
               "NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.5")


def test_an_nccl_error_names_the_interconnect_only_as_the_error_a_traceback_raised() -> None:
    """The NCCL error this rank's own communicator raised is evidence; the same line quoted alone (as other ranks
    print it when a peer died) is shown but blames nothing."""
    raised = ["Traceback (most recent call last):",
              '  File "/usr/lib/python3/dist-packages/sglang/srt/distributed/parallel_state.py", line 255, in __init__',
              "    self.pynccl_comm = PyNcclCommunicator(", NCCL_RAISED]
    assert found("\n".join(raised)) == [("nccl-error", "gpu.nvlink")]
    alone = diagnose_lines([f"[2026-11-29 10:00:00 TP3] {NCCL_RAISED}"], load_signatures())
    assert [(f.signature.id, f.signature.check, f.withheld_check) for f in alone] == [
        ("nccl-error", None, "gpu.nvlink")]


def test_root_cause_first_and_no_false_alarm_on_a_clean_start() -> None:
    log = "\n".join([
        "[2026-11-29 10:00:00] server_args=ServerArgs(model_path='/models/Kimi-K2.6', trust_remote_code=True, "
        "port=30000, ...)",
        "[2026-11-29 10:00:01] Port 30001 is already in use, trying port 30002",
        "[2026-11-29 10:03:00 TP0] Load weight end. type=KimiK25ForConditionalGeneration, mem usage=69.37 GB.",
        "[2026-11-29 10:05:00 TP5] torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356",
        "[2026-11-29 10:05:00 TP2] ptxas fatal   : Value 'sm_103a' is not defined for option 'gpu-name'",
    ])
    got = found(log)
    assert [g[1] for g in got] == ["triton.ptxas", None]  # the echo of a crashed rank comes last, blaming nothing
    assert found(log.splitlines()[0] + "\n" + log.splitlines()[1] + "\n" + log.splitlines()[2]) == []


def test_bad_signature_files(tmp_path: Path) -> None:
    bad = tmp_path / "s.toml"
    bad.write_text("[[signature]]\nid = 'x'\npatterns = ['(unclosed']\n")
    with pytest.raises(SignatureError, match="bad pattern"):
        load_signatures([bad])
    bad.write_text("not toml = = =")
    with pytest.raises(SignatureError, match="not valid TOML"):
        load_signatures([bad])


def test_cli(tmp_path: Path) -> None:
    log = tmp_path / "failed.log"
    log.write_bytes(b"\x1b[31mERROR\x1b[0m: safetensors_rust.SafetensorError: Error while deserializing header: "
                    b"HeaderTooLarge\n\xff\xfe garbage\n")
    res = run_doctor("diagnose", str(log), "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["findings"][0]["check"] == "model.shards" and doc["findings"][0]["line"] == 1
    res = run_doctor("diagnose", str(log))
    assert res.returncode == 0 and "-> check model.shards" in res.stdout and "$ k26-doctor check" in res.stdout
    site = tmp_path / "site.toml"
    site.write_text("[[signature]]\nid = 'site-nfs'\ntitle = 'NFS stale handle'\npatterns = ['Stale file handle']\n"
                    "check = 'host.disk'\nfix = 'remount'\n")
    log.write_text("OSError: [Errno 116] Stale file handle\n")
    assert run_doctor("diagnose", str(log)).returncode == 1
    res = run_doctor("diagnose", str(log), "--signatures", str(site))
    assert res.returncode == 0 and "NFS stale handle" in res.stdout
    assert run_doctor("diagnose", str(tmp_path / "absent.log")).returncode == 2
    assert run_doctor("diagnose").returncode == 2
    res = run_doctor("diagnose", "-", input="fatal error: Python.h: No such file or directory\n")
    assert res.returncode == 0 and "triton.jit" in res.stdout


def test_exec_stop_post_mode_is_silent_after_success(tmp_path: Path) -> None:
    from conftest import doctor_env

    res = run_doctor("diagnose", "--journal", "x.service", "--on-service-failure",
                     env=doctor_env(SERVICE_RESULT="success"))
    assert res.returncode == 0 and res.stdout == ""


def test_journal_is_read_for_the_failed_invocation(tmp_path: Path) -> None:
    """A stand-in journalctl on PATH (no journal daemon here) that logs its argv and prints a real log."""
    from conftest import doctor_env

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "argv"
    fake = bin_dir / "journalctl"
    line = "ptxas fatal   : Value 'sm_103a' is not defined for option 'gpu-name'"
    (tmp_path / "journal.txt").write_text(line + "\n")
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}\ncat {tmp_path / 'journal.txt'}\n")
    fake.chmod(0o755)
    path = f"{bin_dir}:{os.environ.get('PATH', '')}"
    res = run_doctor("diagnose", "--journal", "sglang-k26-ddtree.service", env=doctor_env(PATH=path))
    assert res.returncode == 0 and "triton.ptxas" in res.stdout, res.stdout + res.stderr
    assert "-u\nsglang-k26-ddtree.service" in seen.read_text()
    res = run_doctor("diagnose", "--journal", "sglang-k26-ddtree.service", "--on-service-failure",
                     env=doctor_env(PATH=path, SERVICE_RESULT="exit-code", INVOCATION_ID="abc123"))
    assert res.returncode == 0
    assert "_SYSTEMD_INVOCATION_ID=abc123" in seen.read_text()
    fake.write_text("#!/bin/sh\necho 'No journal files were found.' >&2\nexit 1\n")
    res = run_doctor("diagnose", "--journal", "x.service", env=doctor_env(PATH=path))
    assert res.returncode == 2 and "cannot read the journal" in res.stderr
