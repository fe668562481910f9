"""The flag table read from the sources against SGLang's own parser, built by importing it.

The doctor never imports SGLang; this test does, in an interpreter with SGLang's dependencies
(``$K26_SGLANG_ARGS_PYTHON``, default this one: torch, transformers, msgspec, psutil, ...; no GPU
needed), to prove that what ``doctor.sglang.flag_reader`` reads with ``ast`` is what SGLang's argparse
accepts: the same option strings, destinations, arities, types and choices, and the same verdict
on a set of command lines. Skips, naming the missing module, where the dependencies are absent.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ci_requirements
import pytest
import sglang_wheels
from flag_support import validate
from interpreters import probe_env, run_identity

from doctor.sglang.flag_reader import read_flags

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)

PYTHON = os.environ.get("K26_SGLANG_ARGS_PYTHON", sys.executable)

REAL_PARSER = r'''
import argparse, contextlib, io, json, sys, warnings
warnings.simplefilter("ignore")
from sglang.srt.server_args import ServerArgs

class Rejected(Exception):
    pass

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Rejected(message)

parser = Parser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
options = {}
for opt, act in parser._option_string_actions.items():
    if opt in ("-h", "--help"):
        continue
    options[opt] = {"dest": act.dest, "nargs": act.nargs, "required": act.required,
                    "choices": None if act.choices is None else sorted(str(c) for c in act.choices),
                    "type": getattr(act.type, "__name__", None)}
verdicts = []
for argv in json.loads(sys.stdin.read()):
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(argv)
        verdicts.append(None)
    except Rejected as exc:
        verdicts.append(str(exc))
print("RESULT " + json.dumps({"options": options, "verdicts": verdicts}))
'''

BASE = ["--model-path", "/m", "--tp-size", "8", "--trust-remote-code", "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", "/d", "--attention-backend", "triton", "--mem-fraction-static", "0.85",
        "--host", "0.0.0.0", "--port", "30000", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"]
TAILS = [[], ["--cuda-graph-max-bs", "256"], ["--cuda-graph-max-bs-decode", "256"], ["--mem-frac", "0.8"],
         ["--tp", "8"], ["--no-such-flag"], ["--port", "x"], ["--port=31000"], ["--trust-remote-code=1"],
         ["--disable-cuda-graph"], ["--cuda-graph-backend-decode", "fast"], ["--cuda-graph-backend-decode", "full"],
         ["--speculative-ddtree-budget", "64"], ["--lora-paths"], ["--enable-tf32-matmul"],
         ["--no-enable-tf32-matmul"], ["--dp-size", "-1"], ["--"], ["stray"], ["--tp-size"],
         ["--cuda-graph-bs", "1", "2"], ["--stream-output"], ["--reasoning-parser", "no-such-parser"],
         ["--tensor-parallel-size", "8"], ["--speculative-draft-model", "/d2"], ["--fuseep-mode", "3"]]


@functools.lru_cache(maxsize=1)
def _missing_dependencies() -> tuple[str, ...]:
    """Found without importing them (torch alone takes seconds)."""
    code = ("import importlib.util as u\nprint(' '.join(m for m in ('torch', 'transformers', 'msgspec', 'psutil', "
            "'zmq', 'pybase64') if u.find_spec(m) is None))")
    res = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    return tuple(res.stdout.split()) if res.returncode == 0 else (f"{PYTHON} does not run",)


def _transformers_mismatch(release: str) -> str | None:
    """Why ``release`` cannot be imported by this interpreter's transformers, or None.

    SGLang registers its own model configs with transformers at import, so a release only imports beside
    the transformers it pins: 0.5.13.post1 pins 5.8.1 and registers ``qwen3_asr``, which 5.19 (0.5.23's pin,
    what .ci/run installs) already has ("'qwen3_asr' is already used by a Transformers config").
    """
    want = sglang_wheels.pinned(release, "transformers")
    code = "import importlib.metadata as m\ntry: print(m.version('transformers'))\nexcept Exception: print('')"
    have = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    if want is None or not have or want == have:
        return None
    return f"sglang {release} pins transformers=={want}; {PYTHON} has {have}, beside which it does not import"


def mine_and_real(table, real: dict) -> set[str]:
    return set(table.options) & set(real["options"])


def real_parser(version: str, factory: pytest.TempPathFactory) -> dict:
    missing = _missing_dependencies()
    if missing:
        ci_requirements.unavailable(ci_requirements.reason(list(missing), PYTHON, "to run SGLang's own parser")
                                    + "; or set K26_SGLANG_ARGS_PYTHON to an interpreter that has them")
    release, _, patched = version.partition("+")
    mismatch = _transformers_mismatch(release)  # before unpacking 2,000 files for nothing
    if mismatch:
        pytest.skip(mismatch)
    site = sglang_wheels.unpack(release, factory.mktemp(f"whole-{release}"), whole=True)
    if patched:  # the project's DDTree patches, applied as in sglang_wheels.ddtree_site
        for patch in sglang_wheels.FLAG_PATCHES:
            res = subprocess.run(["git", "apply", "-p1", str(sglang_wheels.PATCH_SET / patch)], cwd=site,
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res.stderr
    argvs = [[*BASE, *tail] for tail in TAILS]

    def run() -> tuple[dict, bool]:
        proc = subprocess.run([PYTHON, "-c", REAL_PARSER], input=json.dumps(argvs), capture_output=True, text=True,
                              timeout=600, env=probe_env(PYTHONPATH=str(site)))
        missing = re.search(r"No module named '([^']+)'", proc.stderr)
        if proc.returncode != 0 and missing:
            ci_requirements.unavailable(ci_requirements.reason([missing.group(1)], PYTHON,
                                                               f"by sglang {version}'s parser")
                                        + "; or set K26_SGLANG_ARGS_PYTHON to an interpreter that has it")
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        return json.loads(line[len("RESULT "):]), True

    # SGLang's own parser on these command lines: computed once per release (and patches), program, command
    # lines and interpreter (``computed_once``), reused by later runs until one of them changes.
    patches = [sglang_wheels.PATCH_SET / p for p in sglang_wheels.FLAG_PATCHES] if patched else []
    key = {"wheel": sglang_wheels.wheel_for(release).name, "program": REAL_PARSER, "argvs": argvs,
           **run_identity(PYTHON, probe_env())}
    return {"site": site, "argvs": argvs, **sglang_wheels.computed_once(f"real-parser-{version}", patches, key, run)}


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.23", "0.5.13.post1", "0.5.23+ddtree"])
def test_sources_agree_with_the_imported_parser(version: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    real = real_parser(version, tmp_path_factory)
    table = read_flags(Path(real["site"]) / "sglang", version)
    if version.endswith("+ddtree"):
        assert "--speculative-ddtree-budget" in mine_and_real(table, real)
    mine = table.options
    assert set(mine) == set(real["options"])
    for opt, r in real["options"].items():
        m = mine[opt]
        assert m["dest"] == r["dest"], opt
        assert m["nargs"] == (1 if r["nargs"] is None else r["nargs"]), opt
        assert bool(m.get("required")) == r["required"], opt
        if r["type"] in ("int", "float"):
            assert m.get("type") == r["type"], opt
        if m.get("choices") is not None:  # where the reader resolved choices, they are SGLang's
            assert sorted(str(c) for c in m["choices"]) == r["choices"], opt
    for argv, verdict in zip(real["argvs"], real["verdicts"], strict=True):
        problems = validate(table, argv, removed={})
        # A value outside a registry plugins can extend is a warning for the doctor, an error for the
        # stock parser (no plugin loaded): both say "rejected without a plugin".
        errors = [p.message for p in problems if p.severity == "error" or "only a plugin" in p.message]
        flag = re.match(r"argument ([-\w]+)", verdict or "")
        if verdict and "invalid choice" in verdict and flag and "choices" not in mine.get(flag.group(1), {}):
            continue  # choices computed at run time from a registry the reader could not resolve: unjudged
        assert (verdict is None) == (not errors), (argv[len(BASE):], verdict, errors)
        if verdict and "ambiguous option" in verdict:
            assert any(verdict.split(" (")[0] in e or verdict in e for e in errors), (verdict, errors)
