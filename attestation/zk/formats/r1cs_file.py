"""iden3 .r1cs v1 (circom's output): header, constraints (standard form), wire-to-label map."""
from __future__ import annotations

from pathlib import Path

from ..errors import ZkError
from ..field import R
from ..r1cs import R1CS
from .binfile import Reader, Writer, le, read_sections, section, u32, u64


def _read_lc(rd: Reader, n_wires: int) -> dict[int, int]:
    n = rd.u32()
    lc: dict[int, int] = {}
    for _ in range(n):
        w = rd.u32()
        if w >= n_wires:
            raise ZkError(f"wire {w} out of range (nWires {n_wires})", rd.where)
        lc[w] = rd.fr()
    return lc


def loads(data: bytes, name: str = ".r1cs") -> R1CS:
    version, secs = read_sections(data, b"r1cs", name)
    if version != 1:
        raise ZkError(f"r1cs version {version} is not supported (expected 1)", name)
    h = section(data, secs, 1, name)
    n8 = h.u32()
    if n8 != 32 or h.bigint(n8) != R:
        raise ZkError("the circuit is not over the BN254 scalar field (compile with circom --prime bn128)", name)
    n_wires, n_out, n_pub, n_prv = h.u32(), h.u32(), h.u32(), h.u32()
    n_labels, n_constraints = h.u64(), h.u32()
    h.done()
    if 1 + n_out + n_pub + n_prv > n_wires:
        raise ZkError(f"{n_out}+{n_pub}+{n_prv} signals do not fit in {n_wires} wires", name)
    c = section(data, secs, 2, name)
    if n_constraints * 12 > c.end - c.pos:
        raise ZkError(f"{n_constraints} constraints cannot fit in {c.end - c.pos} bytes", c.where)
    cons = tuple((_read_lc(c, n_wires), _read_lc(c, n_wires), _read_lc(c, n_wires)) for _ in range(n_constraints))
    c.done()
    labels: tuple[int, ...] = ()
    if 3 in secs:
        m = section(data, secs, 3, name)
        if (m.end - m.pos) != 8 * n_wires:
            raise ZkError(f"wire map has {(m.end - m.pos)} bytes, expected {8 * n_wires}", m.where)
        labels = tuple(m.u64() for _ in range(n_wires))
        if labels and max(labels) >= max(n_labels, 1):
            raise ZkError(f"label {max(labels)} out of range (nLabels {n_labels})", m.where)
    return R1CS(n_wires, n_out, n_pub, n_prv, cons, labels)


def dumps(r: R1CS) -> bytes:
    w = Writer(b"r1cs", 1)
    labels = r.wire_labels or tuple(range(r.n_wires))
    h = w.start(1)
    h += u32(32) + le(R) + u32(r.n_wires) + u32(r.n_outputs) + u32(r.n_pub_inputs) + u32(r.n_prv_inputs)
    h += u64(max(labels) + 1 if labels else r.n_wires) + u32(len(r.constraints))
    c = w.start(2)
    for con in r.constraints:
        for lc in con:
            c += u32(len(lc))
            for wire, k in sorted(lc.items()):
                c += u32(wire) + le(k % R)
    m = w.start(3)
    for lab in labels:
        m += u64(lab)
    return w.getvalue()


def read(path: Path) -> R1CS:
    return loads(Path(path).read_bytes(), str(path))


def write(path: Path, r: R1CS) -> None:
    Path(path).write_bytes(dumps(r))
