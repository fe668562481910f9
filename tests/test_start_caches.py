"""The start plan reads the caches the server will use as facts: FlashInfer's compiled modules, the Triton cache and
SGLang's own JIT modules, on directory layouts as the real packages write them, so that a warm start is predicted
warm and a cold one cold; and ``launch``'s prewarm compiles the modules at once, one process each."""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from doctor.host.jitcache import server_triton_dir, sglang_jit_compiled, sglang_jit_dir, sglang_module_name
from doctor.service import prewarm, startplan
from doctor.service.launcher import LaunchPlan
from doctor.service.startwatch import server_caches

ARGS = ["--speculative-algorithm", "DDTREE", "--max-running-requests", "48"]
TRAINED = Path(__file__).resolve().parents[1] / "bench" / "ddtree" / "profiles" / "h200-trained-ddtree.toml"  # DDTREE
PAYLOAD_WHEEL = Path.home() / ".cache/k26-doctor-payload/flashinfer/flashinfer_python-0.7.2-py3-none-any.whl"


def flashinfer_module(base: Path, module: str, version: str = "0.7.2", archs: str = "90a") -> Path:
    """A module as FlashInfer 0.7.2 leaves it built (flashinfer/jit/env.py: FLASHINFER_CACHE_DIR =
    <FLASHINFER_WORKSPACE_BASE>/.cache/flashinfer, the workspace <version>/<archs: sorted major-minor joined by
    "_">, FLASHINFER_JIT_DIR its cached_ops; flashinfer/jit/core.py: build_dir <JIT_DIR>/<name>, the library
    <name>.so beside build.ninja and the objects, the lock <JIT_DIR>/tmp/<name>.lock)."""
    ops = base / ".cache" / "flashinfer" / version / archs / "cached_ops"
    (ops / "tmp").mkdir(parents=True, exist_ok=True)
    (ops / "tmp" / f"{module}.lock").write_bytes(b"")
    (ops / module).mkdir(parents=True, exist_ok=True)
    (ops / module / "build.ninja").write_text("ninja_required_version = 1.3\n")
    (ops / module / f"{module}.cuda.o").write_bytes(b"\x7fELF")
    so = ops / module / f"{module}.so"
    so.write_bytes(b"\x7fELF")
    return so


def sglang_module(root: Path, *args: object, target: str = "sm90a") -> Path:
    """A module as SGLang 0.5.23 publishes it from ``load_jit(*args)`` (sglang/kernels/jit/utils/compile/cache.py:
    <SGLANG_JIT_CACHE_DIR>/<target>/<module_name>/build-<build_key>/deps-<deps_key>/<module_name>.so beside
    sgl_deps.json, spec.py: module_name = "sgl_kernel_jit_" + "_".join(args); the keys are 16 hex digits) and a
    build of it in progress (``.staging-<uuid>``), as the server's cache holds them after a start."""
    module_name = "sgl_kernel_jit_" + "_".join(str(a) for a in args)
    scope = root / target / module_name / "build-3f2a9c0d11e4b5a6"
    leaf = scope / "deps-77b1e0aa90c3d2f1"
    leaf.mkdir(parents=True, exist_ok=True)
    (scope / ".staging-0b7e").mkdir(exist_ok=True)
    (leaf / "sgl_deps.json").write_text('[["kernels","csrc/speculative/tree.cuh","ab12"]]')
    so = leaf / f"{module_name}.so"
    so.write_bytes(b"\x7fELF")
    return so


TREE, SAMPLING = ("speculative_tree",), ("speculative_sampling", 4, True)  # the server's load_jit arguments


def env_for(tmp: Path) -> dict[str, str]:
    return {"HOME": str(tmp / "home"), "FLASHINFER_WORKSPACE_BASE": str(tmp / "fi"),
            "TRITON_CACHE_DIR": str(tmp / "triton"), "SGLANG_JIT_CACHE_DIR": str(tmp / "sgl-jit")}


