"""The libtorch ABI read from the binaries: real sglang-kernel wheels against torch 2.11.0's libraries,
and libraries built with gcc for the lookup's corners (hash table or none, weak references)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
from kernel_wheels import MISSING_0_4_10, kernel_site, torch_site
from stack_support import workdir

from doctor.stack import abi
from doctor.stack.elf import ElfFile


def torch_libs() -> list[str]:
    return sorted(str(p) for p in (torch_site() / "torch" / "lib").iterdir() if ".so" in p.name)


def needed(path: Path) -> list[str]:
    with ElfFile(str(path)) as elf:
        return abi.needed_torch_symbols(elf)


@pytest.mark.network
def test_sglang_kernel_0_4_10_needs_symbols_torch_2_11_lacks():
    with abi.TorchLibraries(torch_libs()) as libs:
        assert not libs.errors
        missing = libs.missing(needed(kernel_site() / "sgl_kernel/sm90/common_ops.abi3.so"))
    assert set(missing) == MISSING_0_4_10


@pytest.mark.network
def test_sglang_kernel_0_4_5_resolves_against_torch_2_11():
    with abi.TorchLibraries(torch_libs()) as libs:
        for path in sorted((kernel_site("0.4.5") / "sgl_kernel").rglob("*.so")):
            want = needed(path)
            assert want, path  # they do need torch: the test would pass vacuously otherwise
            assert libs.missing(want) == [], path


@pytest.mark.network
def test_hash_lookup_agrees_with_reading_every_symbol():
    """The .gnu.hash lookup answers exactly as decoding all 100,000 names of torch's libraries does."""
    defined: set[bytes] = set()
    for lib in torch_libs():
        with ElfFile(lib) as elf:
            defined |= abi.defined_names(elf)
    want = set()
    for site in (kernel_site(), kernel_site("0.4.5")):
        for path in (site / "sgl_kernel").rglob("*.so"):
            want.update(needed(path))
    assert len(want) > 100
    with abi.TorchLibraries(torch_libs()) as libs:
        assert sorted(libs.missing(sorted(want))) == sorted(n for n in want if n.encode() not in defined)


def test_only_torch_namespaces_are_judged():
    for name in ("_ZN3c106detail14torchCheckFailEPKcS2_jRKSs", "_ZNK2at10TensorBase4cudaEv",
                 "_ZTVN5torch8autograd4NodeE", "_ZNR5torch7Library4_defEv", "_ZN6caffe28TypeMeta3fooEv"):
        assert abi.TORCH_SYMBOL.match(name), name
    for name in ("_ZNSt6vectorIiSaIiEED1Ev", "_ZdlPvm", "cudaMalloc", "_ZN3c10x", "_ZN4c10d5StoreD1Ev",
                 "_ZN5torchlike3fooEv"):
        assert not abi.TORCH_SYMBOL.match(name), name


# -- gcc-built libraries -------------------------------------------------------------------------------------

PROVIDER = """
namespace c10 { int present(int x) { return x + 1; } }
namespace at { struct K { virtual ~K(); }; K::~K() {} }
"""
CONSUMER = """
namespace c10 { int present(int); int absent(int); __attribute__((weak)) int optional(int); }
namespace at { struct K { virtual ~K(); }; }
extern "C" int use(int x) { at::K *k = nullptr; delete k; return c10::present(x) + c10::absent(x)
                            + (c10::optional ? c10::optional(x) : 0); }
"""


@functools.cache
def gcc_libs(hash_style: str) -> tuple[Path, Path]:
    d = workdir() / f"abi-{hash_style}"
    d.mkdir()
    (d / "p.cc").write_text(PROVIDER)
    (d / "c.cc").write_text(CONSUMER)
    provider, consumer = d / "libprovider.so", d / "libconsumer.so"
    for src, out in ((d / "p.cc", provider), (d / "c.cc", consumer)):
        subprocess.run(["g++", "-shared", "-fPIC", f"-Wl,--hash-style={hash_style}", "-o", str(out), str(src)],
                       check=True, timeout=120)
    return provider, consumer


@pytest.mark.parametrize("hash_style", ["gnu", "sysv"])
def test_missing_symbols_of_gcc_built_libraries(hash_style):
    provider, consumer = gcc_libs(hash_style)
    want = needed(consumer)
    assert "_ZN3c107presentEi" in want and "_ZN3c106absentEi" in want
    assert "_ZN3c108optionalEi" not in want  # a weak reference may stay unbound: the loader does not fail on it
    with abi.TorchLibraries([str(provider)]) as libs:
        assert libs.missing(want) == ["_ZN3c106absentEi"]
        # with .gnu.hash the names are looked up; without it they were read once into a set
        assert (libs.definitions[0].names is None) == (hash_style == "gnu")


def test_unreadable_torch_library_is_named(tmp_path):
    bad = tmp_path / "libtorch_cpu.so"
    bad.write_bytes(b"\x7fELF\x02\x01" + b"\0" * 10)
    with abi.TorchLibraries([str(bad), str(tmp_path / "absent.so")]) as libs:
        assert set(libs.errors) == {str(bad), str(tmp_path / "absent.so")}
        assert libs.missing(["_ZN3c107presentEi"]) == ["_ZN3c107presentEi"]
