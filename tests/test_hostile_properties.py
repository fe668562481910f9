"""Every command, any value of each of its options: a property test (hypothesis) over the whole command line.

For each command of ``k26-doctor`` (walked from the click group, so a new command or option is fuzzed without
being listed here), hypothesis picks a few of its options and a value of each option's type:

- numbers: ``nan``, ``inf``, ``1e300``, negative, zero, 400 digits, words, and small valid ones;
- paths (in a sandbox made for the example): a regular file, a FIFO, a directory, a symlink to a file, a dangling
  link, a symlink loop, a hardlink, a name holding a newline or ESC, a file that does not exist, URLs with
  credentials in every spelling; the pool is small, so the same file is often named twice (``--output F
  --secrets-file F``, ``--config F --output F``);
- strings: control characters (OSC, CR, BS, C1), newlines, URLs with credentials, secret flags and values;
- choices (and one that is none), flags, server arguments after ``--``.

and requires that the command ends within its deadline, exits 0, 1 or 2 (3 is a bug: no report), prints no
planted secret (stdout, stderr and every written file but the secrets file it was asked for), puts no control
character on the terminal, and changes no file of the sandbox but the ones it was asked to write.

The runs are in this process (``hostile_support.cli_run``: ``doctor.cli.run_cli`` with its redacting streams),
derandomized and without an example database, so CI sees the same examples every run. What a command would do to
the machine beyond its arguments is pinned: ``launch`` only ``--dry-run``, ``slurm-health`` only ``--dry-run``
with no real ``scontrol``, ``fix`` never ``--apply``, ``patches apply/revert`` against a ``--python`` that is no
interpreter, ``env`` from a recorded snapshot and ``check``/``fix``/``snapshot`` on two fast checks (facts) unless
the example chose their selection; ``--deep`` and ``--import-sglang`` (imports timed by their own tests) are left out.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Any

import click
import pytest
from hostile_support import cli_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doctor.cli import cli
from doctor.commands.options import Number

pytestmark = pytest.mark.timeout(300)
RECORDED = Path(__file__).parent / "fixtures" / "snapshots" / "gpuless-fresh-venv.json"
DEADLINE_S = 45.0  # the slowest command here (a probe under a hostile --python) ends well before it

PASSWORD = "Pw0rdPlant3d"
API_KEY = "ApiKeyPlant3d77"
HF = "hf_" + "Pl4" * 10
SECRETS = (PASSWORD, API_KEY, HF)
URLS = [f"https://user:{PASSWORD}@host.example/x", f"HTTPS://user:{PASSWORD}@host.example",
        f"https:/user:{PASSWORD}@host.example/x", f"//user:{PASSWORD}@host.example/x",
        f"https%3A%2F%2Fuser%3A{PASSWORD}%40host.example", f"http://user:{PASSWORD}@127.0.0.1:9/health",
        f"https://host.example/m?hf_token={PASSWORD}&rev=main"]
CONTROL_TEXT = ["\x1b]0;owned\x07", "a\nb", "x\rFAKE PASS", "bs\x08\x08", "\x9b31m", "tab\there", "\x00nul", ""]
NUMBERS = ["nan", "inf", "-inf", "1e300", "-1", "0", "9" * 400, "abc", "1e-300", "0x10"]
SMALL = {"seconds": ["0.5", "1", "2"], "int": ["1", "2", "8"], "number": ["0.5", "1.5", "3"]}
PATH_NAMES = {"config", "output", "python", "model_path", "draft_model_path", "patches_dir", "state_dir",
              "from_snapshot", "secrets_file", "textfile", "cache_dir", "signatures", "doctor_path", "scontrol_path",
              "site_packages", "set_dir", "model_dir", "logfile", "snapshot"}
OUTPUTS = {"output", "secrets_file"}
LEFT_OUT = {"deep", "import_sglang", "do_apply", "wait"}  # (the module docstring says why)
KINDS = ["file", "file2", "fifo", "dir", "link", "dangling", "loop", "hardlink", "newline", "esc", "absent",
         "absent2"]


def leaf_commands() -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), (*path, name))  # type: ignore[arg-type]
        else:
            out.append(path)

    walk(cli, ())
    return out


def command_of(path: tuple[str, ...]) -> click.Command:
    cmd: Any = cli
    for name in path:
        cmd = cmd.get_command(click.Context(cmd), name)
    return cmd


def sandbox(root: Path) -> dict[str, Path]:
    """The paths an example may name, made fresh for it."""
    root.mkdir(parents=True)
    paths = {kind: root / kind for kind in KINDS}
    paths["newline"] = root / "new\nline"
    paths["esc"] = root / "esc\x1b]0;t\x07"
    for kind in ("file", "newline", "esc"):
        paths[kind].write_text('[server]\nport = 30000\n')
    paths["file2"].write_text("{}\n")
    os.mkfifo(paths["fifo"])
    paths["dir"].mkdir()
    paths["link"].symlink_to(paths["file"])
    paths["dangling"].symlink_to(root / "nowhere")
    paths["loop"].symlink_to(root / "loop2")
    (root / "loop2").symlink_to(paths["loop"])
    os.link(paths["file2"], paths["hardlink"])
    (root / "fake-python").write_text("#!/bin/sh\nexit 1\n")
    (root / "fake-python").chmod(0o755)
    return paths


def tree(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under ``root``: what it is and its bytes' hash (or its link's target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = os.lstat(p)
            if stat.S_ISLNK(st_.st_mode):
                out[str(p)] = ("link", os.readlink(p))
            elif stat.S_ISREG(st_.st_mode):
                out[str(p)] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[str(p)] = (oct(stat.S_IFMT(st_.st_mode)), "")
    return out


def value_strategy(param: click.Parameter) -> st.SearchStrategy[Any]:
    """Values of ``param``'s type; paths are kinds, resolved against the example's sandbox."""
    typ = param.type
    if isinstance(typ, Number):
        small = SMALL["seconds" if typ.unit == "seconds" else "int" if typ.integer else "number"]
        return st.sampled_from(NUMBERS + small)
    if isinstance(typ, click.Choice):
        return st.sampled_from([*typ.choices, "bogus\x1b[2J"])
    if isinstance(typ, click.Path) or param.name in PATH_NAMES:
        return st.one_of(st.sampled_from(KINDS).map(lambda k: ("path", k)), st.sampled_from(URLS))
    return st.one_of(st.sampled_from(CONTROL_TEXT + URLS + [HF, "host.port", "sglang"]),
                     st.text(st.sampled_from("ab-_.\n\r\x1b\x07\x08\x9b/ "), max_size=12))


# whole units, so that a planted secret always stands where it is recognisably one (after its flag)
SERVER_ARGS = st.lists(st.sampled_from([("--api-key", API_KEY), (f"--api-key={API_KEY}",), ("--api-ke", API_KEY),
                                        ("--log-level", "debug"), ("--served-model-name", "a\nb"), (URLS[0],),
                                        ("--",), ("-x",), ("--api-key",)]), max_size=3).map(
    lambda units: [a for unit in units for a in unit])


@st.composite
def invocation(draw: st.DrawFn, path: tuple[str, ...]) -> list[tuple[click.Parameter, Any]]:
    cmd = command_of(path)
    params = [p for p in cmd.params if p.name not in LEFT_OUT and not getattr(p, "hidden", False)]
    options = [p for p in params if isinstance(p, click.Option)]
    chosen = draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda p: p.name)) if options else []
    picked: list[tuple[click.Parameter, Any]] = []
    for p in chosen:
        if isinstance(p, click.Option) and (p.is_flag or p.count):
            picked.append((p, True))
        else:
            picked.append((p, draw(value_strategy(p))))
    for p in params:
        if isinstance(p, click.Argument):
            picked.append((p, draw(SERVER_ARGS) if p.nargs == -1 else draw(value_strategy(p))))
    return picked


def argv_of(path: tuple[str, ...], picked: list[tuple[click.Parameter, Any]], box: dict[str, Path],
            root: Path) -> tuple[list[str], set[Path]]:
    """The command line, the pins of the module docstring added, and the files it was asked to write."""
    def concrete(v: Any) -> str:
        return str(box[v[1]]) if isinstance(v, tuple) else str(v)

    argv, rest, allowed = list(path), [], set()
    names = {p.name for p, _ in picked}
    for p, v in picked:
        if isinstance(p, click.Argument):
            rest.append((p, v))
            continue
        flag = p.opts[0]
        if p.is_flag or p.count:  # type: ignore[union-attr]
            argv.append(flag)
            continue
        argv += [flag, concrete(v)]
        if p.name in OUTPUTS:
            allowed.add(Path(os.path.abspath(concrete(v))))
    pins = {"launch": ["--dry-run"] + ([] if "no_flag_check" in names else ["--no-flag-check"]),
            "slurm-health": ["--dry-run"] + ([] if "scontrol_path" in names else ["--scontrol", "/nonexistent"]),
            "env": [] if "from_snapshot" in names else ["--from-snapshot", str(RECORDED)],
            "smoke": [] if "url" in names else ["--url", "http://127.0.0.1:9"],
            "wait-ready": [] if "url" in names else ["--url", "http://127.0.0.1:9/health"]}
    argv += pins.get(path[0], [])
    if path[0] in ("smoke", "wait-ready") and "timeout" not in names:
        argv += ["--timeout", "1"]
    if path[0] == "snapshot" and "facts" not in names:
        argv += ["--fact", "env", "--fact", "python"]
    if path[0] in ("check", "fix") and not {"only", "from_snapshot"} & names:
        argv += ["--only", "host.port", "--only", "python.venv"]
    if path[0] == "patches" and "python" not in names and "python" in {p.name for p in command_of(path).params}:
        argv += ["--python", str(root / "fake-python")]
    if path[0] == "patches" and "state_dir" in {p.name for p in command_of(path).params} and "state_dir" not in names:
        argv += ["--state-dir", str(root / "state")]
    tail: list[str] = []
    for p, v in rest:
        if p.nargs == -1:
            tail = ["--", *map(str, v)] if v else []
        else:
            argv.append(concrete(v))
            if p.name in ("model_dir", "set_dir"):  # their default outputs: the manifest beside the files
                allowed |= {Path(os.path.abspath(concrete(v))) / n for n in ("k26-manifest.json", "manifest.json")}
    for out in list(allowed):
        if out.suffix == ".service":
            allowed.add(out.with_suffix(".timer"))
    return argv + tail, allowed


def check_invocation(path: tuple[str, ...], picked: list[tuple[click.Parameter, Any]], root: Path) -> None:
    box = sandbox(root)
    argv, allowed = argv_of(path, picked, box, root)
    before = tree(root)
    env = {"HF_TOKEN": HF, "HTTPS_PROXY": URLS[0], "HOME": str(root)}
    t0 = time.monotonic()
    code, out, err = cli_run(*argv, env=env)
    took = time.monotonic() - t0
    shown = f"{argv!r} -> {code} in {took:.1f}s\nstdout: {out[-600:]!r}\nstderr: {err[-600:]!r}"
    assert took < DEADLINE_S, shown
    assert code in (0, 1, 2), shown
    assert not [s for s in SECRETS if s in out + err], shown
    assert not [c for c in out + err if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0], shown
    after = tree(root)
    secrets_files = {Path(os.path.abspath(str(box[v[1]]) if isinstance(v, tuple) else str(v)))
                     for p, v in picked if p.name == "secrets_file"}
    for name, what in after.items():
        p = Path(name)
        if name in before and before[name] == what:
            continue
        assert p in allowed or p.parent == root / "state" or root / "state" in p.parents, \
            f"{name} changed ({before.get(name)} -> {what})\n{shown}"
        if what[0] == "file" and p not in secrets_files:
            assert not [s for s in SECRETS if s in p.read_text(errors="replace")], f"a secret in {name}\n{shown}"
    assert not [n for n in before if n not in after and Path(n) not in allowed], shown


COMMANDS = leaf_commands()


def test_every_command_is_fuzzed() -> None:
    assert len(COMMANDS) >= 18 and ("systemd-unit",) in COMMANDS and ("manifest", "export") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_any_value_of_any_option(path: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> None:
    counter = iter(range(10_000))

    @settings(max_examples=8, deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                     HealthCheck.data_too_large])
    @given(picked=invocation(path))
    def prop(picked: list[tuple[click.Parameter, Any]]) -> None:
        check_invocation(path, picked, tmp_path_factory.mktemp("box") / str(next(counter)))

    prop()


# The classes of issue 36, each as one fixed example the property covers (so a regression names its class).
@pytest.mark.parametrize("argv", [
    ["systemd-unit", "--doctor", "/usr/bin/true", "--secrets-file", "{file}", "--output", "{file}", "--",
     "--api-key", API_KEY],
    ["systemd-unit", "--doctor", "/usr/bin/true", "--secrets-file", "{file2}", "--output", "{hardlink}", "--",
     "--api-key", API_KEY],
    ["check", "--only", "host.port", "--config", "{file}", "--output", "{link}"],
    ["smoke", "--url", "http://127.0.0.1:9", "--timeout", "1e300"],
    ["check", "--only", "host.port", "--python", URLS[0], "-v"],
])
def test_the_classes_found_by_hand(argv: list[str], tmp_path: Path) -> None:
    box = sandbox(tmp_path / "box")
    argv = [a.format(**{k: str(v) for k, v in box.items()}) for a in argv]
    before = tree(tmp_path / "box")
    code, out, err = cli_run(*argv, env={"HOME": str(tmp_path)})
    assert code in (0, 1, 2) and not [s for s in SECRETS if s in out + err], (code, err)
    assert tree(tmp_path / "box") == before
