"""The iden3 binary container: magic[4], u32 version, u32 nSections, then {u32 type, u64 size,
payload} sections, little-endian. Section order is not guaranteed, so sections are indexed first.
Every read is bounds-checked and every failure is a ZkError naming the file and section."""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ZkError
from ..field import Q, R

MONT_Q = pow(2, 256, Q)  # Montgomery factor of the base field (zkey and ptau points)
MONT_Q_INV = pow(MONT_Q, -1, Q)


@dataclass(slots=True)
class Reader:
    """A cursor over one section's payload."""

    data: bytes
    pos: int
    end: int
    where: str

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise ZkError(f"truncated: needs {n} bytes at offset {self.pos}, section ends at {self.end}", self.where)
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def bigint(self, n8: int) -> int:
        return int.from_bytes(self.take(n8), "little")

    def fr(self) -> int:
        v = self.bigint(32)
        if v >= R:
            raise ZkError("field element is not reduced modulo r", self.where)
        return v

    def fq_mont(self) -> int:
        v = self.bigint(32)
        if v >= Q:
            raise ZkError("coordinate is not reduced modulo q", self.where)
        return v * MONT_Q_INV % Q

    def g1_mont(self) -> tuple[int, int] | None:
        x, y = self.fq_mont(), self.fq_mont()
        return None if x == 0 and y == 0 else (x, y)

    def g2_mont(self) -> tuple[tuple[int, int], tuple[int, int]] | None:
        x0, x1, y0, y1 = (self.fq_mont() for _ in range(4))
        return None if (x0, x1, y0, y1) == (0, 0, 0, 0) else ((x0, x1), (y0, y1))

    def done(self) -> None:
        if self.pos != self.end:
            raise ZkError(f"{self.end - self.pos} unexpected bytes at the end of the section", self.where)


def read_sections(data: bytes, magic: bytes, name: str) -> tuple[int, dict[int, list[tuple[int, int]]]]:
    """(version, {section type: [(offset, size), ...]})."""
    if not isinstance(data, (bytes, bytearray)):
        raise ZkError("expected bytes", name)
    if len(data) < 12 or data[:4] != magic:
        raise ZkError(f"not a {magic.decode()} file (magic {bytes(data[:4])!r})", name)
    version, n_sections = struct.unpack("<II", data[4:12])
    pos = 12
    sections: dict[int, list[tuple[int, int]]] = {}
    for i in range(n_sections):
        if pos + 12 > len(data):
            raise ZkError(f"truncated header of section {i + 1} of {n_sections}", name)
        stype, size = struct.unpack("<IQ", data[pos:pos + 12])
        pos += 12
        if pos + size > len(data):
            raise ZkError(f"section type {stype} claims {size} bytes, only {len(data) - pos} remain", name)
        sections.setdefault(stype, []).append((pos, size))
        pos += size
    if pos != len(data):
        raise ZkError(f"{len(data) - pos} trailing bytes after the last section", name)
    return version, sections


def section(data: bytes, sections: dict[int, list[tuple[int, int]]], stype: int, name: str) -> Reader:
    found = sections.get(stype, [])
    if len(found) != 1:
        raise ZkError(f"needs exactly one section of type {stype}, found {len(found)}", name)
    off, size = found[0]
    return Reader(data if isinstance(data, bytes) else bytes(data), off, off + size, f"{name} section {stype}")


class Writer:
    def __init__(self, magic: bytes, version: int) -> None:
        self.magic, self.version = magic, version
        self.sections: list[tuple[int, bytearray]] = []

    def start(self, stype: int) -> bytearray:
        buf = bytearray()
        self.sections.append((stype, buf))
        return buf

    def getvalue(self) -> bytes:
        out = bytearray(self.magic + struct.pack("<II", self.version, len(self.sections)))
        for stype, buf in self.sections:
            out += struct.pack("<IQ", stype, len(buf)) + buf
        return bytes(out)


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def le(v: int, n8: int = 32) -> bytes:
    return v.to_bytes(n8, "little")


def g1_mont(p: tuple[int, int] | None) -> bytes:
    if p is None:
        return bytes(64)
    return le(p[0] * MONT_Q % Q) + le(p[1] * MONT_Q % Q)


def g2_mont(p: tuple[tuple[int, int], tuple[int, int]] | None) -> bytes:
    if p is None:
        return bytes(128)
    return b"".join(le(c * MONT_Q % Q) for c in (*p[0], *p[1]))
