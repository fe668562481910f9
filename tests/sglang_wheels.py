"""Released wheels for tests: SGLang's sources (unpacked, never imported) and binary wheels' files.

One place finds a release's wheel (``locate_wheel``): the directory ``$SGLANG_WHEELS`` if set, else the
per-user cache ``$K26_TEST_WHEEL_CACHE`` (default ``~/.cache/k26-doctor-tests``). A wheel absent there is
fetched into that directory with ``pip download --no-deps`` (CI has PyPI), through a temporary directory
and a rename, so an interrupted run never leaves half a wheel. Without network a test that needs it skips,
saying why -- except under CI (``$CI`` set), where a missing wheel is a failure: CI reaches PyPI, so a skip
there would hide a test that never ran.

Every download says so on the terminal while it happens, and the tests that read a wheel are marked
``network`` (tests/downloads.py: ``-m "not network"`` runs without any of it).

Importable without pytest (tests/ddtree_gpu_harness.py runs as a plain script).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import downloads

VERSIONS = ("0.5.23", "0.5.13.post1")


def wheel_dir() -> Path:
    """Where the wheels are looked for and downloaded to."""
    env = os.environ.get("SGLANG_WHEELS")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("K26_TEST_WHEEL_CACHE") or Path.home() / ".cache" / "k26-doctor-tests")


WHEELS = wheel_dir()
CACHE = Path(os.environ.get("K26_TEST_WHEEL_CACHE") or Path.home() / ".cache" / "k26-doctor-tests")


def _stem(project: str) -> str:
    return re.sub(r"[-_.]+", "_", project).lower()


def installable(wheel: Path) -> bool:
    """Whether pip installs ``wheel`` into this interpreter: one of its tags is one this Python supports
    (a cp311 wheel is not, on Python 3.12)."""
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        tags = parse_wheel_filename(wheel.name)[3]
    except InvalidWheelFilename:
        return False
    return not tags.isdisjoint(sys_tags())


def _found(d: Path, version: str, project: str, for_install: bool = False) -> Path | None:
    hits = sorted(d.glob(f"{_stem(project)}-{version}-*.whl")) if d.is_dir() else []
    if for_install:
        hits = [h for h in hits if installable(h)]
    return hits[0] if hits else None


def locate_wheel(version: str, download: bool = True, package: str = "sglang",
                 pip_args: tuple[str, ...] = (), for_install: bool = False) -> tuple[Path | None, str]:
    """``(wheel, "")``, or ``(None, why)``: looked for in ``wheel_dir()`` and the cache, else downloaded into
    the cache (``pip_args`` pick one platform's wheel, e.g. ``--platform``). Tests that only read a wheel's
    files take any platform's; ``for_install``: one that pip installs into this interpreter."""
    downloads.used(f"the {package} {version} wheel")
    for d in dict.fromkeys((wheel_dir(), CACHE)):
        hit = _found(d, version, package, for_install)
        if hit is not None:
            return hit, ""
    d = CACHE
    what = f"{package} {version} wheel" + (f" for Python {sys.version_info[0]}.{sys.version_info[1]}"
                                            if for_install else "")
    if not download:
        return None, f"no {what} in {wheel_dir()} or {d}"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return None, f"no {package} {version} wheel in {d}, and it cannot be written: {exc}"
    # One download per wheel: test processes that need the same one wait for it instead of fetching it again.
    with locked(d / f".{package}-{version}-{'-'.join(pip_args).replace('/', '_')}.download.lock"):
        hit = _found(d, version, package, for_install)
        if hit is not None:
            return hit, ""
        return _download(d, version, package, pip_args, for_install)


def _download(d: Path, version: str, package: str, pip_args: tuple[str, ...],
              for_install: bool = False) -> tuple[Path | None, str]:
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=d))
    except OSError as exc:
        return None, f"no {package} {version} wheel in {d}, and it cannot be written: {exc}"
    try:
        # pip's own temporary files (where the wheel grows while it downloads) under ``tmp``: the progress lines
        # count them
        env = dict(os.environ, TMPDIR=str(tmp))
        with downloads.downloading(f"{package}=={version}", d, watch=tmp):
            res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp),
                                  *pip_args, f"{package}=={version}"], capture_output=True, text=True, timeout=1800,
                                 env=env)
        got = _found(tmp, version, package, for_install)
        if got is None:
            return None, (f"no {package} {version} wheel in {d}, and pip download failed "
                          f"(rc {res.returncode}): {res.stderr.strip()[-300:]}")
        os.replace(got, d / got.name)
    except subprocess.TimeoutExpired:
        return None, f"no {package} {version} wheel in {d}, and pip download did not finish in 1800 s"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _found(d, version, package, for_install), ""


