"""The first run's downloads: what the ``network`` marker stands for, said on the terminal while it happens.

A fresh machine's first run fetches about 1.6 GB of released wheels (SGLang 0.5.23 and 0.5.13.post1,
torch 2.11.0, triton 3.6.0, two sglang-kernel releases, flashinfer-cubin, NVIDIA's cuobjdump and nvcc) and
builds about 0.8 GB of venvs (transformers 4.57.6, 5.19.0 and 5.4.0 with tiktoken and jinja2) into
``~/.cache/k26-doctor-tests`` (``$K26_TEST_WHEEL_CACHE``, ``$K26_TEST_VENV_CACHE``); later runs reuse them.

* Every test that reads them is marked ``network`` (``-m "not network"`` deselects them all). The helpers
  that hand them out call ``used(what)``: a test that is not marked fails, naming what it used, so a missing
  mark cannot hide behind a warm cache.
* Each download and venv build prints a line when it starts and one when it ends (``announce``), on the
  terminal even while pytest captures output (and from xdist workers, whose stderr is the terminal's).
* Under ``-m "not network"`` no download may happen at all (``guard``): the helper fails instead.

Importable without pytest (tests/ddtree_gpu_harness.py runs as a plain script): then nothing is checked.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

MARK = "network"
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


@contextmanager
def downloading(what: str, where: object, size_hint: str = "") -> Iterator[None]:
    """Announce a download or build of ``what`` into ``where`` before it starts and when it ends."""
    guard(what)
    hint = f" ({size_hint})" if size_hint else ""
    announce(f"first run: fetching {what}{hint} into {where}, once; `-m \"not {MARK}\"` skips the tests "
             "that need it")
    t0 = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        announce(f"{'fetched' if ok else 'could not fetch'} {what} in {time.monotonic() - t0:.0f} s")


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
