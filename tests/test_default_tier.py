"""The default tier imports none of torch, triton, SGLang (issue 14): cuda.compat and sglang.install judge from files.

The service's interpreter here is a bare venv whose path holds a torch package that cannot be imported (its
``__init__`` writes a mark and raises) around the real ``torch/version.py`` and ``torch/lib`` of the torch
2.11.0+cu130 wheel, a Triton whose ``__init__`` raises, and the real SGLang 0.5.23 sources; an audit hook
(``sitecustomize``) records any import of those packages by any probe. The whole default tier runs against a
real H200's NVML reading; nothing may be imported, and cuda.compat still reads CUDA 13.0. ``--deep`` does import.
Recorded snapshots replay to the same verdicts with both kinds of facts, with only the old (import) facts, and
with only the new (file) facts.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import ci_requirements
import downloads
import pytest
from cuda_toolkit import nvcc_script, runtime_release, toolkit
from interpreters import bare_python
from kernel_wheels import torch_site
from sglang_wheels import wheel_for
from stack_support import make_ctx, nvml_fact, run_check, triton_package, workdir, write_dist

from doctor.core import registry
from doctor.core.result import Status
from doctor.core.runner import run_all, select

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HEAVY = ("torch", "triton", "sglang", "flashinfer", "cutlass", "sgl_kernel")
HOOK = f'''import os, sys
def _k26_hook(event, args):
    if event == "import" and str(args[0]).split(".")[0] in {HEAVY!r}:
        with open(os.environ["K26_IMPORT_MARKS"], "a") as fh:
            fh.write(str(args[0]) + " " + " ".join(sys.argv[:2]) + "\\n")
sys.addaudithook(_k26_hook)
'''


@downloads.reads("the torch 2.11.0 wheel")
def poisoned_site() -> Path:
    """torch 2.11.0+cu130's real version.py, libraries and metadata in a package whose import raises."""
    site = workdir() / "site-poisoned"
    real = torch_site()
    pkg = site / "torch"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the default tier must not import torch')\n")
    os.symlink(real / "torch" / "version.py", pkg / "version.py")
    for lib in (real / "torch" / "lib").iterdir():
        os.symlink(lib, pkg / "lib" / lib.name)
    for info in real.glob("torch-*.dist-info"):
        os.symlink(info, site / info.name)
    (site / "sitecustomize.py").write_text(HOOK)
    return site


@downloads.reads("the sglang 0.5.23 wheel")
def sglang_sources() -> Path:
    """The real SGLang 0.5.23 sources and metadata (its dependencies absent)."""
    import zipfile

    site = workdir() / "site-sglang-0.5.23-default-tier"
    with zipfile.ZipFile(wheel_for("0.5.23")) as zf:
        zf.extractall(site, [n for n in zf.namelist() if n.endswith((".py", "METADATA", "RECORD", "WHEEL"))])
    return site


def h200_nvml() -> dict:
    return json.loads((SNAPS / "h200x1-all-facts.json").read_text())["facts"]["nvml"]


def tier_ctx(marks: Path, *, deep: bool = False):
    path = os.pathsep.join(str(p) for p in (poisoned_site(), triton_package("3.6"), sglang_sources()))
    return make_ctx(bare_python(), profile="h200-tp8", deep=deep, facts={"nvml": h200_nvml()},
                    env={"PYTHONPATH": path, "K26_IMPORT_MARKS": str(marks)})


@pytest.mark.network
def test_the_whole_default_tier_imports_nothing_heavy(tmp_path):
    marks = tmp_path / "imports.txt"
    ctx = tier_ctx(marks)
    reg = registry.load(plugins=False)
    outcome = run_all(select(reg.sorted_checks(), [], [], False), ctx)
    by = {r.id: r for r in outcome.results}
    assert not marks.exists(), marks.read_text()
    assert not {"torch_info", "sglang_import"} & ctx.facts.collected()
    compat = by["cuda.compat"]
    assert compat.status is Status.PASS, compat.summary
    assert compat.summary == "driver 580.159.04 (CUDA 13.0) runs torch's CUDA 13.0 runtime"
    assert compat.details["torch"] == "2.11.0+cu130"
    install = by["sglang.install"]  # judged from the metadata: its requirements are absent here
    assert install.status is Status.FAIL and "of its requirements are not" in install.summary
    assert "torch==2.14.1, installed 2.11.0" in install.details["requirements"]["mismatched"]
    assert "numpy" in install.details["requirements"]["missing"]


@pytest.mark.network
def test_deep_imports_torch_for_real(tmp_path):
    """--deep keeps the import (and the matmul): here it meets the torch that cannot be imported."""
    marks = tmp_path / "imports.txt"
    res = run_check("cuda.compat", tier_ctx(marks, deep=True))
    assert res.status is Status.FAIL and "the default tier must not import torch" in res.summary
    assert marks.read_text().startswith("torch ")