def fetch_wheel(project: str, version: str, pip_args: tuple[str, ...] = (), for_install: bool = False) -> Path:
    """The released wheel of ``project==version``, for a test: located (downloaded if need be), else skip --
    fail under CI."""
    import pytest

    wheel, why = locate_wheel(version, package=project, pip_args=pip_args, for_install=for_install)
    if wheel is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI reaches PyPI, so this must not skip: {why}")
        pytest.skip(why)
    return wheel


def wheel_for(version: str, package: str = "sglang", for_install: bool = False) -> Path:
    """SGLang's released wheel: any platform's for its files; ``for_install``, the one pip installs here."""
    return fetch_wheel(package, version, for_install=for_install)


def release_requires(project: str, version: str) -> list[str]:
    """The ``Requires-Dist`` of a released wheel as the index serves its METADATA (``pip install --dry-run
    --report``: no wheel download), kept in the cache once read. ``===``: never a local build (torch +cpu)."""
    downloads.used(f"{project} {version}'s metadata from the index")
    stem = re.sub(r"[-_.]+", "_", project).lower()
    cached = CACHE / "metadata" / f"{stem}-{version}.json"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")  # processes running in parallel write their own
        with downloads.downloading(f"{project} {version}'s metadata", cached.parent, "a few kB"):
            res = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
                                  "--ignore-installed", "--quiet", "--report", str(tmp), f"{project}==={version}"],
                                 capture_output=True, text=True, timeout=600)
        if res.returncode != 0 or not tmp.is_file():
            import pytest

            pytest.skip(f"cannot read {project} {version}'s metadata with pip: {res.stderr[-300:]}")
        tmp.replace(cached)
    doc = json.loads(cached.read_text())
    return list(doc["install"][0]["metadata"].get("requires_dist") or [])


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock on ``path`` (created): one test process at a time builds a shared cache entry
    (pytest-xdist runs the suite in several processes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def unpacked(wheel: Path, keep) -> Path:
    """The members of ``wheel`` that ``keep(name)`` selects, extracted once into the cache and reused.

    A half-extracted tree (an interrupted run) is never reused: the ``.complete`` mark is written last.
    """
    dest = CACHE / "unpacked" / wheel.name[:-len(".whl")]
    if (dest / ".complete").is_file():
        return dest
    with locked(dest.parent / f".{dest.name}.lock"):
        if (dest / ".complete").is_file():  # another process made it while this one waited
            return dest
        shutil.rmtree(dest, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(dest, [n for n in zf.namelist() if keep(n)])
        (dest / ".complete").write_text(wheel.name + "\n")
    return dest


def content_hash(inputs: list[Path], extra: object = None) -> str:
    """A hash of the content of ``inputs`` (files or directories, with their paths; ``__pycache__`` left out) and
    of ``extra`` (anything JSON: arguments, an interpreter's identity, environment variables)."""
    h = hashlib.sha256()
    for root in inputs:
        files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if root.is_dir() else [root]
        for f in files:
            h.update(str(f.relative_to(root.parent)).encode() + b"\0" + f.read_bytes() + b"\0")
    if extra is not None:
        h.update(json.dumps(extra, sort_keys=True).encode())
    return h.hexdigest()[:16]


def project_sources(*scripts: Path) -> list[Path]:
    """``scripts`` and every module of the checkout (tests/ and the packages) they import, at any depth and inside
    functions too (``modulefinder``: read, not run): the inputs of a child that runs them, for ``computed_once``,
    so that a change to a helper it imports computes its result again. Modules outside the checkout (the standard
    library, torch, SGLang) are the interpreter's: ``interpreters.identity`` names them."""
    import modulefinder

    root = Path(__file__).resolve().parents[1]
    found: set[Path] = set()
    for script in scripts:
        finder = modulefinder.ModuleFinder(path=[str(root / "tests"), str(root)])
        finder.run_script(str(script))
        found |= {Path(m.__file__).resolve() for m in finder.modules.values() if m.__file__}
    return sorted(found | {Path(s).resolve() for s in scripts})


def built_once(name: str, inputs: list[Path], build, extra: object = None) -> Path:
    """A directory ``build(dest)`` fills, made once into the cache per content of ``inputs`` (files or
    directories, hashed with their paths) and of ``extra`` (``content_hash``), and reused by later test processes
    and runs; a changed input makes a new one. Locked, and marked complete last, as ``unpacked``."""
    dest = CACHE / "built" / f"{name}-{content_hash(inputs, extra)}"
    if (dest / ".complete").is_file():
        return dest
    with locked(dest.parent / f".{dest.name}.lock"):
        if not (dest / ".complete").is_file():
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            build(dest)
            (dest / ".complete").write_text(name + "\n")
    return dest


def computed_once(name: str, inputs: list[Path], extra: object, compute) -> dict:
    """What ``compute()`` measures, as JSON: computed once into the cache per content of ``inputs`` and ``extra``
    (everything else the result depends on: the interpreter's identity, the environment, the arguments) and
    reused by later test processes and runs, as ``built_once`` reuses a directory. ``compute`` returns
    ``(result, keep)``: a result it does not vouch for (the child crashed, a module was missing) is returned and
    not kept, so the next run computes it again. Locked; written whole or not at all."""
    dest = CACHE / "results" / f"{name}-{content_hash(inputs, extra)}.json"
    with contextlib.suppress(ValueError, OSError):
        return json.loads(dest.read_text())
    with locked(dest.parent / f".{dest.name}.lock"):
        with contextlib.suppress(ValueError, OSError):  # another process computed it while this one waited
            return json.loads(dest.read_text())
        result, keep = compute()
        if keep:
            tmp = dest.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(result))
            tmp.replace(dest)
    return result


# The parts of the package the server's parser definition lives in (and imports its choices from);
# the rest (models, kernels: most of the 2,000 files) only costs unpacking time.
PARSER_PARTS = ("sglang/srt/arg_groups/", "sglang/srt/parser/", "sglang/srt/function_call/", "sglang/srt/utils/",
                "sglang/srt/speculative/", "sglang/srt/model_executor/", "sglang/srt/entrypoints/",
                "sglang/srt/managers/scheduler.py")  # the patch set hooks the scheduler too


def pinned(version: str, dependency: str) -> str | None:
    """The exact version sglang ``version`` pins ``dependency`` to (``Requires-Dist: dep==X``), if it does."""
    with zipfile.ZipFile(wheel_for(version)) as zf:
        meta = zf.read(f"sglang-{version}.dist-info/METADATA").decode()
    for line in meta.splitlines():
        head, _, spec = line.partition("Requires-Dist: ")
        if not head and spec.split(";")[0].strip().lower().startswith(f"{dependency.lower()}=="):
            return spec.split(";")[0].split("==", 1)[1].strip()
    return None


def unpack(version: str, dest: Path, whole: bool = False, also: tuple[str, ...] = ()) -> Path:
    """Unpack the wheel's parser sources (``whole``: every Python file), the files ``also`` names and the
    metadata into ``dest``."""
    with zipfile.ZipFile(wheel_for(version)) as zf:
        names = [n for n in zf.namelist()
                 if (n.endswith(".py") and (whole or n.startswith(PARSER_PARTS) or (n.count("/") == 2 and
                                            n.startswith("sglang/srt/"))))
                 or n in ("sglang/__init__.py", "sglang/launch_server.py") or n in also
                 or n.startswith(f"sglang-{version}.dist-info/")]
        zf.extractall(dest, names)
    return dest


PATCH_SET = Path(__file__).resolve().parents[1] / "sglang_patches" / "ddtree-0.5.23"
FLAG_PATCHES = ("0001-ddtree-utils.patch", "0002-ddtree-algorithm-and-flags.patch")
_SITES: dict[str, Path] = {}


def patched_files(patches: tuple[str, ...] = FLAG_PATCHES) -> tuple[str, ...]:
    """The files of the wheel that ``patches`` change (their ``+++ b/`` lines)."""
    return tuple(sorted({line[len("+++ b/"):].strip() for patch in patches
                         for line in (PATCH_SET / patch).read_text().splitlines() if line.startswith("+++ b/")}))


def site(version: str, factory) -> Path:
    """A site-packages holding the real sources of ``version``, unpacked once per session."""
    downloads.used(f"the sglang {version} wheel")
    if version not in _SITES:
        _SITES[version] = unpack(version, factory.mktemp(f"sglang-{version}"))
    return _SITES[version]


def ddtree_site(factory) -> Path:
    """0.5.23 with the project's real DDTree patches applied (git apply, as a user would patch by hand)."""
    downloads.used("the sglang 0.5.23 wheel")
    if "ddtree" not in _SITES:
        # the parser's sources and every file the patches change (some lie outside the parser's parts)
        dest = unpack("0.5.23", factory.mktemp("sglang-0.5.23-ddtree"), also=patched_files())
        for patch in FLAG_PATCHES:
            res = subprocess.run(["git", "apply", "-p1", str(PATCH_SET / patch)], cwd=dest, capture_output=True,
                                 text=True, timeout=60)
            assert res.returncode == 0, f"{patch}: {res.stderr}"
        _SITES["ddtree"] = dest
    return _SITES["ddtree"]
