"""The libtorch ABI of a kernel library, read from the binaries: what it needs that torch does not define.

A kernel package built against another torch imports fine until the dynamic loader binds its
undefined C++ symbols: ``import sgl_kernel`` then fails with ``undefined symbol: _ZN3c10...``,
typically after the server has begun loading weights. The loader's question can be asked without
loading anything: the library's ``.dynsym`` lists every symbol it needs (undefined, binding GLOBAL;
a WEAK one may stay unbound), and the ``.dynsym`` of torch's own libraries (``torch/lib/*.so``)
lists every symbol they define. Mangled names are compared as they are: a changed signature is a
different mangled name, which is exactly what the loader will not find.

Only symbols in torch's namespaces (``c10``, ``at``, ``torch``, ``caffe2``: vtables, typeinfo,
functions, methods with any qualifier) are judged; the rest (libstdc++, CUDA runtime, libc) belong to
other libraries. Stdlib only, Python 3.8 compatible (the ``kernels`` probe runs it).
"""

from __future__ import annotations

import re
import struct

from doctor.stack.elf import SHN_UNDEF, SHT_DYNSYM, STB_GLOBAL, SYM, ElfError, ElfFile

# _Z [special: TV vtable, TI typeinfo, TS typeinfo name, TT VTT, TH/TW TLS, GV guard] N [cv/ref quals] <ns>
TORCH_SYMBOL = re.compile(r"^_Z(?:T[VISTHW]|GV)?N[rVKRO]*(?:3c10|2at|5torch|6caffe2)(?=\d|E)")


def _tables(elf: ElfFile) -> tuple[bytes, bytes] | None:
    secs = elf.sections
    table = next((s for s in secs if s.type == SHT_DYNSYM), None)
    if table is None or not 0 <= table.link < len(secs):
        return None
    if table.entsize not in (0, SYM.size):
        return None
    return elf.section_data(table), elf.section_data(secs[table.link])


def _name(strings: bytes, offset: int) -> bytes:
    end = strings.find(b"\0", offset)
    return strings[offset:end] if end >= 0 else strings[offset:]


def needed_torch_symbols(elf: ElfFile) -> list[str]:
    """The torch-namespace symbols ``elf`` needs from elsewhere (undefined, GLOBAL), sorted."""
    tables = _tables(elf)
    if tables is None:
        return []
    data, strings = tables
    out = set()
    for st_name, info, _other, shndx, _value, _size in SYM.iter_unpack(data[:len(data) // SYM.size * SYM.size]):
        if shndx == SHN_UNDEF and info >> 4 == STB_GLOBAL and st_name:
            name = _name(strings, st_name).decode("utf-8", "surrogateescape")
            if TORCH_SYMBOL.match(name):
                out.add(name)
    return sorted(out)


SHT_GNU_HASH = 0x6FFFFFF6


def gnu_hash(name: bytes) -> int:
    """The GNU symbol hash (``dl_new_hash``) the dynamic loader looks names up with."""
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


class Definitions:
    """Which symbols one library defines, answered as the dynamic loader does: through its ``.gnu.hash``.

    A lookup costs a Bloom filter test and, for names that may be there, a read of one or two symbol
    entries: the 100,000 symbols of ``libtorch_cpu.so`` are never all decoded. A library without
    ``.gnu.hash`` has its defined names read once into a set.
    """

    def __init__(self, elf: ElfFile) -> None:
        self.elf = elf
        self.names: set[bytes] | None = None
        secs = elf.sections
        dynsym = next((s for s in secs if s.type == SHT_DYNSYM), None)
        table = next((s for s in secs if s.type == SHT_GNU_HASH), None)
        self.empty = dynsym is None or not 0 <= dynsym.link < len(secs)
        if self.empty:
            return
        assert dynsym is not None
        self.dynsym = dynsym
        self.dynstr = secs[dynsym.link]
        if table is None or dynsym.entsize not in (0, SYM.size):
            self.names = defined_names(elf)
            return
        data = elf.section_data(table)
        if len(data) < 16:
            raise ElfError(".gnu.hash shorter than its header")
        self.nbuckets, self.symoffset, bloom_size, self.shift = struct.unpack_from("<IIII", data)
        end_bloom = 16 + 8 * bloom_size
        end_buckets = end_bloom + 4 * self.nbuckets
        if self.nbuckets == 0 or bloom_size == 0 or end_buckets > len(data):
            raise ElfError(".gnu.hash tables overrun the section")
        self.bloom = struct.unpack_from(f"<{bloom_size}Q", data, 16)
        self.buckets = struct.unpack_from(f"<{self.nbuckets}I", data, end_bloom)
        self.chain = data[end_buckets:]
        self.nsyms = dynsym.size // SYM.size

    def defines(self, name: bytes, h: int) -> bool:
        if self.empty:
            return False
        if self.names is not None:
            return name in self.names
        word = self.bloom[(h >> 6) % len(self.bloom)]
        if not (word >> (h & 63)) & 1 or not (word >> ((h >> self.shift) & 63)) & 1:
            return False
        i = self.buckets[h % self.nbuckets]
        if i == 0:
            return False
        key = name + b"\0"
        while self.symoffset <= i < self.nsyms and 4 * (i - self.symoffset) + 4 <= len(self.chain):
            h2 = struct.unpack_from("<I", self.chain, 4 * (i - self.symoffset))[0]
            if (h2 | 1) == (h | 1):
                st_name, _info, _other, shndx, _value, _size = SYM.unpack(
                    self.elf.read(self.dynsym.offset + i * SYM.size, SYM.size))
                if shndx != SHN_UNDEF and st_name + len(key) <= self.dynstr.size and \
                        self.elf.read(self.dynstr.offset + st_name, len(key)) == key:
                    return True
            if h2 & 1:
                return False
            i += 1
        return False


def defined_names(elf: ElfFile) -> set[bytes]:
    """Every symbol ``elf`` defines for others (any binding but LOCAL), as raw bytes (no hash table)."""
    tables = _tables(elf)
    if tables is None:
        return set()
    data, strings = tables
    return {_name(strings, st_name) for st_name, info, _other, shndx, _value, _size
            in SYM.iter_unpack(data[:len(data) // SYM.size * SYM.size])
            if shndx != SHN_UNDEF and info >> 4 != 0 and st_name}


class TorchLibraries:
    """torch's shared libraries, open for lookups; ``missing(needed)`` is what none of them defines."""

    def __init__(self, paths: list[str]) -> None:
        self.files: list[ElfFile] = []
        self.definitions: list[Definitions] = []
        self.errors: dict[str, str] = {}
        for path in paths:
            try:
                elf = ElfFile(path)
            except (OSError, ElfError) as exc:
                self.errors[path] = str(exc)
                continue
            self.files.append(elf)
            try:
                self.definitions.append(Definitions(elf))
            except (OSError, ElfError) as exc:
                self.errors[path] = str(exc)

    def missing(self, needed: list[str]) -> list[str]:
        out = []
        for name in needed:
            raw = name.encode("utf-8", "surrogateescape")
            h = gnu_hash(raw)
            if not any(d.defines(raw, h) for d in self.definitions):
                out.append(name)
        return out

    def close(self) -> None:
        for elf in self.files:
            elf.close()
        self.files = []

    def __enter__(self) -> TorchLibraries:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
