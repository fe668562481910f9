"""python.venv and python.venv.scripts on real venvs: scripts from another machine, a pyvenv.cfg home that is gone,
the fixer; a --python that is not the service's interpreter at all, as one root cause.

The B300 venv was streamed from another machine; these venvs are made here with the real ``venv``
module and then damaged the way a copy damages them.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest
from stack_support import make_ctx, make_venv, pyenv_python, run_check, workdir

from doctor.core.actions import new_backup_dir
from doctor.core.result import Status
from doctor.python.facts import read_shebang
from fixes.python import fix_venv_shebangs, rewrite_shebang

OTHER_MACHINE = "/home/builder/k26/.venv/bin/python3"


def fresh_venv(tmp_path, name="venv"):
    return make_venv(pyenv_python(), tmp_path / name)


def add_script(venv_python, name, text, mode=0o755):
    path = venv_python.parent / name
    path.write_text(text)
    path.chmod(mode)
    return path


def test_healthy_venv_passes(tmp_path):
    py = fresh_venv(tmp_path)
    add_script(py, "sglang-tool", f"#!{py}\nimport sys\nprint(sys.prefix)\n")
    res = run_check("python.venv", make_ctx(py))
    assert res.status is Status.PASS, res.summary
    assert "3.12.1" in res.summary
    scripts = run_check("python.venv.scripts", make_ctx(py))
    assert scripts.status is Status.PASS and "1 script(s)" in scripts.summary, scripts.summary


def test_not_a_venv_is_judged_as_an_interpreter():
    res = run_check("python.venv", make_ctx(pyenv_python()))
    assert res.status is Status.PASS and "not a venv" in res.summary


def test_missing_interpreter_fails_clearly(tmp_path):
    res = run_check("python.venv", make_ctx(tmp_path / "nope" / "bin" / "python"))
    assert res.status is Status.FAIL and "does not exist" in res.summary


def test_shebangs_from_another_machine_fail_and_the_fixer_rewrites_them(tmp_path):
    py = fresh_venv(tmp_path)
    plain = add_script(py, "torchrun", f"#!{OTHER_MACHINE}\n# -*- coding: utf-8 -*-\nimport sys\nprint('ok')\n")
    long_form = add_script(py, "sglang-router",
                           f"#!/bin/sh\n'''exec' \"{OTHER_MACHINE}\" \"$0\" \"$@\"\n' '''\nprint('ok')\n", 0o750)
    ok = add_script(py, "fine", f"#!{py}\nprint('ok')\n")
    shell = add_script(py, "helper.sh", "#!/bin/bash\necho hi\n")
    ctx = make_ctx(py)
    assert run_check("python.venv", ctx).status is Status.PASS  # the interpreter itself is whole
    res = run_check("python.venv.scripts", ctx)
    assert res.status is Status.FAIL
    assert "2 script(s)" in res.summary and "does not exist" in res.summary
    assert {s["name"] for s in res.details["broken_scripts"]} == {"torchrun", "sglang-router"}
    # the real failure: the kernel cannot exec the script ("bad interpreter")
    with pytest.raises(FileNotFoundError):
        subprocess.run([str(plain)], capture_output=True, text=True)

    plan = fix_venv_shebangs(ctx, res)
    assert sorted(a.path for a in plan) == sorted([str(plain), str(long_form)])
    assert any(f"+#!{py}" in line for a in plan for line in a.details())
    before = {p: p.read_text() for p in (plain, long_form)}
    backups = new_backup_dir(str(tmp_path / "state"))
    for action in plan:
        action.apply(backups)
    assert read_shebang(plain) == str(py) and read_shebang(long_form) == str(py)
    assert stat.S_IMODE(long_form.stat().st_mode) == 0o750
    for path, text in before.items():
        assert (backups / str(path.resolve()).lstrip("/")).read_text() == text
    assert subprocess.run([str(plain)], capture_output=True, text=True).stdout.strip() == "ok"
    assert subprocess.run([str(long_form)], capture_output=True, text=True).stdout.strip() == "ok"
    assert ok.read_text() == f"#!{py}\nprint('ok')\n" and shell.read_text().startswith("#!/bin/bash")
    again = run_check("python.venv.scripts", make_ctx(py))
    assert again.status is Status.PASS, again.summary
    assert fix_venv_shebangs(make_ctx(py), again) == []


def test_script_running_another_existing_interpreter_fails(tmp_path):
    py = fresh_venv(tmp_path)
    add_script(py, "launcher", f"#!{pyenv_python()}\nprint('runs without the venv packages')\n")
    res = run_check("python.venv.scripts", make_ctx(py))
    assert res.status is Status.FAIL and "outside this environment" in res.summary


def test_home_gone_fails_and_other_checks_fail_cleanly(tmp_path):
    """A venv whose base interpreter is not on this machine: pyvenv.cfg home points nowhere."""
    base = workdir() / "gone-base"
    if not base.exists():
        src = pyenv_python().parent.parent
        (base / "bin").mkdir(parents=True)
        shutil.copy2(src / "bin" / "python3.12", base / "bin" / "python3.12")
        (base / "lib").mkdir()
        for entry in (src / "lib").iterdir():
            os.symlink(entry, base / "lib" / entry.name)
    py = make_venv(base / "bin" / "python3.12", tmp_path / "copied")
    shutil.rmtree(base / "bin")  # the machine the venv came from
    ctx = make_ctx(py)
    res = run_check("python.venv", ctx)
    assert res.status is Status.FAIL
    assert f"pyvenv.cfg home {base}/bin does not exist" in res.summary
    assert "dangling symlink" in res.summary and "does not start" in res.summary
    assert [f.code for f in res.findings] == ["python.venv.dangling", "python.venv.home_gone",
                                              "python.venv.does_not_start"]  # each its own, in the order said
    assert any("venv --clear" in c for c in res.remediation.commands)
    for check_id in ("stack.versions", "sglang.install", "triton.jit"):
        other = run_check(check_id, ctx)
        assert other.status is Status.FAIL, (check_id, other.summary)
        assert str(py) in other.summary


def test_version_mismatch_in_pyvenv_cfg(tmp_path):
    py = fresh_venv(tmp_path)
    cfg = py.parent.parent / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("version = 3.12.1", "version = 3.11.7"))
    res = run_check("python.venv", make_ctx(py))
    assert res.status is Status.FAIL and "3.11.7" in res.summary and "3.12.1" in res.summary
    assert res.has("python.venv.version")


def test_rewrite_shebang_keeps_arguments_and_refuses_non_scripts():
    assert rewrite_shebang("#!/old/python -E\nx\n", "/new/python") == "#!/new/python -E\nx\n"
    assert rewrite_shebang("no shebang\n", "/new/python") is None
    assert rewrite_shebang("#!/bin/sh\necho\n", "/n") is None


def test_binary_files_in_bin_are_ignored(tmp_path):
    py = fresh_venv(tmp_path)
    (py.parent / "blob").write_bytes(b"\x7fELF\x00\x01#!/x/python")
    (py.parent / "bad-utf8").write_bytes(b"#!/gone/python\n\xff\xfe\n")
    ctx = make_ctx(py)
    res = run_check("python.venv.scripts", ctx)
    assert res.status is Status.FAIL and [s["name"] for s in res.details["broken_scripts"]] == ["bad-utf8"]
    assert fix_venv_shebangs(ctx, res) == []  # not valid UTF-8: left alone rather than mangled