def exec_version_py(path: Path) -> dict:
    """What ``torch.version`` holds: the file executed (it only assigns constants), as ``import torch`` would."""
    ns: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return {k: ns[k] for k in ("__version__", "cuda", "hip", "git_version") if k in ns}


def installed_torch_version_py() -> Path:
    import importlib.util

    ci_requirements.require("torch", needed_for="to compare its version.py with the import")
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations, spec
    return Path(next(iter(spec.submodule_search_locations))) / "version.py"


@pytest.mark.network
@pytest.mark.parametrize("which", ["wheel-2.11.0", "installed"])
def test_version_py_parsed_as_torch_reads_it(which):
    path = torch_site() / "torch" / "version.py" if which == "wheel-2.11.0" else installed_torch_version_py()
    sys.path.insert(0, str(ROOT / "doctor" / "probes"))
    try:
        import stack as stack_probe
    finally:
        sys.path.pop(0)
    values, error = stack_probe.version_py(path.read_text())
    assert error is None and values == exec_version_py(path)
    assert values["cuda"] == "13.0"


def test_installed_torch_version_matches_the_real_import():
    """The running interpreter's torch: the file's answer equals ``torch.version.cuda`` in a child."""
    ci_requirements.require("torch", needed_for="to import it")
    out = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps([torch.__version__, "
                          "torch.version.cuda]))"], capture_output=True, text=True, timeout=300, check=True)
    version, cuda = json.loads(out.stdout.strip().splitlines()[-1])
    assert exec_version_py(installed_torch_version_py())["cuda"] == cuda
    assert exec_version_py(installed_torch_version_py())["__version__"] == version


@pytest.mark.network
@pytest.mark.parametrize(("driver", "cuda", "status"), [("580.159.04", 13000, Status.PASS),
                                                        ("570.26", 12080, Status.FAIL)])
def test_cuda_compat_judges_the_wheels_cuda_against_the_driver(tmp_path, driver, cuda, status):
    ctx = tier_ctx(tmp_path / "imports.txt")
    ctx.facts._values["nvml"] = nvml_fact([(9, 0)], driver=driver, cuda=cuda, name="NVIDIA H200")
    res = run_check("cuda.compat", ctx)
    assert res.status is status and res.details["torch_cuda"] == "13.0", res.summary
    assert not (tmp_path / "imports.txt").exists()


