"""Where Python.h comes from: the package that exists on the distribution, or the interpreter's own answer.

`diagnose` once proposed ``apt-get install python3.12-dev`` on Debian 12, which has no such package. The advice
(doctor/python/headers.py, doctor/data/python_headers.toml) reads the distribution and the interpreter; here it is
judged against the table's releases, against this host's real package manager where the host is one of them,
and through `diagnose` on the reference log of the H200 failure.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_doctor
from interpreters import find_python

from doctor.core.datafile import load_toml
from doctor.python.headers import TABLE, from_include, headers_advice, release
from doctor.service.diagnose import diagnose_lines, host_values, load_signatures
from doctor.triton.facts import read_os_release

DEBIAN12 = {"ID": "debian", "VERSION_ID": "12", "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"}
UBUNTU22 = {"ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "22.04"}
UBUNTU26 = {"ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "26.04", "PRETTY_NAME": "Ubuntu 26.04 LTS"}
ROCKY9 = {"ID": "rocky", "ID_LIKE": "rhel centos fedora", "VERSION_ID": "9.4"}
RHEL8 = {"ID": "rhel", "ID_LIKE": "fedora", "VERSION_ID": "8.10"}
ALPINE = {"ID": "alpine", "VERSION_ID": "3.20.0"}
REFERENCE_LOG = ROOT / "tests" / "fixtures" / "reference" / "h200-triton-missing-python-h.txt"


@pytest.mark.parametrize("os_release, mm, packages", [
    (DEBIAN12, "3.11", ["python3-dev"]),
    (DEBIAN12, "3.12", []),  # not a Debian 12 package: nothing to install
    (UBUNTU22, "3.10", ["python3-dev"]),
    (UBUNTU22, "3.11", ["python3.11-dev"]),
    (ROCKY9, "3.12", ["python3.12-devel"]),
    (ROCKY9, "3.9", ["python3-devel"]),
    (RHEL8, "3.8", ["python38-devel"]),
    (ALPINE, "3.12", []),
])
def test_the_package_that_exists_there(os_release, mm, packages):
    advice = headers_advice(os_release, mm, "/usr")
    assert advice.kind == "system" and advice.packages == packages
    if packages:
        assert advice.commands[-1].endswith(" ".join(packages))
    else:
        assert advice.commands == []


def test_a_release_not_in_the_table_is_checked_before_it_is_installed():
    advice = headers_advice(UBUNTU26, "3.13", "/usr")
    assert advice.commands == ["apt-cache policy python3.13-dev", "apt-get install -y python3.13-dev"]
    assert "check that python3.13-dev exists first" in advice.text


@pytest.mark.parametrize("base, kind, command", [
    ("/root/.pyenv/versions/3.12.1", "pyenv", "pyenv install --force 3.12.1"),
    ("/home/u/.local/share/uv/python/cpython-3.12.1-linux-x86_64-gnu", "uv", "uv python install --reinstall 3.12.1"),
    ("/opt/miniconda3", "conda", "conda install -p /opt/miniconda3 --force-reinstall python=3.12.1"),
    ("/usr/local", "other", None),
])
def test_an_interpreter_that_is_not_the_systems_has_its_own_answer(base, kind, command):
    advice = headers_advice(DEBIAN12, "3.12", base, "3.12.1", conda=kind == "conda")
    assert advice.kind == kind and advice.packages == []
    assert advice.commands == ([command] if command else [])
    assert "apt-get" not in " ".join(advice.commands)


def test_an_include_directory_names_the_interpreter():
    assert from_include("/usr/include/python3.12") == ("/usr", "3.12")
    assert from_include("/root/.pyenv/versions/3.11.7/include/python3.11") == ("/root/.pyenv/versions/3.11.7", "3.11")
    assert from_include("/opt/x/lib") is None


def _package_exists(name: str) -> bool | None:
    """Whether this host's package manager has a candidate for ``name`` (None: no manager to ask)."""
    if shutil.which("apt-cache"):
        out = subprocess.run(["apt-cache", "policy", name], capture_output=True, text=True, timeout=60).stdout
        line = next((ln for ln in out.splitlines() if "Candidate:" in ln), "")
        return bool(line) and "(none)" not in line
    if shutil.which("dnf"):
        return subprocess.run(["dnf", "-q", "info", name], capture_output=True, timeout=120).returncode == 0
    return None


