"""FlashInfer's JIT toolchain, exactly: nvcc's release against the CUDA headers the build would include
(CCCL's cuda_toolkit.h: "CUDA compiler and CUDA toolkit headers are incompatible", nvcc 13.5 from the
nvidia-cuda-nvcc wheel beside the cu13.0 runtime headers), against torch's CUDA, and a malformed CUDA_HOME / PATH,
in ``sglang.install`` and ``host.env``.

The stack probe runs for real on toolkit layouts built here (``tests/cuda_toolkit.py``): the headers are copies of
the installed CUDA runtime's real ones; nvcc is NVIDIA's real one from the nvidia-cuda-nvcc wheel (a download:
those tests are marked ``network``) or, for a release no wheel here has, a script answering ``--version``."""

from __future__ import annotations

import sys
from pathlib import Path

import kernel_wheels
import pytest
from cuda_toolkit import nvcc_script, runtime_release, toolkit
from stack_support import healthy_venv, make_ctx, nvml_fact, run_check, stack_site, write_dist

from doctor.core import proc
from doctor.core.result import Findings, Severity, Status
from doctor.host.environment import CUDA_HOME_BAD, PATH_EMPTY, judge_env
from doctor.sglang.runtime import JIT_TOOLCHAIN, flashinfer_jit_problems


def site_with_flashinfer(root: Path) -> Path:
    site = root / "site"
    write_dist(site, "flashinfer-python", "0.7.2", top_level="flashinfer")
    return site


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def probed(tmp: Path, cuda_home: str | None, path: str = "") -> dict:
    """The stack probe's ``flashinfer_jit`` fact, ninja on PATH, a writable cache."""
    site = site_with_flashinfer(tmp)
    tools = executable(tmp / "tools" / "ninja").parent
    env = {"PATH": f"{tools}:{path}" if path else str(tools), "PYTHONPATH": str(site),
           "SGLANG_CACHE_DIR": str(tmp / "cache"), **({"CUDA_HOME": cuda_home} if cuda_home is not None else {})}
    data, res = proc.run_probe(sys.executable, "stack", [], timeout=60, env=env)
    assert data is not None, res.why()
    return data["flashinfer_jit"]


def judge(fi: dict, torch_cuda: str = "13.0") -> Findings:
    return flashinfer_jit_problems(fi, {}, algorithm="DDTREE", compute_capability="10.3", torch_cuda=torch_cuda)


def toolchain(found: Findings) -> list[str]:
    """The messages of the toolchain's own failures (code ``JIT_TOOLCHAIN``: what its fixer would act on)."""
    return [f.message for f in found if f.code == JIT_TOOLCHAIN and f.severity is Severity.FAIL]


def note(found: Findings) -> str:
    """Where the kernels come from, when nothing fails (the one info finding)."""
    return " ".join(f.message for f in found.of(Severity.INFO))


def pip_nvidia(tmp: Path, nvcc) -> Path:
    """A pip install of CUDA: ``site-packages/nvidia/cu13`` with bin/nvcc and the runtime's include/."""
    return toolkit(tmp / "venv" / "lib" / "python3.11" / "site-packages" / "nvidia" / "cu13", nvcc=nvcc)


# -- nvcc against the headers ------------------------------------------------------------------------------

@pytest.mark.network
def test_real_nvcc_13_5_beside_the_cu13_0_runtime_headers_fails(tmp_path: Path) -> None:
    cu13 = pip_nvidia(tmp_path, kernel_wheels.nvcc())
    fi = probed(tmp_path, None, path=str(cu13 / "bin"))  # found on PATH, as pip leaves it
    nvcc = fi["nvcc"]
    headers = runtime_release()
    assert nvcc["found_by"] == "PATH" and nvcc["release"] == "13.5"
    assert nvcc["include"] == str(cu13 / "include") and nvcc["cuda_runtime_h"] is True
    assert nvcc["cudart_version"] == int(headers.split(".")[0]) * 1000 + int(headers.split(".")[1]) * 10
    assert headers != "13.5"
    found = judge(fi)
    assert toolchain(found) and not note(found)
    mismatch = [f for f in found if f.code == JIT_TOOLCHAIN and
                f"nvcc 13.5 ({cu13}/bin/nvcc) with CUDA {headers} headers ({cu13}/include/cuda_runtime_api.h "
                "CUDART_VERSION): the build stops at \"CUDA compiler and CUDA toolkit headers are incompatible\""
                in f.message]
    assert len(mismatch) == 1 and mismatch[0].fix, found
    assert f"pip install 'nvidia-cuda-nvcc=={headers}.*'" in mismatch[0].fix.commands
    # the precompiled modules avoid it all: offered first
    assert mismatch[0].fix.commands[0].startswith("pip install 'flashinfer-jit-cache==0.7.2'")


