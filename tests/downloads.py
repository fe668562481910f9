"""The first run's downloads: what the ``network`` marker stands for, said on the terminal while it happens.

A fresh machine's first run fetches about 1.6 GB of released wheels (SGLang 0.5.23 and 0.5.13.post1,
torch 2.11.0, triton 3.6.0, two sglang-kernel releases, flashinfer-cubin, NVIDIA's cuobjdump and nvcc) and
builds about 0.8 GB of venvs (transformers 4.57.6, 5.19.0 and 5.4.0 with tiktoken and jinja2) into
``~/.cache/k26-doctor-tests`` (``$K26_TEST_WHEEL_CACHE``, ``$K26_TEST_VENV_CACHE``); later runs reuse them.

* Every test that reads them is marked ``network`` (``-m "not network"`` deselects them all). The helpers
  that hand them out call ``used(what)``: a test that is not marked fails, naming what it used, so a missing
  mark cannot hide behind a warm cache.
* Each download and venv build prints a line when it starts and one when it ends (``announce``), on the
  terminal even while pytest captures output (and from xdist workers, whose stderr is the terminal's); while it
  runs, a line every ``PROGRESS_S`` seconds with the bytes written so far and the rate (``watch``: the directory
  the download or build writes, pip's temporary files included when its TMPDIR is there), and the end line
  says the size and the mean rate.
* Under ``-m "not network"`` no download may happen at all (``guard``): the helper fails instead.

Importable without pytest (tests/ddtree_gpu_harness.py runs as a plain script): then nothing is checked.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

MARK = "network"
PROGRESS_S = 5.0  # seconds between two progress lines of a download or a build
T = TypeVar("T")
# Set by tests/conftest.py for the test being run: its node id and whether it is marked ``network``.
current: dict[str, object] = {"nodeid": None, "marked": True, "offline": False}
# Set by tests/conftest.py: writes a line past pytest's capture. Plain stderr outside pytest.
_writer: list[Callable[[str], None]] = []


def announce(line: str) -> None:
    """One line on the terminal, whatever pytest captures."""
    text = f"\n[k26-doctor tests] {line}"
    if _writer:
        _writer[0](text)
        return
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def used(what: str) -> None:
    """The running test reads ``what``, which the first run downloads: it must be marked ``network``."""
    nodeid = current["nodeid"]
    if nodeid is None or current["marked"]:
        return
    import pytest

    pytest.fail(f"{nodeid} reads {what}, a first-run download, but is not marked `{MARK}` "
                f"(add @pytest.mark.{MARK}, or pytestmark = pytest.mark.{MARK} for the module)", pytrace=False)


def guard(what: str) -> None:
    """Before a download: refused when the run deselected ``network`` (``-m "not network"``)."""
    if current["offline"]:
        import pytest

        pytest.fail(f"would download {what}, but this run deselects `{MARK}` tests: "
                    f"{current['nodeid']} is not marked `{MARK}`", pytrace=False)


def tree_bytes(where: Path) -> int:
    """Bytes of the regular files under ``where`` (a file that vanishes while it is counted counts 0)."""
    total = 0
    for root, _dirs, files in os.walk(where):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def size(n: float) -> str:
    """``n`` bytes as a person reads them: ``312 MB``, ``1.6 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


class Progress:
    """A thread that says every ``every`` seconds how much ``watch`` grew since the start, and how fast."""

    def __init__(self, what: str, watch: Path, every: float = PROGRESS_S) -> None:
        self.what, self.watch, self.every = what, Path(watch), every
        self.start_bytes = tree_bytes(self.watch) if self.watch.exists() else 0
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name=f"progress:{what}", daemon=True)

    def grown(self) -> int:
        return max(0, (tree_bytes(self.watch) if self.watch.exists() else 0) - self.start_bytes)

    def line(self) -> str:
        took = max(time.monotonic() - self.t0, 1e-6)
        got = self.grown()
        return f"{size(got)} in {took:.0f} s ({size(got / took)}/s)"

    def run(self) -> None:
        while not self.stop.wait(self.every):
            announce(f"fetching {self.what}: {self.line()} so far")

    def __enter__(self) -> Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


@contextmanager
def downloading(what: str, where: object, size_hint: str = "", watch: Path | None = None,
                every: float = PROGRESS_S) -> Iterator[None]:
    """Announce a download or build of ``what`` into ``where`` before it starts and when it ends; with ``watch``
    (the directory it writes), a progress line every ``every`` seconds: bytes so far and the rate."""
    guard(what)
    hint = f" ({size_hint})" if size_hint else ""
    announce(f"first run: fetching {what}{hint} into {where}, once; `-m \"not {MARK}\"` skips the tests "
             "that need it")
    t0 = time.monotonic()
    ok = False
    progress = Progress(what, watch, every) if watch is not None else None
    try:
        if progress is not None:
            with progress:
                yield
        else:
            yield
        ok = True
    finally:
        took = f"in {time.monotonic() - t0:.0f} s" if progress is None else progress.line()
        announce(f"{'fetched' if ok else 'could not fetch'} {what} {took}")


def reads(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """``functools.cache`` for a helper built from a first-run download: every call, cached or not, counts as
    a use of ``what`` by the running test (``used``)."""
    def deco(func: Callable[..., T]) -> Callable[..., T]:
        cached = functools.cache(func)

        @functools.wraps(func)
        def wrapper(*args: object, **kwargs: object) -> T:
            used(what)
            return cached(*args, **kwargs)

        wrapper.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        return wrapper

    return deco
