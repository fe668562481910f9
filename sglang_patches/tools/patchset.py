"""Build and check an SGLang patch set (``sglang_patches/<set>/``) against its wheel: a thin command line
over the doctor's patch engine (``doctor.sglang.patching``), so a set is hashed, applied and verified by
the same code that applies it on a host.

Why: the manifest's hashes must come from the wheel and the diffs, never from a hand edit.

``hash``      unpack the files the set touches (and RECORD, METADATA) into a temporary site-packages
              and regenerate ``manifest.json`` with ``doctor.sglang.patching.generate`` (``before`` =
              RECORD's sha256, ``after`` = after applying the patches in order);
``verify``    unpack, then with the engine: every ``before`` hash is the wheel's, the set applies
              strictly (no fuzz) and gives every ``after`` hash, every patched file byte-compiles,
              and reverting restores every file to RECORD (created files gone);
``diff``      write one unified diff (paths relative to site-packages, ``a/...``/``b/...``,
              ``/dev/null`` for created files) from a pristine tree and a modified tree.

Usage::

    python3 sglang_patches/tools/patchset.py hash   sglang_patches/ddtree-0.5.23 WHEEL
    python3 sglang_patches/tools/patchset.py verify sglang_patches/ddtree-0.5.23 WHEEL
    python3 sglang_patches/tools/patchset.py diff PRISTINE MODIFIED OUT.patch REL [REL...]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run from a checkout: use this checkout's engine
    sys.path.insert(0, str(ROOT))

from doctor.core.fileio import DEFAULT_LIMIT, read_capped, read_or_none, read_text  # noqa: E402
from doctor.sglang.patching import generate, udiff  # noqa: E402
from doctor.sglang.patching import manifest as mf  # noqa: E402
from doctor.sglang.patching.engine import Engine, EngineError  # noqa: E402
from doctor.sglang.patching.hashing import record_to_hex, sha256_bytes  # noqa: E402
from doctor.sglang.patching.record import Installed, installed_in, parse_record  # noqa: E402
from doctor.sglang.patching.status import PRISTINE  # noqa: E402


def record_hashes(wheel: Path) -> dict[str, str]:
    """``path -> sha256 hex`` from the wheel's ``*.dist-info/RECORD``."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        if len(names) != 1:
            raise ValueError(f"{wheel}: expected one dist-info/RECORD, found {names}")
        text = zf.read(names[0]).decode("utf-8")
    out = {}
    for path, field in parse_record(text).items():
        digest = record_to_hex(field) if field else None
        if digest:
            out[path] = digest
    return out


def unpack(wheel: Path, dest: Path, members: list[str] | None = None) -> None:
    """Extract ``members`` (all when None) of ``wheel`` into ``dest``; a member the wheel lacks is skipped."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for name in sorted(names if members is None else set(members) & names):
            zf.extract(name, dest)


def load_manifest(set_dir: Path) -> dict:
    return json.loads(read_text(Path(set_dir) / mf.MANIFEST_NAME, mf.MAX_MANIFEST_BYTES, "a manifest"))


def diff_paths(diff_text: str) -> list[tuple[str, bool]]:
    """``(path, created)`` of every file a diff touches, paths relative to site-packages."""
    return [(udiff.strip_prefix(sec.path), sec.creates) for sec in udiff.parse(diff_text.encode())]


def touched_paths(set_dir: Path, manifest: dict) -> list[str]:
    """Every path the set's diffs touch (what an unpack for hashing needs)."""
    out: list[str] = []
    for patch in manifest["patches"]:
        for rel, _ in diff_paths(read_text(Path(set_dir) / patch["diff"], mf.MAX_DIFF_BYTES, "a source patch")):
            if rel not in out:
                out.append(rel)
    return out


