"""snarkjs powers-of-tau files (.ptau): phase-1 output, optionally prepared for phase 2.

Sections: 1 header (n8, q, power, ceremonyPower); 2 tau^i G1 (2^(power+1) - 1 points); 3 tau^i G2,
4 alpha tau^i G1, 5 beta tau^i G1 (2^power points each); 6 beta G2; 7 contributions. `powersoftau
prepare phase2` adds 12-15: the Lagrange bases of tau G1, tau G2, alpha tau G1, beta tau G1 for every
domain 2^k, k = 0..power (2^k points at offset 2^k - 1) and 2^(power+1) for 12. Points as in .zkey
(affine, Montgomery coordinates). Only the points a setup needs are parsed, on demand.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ZkError
from ..field import Q
from .binfile import Reader, read_sections, section


@dataclass
class Ptau:
    data: bytes
    sections: dict
    power: int
    name: str

    @property
    def prepared(self) -> bool:
        return all(k in self.sections for k in (12, 13, 14, 15))

    def _points(self, stype: int, start: int, n: int, g2: bool) -> list:
        size = 128 if g2 else 64
        rd = section(self.data, self.sections, stype, self.name)
        if rd.pos + (start + n) * size > rd.end:
            raise ZkError(f"section {stype} has no points {start}..{start + n - 1} (power {self.power} too small?)",
                          self.name)
        rd = Reader(rd.data, rd.pos + start * size, rd.pos + (start + n) * size, rd.where)
        return [rd.g2_mont() if g2 else rd.g1_mont() for _ in range(n)]

    def tau_g1(self, n: int) -> list:
        return self._points(2, 0, n, False)

    def tau_g2(self, n: int) -> list:
        return self._points(3, 0, n, True)

    def alpha_tau_g1(self, n: int) -> list:
        return self._points(4, 0, n, False)

    def beta_tau_g1(self, n: int) -> list:
        return self._points(5, 0, n, False)

    def beta_g2(self):
        return self._points(6, 0, 1, True)[0]

    def lagrange(self, stype: int, n: int) -> list:
        """Prepared files only: the Lagrange basis of the size-n domain from section 12..15."""
        return self._points(stype, n - 1, n, stype == 13)


def loads(data: bytes, name: str = ".ptau") -> Ptau:
    version, secs = read_sections(data, b"ptau", name)
    if version != 1:
        raise ZkError(f"ptau version {version} is not supported (expected 1)", name)
    h = section(data, secs, 1, name)
    n8 = h.u32()
    if n8 != 32 or h.bigint(32) != Q:
        raise ZkError("not a BN254 (bn128) powers-of-tau file", name)
    power = h.u32()
    h.u32()  # ceremony power
    h.done()
    if not 1 <= power <= 28:
        raise ZkError(f"power {power} out of range", name)
    for s in (2, 3, 4, 5, 6):
        section(data, secs, s, name)  # present exactly once
    return Ptau(data, secs, power, name)


def read(path: Path) -> Ptau:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ZkError(f"cannot read ({e})", str(path)) from None
    return loads(data, str(path))
