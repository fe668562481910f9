"""GPU code of a binary, read from its fat binaries: SASS architectures and PTX targets.

A CUDA shared object carries its device code in the ``.nv_fatbin`` section (``__nv_relfatbin`` for
relocatable device code): one or more fat binary containers, each a 16-byte header (magic
``0xBA55ED50``, version, header size, size of what follows) and then entries, each with its own
header::

    u16 kind          1 = PTX, 2 = ELF (a cubin: SASS), 4 = old-style cubin
    u16 version
    u32 header_size   64, or more when an options block follows (flag 0x1000000)
    u64 payload_size
    u32 compressed_size
    u32 options_offset
    u16 minor, major  for PTX: the PTX ISA version (``.version 9.0``)
    u32 arch          SM number, e.g. 100
    u32 name_offset, name_size
    u64 flags         0x2000 LZ4 / 0x8000 zstd / 0x1000 older compression;
                      0x100000 arch-specific (``sm_100a``); 0x200000 family-specific (``sm_100f``)
    u64 reserved
    u64 decompressed_size

The ``a``/``f`` flags were established with NVIDIA's own ``fatbinary`` (CUDA 13.5: one image per
``sm=90, 90a, 100, 100a, 100f, ...``; tests/kernel_wheels.py rebuilds them) and agree with
``cuobjdump``, which prints the arch-specific suffix for SASS and PTX but the family suffix only
for PTX (an ``sm_100f`` cubin is listed as ``sm_100``). Only headers are read, never a payload,
except the 64-byte ELF header of an uncompressed cubin whose fatbin entry says nothing about its
variant (old-ABI ``sm_90a`` cubins mark it in ``e_flags``). Compressed payloads are never inflated.

A bare ``.cubin`` file (flashinfer-cubin ships thousands) is one ELF with ``e_machine`` EM_CUDA:
its SM comes from ``e_flags`` (low byte in the old ABI, bits 8-15 from ABI version 8 on) and the
arch-specific mark from ``e_flags`` (0x800 old ABI, 0x8 new ABI) or, in cubins from ptxas 13,
from the ``.nv.compat`` attribute 9. A family-specific cubin is byte-identical in its headers to a
plain one (ptxas 13.5 builds the same ``e_flags`` and ``.nv.compat`` for ``sm_100`` and
``sm_100f``), so a bare cubin is ``sm_100`` either way, as cuobjdump says; it runs on the same GPUs.

Stdlib only and Python 3.8 compatible: the ``kernels`` probe imports it under the service's
interpreter.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from doctor.stack.elf import ELF_ABI_V1, EM_CUDA, ElfError, ElfFile, cuda_arch, parse_header

MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2
KIND_OLD_CUBIN = 4
FLAG_COMPRESSED_OLD = 0x1000
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000

_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
MAX_ENTRIES = 1 << 20
NV_COMPAT_ARCH_SPECIFIC = 9  # .nv.compat attribute written by ptxas 13 for sm_XYa


class FatbinError(Exception):
    """A fat binary whose headers are inconsistent (the message says where)."""


class Entry(NamedTuple):
    """One image of a fat binary."""

    kind: int
    arch: int
    variant: str  # "", "a" or "f"
    ptx_version: tuple[int, int] | None  # PTX ISA of a PTX entry
    compression: str | None  # None, "lz4", "zstd", "old"

    @property
    def name(self) -> str:
        return f"sm_{self.arch}{self.variant}"


class GpuCode(NamedTuple):
    """What one file holds: sorted SASS and PTX target names, the newest PTX ISA per PTX target."""

    sass: list[str]
    ptx: list[str]
    ptx_isa: dict[str, str]
    entries: int
    compressed: int

    @property
    def empty(self) -> bool:
        return not self.sass and not self.ptx


def arch_key(name: str) -> tuple[int, str]:
    """Sort key for ``sm_90``, ``sm_90a``, ``sm_100f``: by SM number, then plain < a < f."""
    digits = "".join(ch for ch in name[3:] if ch.isdigit())
    return (int(digits) if digits else 0, name[3 + len(digits):])


def _compression(flags: int) -> str | None:
    if flags & FLAG_ZSTD:
        return "zstd"
    if flags & FLAG_LZ4:
        return "lz4"
    if flags & FLAG_COMPRESSED_OLD:
        return "old"
    return None


def read_entries(elf: ElfFile, offset: int, size: int) -> list[Entry]:
    """Every entry of the fat binary containers in ``size`` bytes at ``offset`` of the file.

    Containers follow each other, each aligned to 8 bytes; zero padding between them is skipped.
    """
    entries: list[Entry] = []
    pos, end = offset, offset + size
    while pos + _CONTAINER.size <= end:
        magic, _version, header_size, fat_size = _CONTAINER.unpack(elf.read(pos, _CONTAINER.size))
        if magic != MAGIC:
            pos += 8 - (pos - offset) % 8  # padding: containers start 8-aligned in their section
            continue
        if header_size < _CONTAINER.size:
            raise FatbinError(f"container at {pos} has a {header_size}-byte header")
        epos = pos + header_size
        cend = epos + fat_size
        if cend > end:
            raise FatbinError(f"container at {pos} claims {fat_size} bytes, past the end of its section")
        while epos + _ENTRY.size <= cend:
            (kind, _ver, ehsize, payload, _csize, _opt, minor, major, arch, _noff, _nsize, flags, _res,
             _dsize) = _ENTRY.unpack(elf.read(epos, _ENTRY.size))
            if ehsize < _ENTRY.size or epos + ehsize + payload > cend:
                raise FatbinError(f"entry at {epos} (header {ehsize}, payload {payload}) overruns its container")
            variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
            comp = _compression(flags)
            if kind in (KIND_ELF, KIND_OLD_CUBIN) and not variant and comp is None and payload >= 64:
                variant = _embedded_variant(elf, epos + ehsize)
            entries.append(Entry(kind, arch, variant, (major, minor) if kind == KIND_PTX else None, comp))
            if len(entries) > MAX_ENTRIES:
                raise FatbinError(f"more than {MAX_ENTRIES} entries")
            epos += ehsize + payload
        pos = cend
    return entries


def _embedded_variant(elf: ElfFile, at: int) -> str:
    """The variant an uncompressed embedded cubin's ELF header says (old-ABI ``sm_90a``), else ''."""
    try:
        header = parse_header(elf.read(at, 64))
    except ElfError:  # not an ELF image (or not a 64-bit one): the entry's own flags stand
        return ""
    return cuda_arch(header)[1] if header.machine == EM_CUDA else ""


