"""FlashInfer's JIT at a DFLASH/DDTREE start: precompiled, already compiled, or compilable on this host.

A DFLASH/DDTREE server on CUDA calls FlashInfer's sampling module in its start-up rehearsal; on the lent H200
(bench/results/ddtree-h200-round1) the server compiled FlashInfer modules with nvcc and ninja at start. The
stack probe runs for real under an interpreter whose environment holds (or lacks) an nvcc, a ninja, a cache;
the judgement runs on what it reported. nvcc and ninja are executables written here (the probe runs
``nvcc --version`` and looks ninja up on PATH; it never runs a build); the toolkit's headers are real copies of the
installed CUDA runtime's (``tests/cuda_toolkit.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cuda_toolkit import nvcc_script, runtime_release, toolkit
from stack_support import healthy_venv, make_ctx, nvml_fact, run_check, stack_site, write_dist

from doctor.core import proc
from doctor.core.result import Findings, Severity, Status
from doctor.sglang.runtime import JIT_CACHE, JIT_NINJA, JIT_NVCC, JIT_READY, flashinfer_jit_problems


def cuda_home(root: Path) -> Path:
    """A toolkit whose nvcc answers the release of its real headers (those of the installed CUDA runtime)."""
    return toolkit(root, nvcc=nvcc_script(runtime_release()))


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def site_with_flashinfer(root: Path, *jit_cache: tuple[str, str]) -> Path:
    site = root / "site"
    write_dist(site, "flashinfer-python", "0.7.2", top_level="flashinfer")
    for name, version in jit_cache:
        write_dist(site, name, version)
    return site


def installed_site(root: Path) -> Path:
    """SGLang 0.5.23 with its requirements and a whole FlashInfer 0.7.2 (its JIT directories), as files: what
    ``sglang.install``'s default tier reads (nothing here is imported)."""
    site = stack_site(root / "site")
    write_dist(site, "flashinfer-python", "0.7.2", top_level="flashinfer")
    write_dist(site, "numpy", "2.3.0")  # SGLang's own requirement in this tree
    (site / "flashinfer" / "sampling.py").write_text("raise ImportError('the default tier must not import this')\n")
    for d in ("data/csrc", "data/include", "data/cutlass/include", "data/cccl/cub"):
        (site / "flashinfer" / d).mkdir(parents=True)
    return site


def probe(site: Path, *, python: str = sys.executable, nvcc: bool, ninja: bool, cache: Path) -> dict:
    """The stack probe's facts with ``site`` on the path and only the tools asked for on PATH."""
    tools = site.parent / "tools"
    tools.mkdir(exist_ok=True)
    if ninja:
        executable(tools / "ninja")
    env = {"PATH": str(tools), "PYTHONPATH": str(site), "SGLANG_CACHE_DIR": str(cache),
           "CUDA_HOME": str(cuda_home(site.parent / "cuda")) if nvcc
           else str(site.parent / "no-cuda")}
    data, res = proc.run_probe(python, "stack", [], timeout=60, env=env)
    assert data is not None, res.why()
    return data


def judge(fact: dict, cc: str = "10.3", algorithm: str | None = "DDTREE") -> Findings:
    return flashinfer_jit_problems(fact["flashinfer_jit"], fact["distributions"], algorithm=algorithm,
                                   compute_capability=cc, torch_cuda="13.0")


def note(found: Findings) -> str:
    """Where the kernels come from (the one ``JIT_READY`` finding), when nothing fails."""
    ready = [f for f in found if f.code == JIT_READY]
    assert len(ready) <= 1 and all(f.severity is Severity.INFO for f in ready), found
    return ready[0].message if ready else ""


def test_no_nvcc_and_no_ninja_fail_with_the_precompiled_cache_as_the_fix(tmp_path):
    fact = probe(site_with_flashinfer(tmp_path), nvcc=False, ninja=False, cache=tmp_path / "cache")
    fi = fact["flashinfer_jit"]
    assert fi["version"] == "0.7.2" and fi["cache_dir"] == str(tmp_path / "cache" / ".cache" / "flashinfer")
    assert fi["base_from"] == "SGLANG_CACHE_DIR" and fi["writable"] and fi["compiled"] == []
    assert fi["nvcc"]["exists"] is False and fi["nvcc"]["found_by"] == "CUDA_HOME/CUDA_PATH"
    found = judge(fact)
    assert [f.code for f in found] == [JIT_NVCC, JIT_NINJA] and found.failing and not note(found)  # a code each
    nvcc, ninja = found
    assert "DDTREE compiles FlashInfer's sampling module at start" in nvcc.message and "no nvcc at" in nvcc.message
    assert "`ninja` is not on the service's PATH" in ninja.message
    assert nvcc.fix and ninja.fix
    assert nvcc.fix.commands[0] == "pip install 'flashinfer-jit-cache==0.7.2' --index-url https://flashinfer.ai/whl/cu130"
    assert ninja.fix.commands == ["pip install ninja"]


def test_nvcc_ninja_and_a_writable_cache_compile_at_the_first_start(tmp_path):
    fact = probe(site_with_flashinfer(tmp_path), nvcc=True, ninja=True, cache=tmp_path / "new" / "cache")
    assert fact["flashinfer_jit"]["nvcc"]["release"] == runtime_release()
    assert fact["flashinfer_jit"]["writable_checked"] == str(tmp_path)  # the nearest directory that exists
    found = judge(fact)
    assert [f.code for f in found] == [JIT_READY] and found[0].fix is None
    assert note(found).startswith("the first start compiles FlashInfer's sampling module")
    assert f"({runtime_release()}, CUDA {runtime_release()} headers)" in note(found)
    assert judge(fact, algorithm=None) == []  # no speculation: the start does not call it


