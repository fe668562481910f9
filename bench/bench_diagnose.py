"""How long `diagnose` takes on a large journal, against `grep -c` of one pattern over the same file.

The log (default 50 MB) is what a long failed start looks like: SGLang's per-rank INFO lines, NCCL INFO
chatter, progress bars, and the real failure excerpts of tests/fixtures/diagnose/ spread through it,
so every signature has something to find and the matcher's worst case (many hits) is measured too.

Baseline, in the same run on the same file: `grep -c 'no kernel image is available'` (one fixed string,
the cheapest possible scan). Measured: `read_log` + `diagnose_lines` with the shipped signatures
(in-process; with grep as the literal prefilter, and without it, as on a host with no grep), and the
whole CLI (`python -m doctor diagnose FILE`, interpreter start included). Times are the best of
`--repeat` runs (the median is printed too).

    python bench/bench_diagnose.py [--mb 50] [--repeat 3] [--against REV]

`--against REV` (default e9d74ef, the table before the real-failure corpus's generalisation) times that revision's
signature table on the same log in the same run, interleaved with this table's runs, and prints the ratio of wall-clock
times and of CPU times (this process and its grep: what others do on a shared machine does not add to it).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timing import measure  # noqa: E402 (bench/timing.py: the script's folder is on sys.path)

from doctor.service.diagnose import diagnose_lines, load_signatures, read_log  # noqa: E402

NOISE = [
    "[2026-11-29 10:{m:02d}:{s:02d} TP{r}] Load weight begin. avail mem=178.21 GB",
    "[2026-11-29 10:{m:02d}:{s:02d} TP{r}] Decode batch. #running-req: 12, #token: 40231, token usage: 0.08, "
    "cuda graph: True, gen throughput (token/s): 812.44, #queue-req: 0",
    "gpu-b300-{r}:2949601:2949642 [{r}] NCCL INFO Channel 0{r}/24 : 0[{r}] -> 1[{r}] via P2P/CUMEM/read",
    "Loading safetensors checkpoint shards:  {p}% Completed | {n}/64 [00:{s:02d}<01:02,  1.01it/s]",
    "[2026-11-29 10:{m:02d}:{s:02d}] INFO:     127.0.0.1:4{r}710 - \"GET /health HTTP/1.1\" 503 Service Unavailable",
]


def fixture_bodies() -> list[list[str]]:
    out = []
    for path in sorted((ROOT / "tests" / "fixtures" / "diagnose").glob("*.log")):
        out.append([ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.startswith("# ")])
    return out


def write_log(path: Path, megabytes: int) -> int:
    target = megabytes * 1024 * 1024
    bodies = fixture_bodies()
    size = lines = i = 0
    with open(path, "w", encoding="utf-8") as fh:
        while size < target:
            if i % 5000 == 4999:  # a real failure excerpt every 5000 lines
                chunk = "\n".join(bodies[(i // 5000) % len(bodies)]) + "\n"
            else:
                chunk = NOISE[i % len(NOISE)].format(m=(i // 60) % 60, s=i % 60, r=i % 8, p=i % 100,
                                                     n=i % 64) + "\n"
            fh.write(chunk)
            size += len(chunk.encode())
            lines += chunk.count("\n")
            i += 1
    return lines


def previous_signatures(rev: str) -> list:
    """The built-in signature table as it was at git revision ``rev`` (read with ``git show``)."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:doctor/data/failure_signatures.toml"],
                          capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "failure_signatures.toml"
        path.write_text(text, encoding="utf-8")
        return load_signatures(builtin=path)


def cpu_seconds(fn: Callable[[], object]) -> float:
    """User and system CPU of one call, this process's and its children's (the grep prefilter): unlike wall-clock,
    what other users of a shared machine do does not add to it."""
    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    fn()
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before, strict=True))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", default="e9d74ef", metavar="REV",
                    help="also time the signature table of this git revision on the same log (the same run's "
                         "comparison; '' to skip)")
    args = ap.parse_args()
    sigs = load_signatures()
    previous = previous_signatures(args.against) if args.against else None
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "journal.log"
        n = write_log(log, args.mb)
        print(f"log: {log.stat().st_size / 2**20:.1f} MiB, {n} lines, {len(sigs)} signatures, "
              f"{sum(len(s.patterns) for s in sigs)} patterns")
        grep = measure(lambda: subprocess.run(["grep", "-c", "no kernel image is available", str(log)],
                                              capture_output=True, check=False), args.repeat)
        found: list = []

        def run() -> None:
            found[:] = diagnose_lines(read_log(str(log)), sigs)

        inproc = measure(run, args.repeat)
        nogrep: list = []
        pure = measure(lambda: nogrep.__setitem__(slice(None), diagnose_lines(read_log(str(log)), sigs,
                                                                               use_grep=False)), args.repeat)
        assert [f.signature.id for f in nogrep] == [f.signature.id for f in found], "grep and Python disagree"
        env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
        cli = measure(lambda: subprocess.run([sys.executable, "-m", "doctor", "diagnose", str(log)],
                                             capture_output=True, env=env, check=False), args.repeat)
        print(f"baseline grep -c (one fixed string): {grep[0] * 1000:.0f} ms (median {grep[1] * 1000:.0f})")
        print(f"diagnose in-process: {inproc[0] * 1000:.0f} ms (median {inproc[1] * 1000:.0f}), "
              f"{len(found)} findings, top: {found[0].signature.id if found else None}")
        print(f"diagnose in-process without grep (Python str.find): {pure[0] * 1000:.0f} ms "
              f"(median {pure[1] * 1000:.0f})")
        print(f"diagnose CLI: {cli[0] * 1000:.0f} ms (median {cli[1] * 1000:.0f})")
        print(f"ratio to grep -c: in-process {inproc[0] / grep[0]:.1f}x, without grep {pure[0] / grep[0]:.1f}x, "
              f"CLI {cli[0] / grep[0]:.1f}x")
        if previous is not None:  # interleaved, so that a busy machine slows both tables alike
            pairs, cpu_pairs = [], []
            for i in range(max(3, args.repeat)):
                tables = (sigs, previous) if i % 2 == 0 else (previous, sigs)  # which runs first alternates
                wall = [measure(lambda t=t: diagnose_lines(read_log(str(log)), t), 1)[0] for t in tables]
                cpu = [cpu_seconds(lambda t=t: diagnose_lines(read_log(str(log)), t)) for t in tables]
                pairs.append((wall[0], wall[1]) if i % 2 == 0 else (wall[1], wall[0]))
                cpu_pairs.append((cpu[0], cpu[1]) if i % 2 == 0 else (cpu[1], cpu[0]))
            this_best, that_best = min(p[0] for p in pairs), min(p[1] for p in pairs)
            ratios = sorted(p[0] / p[1] for p in pairs)
            print(f"signatures of {args.against} ({len(previous)}), interleaved with this table: "
                  f"{that_best * 1000:.0f} ms against {this_best * 1000:.0f} ms; this table / that one: "
                  f"{this_best / that_best:.2f}x (best of each), {ratios[len(ratios) // 2]:.2f}x (median of pairs)")
            cpu_this, cpu_that = min(p[0] for p in cpu_pairs), min(p[1] for p in cpu_pairs)
            print(f"CPU time (this process and its grep), best of {len(cpu_pairs)}: {cpu_this * 1000:.0f} ms against "
                  f"{cpu_that * 1000:.0f} ms of {args.against}'s table: {cpu_this / cpu_that:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
