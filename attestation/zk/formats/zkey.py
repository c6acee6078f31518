"""snarkjs Groth16 .zkey v1: header, IC, coefficients (value * R^2 mod r), A, B1, B2, C, H, MPC.

Points are affine with Montgomery coordinates (x * 2^256 mod q), G2 as x.c0 x.c1 y.c0 y.c1,
infinity as zeros. Our dev setup writes an empty contribution list in section 10; snarkjs
`zkey contribute` can add real phase-2 contributions on top of it.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import ZkError
from ..field import Q, R
from ..keys import ProvingKey
from .binfile import Reader, Writer, g1_mont, g2_mont, le, read_sections, section, u32

_R2 = pow(2, 512, R)
_R2_INV = pow(_R2, -1, R)


def _points(rd: Reader, n: int, g2: bool) -> tuple:
    size = 128 if g2 else 64
    if rd.end - rd.pos != n * size:
        raise ZkError(f"{rd.end - rd.pos} bytes for {n} points of {size} bytes", rd.where)
    return tuple(rd.g2_mont() if g2 else rd.g1_mont() for _ in range(n))


def loads(data: bytes, name: str = ".zkey") -> ProvingKey:
    version, secs = read_sections(data, b"zkey", name)
    if version != 1:
        raise ZkError(f"zkey version {version} is not supported (expected 1)", name)
    s1 = section(data, secs, 1, name)
    protocol = s1.u32()
    if protocol != 1:
        raise ZkError(f"protocol {protocol} is not Groth16 (1); PLONK/FFLONK keys are not supported", name)
    h = section(data, secs, 2, name)
    n8q = h.u32()
    q = h.bigint(n8q) if n8q == 32 else -1
    n8r = h.u32() if q == Q else 0
    if q != Q or n8r != 32 or h.bigint(32) != R:
        raise ZkError("the key is not for BN254 (snarkjs curve bn128)", name)
    n_vars, n_pub, domain = h.u32(), h.u32(), h.u32()
    if domain == 0 or domain & (domain - 1) or domain > 1 << 28 or n_pub + 1 > n_vars:
        raise ZkError(f"inconsistent header: nVars {n_vars}, nPublic {n_pub}, domainSize {domain}", name)
    alpha1, beta1, beta2, gamma2 = h.g1_mont(), h.g1_mont(), h.g2_mont(), h.g2_mont()
    delta1, delta2 = h.g1_mont(), h.g2_mont()
    h.done()
    ic = _points(section(data, secs, 3, name), n_pub + 1, False)
    cs = section(data, secs, 4, name)
    n_coefs = cs.u32()
    if cs.end - cs.pos != n_coefs * 44:
        raise ZkError(f"{n_coefs} coefficients do not match the section size", cs.where)
    coefs = []
    for _ in range(n_coefs):
        m, row, sig = cs.u32(), cs.u32(), cs.u32()
        v = cs.fr()
        if m > 1 or row >= domain or sig >= n_vars:
            raise ZkError(f"coefficient (matrix {m}, row {row}, signal {sig}) out of range", cs.where)
        coefs.append((m, row, sig, v * _R2_INV % R))
    a = _points(section(data, secs, 5, name), n_vars, False)
    b1 = _points(section(data, secs, 6, name), n_vars, False)
    b2 = _points(section(data, secs, 7, name), n_vars, True)
    c = _points(section(data, secs, 8, name), n_vars - n_pub - 1, False)
    hh = _points(section(data, secs, 9, name), domain, False)
    cs_hash = bytes(64)
    if 10 in secs:
        cs_hash = section(data, secs, 10, name).take(64)
    return ProvingKey(n_vars, n_pub, domain, alpha1, beta1, beta2, gamma2, delta1, delta2, ic, tuple(coefs),
                      a, b1, b2, c, hh, cs_hash)


def dumps(pk: ProvingKey) -> bytes:
    w = Writer(b"zkey", 1)
    w.start(1).extend(u32(1))
    h = w.start(2)
    h += u32(32) + le(Q) + u32(32) + le(R) + u32(pk.n_vars) + u32(pk.n_public) + u32(pk.domain_size)
    h += g1_mont(pk.alpha1) + g1_mont(pk.beta1) + g2_mont(pk.beta2) + g2_mont(pk.gamma2)
    h += g1_mont(pk.delta1) + g2_mont(pk.delta2)
    cs = w.start(4)  # section order as snarkjs writes it (4, 3, 9, 8, 5, 6, 7): byte-identical keys
    cs += u32(len(pk.coefs))
    for m, row, sig, v in pk.coefs:
        cs += u32(m) + u32(row) + u32(sig) + le(v * _R2 % R)
    w.start(3).extend(b"".join(g1_mont(p) for p in pk.ic))
    w.start(9).extend(b"".join(g1_mont(p) for p in pk.h))
    w.start(8).extend(b"".join(g1_mont(p) for p in pk.c))
    w.start(5).extend(b"".join(g1_mont(p) for p in pk.a))
    w.start(6).extend(b"".join(g1_mont(p) for p in pk.b1))
    w.start(7).extend(b"".join(g2_mont(p) for p in pk.b2))
    w.start(10).extend(pk.cs_hash + u32(0))
    return w.getvalue()


def read(path: Path) -> ProvingKey:
    return loads(Path(path).read_bytes(), str(path))


def write(path: Path, pk: ProvingKey) -> None:
    Path(path).write_bytes(dumps(pk))