def test_a_cache_that_cannot_be_made_fails(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    fact = probe(site_with_flashinfer(tmp_path), nvcc=True, ninja=True, cache=blocker / "cache")
    assert fact["flashinfer_jit"]["writable"] is False and fact["flashinfer_jit"]["writable_checked"] == str(blocker)
    found = judge(fact)
    assert [f.code for f in found] == [JIT_CACHE] and f"{blocker} is not writable" in found[0].message
    assert found[0].fix and "SGLANG_CACHE_DIR" in found[0].fix.commands[0]


def test_a_module_compiled_earlier_needs_no_compiler(tmp_path):
    cache = tmp_path / "cache"
    executable(cache / ".cache" / "flashinfer" / "0.7.2" / "103a" / "cached_ops" / "sampling" / "sampling.so", "")
    (cache / ".cache" / "flashinfer" / "0.7.2" / "103a" / "cached_ops" / "norm").mkdir()  # a failed build: no .so
    fact = probe(site_with_flashinfer(tmp_path), nvcc=False, ninja=False, cache=cache)
    assert fact["flashinfer_jit"]["compiled"] == ["103a/sampling"]
    found = judge(fact)
    assert not found.failing and "sampling module is compiled in" in note(found)
    assert note(found).endswith("0.7.2/103a/sampling")
    assert judge(fact, cc="9.0").failing  # compiled for a B300 only: an H200 compiles its own


def test_the_precompiled_cache_counts_for_its_own_version_and_architecture(tmp_path):
    fact = probe(site_with_flashinfer(tmp_path / "b300", ("flashinfer-jit-cache", "0.7.2+cu130"),
                                      ("flashinfer-jit-cache-sm103a", "0.7.2+cu130")),
                 nvcc=False, ninja=False, cache=tmp_path / "cache")
    found = judge(fact)
    assert not found.failing
    assert note(found) == "FlashInfer's kernels come precompiled from flashinfer-jit-cache-sm103a 0.7.2+cu130"
    assert judge(fact, cc="9.0").failing  # an H200 needs the sm90a provider: nothing precompiled for it here
    fact = probe(site_with_flashinfer(tmp_path / "old", ("flashinfer-jit-cache", "0.7.1+cu130")),
                 nvcc=False, ninja=False, cache=tmp_path / "cache")
    assert judge(fact).failing  # another release's cache is ignored by FlashInfer: the kernels compile


def test_ninja_beside_the_interpreter_but_not_on_path_is_named(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    executable(venv / "bin" / "ninja")
    fact = probe(site_with_flashinfer(tmp_path), python=str(venv / "bin" / "python"), nvcc=True, ninja=False,
                 cache=tmp_path / "cache")
    assert fact["flashinfer_jit"]["ninja_beside_python"] == str(venv / "bin" / "ninja")
    found = judge(fact)
    assert [f.code for f in found] == [JIT_NINJA]
    assert f"({venv}/bin/ninja is, beside the interpreter" in found[0].message
    assert found[0].fix and found[0].fix.commands == [
        f"# add {venv}/bin to the service's PATH (a unit from `k26-doctor systemd-unit` puts it first)"]


def test_sglang_install_fails_a_ddtree_profile_on_a_host_without_nvcc(tmp_path):
    """The check as the default tier runs it: a B300 DDTREE profile, SGLang and FlashInfer installed."""
    site = installed_site(tmp_path)
    env = {"PYTHONPATH": str(site), "PATH": str(tmp_path / "bin"), "CUDA_HOME": str(tmp_path / "no-cuda"),
           "SGLANG_CACHE_DIR": str(tmp_path / "cache")}
    ctx = make_ctx(healthy_venv(), env=env, facts={"nvml": nvml_fact([(10, 3)])})
    res = run_check("sglang.install", ctx)
    assert res.status is Status.FAIL and "would stop at start" in res.summary, res.summary
    assert res.summary.count("would stop at start") == 1  # one verdict line for every problem
    assert "DDTREE compiles FlashInfer's sampling module at start" in res.summary
    assert res.remediation.commands[0].startswith("pip install 'flashinfer-jit-cache==0.7.2' --index-url")
    # each problem stays a finding of its own kind, for a fixer that acts on one (no nvcc, no ninja on PATH)
    assert [f.code for f in res.findings if f.severity is Severity.FAIL] == [JIT_NVCC, JIT_NINJA], res.findings
    assert os.path.basename(res.details["flashinfer_jit"]["cache_dir"]) == "flashinfer"


def test_the_check_sees_the_venv_on_path_as_the_launcher_starts_the_server(tmp_path):
    """``launch`` starts the server with the interpreter's directory first on PATH (as ``activate`` would), and
    the check's probes see the same environment: a ninja beside the interpreter is found, no failure."""
    site = installed_site(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    executable(venv / "bin" / "ninja")
    cuda = cuda_home(tmp_path / "cuda")
    env = {"PYTHONPATH": str(site), "PATH": str(tmp_path / "bin"), "CUDA_HOME": str(cuda),
           "SGLANG_CACHE_DIR": str(tmp_path / "cache")}
    ctx = make_ctx(venv / "bin" / "python", env=env, facts={"nvml": nvml_fact([(10, 3)])})
    res = run_check("sglang.install", ctx)
    assert res.details["flashinfer_jit"]["ninja"] == str(venv / "bin" / "ninja"), res.summary
    assert "first start compiles FlashInfer's sampling module" in res.summary and res.status is not Status.FAIL