def plan_on(caches: dict, *, building: dict | None = None) -> dict[str, startplan.Part]:
    facts = {"nvml": {"devices": [{"name": "NVIDIA H200", "compute_capability": [9, 0]}]},
             "stack": {"distributions": {"flashinfer-python": {"version": "0.7.2"}}}}
    inputs = startplan.start_inputs(facts.get, ARGS, tp=1, caches=caches)
    if building:
        inputs["flashinfer"]["building"] = building
    return {p.name: p for p in startplan.predict(inputs, startplan.constants()).parts}


def test_a_warm_cache_set_is_predicted_warm_and_an_empty_one_cold(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    cold = startplan.cache_state(env, env["HOME"])  # none of the directories exists yet: what a fresh host has
    assert cold["flashinfer"]["compiled"] == [] and cold["triton_cache"]["entries"] == 0
    assert cold["sglang_jit"]["compiled"] == []
    parts = plan_on(cold)
    assert parts["jit"].seconds == pytest.approx(107.0 + 40.1) and "not compiled" in parts["jit"].basis
    assert "Triton cache empty" in parts["cuda_graphs"].basis and parts["cuda_graphs"].avoidable_s > 20
    assert parts["kernels"].seconds == 31.0
    assert "speculative_tree, speculative_sampling JIT modules not built" in parts["kernels"].basis

    for m in ("norm", "sampling"):
        flashinfer_module(tmp_path / "fi", m)
    sglang_module(tmp_path / "sgl-jit", *TREE)
    sglang_module(tmp_path / "sgl-jit", *SAMPLING)
    for i in range(40):  # Triton: one directory per kernel (its hash)
        (tmp_path / "triton" / f"{i:02x}ab").mkdir(parents=True)
    warm = startplan.cache_state(env, env["HOME"])
    assert sorted(warm["flashinfer"]["compiled"]) == ["0.7.2/90a/norm", "0.7.2/90a/sampling"]
    assert warm["triton_cache"] == {"path": str(tmp_path / "triton"), "from": "TRITON_CACHE_DIR", "entries": 40}
    assert warm["sglang_jit"]["compiled"] == ["sm90a/sgl_kernel_jit_speculative_sampling_4_True",
                                              "sm90a/sgl_kernel_jit_speculative_tree"]
    parts = plan_on(warm)
    assert parts["jit"].seconds == 0 and parts["kernels"].seconds == 0.2 and parts["cuda_graphs"].avoidable_s == 0
    assert "40 entries" in parts["cuda_graphs"].basis


def test_a_module_of_another_architecture_or_half_built_does_not_count(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    flashinfer_module(tmp_path / "fi", "sampling", archs="100a")  # a B200's build in the same cache
    half = flashinfer_module(tmp_path / "fi", "norm")
    half.unlink()  # interrupted: objects and build.ninja, no library
    leaf = sglang_module(tmp_path / "sgl-jit", *TREE)
    leaf.unlink()
    (leaf.parents[1] / ".staging-1f").mkdir()  # a build in progress
    state = startplan.cache_state(env, env["HOME"])
    assert state["flashinfer"]["compiled"] == ["0.7.2/100a/sampling"] and state["sglang_jit"]["compiled"] == []
    parts = plan_on(state)
    assert parts["jit"].seconds == pytest.approx(107.0 + 40.1)  # both compile on the H200
    assert parts["kernels"].seconds == 31.0


def test_the_caches_are_those_of_the_servers_environment(tmp_path: Path) -> None:
    """Without the variables: FlashInfer under SGLang's cache (SGLang points it there), Triton under
    <SGLANG_CACHE_DIR>/triton (``import sglang`` sets that default), SGLang's JIT kernels in ~/.cache/sglang/jit."""
    home = str(tmp_path / "h")
    assert server_triton_dir({}, home) == (os.path.join(home, ".cache", "sglang", "triton"),
                                           "SGLang's default <SGLANG_CACHE_DIR>/triton")
    assert server_triton_dir({"SGLANG_CACHE_DIR": "/srv/c"}, home)[0] == "/srv/c/triton"
    assert sglang_jit_dir({"SGLANG_CACHE_DIR": "/srv/c"}, home) == os.path.join(home, ".cache", "sglang", "jit")
    assert sglang_jit_dir({"SGLANG_JIT_CACHE_DIR": "~/j"}, home) == os.path.join(home, "j")
    flashinfer_module(Path(home) / ".cache" / "sglang", "norm")
    sglang_module(Path(home) / ".cache" / "sglang" / "jit", *TREE)
    plan = LaunchPlan(["python3", "-m", "sglang.launch_server"], {"HOME": home}, [], [])
    state = server_caches(plan)
    assert state["flashinfer"]["compiled"] == ["0.7.2/90a/norm"]
    assert state["sglang_jit"]["compiled"] == ["sm90a/sgl_kernel_jit_speculative_tree"]
    assert sglang_jit_compiled(str(tmp_path / "absent")) == []


def test_the_layout_is_the_one_flashinfer_0_7_2_writes() -> None:
    """The paths the tests above build, read in FlashInfer 0.7.2's own JIT code (the wheel the GPU payload ships,
    when this host has it): the cache root, the workspace, cached_ops, the library's name and the build lock."""
    if not PAYLOAD_WHEEL.exists():
        pytest.skip(f"FlashInfer 0.7.2's wheel is not on this host ({PAYLOAD_WHEEL}): bench/ddtree/payload.py "
                    "downloads it")
    with zipfile.ZipFile(PAYLOAD_WHEEL) as z:
        env = z.read("flashinfer/jit/env.py").decode()
        core = z.read("flashinfer/jit/core.py").decode()
    assert 'FLASHINFER_CACHE_DIR: pathlib.Path = FLASHINFER_BASE_DIR / ".cache" / "flashinfer"' in env
    assert 'os.getenv("FLASHINFER_WORKSPACE_BASE"' in env
    assert "return FLASHINFER_CACHE_DIR / flashinfer_version / arch" in env
    assert 'FLASHINFER_JIT_DIR: pathlib.Path = FLASHINFER_WORKSPACE_DIR / "cached_ops"' in env
    assert 'return jit_env.FLASHINFER_JIT_DIR / self.name / f"{self.name}.so"' in core
    # the lock a server waits on while the prewarm builds the module, and its second look once it has it
    assert 'return get_tmpdir() / f"{self.name}.lock"' in core
    body = core[core.index("    def build_and_load(self) -> Any:"):]
    body = body[:body.index("\nclass ")]
    assert body.index("with FileLock(self.lock_path") < body.index("# Another process may have built")
    assert body.index("cached = self.try_load()", body.index("with FileLock")) < body.index("self.build()")


def test_a_prewarm_beside_the_server_is_waited_for_where_the_server_calls_each_module(tmp_path: Path) -> None:
    """Built at once, one process each: the server waits only for what is not done when it calls a module (norm at
    its first forward, sampling at the rehearsal after its captures); a module already built costs nothing."""
    env = env_for(tmp_path)
    for i in range(40):  # a kept Triton cache and tree kernels: short captures, so sampling is waited for
        (tmp_path / "triton" / f"{i:02x}ab").mkdir(parents=True)
    for m in (TREE, SAMPLING, ("activation", "bf16_t", "true")):  # and one of the model's own kernels: kept
        sglang_module(tmp_path / "sgl-jit", *m)
    cold = startplan.cache_state(env, env["HOME"])
    parts = plan_on(cold, building={"modules": ["norm", "sampling"], "elapsed_s": 5.0})
    first_forward = sum(parts[n].seconds for n in ("interpreter", "startup", "weights", "drafter", "kv_cache")
                        if n in parts)
    assert parts["model_kernels"].seconds == 0 and "holds 1 of the model's kernels" in parts["model_kernels"].basis
    rehearsal = first_forward + parts["cuda_graphs"].seconds + parts["kernels"].seconds
    assert parts["jit"].seconds == pytest.approx(107.0 - 5.0 - rehearsal, abs=0.1) and parts["jit"].seconds > 0
    assert "sampling: 107 s to build" in parts["jit"].basis
    flashinfer_module(tmp_path / "fi", "sampling")
    only_norm = plan_on(startplan.cache_state(env, env["HOME"]), building={"modules": ["norm"], "elapsed_s": 0.0})
    assert only_norm["jit"].seconds == pytest.approx(max(0.0, 40.1 - first_forward), abs=0.1)


# -- the prewarm: one process per module, all at once ------------------------------------------------------------

# Each module's build writes its process id and MAX_JOBS, then waits (bounded) until every module has started: the
# build of one can only finish while the others run, so a prewarm that built them one after the other would fail.
TOGETHER = """
import json, os, time
class Spec:
    def __init__(self, name):
        self.name = name
    def build_and_load(self):
        folder = os.environ["K26_TEST_DIR"]
        with open(os.path.join(folder, self.name + ".json"), "w") as fh:
            json.dump({"pid": os.getpid(), "jobs": os.environ.get("MAX_JOBS")}, fh)
        end = time.monotonic() + 30
        while len([n for n in os.listdir(folder) if n.endswith(".json")]) < 2:
            if time.monotonic() > end:
                raise RuntimeError("built alone: the other module never started")
            time.sleep(0.05)
def gen_{name}_module():
    return Spec("{name}")
"""


def test_the_prewarm_builds_each_module_in_a_process_of_its_own_at_once(tmp_path: Path) -> None:
    site = tmp_path / "site"
    for rel, text in {"__init__.py": "", "jit/__init__.py": "", "jit/norm.py": TOGETHER.replace("{name}", "norm"),
                      "jit/sampling.py": TOGETHER.replace("{name}", "sampling")}.items():
        (site / "flashinfer" / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / "flashinfer" / rel).write_text(text)
    seen = tmp_path / "seen"
    seen.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "MAX_JOBS"}
    env.update(PYTHONPATH=str(site), K26_TEST_DIR=str(seen))
    plan = prewarm.plan_prewarm(sys.executable, env, ["sampling", "norm"], str(tmp_path / "c"), "9.0")
    assert plan is not None
    out = prewarm.Prewarm(plan).start().finish(60)
    assert out.ok, out.reason
    assert [m["module"] for m in out.modules] == ["sampling", "norm"] and all(m["ok"] for m in out.modules)
    runs = {n: json.loads((seen / f"{n}.json").read_text()) for n in ("norm", "sampling")}
    assert runs["norm"]["pid"] != runs["sampling"]["pid"]
    cores = len(os.sched_getaffinity(0))
    assert runs["norm"]["jobs"] == runs["sampling"]["jobs"] == str(max(1, cores // 2))


# -- SGLang's DDTree tree kernels: prewarmed too --------------------------------------------------------------------

SGLANG_WHEEL = Path.home() / ".cache/k26-doctor-tests/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
# A stand-in of the three SGLang 0.5.23 names the probe calls (their real signatures: the test below reads them in
# the wheel), which records the architecture each build was made for.
FAKE_SGLANG = {
    "__init__.py": "", "kernels/__init__.py": "", "kernels/jit/__init__.py": "", "kernels/jit/utils/__init__.py": "",
    "kernels/jit/utils/arch.py": (
        "import contextlib\nARCH = [None]\n@contextlib.contextmanager\n"
        "def override_jit_cuda_arch(major, minor, suffix=None):\n    ARCH[0] = (major, minor)\n    yield\n"
        "    ARCH[0] = None\n"),
    "kernels/ops/__init__.py": "", "kernels/ops/speculative/__init__.py": "",
    "kernels/ops/speculative/tree.py": (
        "import json, os, time\nfrom sglang.kernels.jit.utils.arch import ARCH\n"
        "def _jit_tree_module():\n    time.sleep(float(os.environ.get('K26_TEST_BUILD_S', '0')))\n"
        "    json.dump({'arch': ARCH[0], 'pid': os.getpid()}, "
        "open(os.path.join(os.environ['K26_TEST_DIR'], 'tree.json'), 'w'))\n"),
    "kernels/ops/speculative/sampling.py": (
        "import json, os, time\nfrom sglang.kernels.jit.utils.arch import ARCH\n"
        "def _jit_sampling_module(vec_size, deterministic):\n"
        "    time.sleep(float(os.environ.get('K26_TEST_BUILD_S', '0')))\n"
        "    json.dump({'arch': ARCH[0], 'vec': vec_size, "
        "'det': deterministic, 'pid': os.getpid()}, open(os.path.join(os.environ['K26_TEST_DIR'], 'sampling.json'), "
        "'w'))\n"),
}


def test_sglangs_tree_kernels_are_prewarmed_for_the_named_architecture(tmp_path: Path) -> None:
    """Without FlashInfer in the service's environment, SGLang's modules are still built, each in its own process,
    for the architecture ``launch`` names (no device is visible to the prewarm)."""
    site = tmp_path / "site"
    for rel, text in FAKE_SGLANG.items():
        (site / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / "sglang" / rel).write_text(text)
    seen = tmp_path / "seen"
    seen.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), K26_TEST_DIR=str(seen))
    plan = prewarm.plan_prewarm(sys.executable, env, ["sglang.speculative_tree", "sglang.speculative_sampling.4"],
                                str(tmp_path / "c"), "9.0")
    assert plan is not None
    out = prewarm.Prewarm(plan).start().finish(60)
    assert out.ok and out.absent, out.reason  # SGLang's modules built; FlashInfer's absent (none to plan)
    tree, sampling = (json.loads((seen / f"{n}.json").read_text()) for n in ("tree", "sampling"))
    assert tree["arch"] == sampling["arch"] == [9, 0] and tree["pid"] != sampling["pid"]
    assert sampling["vec"] == 4 and sampling["det"] is True


def test_the_prewarms_modules_build_at_once_and_its_time_is_its_own(tmp_path: Path) -> None:
    """The H200 cold run said "built ... in 175 s" where its longest module took 110 s: the doctor read the outcome
    after the server's /health 200 and took the time until then for the prewarm's. The probe now reports its own
    time and each build's span from its start: two builds of 3 s each overlap (one process each, at once), and an
    outcome read later still says the prewarm's time."""
    import time

    site = tmp_path / "site"
    for rel, text in FAKE_SGLANG.items():
        (site / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / "sglang" / rel).write_text(text)
    (tmp_path / "seen").mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), K26_TEST_DIR=str(tmp_path / "seen"), K26_TEST_BUILD_S="3")
    plan = prewarm.plan_prewarm(sys.executable, env, ["sglang.speculative_tree", "sglang.speculative_sampling.4"],
                                str(tmp_path / "c"), "9.0")
    assert plan is not None
    run = prewarm.Prewarm(plan).start()
    assert run.child is not None
    run.child.wait(120)
    time.sleep(2.0)  # read after it ended, as launch reads a prewarm left beside the server
    out = run.outcome_if_done()
    assert out is not None and out.ok, out
    waited = time.monotonic() - run.started
    tree, sampling = ({m["module"]: m for m in out.modules}[n] for n in ("sglang.speculative_tree",
                                                                           "sglang.speculative_sampling.4"))
    assert tree["began_s"] < sampling["ended_s"] and sampling["began_s"] < tree["ended_s"], out.modules
    assert max(tree["ended_s"], sampling["ended_s"]) <= out.seconds < waited - 1.5, (out.seconds, waited)