@pytest.mark.network
def test_sglang_install_names_the_toolchain_code(tmp_path: Path) -> None:
    site = stack_site(tmp_path / "site")
    write_dist(site, "flashinfer-python", "0.7.2", top_level="flashinfer")
    write_dist(site, "numpy", "2.3.0")
    (site / "flashinfer" / "sampling.py").write_text("raise ImportError('the default tier must not import this')\n")
    for d in ("data/csrc", "data/include", "data/cutlass/include", "data/cccl/cub"):
        (site / "flashinfer" / d).mkdir(parents=True)
    cu13 = pip_nvidia(tmp_path, kernel_wheels.nvcc())
    tools = executable(tmp_path / "tools" / "ninja").parent
    env = {"PYTHONPATH": str(site), "PATH": f"{tools}:{cu13 / 'bin'}", "SGLANG_CACHE_DIR": str(tmp_path / "cache")}
    res = run_check("sglang.install", make_ctx(healthy_venv(), env=env, facts={"nvml": nvml_fact([(10, 3)])}))
    assert res.status is Status.FAIL and res.has(JIT_TOOLCHAIN), res.summary
    assert "CUDA compiler and CUDA toolkit headers are incompatible" in res.summary


def test_nvcc_of_the_headers_release_compiles(tmp_path: Path) -> None:
    rel = runtime_release()
    home = toolkit(tmp_path / "cuda", nvcc=nvcc_script(rel))
    found = judge(probed(tmp_path, str(home)), torch_cuda=rel)
    assert not found.failing
    assert f"({rel}, CUDA {rel} headers)" in note(found)


def test_a_toolkit_without_cuda_runtime_h(tmp_path: Path) -> None:
    home = toolkit(tmp_path / "cuda", nvcc=nvcc_script(runtime_release()), headers=("cuda.h", "cuda_runtime_api.h"))
    fi = probed(tmp_path, str(home))
    assert fi["nvcc"]["cuda_runtime_h"] is False
    found = judge(fi, torch_cuda=runtime_release())
    assert any(f"has bin/nvcc but no {home}/include/cuda_runtime.h" in f for f in toolchain(found)), found


def test_a_wrapper_nvcc_without_headers_beside_it_is_not_judged_on_them(tmp_path: Path) -> None:
    """``/usr/local/bin/nvcc`` as a script that execs the real one: FlashInfer takes ``/usr/local`` as the home,
    whose include/ has no CUDA headers, but the nvcc it runs adds its own; with no nvcc.profile beside the
    script, what that is is not known here: no failure, and the headers are not read."""
    wrapper = toolkit(tmp_path / "local", nvcc=nvcc_script(runtime_release()), headers=(), profile=False)
    fi = probed(tmp_path, None, path=str(wrapper / "bin"))
    assert fi["nvcc"]["found_by"] == "PATH" and fi["nvcc"]["cuda_runtime_h"] is None
    found = judge(fi, torch_cuda=runtime_release())
    assert not found.failing and note(found)


def test_nvccs_own_include_directory_comes_first(tmp_path: Path) -> None:
    """A CUDA_HOME whose include/ lacks the headers while the real nvcc's profile points at its own."""
    real = toolkit(tmp_path / "real", nvcc=nvcc_script(runtime_release()))
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "bin" / "nvcc").symlink_to(real / "bin" / "nvcc")
    fi = probed(tmp_path, str(home))
    assert fi["nvcc"]["includes"] == [str(real / "include"), str(home / "include")]
    assert fi["nvcc"]["include"] == str(real / "include") and fi["nvcc"]["cuda_runtime_h"] is True
    assert not judge(fi, torch_cuda=runtime_release()).failing


def test_a_toolkit_of_another_cuda_major_than_torchs(tmp_path: Path) -> None:
    rel = runtime_release()
    home = toolkit(tmp_path / "cuda", nvcc=nvcc_script(rel))
    found = judge(probed(tmp_path, str(home)), torch_cuda="12.8")
    major = [f for f in found if f.code == JIT_TOOLCHAIN
             and f"the toolkit is CUDA {rel}, torch is built for CUDA 12.8" in f.message]
    assert len(major) == 1 and major[0].fix, found
    assert "# install the CUDA 12 toolkit (torch's) and point CUDA_HOME at it" in major[0].fix.commands


