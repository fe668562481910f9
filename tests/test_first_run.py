"""The README's test command on a fresh machine: what the first run downloads is marked, shown and skippable,
and what .ci/run installs is named when it is missing.

Each case runs a real inner pytest session with this suite's conftest (``-p conftest``) over a small test file:
a test that reads a first-run download without the ``network`` mark fails naming it; a marked one passes, and
its download says so on the terminal although pytest captures output; under ``-m "not network"`` a download is
refused; a test that needs what .ci/run installs skips naming the module and the interpreter, and fails under CI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from sglang_wheels import installable

INNER = '''
import downloads
import pytest

def test_unmarked_reader():
    downloads.used("the torch 2.11.0 wheel")

@pytest.mark.network
def test_marked_reader():
    downloads.used("the torch 2.11.0 wheel")

@pytest.mark.network
def test_marked_download():
    with downloads.downloading("thing==1.0", "/nowhere", "1 kB"):
        pass

@pytest.mark.network
def test_download_progress(tmp_path):
    import time
    with downloads.downloading("big==2.0", tmp_path, "3 MB", watch=tmp_path, every=0.2):
        with open(tmp_path / "big.whl.part", "wb") as fh:
            for _ in range(3):
                fh.write(b"x" * 1_000_000)
                fh.flush()
                time.sleep(0.5)

def test_unmarked_download():
    with downloads.downloading("other==2.0", "/nowhere"):
        pass

def test_needs_what_ci_installs():
    import ci_requirements
    ci_requirements.require("k26_no_such_module", needed_for="for this test")
'''


def inner(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    environ.update(env, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-n", "0",
                           "-rA", "-q", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_inner.py"),
                           *args], capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=300)


def outcomes(out: subprocess.CompletedProcess[str]) -> dict[str, str]:
    got = {}
    for line in out.stdout.splitlines():
        for word in ("PASSED", "FAILED", "SKIPPED", "ERROR"):
            if line.startswith(word + " ") and "::" in line:
                got[line.split("::")[1].split()[0]] = word
            elif line.startswith(word + " [") and "k26_no_such_module" in line:
                got["test_needs_what_ci_installs"] = word
    return got


def test_marked_readers_run_unmarked_ones_fail_and_downloads_show(tmp_path: Path) -> None:
    out = inner(tmp_path)
    got = outcomes(out)
    assert got == {"test_unmarked_reader": "FAILED", "test_marked_reader": "PASSED", "test_marked_download": "PASSED",
                   "test_download_progress": "PASSED", "test_unmarked_download": "PASSED",
                   "test_needs_what_ci_installs": "SKIPPED"}, out.stdout
    assert "reads the torch 2.11.0 wheel, a first-run download, but is not marked `network`" in out.stdout
    # past pytest's capture, on the terminal's stream, while it happens: one line at the start, one at the end
    assert "[k26-doctor tests] first run: fetching thing==1.0 (1 kB) into /nowhere" in out.stderr, out.stderr
    assert "[k26-doctor tests] fetched thing==1.0 in 0 s" in out.stderr
    # while a download runs: a line every few seconds (here 0.2) with the bytes so far and the rate; the end line
    # says the size and the mean rate
    progress = [ln for ln in out.stderr.splitlines() if ln.startswith("[k26-doctor tests] fetching big==2.0: ")]
    assert progress and all(re.search(r": [\d.]+ (B|kB|MB) in \d+ s \([\d.]+ (B|kB|MB)/s\) so far$", ln)
                            for ln in progress), out.stderr
    assert re.search(r"\[k26-doctor tests\] fetched big==2.0 3.0 MB in \d+ s \([\d.]+ (kB|MB)/s\)", out.stderr), \
        out.stderr
    assert f"k26_no_such_module is not installed in {sys.executable} (needed for this test): `bash .ci/run` " \
           "installs it" in out.stdout


def test_not_network_deselects_them_and_refuses_any_download(tmp_path: Path) -> None:
    out = inner(tmp_path, "-m", "not network")
    got = outcomes(out)
    assert "test_marked_reader" not in got and "test_marked_download" not in got, out.stdout
    assert got["test_unmarked_download"] == "FAILED" and got["test_unmarked_reader"] == "FAILED"
    assert "would download other==2.0, but this run deselects `network` tests" in out.stdout
    assert "fetching other==2.0" not in out.stderr


def test_under_ci_a_missing_install_fails(tmp_path: Path) -> None:
    got = outcomes(inner(tmp_path, "-k", "needs_what", CI="1"))
    assert got == {"test_needs_what_ci_installs": "FAILED"}


def test_a_wheel_for_another_python_is_not_offered_to_pip() -> None:
    """The old skip said "pip >= 22.3 needed" when the cached wheel was cp311 and the interpreter 3.12."""
    this = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    other = "cp311" if this != "cp311" else "cp312"
    assert installable(Path("pkg-1.0-py3-none-any.whl"))
    assert not installable(Path(f"sglang-0.5.13.post1-{other}-{other}-manylinux_2_34_x86_64.whl"))
    assert not installable(Path("not-a-wheel-name.whl"))
