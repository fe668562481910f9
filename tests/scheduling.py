"""How pytest-xdist hands the suite to its workers: the longest work first, files split where nothing is shared.

The suite runs on 2 cores (CI's machine), a few dozen tests take most of its time, and xdist's ``loadfile``
sends whole files in the order of their number of tests: a file of one 30-second test (the Triton interpreter,
the patched backend, the golden replays) went last, and the run ended with one worker busy and the others idle.
Here (with one worker per core and one more: conftest's ``pytest_xdist_auto_num_workers``):

* A file keeps its tests on one worker (as ``loadfile``) when it holds state its tests share: a fixture of
  module, class, package or session scope, or a ``functools`` cache (set up once, not once per worker). Any
  other file's tests are scheduled one by one, so the 8 tokenizer loads of test_model_config.py, say, run on
  every worker.
* Files that read one result another process computes (``TOGETHER``: those that call ``bare_part``, the
  bare-package probe, 20-30 s on a machine whose test cache does not hold it yet) run on one worker, one after
  the other: another worker would only wait on its lock.
* Work units start longest first (``EXPECTED_S``: CPU seconds measured on the 2-core machine; a unit not
  listed counts ``DEFAULT_S`` per test), the classic longest-processing-time order: what is left at the end
  are the short ones, and the workers finish together.

The figures only order the work: a wrong or stale one costs time, never a result. Update them from
``python -m pytest -q -p no:cacheprovider --durations=40`` when the slowest tests change.
Used by tests/conftest.py (``pytest_xdist_make_scheduler``) for the README's ``--dist loadfile``; another
``--dist`` mode is xdist's own.
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from pathlib import Path

# CPU seconds of the slowest work units (a file that keeps its tests together, a TOGETHER group, or one test of a
# split file), on a machine whose test cache holds none of sglang_wheels.computed_once's results yet (CI's): where
# it holds them, those units take a second or two, and starting them first costs nothing.
EXPECTED_S: dict[str, float] = {
    "ddtree-bare-probe": 70,  # the probe itself about 25
    "tests/test_model_tokenizer.py": 33,
    "tests/test_ddtree_interpreted.py": 35,
    "tests/test_golden_verdicts.py::test_every_recording_replays_to_its_golden_verdicts": 33,
    "tests/test_ddtree_kv_accounting.py": 29,
    "tests/test_ddtree_backend.py": 28,
    "tests/test_ddtree_trained_pair.py": 25,
    "tests/test_launch_flags_real_parser.py": 21,
    "tests/test_hostile_exit_codes.py": 19,
    "tests/test_hostile_hangs.py": 17,
    "tests/test_default_tier.py": 16,
    "tests/test_check_changes_nothing.py::test_check_writes_nothing_and_leaves_no_process": 16,
    "tests/test_launch_gate.py": 14,
    "tests/test_ddtree_site_record.py": 16,  # torch imported once, in the patched server's matcher
    "tests/test_validate_command.py::test_a_whole_run_writes_the_record_and_resumes": 12,
    "tests/test_validate_run.py::test_a_lossless_run_passes_and_leaves_no_server": 8,
    "tests/test_validate_command.py::test_a_failing_run_writes_no_record": 9,
    "tests/test_one_verdict.py::test_a_live_run_and_the_replay_of_its_snapshot_agree": 12,
    "tests/test_fleet_slurm.py": 12,
    "tests/test_gpu_probe.py::test_probe_with_cpu_torch_says_no_cuda": 4,
    "tests/test_hostile_secrets.py": 11,
    "tests/test_launch_flags.py": 6,
    "tests/test_foundation_cli.py::test_snapshot_redacts_secrets_and_replays": 11,
    "tests/test_model_config.py::test_tokenizer_missing_files": 3,  # each of its 4 parameters
    "tests/test_model_config.py::test_tokenizer_config_bad_json": 3,
    "tests/test_hostile_writes.py": 10,
    "tests/test_stack_kernels.py": 9,
    "tests/test_model_config.py::test_snapshot_redaction_keeps_the_verdicts": 3,
    "tests/test_model_config.py::test_remote_code_turned_off": 3,
    "tests/test_stack_versions.py": 9,
    "tests/test_ddtree_step.py": 8,
    "tests/test_stack_triton_jit.py::test_probes_run_on_every_supported_service_python": 8,
    "tests/test_first_screen.py::test_the_live_first_screen_follows_the_same_rules": 8,
    "tests/test_gate_terminal.py::test_env_is_a_short_redacted_summary": 7,
    "tests/test_wrong_python.py::test_a_wrong_python_is_one_root_line_of_at_most_eight": 6,
    "tests/test_gpu_checks.py::test_hostile_facts_never_raise": 6,
    "tests/test_fact_shapes.py::test_what_the_collectors_give_here_has_its_shape": 6,
    "tests/test_ddtree_batched.py": 6,
}
DEFAULT_S = 0.4
# One work unit each: the files whose source reads the same result (ddtree_support.bare_package_probe).
TOGETHER: dict[str, re.Pattern[str]] = {"ddtree-bare-probe": re.compile(r"\bbare_part\(")}

# What makes a file's tests share state: a fixture scoped wider than one test, or a process-wide cache.
SHARED_STATE = re.compile(r"""scope\s*=\s*["'](module|class|package|session)["']|functools\.(cache|lru_cache)\b"""
                          r"|\blru_cache\(")


@functools.cache
def file_scope(root: Path, path: str) -> str | None:
    """The work unit of the tests of the file ``path`` (relative to ``root``): a TOGETHER group, the file (its
    tests share state), or None (each test is one)."""
    try:
        text = (root / path).read_text(encoding="utf-8")
    except OSError:  # not a file we can read (a doctest in a package, say): keep it whole, as loadfile would
        return path
    group = next((name for name, pattern in TOGETHER.items() if pattern.search(text)), None)
    return group or (path if SHARED_STATE.search(text) else None)


def scope_of(root: Path, nodeid: str) -> str:
    return file_scope(root, nodeid.split("::", 1)[0]) or nodeid


def expected_s(scope: str, tests: int) -> float:
    """The CPU seconds a work unit is expected to take: its entry in EXPECTED_S (a test's without its parameters,
    a file's as the sum of its tests' entries), else DEFAULT_S per test."""
    if scope in EXPECTED_S:
        return EXPECTED_S[scope]
    bare = scope.split("[", 1)[0]
    if bare in EXPECTED_S:
        return EXPECTED_S[bare]
    listed = [s for k, s in EXPECTED_S.items() if k.startswith(scope + "::")]
    return sum(listed) + DEFAULT_S * max(0, tests - len(listed)) if listed else DEFAULT_S * tests


def make_scheduler(config, log):
    """xdist's ``loadscope`` scheduler with the scopes and the order above."""
    from xdist.scheduler import LoadScopeScheduling

    root = Path(config.rootpath)

    class LongestFirst(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(root, nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is complete at the first assignment: order it once
                units = sorted(self.workqueue.items(), key=lambda kv: -expected_s(kv[0], len(kv[1])))
                self.workqueue = OrderedDict(units)
                self.ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