def test_the_names_the_prewarm_calls_are_sglang_0_5_23s() -> None:
    if not SGLANG_WHEEL.exists():
        pytest.skip(f"SGLang 0.5.23's wheel is not on this host ({SGLANG_WHEEL}): the wheel tests download it")
    with zipfile.ZipFile(SGLANG_WHEEL) as z:
        arch = z.read("sglang/kernels/jit/utils/arch.py").decode()
        tree = z.read("sglang/kernels/ops/speculative/tree.py").decode()
        sampling = z.read("sglang/kernels/ops/speculative/sampling.py").decode()
        cache = z.read("sglang/kernels/jit/utils/compile/cache.py").decode()
    assert "def override_jit_cuda_arch(major: int, minor: int, suffix: str | None = None):" in arch
    assert "def _jit_tree_module() -> Module:" in tree and '"speculative_tree",' in tree
    assert "def _jit_sampling_module(vec_size: int, deterministic: bool) -> Module:" in sampling
    assert '"speculative_sampling",' in sampling and "vec_size = math.gcd(4, target_probs.shape[-1])" in sampling
    # the layout sglang_module() builds, and its root
    assert "$SGLANG_JIT_CACHE_DIR/<target>/<module_name>/build-<build_key>/" in cache
    assert 'configured = envs.SGLANG_JIT_CACHE_DIR.get() or "~/.cache/sglang/jit"' in cache
    assert "cache_root() / _target_tag() / module_name / f\"{_BUILD_KEY_PREFIX}{build_key}\"" in cache
    assert 'return f"{prefix}{arch.major}{arch.minor}{arch.suffix}"' in cache  # "sm90a" on the H200
    with zipfile.ZipFile(SGLANG_WHEEL) as z:
        spec = z.read("sglang/kernels/jit/utils/compile/spec.py").decode()
    # the module's directory and library name: the prefix and the arguments joined, as sglang_module_name spells it
    assert '_MODULE_NAME_PREFIX = "sgl_kernel_jit_"' in spec
    assert 'return _MODULE_NAME_PREFIX + "_".join(self.module_args)' in spec
    assert "_jit_sampling_module(vec_size, deterministic)" in sampling
    assert sglang_module_name(*TREE) == "sgl_kernel_jit_speculative_tree"
    assert sglang_module_name(*SAMPLING) == "sgl_kernel_jit_speculative_sampling_4_True"


