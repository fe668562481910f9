"""Build and check an SGLang patch set (``sglang_patches/<set>/``) against its wheel.

Why: the manifest's hashes must come from the wheel and the diffs, never from
a hand edit. This script (stdlib + GNU ``patch`` and ``diff``) does three things:

``diff``      write one unified diff (paths relative to site-packages,
              ``a/...`` / ``b/...``, ``/dev/null`` for created files) from a
              pristine tree and a modified tree;
``hash``      fill every patch's ``files`` in ``manifest.json``: the paths each
              diff touches, ``before`` = the sha256 RECORD lists (hex; ``null``
              for a file the patch creates), ``after`` = sha256 after applying
              the patches in order to a pristine unpack of the wheel;
``verify``    unpack the wheel, apply each diff strictly (``patch -p1
              --dry-run`` first, no fuzz), compare the ``after`` hashes, byte-
              compile every patched file, revert in reverse order and compare
              every file with RECORD again (created files must be gone).

Usage::

    python3 sglang_patches/tools/patchset.py hash   sglang_patches/ddtree-0.5.23 WHEEL
    python3 sglang_patches/tools/patchset.py verify sglang_patches/ddtree-0.5.23 WHEEL
    python3 sglang_patches/tools/patchset.py diff PRISTINE MODIFIED OUT.patch REL [REL...]
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

_DIFF_PATH = re.compile(r"^(---|\+\+\+) (\S+)")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hashes(wheel: Path) -> dict[str, str]:
    """``path -> sha256 hex`` from the wheel's ``*.dist-info/RECORD`` (urlsafe base64 there)."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        if len(names) != 1:
            raise ValueError(f"{wheel}: expected one dist-info/RECORD, found {names}")
        text = zf.read(names[0]).decode("utf-8")
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 2 or not row[1]:
            continue
        algo, _, b64 = row[1].partition("=")
        if algo != "sha256":
            continue
        raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
        out[row[0]] = raw.hex()
    return out


def unpack(wheel: Path, dest: Path, members: list[str] | None = None) -> None:
    with zipfile.ZipFile(wheel) as zf:
        if members is None:
            zf.extractall(dest)
        else:
            names = set(zf.namelist())
            for m in members:
                if m in names:
                    zf.extract(m, dest)


def diff_paths(diff_text: str) -> list[tuple[str, bool]]:
    """(relative path, created) for every file a unified diff touches, in order."""
    out: list[tuple[str, bool]] = []
    old = None
    for line in diff_text.splitlines():
        m = _DIFF_PATH.match(line)
        if not m:
            continue
        if m.group(1) == "---":
            old = m.group(2)
        else:
            new = m.group(2)
            if not new.startswith("b/"):
                raise ValueError(f"diff target {new!r} does not start with b/")
            created = old == "/dev/null"
            if not created and old != "a/" + new[2:]:
                raise ValueError(f"diff renames {old} -> {new}; not supported")
            out.append((new[2:], created))
    return out


def run_patch(root: Path, diff: Path, *, reverse: bool = False, dry_run: bool = False) -> None:
    argv = ["patch", "-p1", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "-d", str(root), "-i",
            str(Path(diff).resolve())]
    if reverse:
        argv.append("-R")
    if dry_run:
        argv.append("--dry-run")
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"patch {'-R ' if reverse else ''}{diff.name} failed:\n{proc.stdout}{proc.stderr}")


def touched_paths(set_dir: Path, manifest: dict) -> list[str]:
    """Every path the set's diffs touch (what an unpack for hashing needs)."""
    out: list[str] = []
    for patch in manifest["patches"]:
        for rel, _ in diff_paths((set_dir / patch["diff"]).read_text()):
            if rel not in out:
                out.append(rel)
    return out


def load_manifest(set_dir: Path) -> dict:
    return json.loads((set_dir / "manifest.json").read_text())


