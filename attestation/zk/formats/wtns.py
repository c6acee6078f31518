"""iden3 .wtns v2: the witness vector in standard form, w[0] = 1."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import ZkError
from ..field import R
from .binfile import Writer, le, read_sections, section, u32


def loads(data: bytes, name: str = ".wtns") -> list[int]:
    version, secs = read_sections(data, b"wtns", name)
    if version != 2:
        raise ZkError(f"wtns version {version} is not supported (expected 2)", name)
    h = section(data, secs, 1, name)
    n8 = h.u32()
    if n8 != 32 or h.bigint(n8) != R:
        raise ZkError("the witness is not over the BN254 scalar field", name)
    n = h.u32()
    h.done()
    v = section(data, secs, 2, name)
    if v.end - v.pos != 32 * n:
        raise ZkError(f"{v.end - v.pos} bytes of values for {n} witness entries", v.where)
    values = [v.fr() for _ in range(n)]
    if not values or values[0] != 1:
        raise ZkError("w[0] must be 1", name)
    return values


def dumps(values: Sequence[int]) -> bytes:
    w = Writer(b"wtns", 2)
    w.start(1).extend(u32(32) + le(R) + u32(len(values)))
    sec = w.start(2)
    for x in values:
        sec += le(x % R)
    return w.getvalue()


def read(path: Path) -> list[int]:
    return loads(Path(path).read_bytes(), str(path))


def write(path: Path, values: Sequence[int]) -> None:
    Path(path).write_bytes(dumps(values))