def summarize(entries: list[Entry]) -> GpuCode:
    sass = {e.name for e in entries if e.kind in (KIND_ELF, KIND_OLD_CUBIN)}
    ptx_isa: dict[str, str] = {}
    for e in entries:
        if e.kind == KIND_PTX and e.ptx_version is not None:
            text = f"{e.ptx_version[0]}.{e.ptx_version[1]}"
            old = ptx_isa.get(e.name)
            if old is None or tuple(map(int, old.split("."))) < e.ptx_version:
                ptx_isa[e.name] = text
    return GpuCode(sorted(sass, key=arch_key), sorted(ptx_isa, key=arch_key), ptx_isa, len(entries),
                   sum(1 for e in entries if e.compression))


def shared_object_code(elf: ElfFile, section: str = ".nv_fatbin") -> GpuCode | None:
    """The GPU code in one fatbin section of a host ELF, or None when it has no such section.

    ``.nv_fatbin`` is what the CUDA runtime registers and loads; ``__nv_relfatbin`` holds relocatable
    device code for a later device link, never loaded as such (``cuobjdump`` lists it only with ``-all``).
    """
    sec = elf.section(section)
    if sec is None or not sec.size:
        return None
    return summarize(read_entries(elf, sec.offset, sec.size))


def cubin_code(elf: ElfFile) -> GpuCode:
    """The one SASS target of a bare cubin (``e_machine`` EM_CUDA)."""
    sm, variant = cuda_arch(elf.header)
    # ptxas 13 may mark sm_XYa only in .nv.compat; the old ABI always marks it in e_flags
    if not variant and elf.abi_version > ELF_ABI_V1 and _compat_attribute(elf, NV_COMPAT_ARCH_SPECIFIC):
        variant = "a"
    if not sm:
        raise ElfError(f"cubin e_flags {elf.flags:#x} name no SM")
    return GpuCode([f"sm_{sm}{variant}"], [], {}, 1, 0)


def _compat_attribute(elf: ElfFile, attribute: int) -> int:
    """A byte-valued attribute of ``.nv.compat`` (records: u8 format, u8 attribute, value), else 0."""
    sec = elf.section(".nv.compat")
    if sec is None or sec.size > 4096:
        return 0
    data = elf.section_data(sec)
    pos = 0
    while pos + 2 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        if fmt == 1:  # no value
            pos += 4
        elif fmt in (2, 3):  # byte / half value in the next two bytes
            if pos + 4 > len(data):
                break
            value = data[pos + 2] if fmt == 2 else struct.unpack_from("<H", data, pos + 2)[0]
            if attr == attribute:
                return value
            pos += 4
        elif fmt == 4:  # sized value
            if pos + 4 > len(data):
                break
            pos += 4 + struct.unpack_from("<H", data, pos + 2)[0]
        else:
            break
    return 0


class FileCode(NamedTuple):
    """A file's GPU code: what the runtime loads, and relocatable device code when there is some."""

    cubin: bool  # a bare cubin rather than a host shared object
    code: GpuCode | None
    relocatable: GpuCode | None


def file_code(path: str) -> FileCode:
    """GPU code of a shared object or bare cubin at ``path`` (``code`` None when it carries none).

    Raises OSError, ElfError or FatbinError for unreadable or malformed files.
    """
    with ElfFile(path) as elf:
        if elf.machine == EM_CUDA:
            return FileCode(True, cubin_code(elf), None)
        return FileCode(False, shared_object_code(elf, ".nv_fatbin"), shared_object_code(elf, "__nv_relfatbin"))
