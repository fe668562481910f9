"""A --python that is not the service's interpreter is one root cause, not fifteen failures.

Real paths: the README's example path where nothing is installed, a path that does not exist, programs that
are not Python (/bin/ls, /bin/true), a directory, a file that cannot be executed. ``python.venv`` says what the
path is; every check that runs the service's interpreter depends on it and is blocked (folded under it, no
fixer, no remediation of its own); nothing offers to act on the non-interpreter (``/nonexistent -m pip ...``,
a rewrite of shebangs, ``TRITON_PTXAS_PATH`` written into the service's environment file). The report of those
checks is at most 8 lines.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor

from doctor.core.registry import load

NEXT = "next: k26-doctor check --python PYTHON   (PYTHON: the python SGLang runs in)"  # what to supply, said


def last_step(text: str) -> str:
    """The report's ``next:`` line, its wrapped continuation joined (words compared: wrapping drops spaces)."""
    lines = text.rstrip("\n").splitlines()
    at = max(i for i, ln in enumerate(lines) if ln.startswith("next: "))
    return " ".join(" ".join(lines[at:]).split())


def interpreter_checks() -> list[str]:
    """python.venv and every registered check that depends on it (the registry's own declarations)."""
    reg = load(plugins=False)
    deps = [c.id for c in reg.sorted_checks() if "python.venv" in c.depends and not c.deep]
    assert len(deps) >= 10, deps
    return ["python.venv", *deps]


def wrong_pythons(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """path -> (what python.venv must say of it, a fragment)."""
    plain = tmp_path / "not-executable"
    plain.write_text("print('hello')\n")
    plain.chmod(0o644)
    out = {
        "/opt/k26/venv/bin/python": ("does not exist", "nearest existing directory: /"),
        "/nonexistent": ("does not exist", "/nonexistent does not exist"),
        str(tmp_path): ("is a directory", "is a directory, not an interpreter"),
        str(plain): ("cannot be executed", "mode 0644"),
    }
    for prog in ("ls", "true"):
        path = shutil.which(prog)
        if path:
            out[path] = ("does not run as Python", "it is an ELF executable" if open(path, "rb").read(4) ==
                         b"\x7fELF" else "does not run as Python")
    if os.path.exists("/opt/k26/venv/bin/python"):
        del out["/opt/k26/venv/bin/python"]  # a machine where the README's venv exists: not a wrong path here
    return out


def test_a_wrong_python_is_one_root_line_of_at_most_eight() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="k26-"))  # a short path: pytest's own make the lines wrap
    ids = interpreter_checks()
    only = [a for i in ids for a in ("--only", i)]
    env = doctor_env(COLUMNS="80")
    for path, (what, fragment) in wrong_pythons(tmp_path).items():
        text = run_doctor("check", "--python", path, *only, env=env)
        lines = text.stdout.rstrip("\n").splitlines()
        assert text.returncode == 1, (path, text.stderr)
        assert len(lines) <= 8, f"{path}: {len(lines)} lines\n{text.stdout}"
        own = [ln for ln in lines if ln[:1] in "✔!✘-‼" and len(ln.split()) > 1]
        assert [ln.split()[1] for ln in own] == ["python.venv"], text.stdout
        assert f"{path} {what}" in text.stdout.replace("\n", " ") or path in lines[1], text.stdout
        assert fragment in " ".join(ln.strip() for ln in lines), text.stdout
        assert last_step(text.stdout) == " ".join(NEXT.split())
        for bad in ("pip install", "fix --apply", "shebang", "plan fixes", "--ignore", "TRITON_PTXAS"):
            assert bad not in text.stdout, (path, bad, text.stdout)
        js = json.loads(run_doctor("check", "--python", path, *only, "--format", "json", env=env).stdout)
        by = {r["id"]: r for r in js["results"]}
        assert by["python.venv"]["status"] == "fail" and "root" not in by["python.venv"]
        assert by["python.venv"]["fixer"] is None
        assert js["summary"]["roots"] == ["python.venv"] and js["summary"]["next_step"] == NEXT[len("next: "):]
        for cid in ids[1:]:
            dep = by[cid]
            assert dep["status"] == "skip" and dep["root"] == "python.venv" and dep["cause"] == "python.venv", dep
            assert dep["fixer"] is None and dep["remediation"] is None, dep


def test_in_the_whole_report_nothing_acts_on_the_non_interpreter(tmp_path: Path) -> None:
    for path in ("/nonexistent", shutil.which("ls") or "/bin/ls"):
        js = json.loads(run_doctor("check", "--python", path, "--format", "json").stdout)
        by = {r["id"]: r for r in js["results"]}
        assert by["python.venv"]["status"] == "fail"
        acting = [(r["id"], c) for r in js["results"] if r["id"] != "python.venv"
                  for c in (r.get("remediation") or {}).get("commands", []) if path in c]
        assert acting == [], acting
        assert all(by[i].get("root") == "python.venv" for i in interpreter_checks()[1:])
        plan = run_doctor("fix", "--python", path)  # the plan only: it changes nothing
        assert "Traceback" not in plan.stderr, plan.stderr
        assert "TRITON_PTXAS" not in plan.stdout and "shebang" not in plan.stdout, plan.stdout
        assert f"{path} -m pip" not in plan.stdout, plan.stdout
        text = run_doctor("check", "--python", path, env=doctor_env(COLUMNS="80")).stdout
        own = {ln.split()[1] for ln in text.splitlines() if ln[:1] in "✔!✘-‼" and len(ln.split()) > 1}
        assert not own & set(interpreter_checks()[1:]), text  # folded under python.venv, not lines of their own
        assert text.count("does not") >= 1 and last_step(text) == " ".join(NEXT.split())


@pytest.mark.parametrize("prog", ["ls", "true"])
def test_python_venv_says_what_the_program_is(prog: str) -> None:
    path = shutil.which(prog)
    if path is None:
        pytest.skip(f"no {prog} on PATH")
    js = json.loads(run_doctor("check", "--python", path, "--only", "python.venv", "--format", "json").stdout)
    res = next(r for r in js["results"] if r["id"] == "python.venv")  # --only python.venv selects python.venv.*
    assert res["status"] == "fail" and res["summary"].startswith(f"{path} does not run as Python: it is ")
    assert "asked for its version, it exited" in res["summary"]
    assert res["details"]["kind"] == "file" and res["details"]["starts"] is False