def test_cuda_home_holding_a_search_path(tmp_path: Path) -> None:
    home = toolkit(tmp_path / "cuda", nvcc=nvcc_script(runtime_release()))
    fi = probed(tmp_path, f"{home}:/usr/local/cuda")
    found = judge(fi)
    assert any("is " + repr(f"{home}:/usr/local/cuda") + ", a search path" in f for f in toolchain(found)), found


def test_a_recorded_nvcc_without_the_header_keys_is_judged_as_before() -> None:
    fi = {"version": "0.7.2", "cache_dir": "/c", "compiled": [], "ninja": "/usr/bin/ninja", "writable": True,
          "nvcc": {"exists": True, "nvcc": "/usr/local/cuda/bin/nvcc", "found_by": "PATH", "release": "13.0"}}
    found = judge(fi)
    assert not found.failing and "(13.0)" in note(found)


# -- host.env: PATH and CUDA_HOME ---------------------------------------------------------------------------

def env_result(tmp: Path, **env: str):
    ctx = make_ctx(healthy_venv(), env=env)
    return run_check("host.env", ctx)


@pytest.mark.parametrize("path, where", [(":{venv}:/bin", "a leading ':'"), ("{venv}:/bin:", "a trailing ':'"),
                                         ("{venv}::/bin", "a '::'")])
def test_path_with_an_empty_entry_warns(tmp_path: Path, path: str, where: str) -> None:
    """The interpreter's directory is on PATH already, so the launcher passes PATH on as it is (it rebuilds a PATH
    without empty entries only where it puts that directory first): the server sees the empty entry."""
    res = env_result(tmp_path, PATH=path.format(venv=Path(healthy_venv()).parent))
    assert res.status is Status.WARN and res.has(PATH_EMPTY), res.summary
    assert f"PATH has 1 empty entry ({where})" in res.summary


def test_cuda_home_without_nvcc_or_headers_warns(tmp_path: Path) -> None:
    bare = tmp_path / "cuda-bare"
    (bare / "bin").mkdir(parents=True)
    res = env_result(tmp_path, CUDA_HOME=str(bare))
    assert res.status is Status.WARN and res.has(CUDA_HOME_BAD), res.summary
    assert f"CUDA_HOME={bare} lacks bin/nvcc and include/cuda_runtime.h" in res.summary
    res = env_result(tmp_path, CUDA_HOME=str(tmp_path / "nowhere"))
    assert "lacks the directory itself" in res.summary
    res = env_result(tmp_path, CUDA_HOME="")
    assert res.has(CUDA_HOME_BAD) and "CUDA_HOME is set but empty" in res.summary
    res = env_result(tmp_path, CUDA_PATH=f"{bare}:/opt/cuda")
    assert res.has(CUDA_HOME_BAD) and "is a search path" in res.summary


def test_a_whole_toolkit_and_a_clean_path_pass(tmp_path: Path) -> None:
    home = toolkit(tmp_path / "cuda", nvcc=nvcc_script(runtime_release()))
    res = env_result(tmp_path, CUDA_HOME=str(home), PATH="/usr/bin:/bin")
    assert res.status is Status.PASS, res.summary


def test_malformed_entries_beside_a_breaking_variable_keep_the_failure() -> None:
    found = judge_env({"vars": {"PATH": ":/usr/bin", "NCCL_P2P_DISABLE": "1"}}, 8)
    assert found.failing and [f.code for f in found] == ["host.env.breaking", PATH_EMPTY]


# -- diagnose: the error text of a failed start ----------------------------------------------------------

def test_diagnose_names_the_toolchain_for_cccls_error() -> None:
    """The line a failed JIT build prints: the #error directive of CCCL's cuda_toolkit.h, as nvcc reports it."""
    from doctor.service.diagnose import diagnose_lines, load_signatures

    line = ('/site/flashinfer/data/cccl/libcudacxx/include/cuda/std/__cccl/cuda_toolkit.h:39:6: error: #error '
            '"CUDA compiler and CUDA toolkit headers are incompatible, please check your include paths"')
    found = diagnose_lines(["RuntimeError: Ninja build failed.", line], load_signatures())
    assert found[0].signature.id == "cuda-headers-incompatible" and found[0].signature.check == "sglang.install"


@pytest.mark.parametrize("check_id, words", [
    ("sglang.install", ["CUDART_VERSION", "CUDA compiler and CUDA toolkit headers are incompatible",
                        "sglang.install.jit_toolchain"]),
    ("host.env", ["PATH with empty entries", "include/cuda_runtime.h"]),
])
def test_explain_says_what_the_toolchain_judgement_reads(check_id: str, words: list[str]) -> None:
    from conftest import run_doctor

    out = run_doctor("explain", check_id)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and all(w in text for w in words), out.stdout