def test_the_warm_runs_caches_are_planned_warm_and_not_prewarmed_again(tmp_path: Path) -> None:
    """The H200 run of ddtree-h200-start-coldwarm: the cold run's prewarm had built both tree-kernel modules into
    the SGLang JIT cache the warm run used, yet the warm run's plan said "not built" (31 s) and its prewarm built them
    again, because the cache was read by the bare first argument of load_jit ("speculative_tree") where SGLang names
    the directory sgl_kernel_jit_speculative_tree. On that layout: warm, nothing to prewarm; the sampling kernel of
    another vocabulary's instance (vec 2) does not stand for the target's (vec 4)."""
    from doctor.service.startwatch import sglang_prewarm_names

    env = env_for(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 64}))  # the trained pair's: gcd(4, 64) = 4
    args = [*ARGS, "--model-path", str(model)]
    sglang_module(tmp_path / "sgl-jit", *TREE)
    sglang_module(tmp_path / "sgl-jit", "speculative_sampling", 2, True)
    table = startplan.constants()

    def missing() -> list[str] | None:
        state = startplan.cache_state(env, env["HOME"])
        inputs = {"algorithm": "DDTREE", "compute_capability": "9.0", "sglang_jit": state["sglang_jit"],
                  "vocab_size": startplan.target_vocab(args)}
        return startplan.missing_sglang_modules(inputs, table)

    assert missing() == ["speculative_sampling"]
    assert sglang_prewarm_names(missing() or [], args) == ["sglang.speculative_sampling.4"]
    sglang_module(tmp_path / "sgl-jit", *SAMPLING)
    assert missing() == [] and sglang_prewarm_names([], args) == []
    facts = {"nvml": {"devices": [{"name": "NVIDIA H200", "compute_capability": [9, 0]}]},
             "stack": {"distributions": {"flashinfer-python": {"version": "0.7.2"}}}}
    inputs = startplan.start_inputs(facts.get, args, tp=1, caches=startplan.cache_state(env, env["HOME"]))
    kernels = {p.name: p for p in startplan.predict(inputs, table).parts}["kernels"]
    assert kernels.seconds == 0.2 and "JIT modules built in" in kernels.basis, kernels


