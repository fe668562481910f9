"""A minimal reader of 64-bit little-endian ELF files: header, sections, dynamic symbols.

What ``stack.kernels`` needs from the binaries of the service's packages, read without loading
them: which sections a shared object has (``.nv_fatbin`` holds its GPU code), the ELF header of a
cubin (``e_machine`` 190 is EM_CUDA, ``e_flags`` its SM), and the dynamic symbol table (which
libtorch symbols a kernel library needs, which ones torch defines).

Everything is read with ``os.pread`` at the offsets the headers give: never the whole file, and no
``mmap`` (a file truncated while mapped kills the reader with SIGBUS). Every offset and size is
checked against the file size; a malformed file raises ``ElfError`` with the reason.

Stdlib only and Python 3.8 compatible: the ``kernels`` probe imports it under the service's
interpreter.
"""

from __future__ import annotations

import os
import stat
import struct
from typing import NamedTuple

EM_CUDA = 190
ET_DYN = 3
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_NOBITS = 8
SHT_DYNSYM = 11
SHN_UNDEF = 0
SHN_XINDEX = 0xFFFF
STB_GLOBAL = 1
STB_WEAK = 2

# cubin e_flags (``cuda_arch``)
ELF_ABI_V1 = 7
EF_CUDA_SM = 0xFF
EF_CUDA_ACCELERATORS_V1 = 0x800
EF_CUDA_SM_OFFSET = 8
EF_CUDA_ACCELERATORS = 0x8

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
SYM = struct.Struct("<IBBHQQ")  # one ELF64 symbol: name, info, other, shndx, value, size
MAX_SECTIONS = 1 << 20
HEAD_BLOCK = 4096
MAX_TABLE = 1 << 30  # a symbol or string table larger than 1 GiB is not a real one


class ElfError(Exception):
    """The file is not an ELF file this reader understands, or it is malformed (the message says how)."""


class ElfHeader(NamedTuple):
    """The fields of an ELF header this reader uses."""

    type: int
    machine: int
    flags: int  # e_flags: for EM_CUDA, the SM and the arch-specific mark (``cuda_arch``)
    osabi: int
    abi_version: int
    shoff: int
    shentsize: int
    shnum: int
    shstrndx: int