@pytest.mark.network
def test_a_cpu_build_version_py_is_a_cpu_build(tmp_path):
    """torch/version.py as a CPU wheel writes it (``cuda: Optional[str] = None``): no CUDA at all, said so."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    text = (torch_site() / "torch" / "version.py").read_text()
    (site / "torch" / "version.py").write_text(text.replace("'2.11.0+cu130'", "'2.11.0+cpu'")
                                               .replace("cuda: Optional[str] = '13.0'", "cuda: Optional[str] = None"))
    write_dist(site, "torch", "2.11.0+cpu")
    ctx = make_ctx(bare_python(), facts={"nvml": h200_nvml()}, env={"PYTHONPATH": str(site)})
    res = run_check("cuda.compat", ctx)
    assert res.status is Status.FAIL and "2.11.0+cpu is a CPU-only build" in res.summary


def test_an_unparsable_version_py_falls_back_to_the_import(tmp_path):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('broken torch')\n")
    (site / "torch" / "version.py").write_text("cuda = (\n")
    write_dist(site, "torch", "2.11.0")
    res = run_check("cuda.compat", make_ctx(bare_python(), facts={"nvml": h200_nvml()},
                                            env={"PYTHONPATH": str(site)}))
    assert res.status is Status.FAIL and "broken torch" in res.summary  # judged, never a pass


# -- recorded snapshots: old facts, new facts, both ------------------------------------------------------

RECORDED = [SNAPS / "h200x1-all-facts.json", SNAPS / "reference" / "h200x2-snapshot.json"]
IDS = ("cuda.compat", "torch.arch", "sglang.install")


def replay(snapshot: dict, tmp_path: Path, *extra: str) -> dict:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snapshot))
    args = [sys.executable, "-m", "doctor", "check", "--from-snapshot", str(path), "--format", "json", *extra]
    for cid in IDS:
        args += ["--only", cid]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return {r["id"]: (r["status"], r["summary"]) for r in json.loads(out.stdout)["results"]}


def old_facts_only(snap: dict) -> dict:
    snap = copy.deepcopy(snap)
    stack = snap["facts"].get("stack") or {}
    (stack.get("torch") or {}).pop("version_py", None)
    stack.pop("sglang_runtime", None)
    snap["facts"].pop("kernels", None)
    return snap


def new_facts_only(snap: dict) -> dict:
    snap = copy.deepcopy(snap)
    for name in ("torch_info", "sglang_import"):
        snap["facts"].pop(name, None)
    return snap


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_recorded_snapshots_judge_alike_from_old_and_new_facts(path, tmp_path):
    snap = json.loads(path.read_text())
    assert "torch_info" in snap["facts"] and (snap["facts"]["stack"].get("torch") or {}).get("version_py")
    both = replay(snap, tmp_path)
    assert both["cuda.compat"][0] == "pass" and both["torch.arch"][0] == "pass"
    assert replay(old_facts_only(snap), tmp_path) == both
    new = replay(new_facts_only(snap), tmp_path)
    assert new["cuda.compat"] == both["cuda.compat"] and new["sglang.install"] == both["sglang.install"]
    # torch.arch reads torch's fat binaries (the `kernels` fact), which these recordings predate: not judged
    assert new["torch.arch"][0] == "skip" and "torch_info" in new["torch.arch"][1]


# -- sglang.install: from files, as the import judged it -------------------------------------------------

JIT_DIRS = ("data/csrc", "data/include", "data/cutlass/include", "data/cccl/cub")


def complete_site(tmp_path: Path, *, flashinfer: bool = True, jit_dirs=JIT_DIRS, dflash_kernel: bool = True) -> Path:
    """Metadata of everything SGLang 0.5.23 requires (versions it accepts), FlashInfer's files, the CuTe DSL."""
    from packaging.requirements import Requirement

    site = tmp_path / "deps"
    meta = next(sglang_sources().glob("sglang-*.dist-info/METADATA")).read_text()
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement (sglang[...] among them) or another platform's
        if req.name.replace("_", "-") == "flashinfer-python" and not flashinfer:
            continue
        pins = [s.version for s in req.specifier if s.operator in ("==", ">=", "~=", "===")]
        write_dist(site, req.name, (pins[0] if pins else "1.0").replace("*", "0"))
    if flashinfer:
        pkg = site / "flashinfer"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
        (pkg / "sampling.py").write_text("")
        for d in jit_dirs:
            (pkg / d).mkdir(parents=True)
    (site / "cutlass" / "cute").mkdir(parents=True)
    (site / "cutlass" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (site / "cutlass" / "cute" / "__init__.py").write_text("")
    src = tmp_path / "sglang-src"
    if not dflash_kernel:  # a copy of the sources without the CUDA sampling kernel's module
        import shutil

        shutil.copytree(sglang_sources(), src)
        (src / "sglang" / "kernels" / "ops" / "speculative" / "sampling.py").unlink()
        return Path(f"{site}{os.pathsep}{src}")
    return Path(f"{site}{os.pathsep}{sglang_sources()}")


@functools.cache
def cuda_home() -> Path:
    """A CUDA_HOME whose bin/nvcc answers ``--version`` with the release of its headers (real copies of the
    installed CUDA runtime's: SGLang's JIT finds nvcc there; not what is judged here)."""
    return toolkit(workdir() / "cuda-home", nvcc=nvcc_script(runtime_release()))


def install_ctx(path: Path, profile: str = "h200-tp8"):
    return make_ctx(bare_python(), profile=profile, facts={"nvml": h200_nvml()},
                    env={"PYTHONPATH": str(path), "CUDA_HOME": str(cuda_home())})


@pytest.mark.network
@pytest.mark.parametrize(("kw", "status", "words"), [
    ({}, Status.PASS, "DFlash sampling kernel available"),  # as {"available": True} from the import
    ({"dflash_kernel": False}, Status.WARN, "verify greedily"),  # as {"available": False}
    ({"flashinfer": False}, Status.FAIL, "flashinfer_python==0.7.2"),  # DDTREE without FlashInfer, as NO_FI
    ({"jit_dirs": ("data/include", "data/cccl/cub")}, Status.FAIL, "lacks data/csrc"),  # a trimmed FlashInfer
])
def test_sglang_install_from_files_judges_as_the_import_did(tmp_path, kw, status, words):
    ctx = install_ctx(complete_site(tmp_path, **kw))
    res = run_check("sglang.install", ctx)
    assert res.status is status and words in res.summary, res.summary
    assert "sglang_import" not in ctx.facts.collected()


@pytest.mark.network
def test_flashinfer_installed_without_its_sampling_module_stops_a_ddtree_start(tmp_path):
    """Its metadata there (SGLang's requirement met) but not ``flashinfer/sampling.py``: the runtime rule names it."""
    path = complete_site(tmp_path)
    (tmp_path / "deps" / "flashinfer" / "sampling.py").unlink()
    res = run_check("sglang.install", install_ctx(path))
    assert res.status is Status.FAIL and "would stop at start" in res.summary
    assert "No module named 'flashinfer.sampling'" in res.summary
    assert res.remediation.commands == ["pip install 'flashinfer-python==0.7.2'"]
