"""Benchmark: ``patches status`` of a 10-file patch set on a real SGLang 0.5.23 install.

Target (issue 6): well under 0.2 s. Measured in the same run against a baseline that does the
irreducible work, reading and hashing those 10 files, so the ratio says what the engine adds
(manifest load, RECORD parse, diff checks, journal lookup). The probe (a child interpreter
that finds site-packages) and the whole CLI (`python -m doctor patches status`) are timed too.

    python3 bench/bench_patches.py                       # the wheel as the tests find it (tests/sglang_wheels.py)
    python3 bench/bench_patches.py --python /opt/venv/bin/python   # an existing install (read only)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from sglang_wheels import locate_wheel, wheel_dir  # noqa: E402
from timing import median_time  # noqa: E402 (bench/timing.py: the script's folder is on sys.path)

from doctor.sglang.patching import generate, locate, manifest, record, udiff  # noqa: E402
from doctor.sglang.patching.engine import Engine  # noqa: E402


def install(tmp: Path, wheels: Path) -> str:
    found = sorted(wheels.glob("sglang-0.5.23-*.whl"))
    if not found and wheels == wheel_dir():  # the tests' place: download into it as they do
        wheel, why = locate_wheel("0.5.23")
        if wheel is None:
            sys.exit(f"{why}; pass --python of an install")
        found = [wheel]
    if not found:
        sys.exit(f"no sglang-0.5.23 wheel in {wheels}; pass --python of an install")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    sp = tmp / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    with zipfile.ZipFile(found[0]) as zf:
        zf.extractall(sp)
    return str(tmp / "venv" / "bin" / "python")


def make_set(set_dir: Path, installed: record.Installed, n: int = 10) -> list[str]:
    """A set of n one-hunk patches on the n largest SGLang sources (hashing cost is realistic)."""
    srt = installed.site_packages / "sglang" / "srt"
    files = sorted(srt.rglob("*.py"), key=lambda p: p.stat().st_size, reverse=True)[:n]
    rels = [str(p.relative_to(installed.site_packages)) for p in files]
    set_dir.mkdir(parents=True)
    for i, rel in enumerate(rels, 1):
        old = (installed.site_packages / rel).read_bytes()
        new = old.replace(b"\nimport ", b"\n# k26-doctor bench\nimport ", 1)
        (set_dir / f"{i:04d}-bench.patch").write_bytes(udiff.make_diff(rel, old, new))
    generate.generate(set_dir, installed, name=set_dir.name)
    return rels


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", help="an existing SGLang 0.5.23 install (only read)")
    ap.add_argument("--wheels", default=str(wheel_dir()), help="directory of sglang wheels (default: as the tests)")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        python = args.python or install(tmp, Path(args.wheels))
        found = locate.locate(python)
        sets = tmp / "sets"
        rels = make_set(sets / "bench10", found.installed)
        paths = [found.package_root / r for r in rels]
        size = sum(p.stat().st_size for p in paths)

        def baseline() -> None:
            for p in paths:
                hashlib.sha256(p.read_bytes()).hexdigest()

        def engine_status() -> None:
            pset = manifest.resolve("bench10", str(sets))
            inst = record.load_installed(found.installed.dist_info, found.installed.site_packages)
            eng = Engine(pset, inst, state_dir=str(tmp / "state"), package_root=found.package_root)
            eng.check_diffs()
            assert eng.status().overall == "pristine"

        def with_probe() -> None:
            again = locate.locate(python)
            pset = manifest.resolve("bench10", str(sets))
            Engine(pset, again.installed, state_dir=str(tmp / "state"), package_root=again.package_root).status()

        def cli() -> None:
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            env.pop("K26_DOCTOR_CONFIG", None)
            subprocess.run([sys.executable, "-m", "doctor", "patches", "status", "--python", python, "--patches-dir",
                            str(sets), "--set", "bench10", "--state-dir", str(tmp / "state")],
                           env=env, capture_output=True, check=False)

        engine_status()
        b = median_time(baseline, args.repeat)
        e = median_time(engine_status, args.repeat)
        p = median_time(with_probe, max(5, args.repeat // 5))
        c = median_time(cli, 5)
        print(f"10-file patch set on sglang {found.installed.version} ({size / 1e6:.2f} MB of sources), "
              f"RECORD {len(found.installed.hashes)} entries; medians")
        print(f"  baseline: read + sha256 of the 10 files      {b * 1e3:8.2f} ms")
        print(f"  engine status (manifest, RECORD, diffs, hash) {e * 1e3:8.2f} ms  = {e / b:5.1f} x baseline")
        print(f"  + probe of the interpreter (child process)   {p * 1e3:8.2f} ms  = {p / b:5.1f} x baseline")
        print(f"  whole CLI `k26-doctor patches status`        {c * 1e3:8.2f} ms")
        print(f"  target < 200 ms: {'met' if p < 0.2 else 'NOT met'} (status incl. probe)")
        try:
            shipped = manifest.resolve("ddtree-0.5.23")
        except manifest.ManifestError:
            return 0
        ship_paths = [found.package_root / r for r in shipped.chains()]

        def ship_baseline() -> None:
            for q in ship_paths:
                if q.exists():
                    hashlib.sha256(q.read_bytes()).hexdigest()

        def ship_status() -> None:
            inst = record.load_installed(found.installed.dist_info, found.installed.site_packages)
            Engine(manifest.resolve("ddtree-0.5.23"), inst, state_dir=str(tmp / "state"),
                   package_root=found.package_root).status()

        sb, ss = median_time(ship_baseline, args.repeat), median_time(ship_status, args.repeat)
        print(f"shipped set ddtree-0.5.23 ({len(ship_paths)} files): baseline {sb * 1e3:.2f} ms, "
              f"engine status {ss * 1e3:.2f} ms = {ss / sb:.1f} x baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