def cmd_hash(set_dir: Path, wheel: Path) -> int:
    manifest = load_manifest(set_dir)
    record = record_hashes(wheel)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        unpack(wheel, root, touched_paths(set_dir, manifest))
        for patch in manifest["patches"]:
            diff = set_dir / patch["diff"]
            files = []
            for rel, created in diff_paths(diff.read_text()):
                if created:
                    before = None
                else:
                    if rel not in record:
                        raise ValueError(f"{rel} is not in the wheel's RECORD")
                    before = sha256_hex((root / rel).read_bytes())
                files.append({"path": rel, "before": before})
            run_patch(root, diff, dry_run=True)
            run_patch(root, diff)
            for f in files:
                f["after"] = sha256_hex((root / f["path"]).read_bytes())
            patch["files"] = files
    # `before` of a file first touched by this set must be RECORD's hash.
    seen: set[str] = set()
    for patch in manifest["patches"]:
        for f in patch["files"]:
            if f["path"] not in seen and f["before"] is not None and f["before"] != record[f["path"]]:
                raise ValueError(f"{f['path']}: unpacked file does not match RECORD")
            seen.add(f["path"])
    (set_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {set_dir / 'manifest.json'}: {sum(len(p['files']) for p in manifest['patches'])} files")
    return 0


def verify(set_dir: Path, wheel: Path, workdir: Path | None = None) -> list[str]:
    """Problems found (empty list: the set applies, compiles and reverts cleanly)."""
    problems: list[str] = []
    manifest = load_manifest(set_dir)
    record = record_hashes(wheel)
    own_tmp = workdir is None
    root = Path(tempfile.mkdtemp(prefix="patchset-")) if own_tmp else workdir
    try:
        unpack(wheel, root, touched_paths(set_dir, manifest))
        for patch in manifest["patches"]:
            diff = set_dir / patch["diff"]
            listed = [(f["path"], f["before"] is None) for f in patch["files"]]
            if diff_paths(diff.read_text()) != listed:
                problems.append(f"{patch['id']}: manifest files differ from the diff's files")
            for f in patch["files"]:
                p = root / f["path"]
                cur = sha256_hex(p.read_bytes()) if p.exists() else None
                if cur != f["before"]:
                    problems.append(f"{patch['id']}: {f['path']} before-hash mismatch")
            run_patch(root, diff, dry_run=True)
            run_patch(root, diff)
            for f in patch["files"]:
                if sha256_hex((root / f["path"]).read_bytes()) != f["after"]:
                    problems.append(f"{patch['id']}: {f['path']} after-hash mismatch")
        for patch in manifest["patches"]:
            for f in patch["files"]:
                if f["path"].endswith(".py"):
                    try:
                        compile((root / f["path"]).read_bytes(), f["path"], "exec", dont_inherit=True)
                    except (SyntaxError, ValueError) as e:
                        problems.append(f"{f['path']} does not compile: {e}")
        for patch in reversed(manifest["patches"]):
            run_patch(root, set_dir / patch["diff"], reverse=True, dry_run=True)
            run_patch(root, set_dir / patch["diff"], reverse=True)
        for patch in manifest["patches"]:
            for f in patch["files"]:
                p = root / f["path"]
                if f["before"] is None and f["path"] not in record:
                    if p.exists():
                        problems.append(f"{f['path']} still exists after revert")
                elif not p.exists() or sha256_hex(p.read_bytes()) != record.get(f["path"]):
                    problems.append(f"{f['path']} does not match RECORD after revert")
    finally:
        if own_tmp:
            shutil.rmtree(root, ignore_errors=True)
    return problems


def apply_to(set_dir: Path, wheel: Path, dest: Path, *, whole: bool = False) -> None:
    """Unpack ``wheel`` (only the touched files unless ``whole``) into ``dest`` and apply the set."""
    unpack(wheel, dest, None if whole else touched_paths(set_dir, load_manifest(set_dir)))
    for patch in load_manifest(set_dir)["patches"]:
        run_patch(dest, set_dir / patch["diff"], dry_run=True)
        run_patch(dest, set_dir / patch["diff"])


def cmd_diff(pristine: Path, modified: Path, out: Path, rels: list[str]) -> int:
    chunks = []
    for rel in rels:
        a = pristine / rel
        b = modified / rel
        argv = ["diff", "-u", "--label", "/dev/null" if not a.exists() else f"a/{rel}", "--label", f"b/{rel}",
                str(a) if a.exists() else "/dev/null", str(b)]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode not in (0, 1):
            raise RuntimeError(proc.stderr)
        if proc.returncode == 0:
            raise ValueError(f"{rel}: no change")
        chunks.append(proc.stdout)
    out.write_text("".join(chunks))
    print(f"wrote {out}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "hash":
        return cmd_hash(Path(argv[1]), Path(argv[2]))
    if len(argv) >= 3 and argv[0] == "verify":
        problems = verify(Path(argv[1]), Path(argv[2]))
        for p in problems:
            print("FAIL", p)
        print("ok" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    if len(argv) >= 5 and argv[0] == "diff":
        return cmd_diff(Path(argv[1]), Path(argv[2]), Path(argv[3]), argv[4:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