def site_of(set_dir: Path, wheel: Path, dest: Path, *, whole: bool = False) -> Installed:
    """A site-packages in ``dest`` holding the wheel's dist-info and the files the set touches (or all)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = [n for n in zf.namelist() if n.endswith((".dist-info/RECORD", ".dist-info/METADATA"))]
    unpack(wheel, dest, None if whole else touched_paths(set_dir, load_manifest(set_dir)) + meta)
    return installed_in(dest)


def cmd_hash(set_dir: Path, wheel: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        pset = generate.generate(set_dir, site_of(set_dir, wheel, Path(tmp)))
    print(f"wrote {Path(set_dir) / mf.MANIFEST_NAME}: {sum(len(p.files) for p in pset.patches)} files")
    return 0


def _engine(set_dir: Path, installed: Installed, state: Path) -> Engine:
    pset = mf.load(Path(set_dir))
    return Engine(pset, installed, state_dir=str(state), package_root=installed.site_packages)


def verify(set_dir: Path, wheel: Path, workdir: Path | None = None) -> list[str]:
    """Problems found (empty list: the set applies, compiles and reverts cleanly); a set the engine
    cannot apply at all raises ``RuntimeError`` naming why."""
    problems: list[str] = []
    manifest = load_manifest(set_dir)
    record = record_hashes(wheel)
    own_tmp = workdir is None
    work = Path(tempfile.mkdtemp(prefix="patchset-")) if own_tmp else Path(workdir)
    try:
        site, state = work / "site", work / "state"
        site.mkdir(parents=True, exist_ok=True)
        installed = site_of(set_dir, wheel, site)
        for patch in manifest["patches"]:
            listed = [(f["path"], f["before"] is None) for f in patch["files"]]
            if diff_paths(read_text(Path(set_dir) / patch["diff"], mf.MAX_DIFF_BYTES, "a source patch")) != listed:
                problems.append(f"{patch['id']}: manifest files differ from the diff's files")
        # The chain of diffs on the pristine files gives every manifest hash (the engine's udiff, strict).
        current: dict[str, bytes | None] = {}
        for patch in manifest["patches"]:
            sections = udiff.parse(read_capped(Path(set_dir) / patch["diff"], mf.MAX_DIFF_BYTES, "a source patch"))
            for f in patch["files"]:
                if f["path"] not in current:
                    p = site / f["path"]
                    current[f["path"]] = read_or_none(p)
                cur = current[f["path"]]
                if (None if cur is None else sha256_bytes(cur)) != f["before"]:
                    problems.append(f"{patch['id']}: {f['path']} before-hash mismatch")
                sec = udiff.match_section(sections, f["path"])
                if sec is None:
                    continue
                try:
                    current[f["path"]] = udiff.apply(cur, sec)
                except udiff.HunkMismatch as exc:
                    raise RuntimeError(f"{patch['id']}: applying {patch['diff']} failed: {exc}") from None
                after = current[f["path"]]
                if (None if after is None else sha256_bytes(after)) != f["after"]:
                    problems.append(f"{patch['id']}: {f['path']} after-hash mismatch")
        if problems:
            return problems
        # Apply and revert for real, through the engine (journal, backups, verification).
        engine = _engine(set_dir, installed, state)
        try:
            engine.apply()
        except EngineError as exc:
            raise RuntimeError(f"applying the set failed: {exc}") from None
        for path, data in current.items():
            if path.endswith(".py") and data is not None:
                try:
                    compile(data, path, "exec", dont_inherit=True)
                except (SyntaxError, ValueError) as e:
                    problems.append(f"{path} does not compile: {e}")
        try:
            engine.revert()
        except EngineError as exc:
            raise RuntimeError(f"reverting the set failed: {exc}") from None
        if engine.status().overall != PRISTINE:
            problems.append(f"after revert the set is {engine.status().overall}, not {PRISTINE}")
        for path in current:
            p = site / path
            if path not in record:
                if p.exists():
                    problems.append(f"{path} still exists after revert")
            elif not p.exists() or sha256_bytes(read_capped(p, DEFAULT_LIMIT, "a source file")) != record[path]:
                problems.append(f"{path} does not match RECORD after revert")
    finally:
        if own_tmp:
            shutil.rmtree(work, ignore_errors=True)
    return problems


def apply_to(set_dir: Path, wheel: Path, dest: Path, *, whole: bool = False) -> None:
    """Unpack ``wheel`` (only the touched files unless ``whole``) into ``dest`` and apply the set (engine)."""
    installed = site_of(set_dir, wheel, dest, whole=whole)
    with tempfile.TemporaryDirectory() as state:
        try:
            _engine(set_dir, installed, Path(state)).apply()
        except EngineError as exc:
            raise RuntimeError(f"applying the set failed: {exc}") from None


def cmd_diff(pristine: Path, modified: Path, out: Path, rels: list[str]) -> int:
    chunks = []
    for rel in rels:
        a, b = pristine / rel, modified / rel
        old = read_or_none(a)
        new = read_or_none(b)
        if old == new:
            raise ValueError(f"{rel}: no change")
        chunks.append(udiff.make_diff(rel, old, new))
    out.write_bytes(b"".join(chunks))
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