def test_the_sampling_kernels_instance_follows_the_targets_vocabulary(tmp_path: Path) -> None:
    from doctor.service.startwatch import sglang_prewarm_names

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 163842}))
    args = ["--model-path", str(model)]
    assert sglang_prewarm_names(["speculative_tree", "speculative_sampling"], args) == [
        "sglang.speculative_tree", "sglang.speculative_sampling.2"]
    (model / "config.json").write_text("{not json")
    assert sglang_prewarm_names(["speculative_sampling"], args) == []  # not known: left to the server
    assert sglang_prewarm_names(["speculative_tree"], ["--model-path", str(tmp_path / "absent")]) == [
        "sglang.speculative_tree"]


def test_tree_kernels_being_prewarmed_leave_what_is_not_done_at_the_first_forward(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    state = startplan.cache_state(env, env["HOME"])
    state["sglang_jit"]["building"] = {"modules": ["sglang.speculative_tree", "sglang.speculative_sampling.4"],
                                       "elapsed_s": 25.0}
    parts = plan_on(state)
    assert parts["kernels"].seconds == 0.2 and "being compiled by the prewarm" in parts["kernels"].basis
    state["sglang_jit"]["building"] = {"modules": ["sglang.speculative_tree"], "elapsed_s": 25.0}
    assert plan_on(state)["kernels"].seconds == 31.0  # the sampling module is not among them: compiled at start


def test_check_v_plans_on_the_caches_of_the_servers_environment(tmp_path: Path) -> None:
    """`check -v`'s start plan reads the caches where the server will look (the doctor's environment here, as
    launch passes it on): the same host with its FlashInfer modules built is planned without their compile."""
    from conftest import doctor_env, run_doctor

    def notice(env: dict[str, str]) -> str:
        res = run_doctor("check", "--profile", str(TRAINED), "--only", "host.port", "--format", "json", "-v",
                         env=doctor_env(**env), timeout=300)
        notices = {n["id"]: n for n in json.loads(res.stdout)["doctor"]["notices"]}
        return json.dumps(notices["doctor.start_plan"])

    env = {**env_for(tmp_path), "FLASHINFER_CUDA_ARCH_LIST": "9.0"}
    cold = notice(env)
    for m in ("norm", "sampling"):
        flashinfer_module(tmp_path / "fi", m)
    warm = notice(env)
    assert "jit 147" in cold and "jit 0" in warm, (cold, warm)
    assert sorted(os.listdir(tmp_path)) == ["fi"]  # nothing made: the other caches stay absent


# -- the newest recorded starts (ddtree-h200-site-validate), predicted again ---------------------------------------

SITE = Path(__file__).resolve().parents[1] / "bench" / "results" / "ddtree-h200-site-validate"
COLDWARM = {r["run"]: r for r in json.loads((SITE.parent / "ddtree-h200-start-coldwarm" / "start-plan.json")
                                            .read_text())["runs"]}


def test_the_recorded_warm_and_cold_prewarmed_starts_are_predicted_within_20_percent() -> None:
    """call2: the product's launch --wait on warm caches (its recorded inputs); call4: the bench's launch on fresh
    FlashInfer and Triton directories with the prewarm 32.4 s into its compile at the exec and SGLang's JIT cache
    kept (its tree kernels took 0.18 s), predicted 277 s then against 118.1 s read (the Triton figures are now measured
    on it: the model reproduces its own data). Both within the issue's 20%."""
    record = json.loads((SITE / "call2-launch-start-record.json").read_text())
    inputs = record["inputs"]
    # SGLang's JIT cache kept on that host: its listing as an H200 server of the same pair leaves it (the warm run
    # of ddtree-h200-start-coldwarm: the tree kernels and the model's own)
    inputs["sglang_jit"] = dict(COLDWARM["warm"]["inputs"]["sglang_jit"], path="/kept")
    warm = startplan.predict(inputs, startplan.constants())
    assert abs(warm.total_s - record["ready_after_s"]) <= 0.2 * record["ready_after_s"], warm.to_dict()

    run = json.loads((SITE / "call4-start-plan.json").read_text())["runs"][0]
    cold = json.loads(json.dumps(inputs))
    cold["import_s"] = 18.31  # as that run's plan read it
    cold["flashinfer"].update(compiled=[], building={"modules": ["norm", "sampling"], "elapsed_s": 32.4})
    cold["triton_cache"] = {"path": "/fresh", "entries": 0}
    got = startplan.predict(cold, startplan.constants())
    assert abs(got.total_s - run["server_ready_after_s"]) <= 0.2 * run["server_ready_after_s"], got.to_dict()
    assert got.total_s > warm.total_s + 30  # the Triton compiles and what is left of sampling's


def test_the_h200_runs_recorded_cache_listing_is_read_warm_and_the_replan_says_what_was_fitted_on_it() -> None:
    """bench/replan_start.py on ddtree-h200-start-coldwarm: the warm run's recorded listing of SGLang's JIT cache
    (as the H200 server and prewarm left it) holds every DDTree module and the model's own, so its tree kernels and
    model kernels cost nothing now; the cold run, on an empty cache, counts the model's kernels. The script names the
    constants measured on these very runs, so a prediction of them is not taken for a check."""
    import subprocess

    res = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "replan_start.py"),
                          str(SITE.parent / "ddtree-h200-start-coldwarm")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert "h200.model_kernels_cold_s" in lines[0]["constants_measured_on_these_runs"]
    runs = {d["run"]: d for d in lines[1:]}
    warm, cold = runs["warm"]["parts_now"], runs["cold-prewarm"]["parts_now"]
    assert warm["kernels"] == 0.2 and warm["model_kernels"] == 0.0, warm
    assert cold["model_kernels"] > 0 and cold["kernels"] == 0.2, cold
    inputs = dict(COLDWARM["warm"]["inputs"], algorithm="DDTREE", compute_capability="9.0")
    assert startplan.missing_sglang_modules(inputs, startplan.constants()) == []


