"""The strict unified-diff applier against real SGLang sources, cross-checked with GNU patch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from patches_install import FIXTURE_SETS, fresh_venv, pristine_venv

from doctor.sglang.patching import udiff
from doctor.sglang.patching.hashing import hex_to_record, normalize_digest, record_to_hex, sha256_bytes
from doctor.sglang.patching.manifest import load

GNU_PATCH = shutil.which("patch")
needs_gnu_patch = pytest.mark.skipif(GNU_PATCH is None, reason="GNU patch is not installed")
TRITON = "sglang/srt/layers/attention/triton_backend.py"


@pytest.fixture(scope="module")
def real_source(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return (pristine_venv("0.5.23", tmp_path_factory).site_packages / TRITON).read_bytes()


@pytest.mark.network
def test_roundtrip_and_reverse_on_a_real_file(real_source: bytes) -> None:
    lines = real_source.split(b"\n")
    lines[10:12] = [b"# replaced"]
    lines.insert(400, b"    pass  # inserted")
    new = b"\n".join(lines)
    diff = udiff.make_diff(TRITON, real_source, new)
    (sec,) = udiff.parse(diff)
    assert udiff.apply(real_source, sec) == new
    assert udiff.apply(new, sec.reversed()) == real_source


def test_create_delete_and_missing_final_newline() -> None:
    created = udiff.parse(udiff.make_diff("pkg/new.py", None, b"a\nb"))[0]
    assert created.creates and udiff.apply(None, created) == b"a\nb"
    with pytest.raises(udiff.HunkMismatch, match="already exists"):
        udiff.apply(b"x\n", created)
    deleted = udiff.parse(udiff.make_diff("pkg/old.py", b"x\ny\n", None))[0]
    assert deleted.deletes and udiff.apply(b"x\ny\n", deleted) is None
    with pytest.raises(udiff.HunkMismatch):
        udiff.apply(b"x\nz\n", deleted)
    eol = udiff.parse(udiff.make_diff("f", b"a\nb\n", b"a\nb"))[0]
    assert udiff.apply(b"a\nb\n", eol) == b"a\nb"
    assert udiff.apply(b"a\nb", eol.reversed()) == b"a\nb\n"


@pytest.mark.network
def test_strict_means_exact_place_and_bytes(real_source: bytes) -> None:
    new = real_source.replace(b"\nimport ", b"\nimport os  # x\nimport ", 1)
    (sec,) = udiff.parse(udiff.make_diff(TRITON, real_source, new))
    shifted = b"# one more line\n" + real_source
    with pytest.raises(udiff.HunkMismatch, match=r"hunk 1 .* does not apply: line \d+"):
        udiff.apply(shifted, sec)
    assert udiff.apply(shifted, sec, allow_offset=True) == b"# one more line\n" + new
    crlf = real_source.replace(b"\n", b"\r\n")
    with pytest.raises(udiff.HunkMismatch):
        udiff.apply(crlf, sec, allow_offset=True)  # a differing byte is never fuzzed over


@pytest.mark.parametrize("text, match", [
    (b"", "no file sections"),
    (b"--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n", "ends early"),
    (b"--- a/x\n+++ b/x\n@@ -1 +1 @@\n a\n b\n", "more lines|ends early|start with"),
    (b"--- a/x\n+++ b/x\n@@ bogus @@\n", "malformed hunk header"),
    (b"@@ -1 +1 @@\n-a\n+b\n", "without a"),
    (b"diff --git a/x b/x\nGIT binary patch\nliteral 0\n", "binary"),
    (b"diff --git a/x b/y\nrename from x\nrename to y\n", "renames"),
    (b"--- a/x\n+++ b/x\n@@ -1 +1 @@\n*a\n", "must start with"),
])
def test_malformed_diffs_are_refused_clearly(text: bytes, match: str) -> None:
    with pytest.raises(udiff.PatchFormatError, match=match):
        udiff.parse(text)


def test_section_matching_accepts_repo_layout_paths() -> None:
    secs = udiff.parse(b"--- a/python/sglang/srt/x.py\n+++ b/python/sglang/srt/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert udiff.match_section(secs, "sglang/srt/x.py") is secs[0]
    assert udiff.match_section(secs, "srt/y.py") is None


def test_record_hash_spellings() -> None:
    digest = sha256_bytes(b"abc")
    assert record_to_hex(hex_to_record(digest)) == digest
    assert normalize_digest(hex_to_record(digest)) == digest
    assert normalize_digest(digest.upper()) == digest
    for bad in ("sha256=", "md5=abc", "xyz", "a" * 63):
        with pytest.raises(ValueError):
            normalize_digest(bad)


# -- GNU patch cross-check -----------------------------------------------------------------------

def gnu_apply(site: Path, diff: Path, *, dry: bool) -> subprocess.CompletedProcess[str]:
    argv = [GNU_PATCH or "patch", "-p1", "--batch", "--fuzz=0", "-d", str(site), "-i", str(diff)]
    return subprocess.run(argv + (["--dry-run"] if dry else []), capture_output=True, text=True, timeout=60)


@pytest.mark.network
@needs_gnu_patch
@pytest.mark.parametrize("set_name, version", [("t-0.5.23", "0.5.23"), ("t-0.5.13", "0.5.13.post1")])
def test_fixture_sets_agree_with_gnu_patch(set_name: str, version: str, tmp_path_factory: pytest.TempPathFactory,
                                           tmp_path: Path) -> None:
    """GNU patch (no fuzz) accepts each diff and writes the very bytes whose hashes the manifest lists."""
    venv = fresh_venv(version, tmp_path_factory, tmp_path / "venv")
    pset = load(FIXTURE_SETS / set_name)
    for patch in pset.patches:
        assert gnu_apply(venv.site_packages, pset.diff_path(patch), dry=True).returncode == 0
        res = gnu_apply(venv.site_packages, pset.diff_path(patch), dry=False)
        assert res.returncode == 0, res.stdout + res.stderr
        for change in patch.files:
            target = venv.site_packages / change.path
            got = sha256_bytes(target.read_bytes()) if target.exists() else None
            assert got == change.after, change.path


@pytest.mark.network
@needs_gnu_patch
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_edits_agree_with_gnu_patch(real_source: bytes, tmp_path_factory: pytest.TempPathFactory,
                                           data: st.DataObject) -> None:
    """Random real-looking edits: our result equals GNU patch's; a corrupted context is refused by both."""
    lines = real_source.split(b"\n")[:300]
    base = b"\n".join(lines) + b"\n"
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(lines) - 1), st.integers(0, 3),
                                         st.sampled_from([b"", b"    x = 1", b"# k26"])), min_size=1, max_size=5))
    new_lines = list(lines)
    for at, cut, text in sorted(edits, reverse=True):
        new_lines[at:at + cut] = [text] if text else []
    new = b"\n".join(new_lines) + b"\n"
    if new == base:
        return
    diff = udiff.make_diff("pkg/f.py", base, new)
    ours = udiff.apply(base, udiff.parse(diff)[0])
    assert ours == new
    work = tmp_path_factory.mktemp("gnu")
    (work / "pkg").mkdir()
    (work / "pkg/f.py").write_bytes(base)
    (work / "d.patch").write_bytes(diff)
    assert gnu_apply(work, work / "d.patch", dry=False).returncode == 0
    assert (work / "pkg/f.py").read_bytes() == ours
    # corrupt one line the first hunk relies on: strict refuses; with offsets allowed (never fuzz) we find
    # what GNU patch --fuzz=0 finds, or both refuse
    hunk = udiff.parse(diff)[0].hunks[0]
    idx = (hunk.old_start - 1) if hunk.old_count else None
    if idx is None or idx >= len(lines):
        return
    broken_lines = list(lines)
    broken_lines[idx] = broken_lines[idx] + b"  # drift"
    broken = b"\n".join(broken_lines) + b"\n"
    (work / "pkg/f.py").write_bytes(broken)
    with pytest.raises(udiff.HunkMismatch):
        udiff.apply(broken, udiff.parse(diff)[0])
    try:
        ours = udiff.apply(broken, udiff.parse(diff)[0], allow_offset=True)
    except udiff.HunkMismatch:
        ours = None
    gnu = gnu_apply(work, work / "d.patch", dry=False)
    assert (gnu.returncode == 0) == (ours is not None), gnu.stdout
    if ours is not None:
        assert (work / "pkg/f.py").read_bytes() == ours