def test_the_table_agrees_with_this_hosts_package_manager():
    """On a host that is one of the table's releases, every package it names exists, and the X.Y it says the
    release does not package has no dev package there."""
    os_release = read_os_release()
    rel = release(os_release)
    if rel is None:
        pytest.skip(f"this host ({os_release.get('PRETTY_NAME') or os_release.get('ID')}) is not a release of "
                    f"{TABLE.name}: nothing to cross-check")
    known = _package_exists("python3" if shutil.which("apt-cache") else "python3-devel")
    if known is None:
        pytest.skip("no apt-cache or dnf on this host to ask")
    if not known:
        pytest.skip("this host's package lists are empty (apt-get update was never run): nothing to ask them")
    fam = load_toml(TABLE)["family"]["debian" if shutil.which("apt-cache") else "fedora"]
    # the default python3's package, and its X.Y's own (both in the release's main repository; the other X.Y
    # may sit in a component this host has not enabled, such as Ubuntu's universe)
    named = [headers_advice(os_release, rel["python3"], "/usr").packages[0],
             rel.get("headers", {}).get(rel["python3"], fam["versioned"].format(mm=rel["python3"]))]
    assert all(_package_exists(p) for p in named), named
    newest = max([rel["python3"], *rel.get("headers", {})], key=lambda v: [int(x) for x in v.split(".")])
    beyond = f"{newest.split('.')[0]}.{int(newest.split('.')[1]) + 1}"
    assert headers_advice(os_release, beyond, "/usr").packages == []
    assert _package_exists(fam["versioned"].format(mm=beyond)) is False


def test_the_system_python_of_this_host_is_named_by_its_package():
    """The real /usr/bin/python3: its sysconfig include directory, judged as the system's."""
    python = Path("/usr/bin/python3")
    if not python.exists() or release(read_os_release()) is None:
        pytest.skip("no /usr/bin/python3, or this host is not a release of the table")
    out = subprocess.run([str(python), "-c", "import sysconfig, sys; print(sysconfig.get_paths()['include']); "
                          "print(sys.base_prefix)"], capture_output=True, text=True, timeout=60)
    include, base = out.stdout.split()
    mm = from_include(include)[1]
    advice = headers_advice(read_os_release(), mm, base)
    assert advice.kind == "system" and advice.packages, advice.text


def test_diagnose_names_what_this_host_has_for_the_logs_interpreter():
    """The H200 reference log: gcc was given -I/usr/include/python3.12. On Debian 12 no package has those
    headers; with --python naming a pyenv interpreter the answer is pyenv's."""
    lines = REFERENCE_LOG.read_text().splitlines()
    sigs = load_signatures()
    found = diagnose_lines(lines, sigs, host=lambda clean: host_values(clean, os_release=DEBIAN12))
    top = next(f for f in found if f.signature.id == "triton-python-h")
    assert "Debian 12 packages Python.h only for Python 3.11" in top.fix
    assert top.commands == ["k26-doctor check --only triton.jit"]  # no apt-get of a package that does not exist
    ubuntu = diagnose_lines(lines, sigs, host=lambda clean: host_values(clean, os_release={
        "ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "24.04"}))
    hit = next(f for f in ubuntu if f.signature.id == "triton-python-h")
    assert hit.commands[0] == "apt-get install -y python3-dev"
    pyenv = find_python("3.12")
    if pyenv is None or "/.pyenv/" not in str(pyenv):
        pytest.skip("no pyenv Python 3.12 on this machine for the --python case")
    out = run_doctor("diagnose", str(REFERENCE_LOG), "--python", str(pyenv))
    assert out.returncode == 0, out.stderr
    assert "$ pyenv install --force 3.12" in out.stdout and "apt-get" not in out.stdout