def test_the_server_waits_for_a_tree_kernel_still_compiling_after_its_verify_capture(tmp_path: Path) -> None:
    """The critical path: the server calls the tree kernels after the target's verify capture; a module the prewarm
    is still building then is waited for, until the prewarm's expected end (its compile time from the prewarm's
    start, less the seconds the prewarm ran before the exec); a module done before costs nothing."""
    import copy

    env = env_for(tmp_path)
    state = startplan.cache_state(env, env["HOME"])
    state["sglang_jit"]["building"] = {"modules": ["sglang.speculative_tree", "sglang.speculative_sampling.4"],
                                       "elapsed_s": 20.0}
    facts = {"nvml": {"devices": [{"name": "NVIDIA H200", "compute_capability": [9, 0]}]},
             "stack": {"distributions": {"flashinfer-python": {"version": "0.7.2"}}}}
    inputs = startplan.start_inputs(facts.get, ARGS, tp=1, caches=state)
    table = copy.deepcopy(startplan.constants())
    table["kinds"]["h200"]["jit"]["speculative_sampling"]["value"] = 400.0  # a slow toolchain
    parts = {p.name: p for p in startplan.predict(inputs, table).parts}
    gp = startplan.graph_plan(ARGS, table["graphs"])
    k = table["kinds"]["h200"]
    layers = startplan.ASSUMED_LAYERS
    before_tree = sum(sum(startplan._graph_seconds(kd, gp["kinds"][kd], layers, True, k)) for kd in ("prefill",
                                                                                                      "verify"))
    needed_at = sum(parts[n].seconds for n in ("interpreter", "startup", "weights", "drafter", "kv_cache",
                                               "model_kernels") if n in parts) + before_tree
    assert parts["kernels"].seconds == pytest.approx(0.2 + 400.0 - 20.0 - needed_at, abs=0.2), parts["kernels"]
    assert "the server waits" in parts["kernels"].basis
    table["kinds"]["h200"]["jit"]["speculative_sampling"]["value"] = 37.5
    assert {p.name: p for p in startplan.predict(inputs, table).parts}["kernels"].seconds == 0.2
