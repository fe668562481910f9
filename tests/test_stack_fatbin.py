"""The fat binary reader against cuobjdump, on real wheels and on fat binaries built by NVIDIA's own tools.

Agreement is exact, with one difference that is cuobjdump's: it prints the family suffix of PTX
(``sm_100f``) but not of SASS, listing an ``sm_100f`` cubin as ``sm_100`` (shown below on a fat
binary built from known images). The reader keeps the ``f``: the comparison drops it from SASS.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_wheels import built, cubin_site, cuobjdump_list, host_library, kernel_site, torch_site

from doctor.stack import fatbin
from doctor.stack.elf import ElfError, ElfFile


def without_family(names: list[str]) -> list[str]:
    return sorted({n[:-1] if n.endswith("f") else n for n in names}, key=fatbin.arch_key)


def assert_agrees(path: Path) -> fatbin.FileCode:
    code = fatbin.file_code(str(path))
    sass = code.code.sass if code.code else []
    ptx = code.code.ptx if code.code else []
    assert without_family(sass) == cuobjdump_list(path, "elf"), path
    assert ptx == cuobjdump_list(path, "ptx"), path
    if code.relocatable is not None:  # cuobjdump lists relocatable device code only with -all
        assert without_family(sass + code.relocatable.sass) == cuobjdump_list(path, "elf", all_sections=True)
        assert sorted(set(ptx + code.relocatable.ptx), key=fatbin.arch_key) == cuobjdump_list(path, "ptx", True)
    return code


# The shared objects of the real wheels, but for the two whose cuobjdump listing alone takes 17 s and 36 s
# (flash_ops.abi3.so, libtorch_cuda.so: bench/bench_kernels.py compares those).
KERNEL_FILES = ["sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
                "sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so",
                "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so"]


@pytest.mark.network
@pytest.mark.parametrize("rel", KERNEL_FILES)
def test_sglang_kernel_0_4_10_agrees_with_cuobjdump(rel):
    code = assert_agrees(kernel_site() / rel)
    assert code.code is not None and code.code.entries > 0


@pytest.mark.network
def test_sglang_kernel_0_4_10_reads_as_documented():
    """sm_100f (family) SASS in 0.4.10, where 0.4.5 had sm_100a and sm_103a (arch-specific) cubins."""
    new = fatbin.file_code(str(kernel_site() / "sgl_kernel/sm90/common_ops.abi3.so")).code
    old = fatbin.file_code(str(kernel_site("0.4.5") / "sgl_kernel/sm90/common_ops.abi3.so")).code
    assert new.sass == ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100f", "sm_120a"] and new.ptx == []
    assert old.sass == ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"]
    assert new.compressed == new.entries  # zstd throughout: nothing was inflated to read them


@pytest.mark.network
def test_sglang_kernel_0_4_5_agrees_with_cuobjdump():
    assert_agrees(kernel_site("0.4.5") / "sgl_kernel/sm90/common_ops.abi3.so")


@pytest.mark.network
@pytest.mark.parametrize("rel", ["torch/lib/libtorch_cuda_linalg.so", "torch/lib/libtorch_nvshmem.so"])
def test_torch_cuda_libraries_agree_with_cuobjdump(rel):
    code = assert_agrees(torch_site() / rel)
    if rel.endswith("nvshmem.so"):  # relocatable device code: __nv_relfatbin, never loaded as such
        assert code.relocatable is not None and "sm_89" in code.relocatable.sass
        assert "sm_89" not in code.code.sass


@pytest.mark.network
def test_libraries_without_gpu_code_have_none():
    for rel in ("torch/lib/libc10.so", "torch/lib/libtorch_cpu.so"):
        code = fatbin.file_code(str(torch_site() / rel))
        assert not code.cubin and code.code is None and code.relocatable is None


def flashinfer_sample() -> list[Path]:
    """Every kind of cubin header flashinfer-cubin ships (ABI version, e_flags) and a spread of the rest."""
    files = sorted(cubin_site().rglob("*.cubin"))
    assert len(files) > 3000
    kinds: dict[bytes, Path] = {}
    for f in files:
        with open(f, "rb") as fh:
            head = fh.read(52)
        kinds.setdefault(head[7:9] + head[48:52], f)
    return sorted(set(kinds.values()) | set(random.Random(0).sample(files, 40)))


@pytest.mark.network
def test_flashinfer_cubins_agree_with_cuobjdump():
    sample = flashinfer_sample()
    seen = set()
    for path in sample:
        code = assert_agrees(path)
        assert code.cubin and code.code.ptx == []
        seen.update(code.code.sass)
    assert {"sm_100", "sm_100a", "sm_103a"} <= seen


# -- fat binaries built by NVIDIA's tools (kernel_wheels.built), contents known -----------------------------

@pytest.mark.network
def test_variants_read_from_a_fatbinary_built_fat_binary():
    lib = host_library([built() / "all.fatbin"], "variants")
    code = fatbin.file_code(str(lib)).code
    assert code.sass == ["sm_80", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_100f", "sm_103a", "sm_103f", "sm_120",
                         "sm_120a", "sm_120f"]
    assert code.ptx == ["sm_90", "sm_100a", "sm_100f"]
    assert code.ptx_isa == {"sm_90": "8.7", "sm_100a": "9.0", "sm_100f": "9.0"}
    # cuobjdump names the same images, but a family-specific cubin without its suffix
    assert cuobjdump_list(lib, "elf") == without_family(code.sass)
    assert "sm_103f" in code.sass and "sm_103f" not in cuobjdump_list(lib, "elf")
    assert cuobjdump_list(lib, "ptx") == code.ptx


@pytest.mark.network
def test_several_containers_lz4_and_uncompressed_payloads():
    d = built()
    lib = host_library([d / "lz4.fatbin", d / "plain.fatbin", d / "all.fatbin"], "containers")
    fc = fatbin.file_code(str(lib))
    with ElfFile(str(lib)) as elf:
        sec = elf.section(".nv_fatbin")
        entries = fatbin.read_entries(elf, sec.offset, sec.size)
    assert [e.compression for e in entries[:3]] == ["lz4", None, None]
    assert [e.name for e in entries[:3]] == ["sm_90a", "sm_100a", "sm_90"]
    assert "sm_120f" in fc.code.sass
    assert_agrees(lib)


@pytest.mark.network
@pytest.mark.parametrize(("arch", "name"), [("90a", "sm_90a"), ("100a", "sm_100a"), ("100f", "sm_100"),
                                            ("103a", "sm_103a"), ("120", "sm_120"), ("80", "sm_80")])
def test_bare_cubins_from_ptxas(arch, name):
    """A bare cubin carries its arch-specific mark (ptxas 13: .nv.compat attribute 9) but no family mark."""
    path = built() / f"k_{arch}.cubin"
    assert assert_agrees(path).code.sass == [name]


# -- hostile and broken files -----------------------------------------------------------------------------

ERRORS = (ElfError, fatbin.FatbinError)


def read_or_refuse(path: Path) -> fatbin.FileCode | None:
    try:
        return fatbin.file_code(str(path))
    except ERRORS:
        return None


@pytest.mark.network
def test_truncated_library_is_refused_never_a_traceback(tmp_path):
    src = (kernel_site() / "sgl_kernel/spatial_ops.abi3.so").read_bytes()
    for cut in (0, 3, 20, 63, 64, 4096, len(src) // 2, len(src) - 1):
        p = tmp_path / f"cut{cut}.so"
        p.write_bytes(src[:cut])
        with pytest.raises(ERRORS):
            fatbin.file_code(str(p))


@pytest.mark.network
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 81327), st.integers(0, 255)), min_size=1, max_size=8))
def test_corrupted_bytes_give_a_reading_or_a_clear_refusal(tmp_path, flips):
    data = bytearray((kernel_site() / "sgl_kernel/spatial_ops.abi3.so").read_bytes())
    for at, value in flips:
        data[at % len(data)] = value
    p = tmp_path / "flipped.so"
    p.write_bytes(bytes(data))
    read_or_refuse(p)  # any other exception fails the test


@pytest.mark.network
def test_a_container_claiming_more_than_its_section_is_refused(tmp_path):
    data = bytearray((built() / "plain.fatbin").read_bytes())
    data[8:16] = (1 << 40).to_bytes(8, "little")
    bad = tmp_path / "bad.fatbin"
    bad.write_bytes(bytes(data))
    lib = host_library([bad], "bad")
    with pytest.raises(fatbin.FatbinError, match="past the end of its section"):
        fatbin.file_code(str(lib))


def test_not_elf_fifo_and_directory(tmp_path):
    text = tmp_path / "libfoo.so"
    text.write_text("/* GNU ld script */\nOUTPUT_FORMAT(elf64-x86-64)\nGROUP ( /lib/x86_64-linux-gnu/libfoo.so.1 )\n")
    with pytest.raises(ElfError, match="not an ELF file"):
        fatbin.file_code(str(text))
    fifo = tmp_path / "pipe.so"
    os.mkfifo(fifo)
    with pytest.raises(ElfError, match="not a regular file"):  # and it returns at once: no writer needed
        fatbin.file_code(str(fifo))
    (tmp_path / "dir.so").mkdir()
    with pytest.raises(ElfError, match="not a regular file"):
        fatbin.file_code(str(tmp_path / "dir.so"))


def _ehdr(machine: int, flags: int, abi_version: int, cls: int = 2) -> bytes:
    """A 64-byte ELF header with the fields ``parse_header`` reads (the rest zero)."""
    import struct

    ident = b"\x7fELF" + bytes([cls, 1, 1, 0, abi_version]) + bytes(7)
    return struct.pack("<16sHHIQQQIHHHHHH", ident, 2, machine, 1, 0, 0, 0, flags, 64, 0, 0, 64, 0, 0)


def test_one_header_parser_for_files_and_embedded_cubins() -> None:
    from doctor.stack.elf import EM_CUDA, cuda_arch, parse_header

    old = parse_header(_ehdr(EM_CUDA, 90 | 0x800, 7))
    assert (old.machine, old.abi_version) == (EM_CUDA, 7) and cuda_arch(old) == (90, "a")
    assert cuda_arch(parse_header(_ehdr(EM_CUDA, (100 << 8) | 0x8, 8))) == (100, "a")
    assert cuda_arch(parse_header(_ehdr(EM_CUDA, 100 << 8, 8))) == (100, "")
    with pytest.raises(ElfError, match="64-bit little-endian"):
        parse_header(_ehdr(EM_CUDA, 90, 7, cls=1))
    with pytest.raises(ElfError, match="shorter"):
        parse_header(_ehdr(EM_CUDA, 90, 7)[:40])