def parse_header(head: bytes) -> ElfHeader:
    """The ELF header at the start of ``head``; ``ElfError`` unless it is a 64-bit little-endian one.

    The one parser of an ELF header: a file's (``ElfFile``) and a cubin's embedded in a fat binary
    (``doctor.stack.fatbin``), so both agree on the offsets and on what is refused.
    """
    if len(head) < _EHDR.size:
        raise ElfError("shorter than an ELF header")
    (ident, etype, machine, _version, _entry, _phoff, shoff, flags, _ehsize, _phentsize,
     _phnum, shentsize, shnum, shstrndx) = _EHDR.unpack_from(head)
    if ident[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if ident[4] != 2 or ident[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    return ElfHeader(etype, machine, flags, ident[7], ident[8], shoff, shentsize, shnum, shstrndx)


def cuda_arch(header: ElfHeader) -> tuple[int, str]:
    """A cubin's SM number and arch-specific mark (``"a"`` or ``""``) as its ``e_flags`` give them.

    One reading for a bare cubin and an embedded one: ABI version 7 keeps the SM in the low byte and
    marks ``sm_90a`` with EF_CUDA_ACCELERATORS_V1; from version 8 (Blackwell toolchains) the SM is in
    bits 8-15 and the mark is EF_CUDA_ACCELERATORS (llvm/BinaryFormat/ELF.h). SM 0: none named.
    """
    flags = header.flags
    if header.abi_version <= ELF_ABI_V1:
        return flags & EF_CUDA_SM, "a" if flags & EF_CUDA_ACCELERATORS_V1 else ""
    return (flags >> EF_CUDA_SM_OFFSET) & 0xFF, "a" if flags & EF_CUDA_ACCELERATORS else ""


class Section(NamedTuple):
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    entsize: int


class ElfFile:
    """One open ELF file. ``with ElfFile(path) as elf: elf.section(".nv_fatbin")``."""

    def __init__(self, path: str) -> None:
        self.path = path
        # O_NONBLOCK: a FIFO named like a library must not block the reader (it is refused below)
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise ElfError("not a regular file")
            self.size = st.st_size
            self._parse_header()
            self._sections: list[Section] | None = None
            self._table: tuple[list[tuple[int, ...]], bytes] | None = None
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> ElfFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``; ElfError if they are not all inside the file."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ElfError(f"read of {size} bytes at {offset} is outside the file ({self.size} bytes)")
        if offset + size <= len(self._head):  # the first block, read once: a cubin's names and notes sit there
            return self._head[offset:offset + size]
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise ElfError(f"short read at {offset}: the file shrank while being read")
        return data

    def _parse_header(self) -> None:
        if self.size < _EHDR.size:
            raise ElfError("shorter than an ELF header")
        self._head = b""
        self._head = self.read(0, min(self.size, HEAD_BLOCK))
        hdr = parse_header(self._head)
        self.header = hdr
        self.type, self.machine, self.flags = hdr.type, hdr.machine, hdr.flags
        self.osabi, self.abi_version = hdr.osabi, hdr.abi_version
        self.shoff, self.shentsize = hdr.shoff, hdr.shentsize
        self._shnum = hdr.shnum
        self._shstrndx = hdr.shstrndx

    @property
    def sections(self) -> list[Section]:
        """The section headers, with their names (read once)."""
        if self._sections is None:
            raw, names = self._section_table()
            self._sections = [Section(_cstr(names, r[0]), r[1], r[2], r[4], r[5], r[6], r[9]) for r in raw]
        return self._sections

    def _section_table(self) -> tuple[list[tuple[int, ...]], bytes]:
        """The raw section headers and the section name table (read once)."""
        if self._table is not None:
            return self._table
        if self.shoff == 0:
            self._table = ([], b"")
            return self._table
        if self.shentsize < _SHDR.size:
            raise ElfError(f"section header entries of {self.shentsize} bytes")
        shnum, shstrndx = self._shnum, self._shstrndx
        if shnum == 0 or shstrndx == SHN_XINDEX:  # extended numbering: the real values sit in section 0
            first = _SHDR.unpack(self.read(self.shoff, _SHDR.size))
            shnum = shnum or first[5]
            if shstrndx == SHN_XINDEX:
                shstrndx = first[6]
        if shnum > MAX_SECTIONS:
            raise ElfError(f"{shnum} sections")
        table = self.read(self.shoff, shnum * self.shentsize)
        if self.shentsize == _SHDR.size:
            raw = list(_SHDR.iter_unpack(table))
        else:
            raw = [_SHDR.unpack_from(table, i * self.shentsize) for i in range(shnum)]
        names = b""
        if 0 < shstrndx < shnum and raw[shstrndx][1] != SHT_NOBITS:
            names = self.read(raw[shstrndx][4], min(raw[shstrndx][5], MAX_TABLE))
        self._table = (raw, names)
        return self._table

    def section(self, name: str) -> Section | None:
        """The first section called ``name`` (found without decoding every section's name)."""
        if self._sections is not None:
            return next((s for s in self._sections if s.name == name), None)
        raw, names = self._section_table()
        key = name.encode() + b"\0"
        at = names.find(key)
        offsets = set()
        while at >= 0:  # every place the name occurs (a name may also be the tail of a longer one)
            offsets.add(at)
            at = names.find(key, at + 1)
        for r in raw:
            if r[0] in offsets and _cstr(names, r[0]) == name:
                return Section(name, r[1], r[2], r[4], r[5], r[6], r[9])
        return None

    def section_data(self, sec: Section) -> bytes:
        if sec.type == SHT_NOBITS:
            return b""
        if sec.size > MAX_TABLE:
            raise ElfError(f"section {sec.name} of {sec.size} bytes")
        return self.read(sec.offset, sec.size)


def _cstr(table: bytes, offset: int) -> str:
    if offset >= len(table):
        return ""
    end = table.find(b"\0", offset)
    return table[offset:end if end >= 0 else len(table)].decode("utf-8", "replace")
