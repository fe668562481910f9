"""Regenerate doctor/data/compat.toml's SGLang and torch pins from the released wheels' metadata.

For each SGLang release: the torch, sglang-kernel and flashinfer-python versions its ``Requires-Dist``
pins; for each torch release those name: the Triton its ``Requires-Dist`` pins. Read with pip itself
(``pip install --dry-run --no-deps --report``: the wheel's own METADATA as the index serves it, no
wheel download). The generated blocks between the ``BEGIN``/``END`` marks of compat.toml are
replaced; the rest of the file is left as it is.

    python tools/sglang_pins.py [--releases 12] [--check]      (--check: exit 1 if the file would change)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "doctor" / "data" / "compat.toml"
COMPONENTS = {"torch": "torch", "sglang-kernel": "sglang_kernel", "sgl-kernel": "sglang_kernel",
              "flashinfer-python": "flashinfer"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requires(project: str, version: str) -> list[str]:
    """``Requires-Dist`` of ``project==version`` as pip reads it from the index (``===``: never a local build
    such as torch 2.13.0+cpu, whose metadata differs)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                        "--quiet", "--report", str(report), f"{project}==={version}"], check=True, timeout=600,
                       capture_output=True)
        doc = json.loads(report.read_text())
    return list(doc["install"][0]["metadata"].get("requires_dist") or [])


def pins(reqs: list[str], wanted: dict[str, str]) -> dict[str, str]:
    """``{component: version or specifier}`` for the wanted distributions (markers other than extras ignored)."""
    from packaging.requirements import Requirement

    out = {}
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        comp = wanted.get(norm(req.name))
        if comp is None:
            continue
        specs = list(req.specifier)
        out[comp] = specs[0].version if len(specs) == 1 and specs[0].operator == "==" else str(req.specifier)
    return out


def releases(project: str, count: int) -> list[str]:
    res = subprocess.run([sys.executable, "-m", "pip", "index", "versions", project], capture_output=True, text=True,
                         check=True, timeout=300)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("Available versions:"))
    return [v.strip() for v in line.split(":", 1)[1].split(",")][:count]


def render(sglang: dict[str, dict[str, str]], torch: dict[str, str]) -> tuple[str, str]:
    a = []
    for version, p in sglang.items():
        a.append(f'[sglang."{version}"]')
        a.extend(f'{k} = "{p[k]}"' for k in ("torch", "sglang_kernel", "flashinfer") if k in p)
        a.append("")
    b = [f'"{v}" = "{t}"' for v, t in sorted(torch.items(), key=lambda kv: [int(x) for x in kv[0].split(".")])]
    return "\n".join(a).rstrip() + "\n", "\n".join(b) + "\n"


def replace_block(text: str, name: str, body: str) -> str:
    """``body`` between the block's marks; a hand-written line of the same table with a key the body sets is dropped."""
    begin, end = f"# BEGIN {name} (tools/sglang_pins.py)\n", f"# END {name}\n"
    head, tail = text[:text.index(begin)], text[text.index(end):]
    table = head.rfind("\n[") + 1  # the table the block belongs to starts at the last header above it
    keys = set(re.findall(r'^("[^"]+") = ', body, re.M))
    own = [ln for ln in head[table:].splitlines(keepends=True) if ln.split(" = ", 1)[0] not in keys]
    return head[:table] + "".join(own) + begin + body + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", type=int, default=12, help="how many recent SGLang releases")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    sglang = {v: pins(requires("sglang", v), COMPONENTS) for v in releases("sglang", args.releases)}
    torch = {}
    for p in sglang.values():
        if "torch" in p and p["torch"] not in torch and re.fullmatch(r"[\d.]+", p["torch"]):
            triton = pins(requires("torch", p["torch"]), {"triton": "triton"}).get("triton")
            if triton:
                torch[p["torch"]] = triton
    old = DATA.read_text()
    a, b = render(sglang, torch)
    new = replace_block(replace_block(old, "sglang pins", a), "torch triton pins", b)
    if args.check:
        return int(new != old)
    DATA.write_text(new)
    print(f"{DATA}: {len(sglang)} SGLang releases, {len(torch)} torch releases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
