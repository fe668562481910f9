"""SGLang's own tests for what the DDTree patch set touches, run against pristine and patched SGLang 0.5.23.

The upstream test files are not part of this repository (they are SGLang's code): the caller copies them
into a directory (``--tests DIR``) and this script runs the ones listed in ``bench/sglang_upstream_tests.json``
(the list says where each comes from, what patched file it covers and whether it needs a GPU) that are present
there, each file in its own pytest process, and records per file and per SGLang tree: passed / failed /
skipped / errors, the exit code, the time, and the failing test ids. What matters is the difference: a test
that passes on the pristine tree and fails on the patched one is a regression of the set.

Trees (``--trees``, default ``pristine,patched``): ``pristine`` is the 0.5.23 wheel unpacked, ``patched`` the
same with the set applied (sglang_patches/tools/patchset.py ``apply_to``), each put first on ``PYTHONPATH``;
``installed`` runs against whatever sglang the interpreter has installed (on the GPU host, after
``k26-doctor patches apply``). The interpreter (``--python``, default this one) needs pytest, torch and SGLang's
import-time dependencies (.ci/sglang-test-requirements.txt). ``--cpu`` runs only the files the list marks
``cpu``, under ``TRITON_INTERPRET=1``; ``--gpu`` only those marked ``gpu``. ``sglang.test.test_utils`` (which
the upstream tests import) also needs ``datasets``.

    python3 bench/sglang_upstream_tests.py --tests /path/to/upstream-tests --cpu --out bench/results/up.json
    python3 bench/sglang_upstream_tests.py --tests DIR --gpu --trees installed --python /opt/venv/bin/python

Exit status: 0 when no test regressed (pristine pass -> patched fail), 1 when one did, 3 when nothing ran.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "bench" / "sglang_upstream_tests.json"
SET_DIR = ROOT / "sglang_patches" / "ddtree-0.5.23"
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "sglang_patches" / "tools"))


def build_trees(names: list[str], wheel: Path, work: Path) -> dict[str, Path | None]:
    """``name -> directory to put first on PYTHONPATH`` (None: the interpreter's installed sglang)."""
    import patchset

    trees: dict[str, Path | None] = {}
    for name in names:
        if name == "installed":
            trees[name] = None
        elif name == "pristine":
            dest = work / "pristine"
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(dest, [n for n in zf.namelist() if n.startswith("sglang/")])
            trees[name] = dest
        elif name == "patched":
            dest = work / "patched"
            patchset.apply_to(SET_DIR, wheel, dest, whole=True)
            trees[name] = dest
        else:
            raise SystemExit(f"unknown tree {name!r} (pristine, patched, installed)")
    return trees


def junit_counts(xml_path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failing": []}
    if not xml_path.is_file():
        return counts
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        cid = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            counts["failed"] += 1
            counts["failing"].append(cid)
        elif "error" in kinds:
            counts["errors"] += 1
            counts["failing"].append(cid)
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def run_file(python: str, test: Path, tree: Path | None, interpret: bool, timeout: int, work: Path) -> dict:
    xml = work / f"{test.stem}-{tree.name if tree else 'installed'}.xml"
    # CustomTestCase retries a failing test (SGLANG_TEST_MAX_RETRY): one run each, the verdict as it is
    env = dict(os.environ, NO_COLOR="1", SGLANG_TEST_MAX_RETRY="0")
    if tree is not None:
        env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if interpret:
        env["TRITON_INTERPRET"] = "1"  # not CUDA_VISIBLE_DEVICES="": sglang.test.test_utils indexes its first char
    t0 = time.monotonic()
    try:
        proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(test.parent),
                               f"--junitxml={xml}", str(test)], capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=work)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        rc, tail = 124, f"timed out after {timeout} s"
    out = junit_counts(xml)
    out.update(rc=rc, seconds=round(time.monotonic() - t0, 1), tail=tail if rc not in (0, 5) else "")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", required=True, type=Path, help="directory holding the upstream test files")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--trees", default="pristine,patched")
    ap.add_argument("--wheel", type=Path, help="the sglang 0.5.23 wheel (default: as the tests find it)")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--cpu", action="store_true", help="only the files marked cpu, in Triton's interpreter")
    which.add_argument("--gpu", action="store_true", help="only the files marked gpu")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    listing = json.loads(LIST.read_text())
    entries = [e for e in listing["files"] if e.get("usable", True)
               and (not args.cpu or e["needs"] == "cpu") and (not args.gpu or e["needs"] == "gpu")]
    present = [e for e in entries if (args.tests / e["local_name"]).is_file()]
    missing = [e["local_name"] for e in entries if e not in present]
    names = [t.strip() for t in args.trees.split(",") if t.strip()]
    wheel = args.wheel
    if wheel is None and any(n != "installed" for n in names):
        from sglang_wheels import locate_wheel

        wheel, why = locate_wheel("0.5.23")
        if wheel is None:
            print(f"no wheel: {why}", file=sys.stderr)
            return 3
    report: dict = {"python": args.python, "trees": names, "wheel": str(wheel) if wheel else None,
                    "missing_files": missing, "results": {}, "regressions": []}
    with tempfile.TemporaryDirectory(prefix="sglang-upstream-") as tmpd:
        work = Path(tmpd)
        trees = build_trees(names, wheel, work) if wheel or names == ["installed"] else {}
        for e in present:
            test = args.tests / e["local_name"]
            per = {}
            for name, tree in trees.items():
                per[name] = run_file(args.python, test, tree, args.cpu, args.timeout, work)
                r = per[name]
                print(f"{e['local_name']:45s} {name:9s} passed {r['passed']:3d} failed {r['failed']:3d} "
                      f"skipped {r['skipped']:3d} errors {r['errors']:3d} rc {r['rc']} {r['seconds']} s")
            report["results"][e["local_name"]] = per
            if "pristine" in per and "patched" in per:
                base = per["pristine"]
                passed_before = base["passed"] > 0 and base["rc"] in (0, 1)
                for cid in per["patched"]["failing"]:
                    if passed_before and cid not in base["failing"]:
                        report["regressions"].append(f"{e['local_name']}: {cid}")
                if base["rc"] not in (0, 1, 5) and per["patched"]["rc"] not in (0, 1, 5):
                    continue  # could not run on either tree (collection error): nothing compared
                if base["rc"] in (0, 1) and per["patched"]["rc"] not in (0, 1, 5):
                    report["regressions"].append(f"{e['local_name']}: runs on pristine, not on patched "
                                                 f"(rc {per['patched']['rc']})")
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print("regressions: " + (", ".join(report["regressions"]) or "none"))
    if missing:
        print("not in --tests: " + ", ".join(missing))
    if not report["results"]:
        return 3
    return 1 if report["regressions"] else 0


if __name__ == "__main__":
    sys.exit(main())
