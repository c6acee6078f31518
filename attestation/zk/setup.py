"""Groth16 key generation. `dev_setup` is a single-party setup: whoever runs it knows the toxic
waste (tau, alpha, beta, gamma, delta) and could forge proofs, so it is for development and tests.
Production keys come from a multi-party phase 1 (`from_ptau` imports a snarkjs .ptau) followed by
phase-2 contributions (`snarkjs zkey contribute` works on the .zkey this module writes).

Both produce exactly the key layout snarkjs's `groth16 setup` writes: Lagrange-basis A/B points on
the 2^k domain with one extra A row per public signal, and H points that are the odd-index
Lagrange basis of the 2^(k+1) domain (see ntt.py for why).
"""
from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass

from . import backend as backends
from .curve import G1, G2
from .errors import ZkError
from .field import G1_GEN, G2_GEN, R, ROOTS, inv
from .fixed_base import FixedBase
from .keys import ProvingKey
from .ntt import bit_reverse, log2_exact
from .r1cs import R1CS


@dataclass(frozen=True, slots=True)
class ToxicWaste:
    tau: int
    alpha: int
    beta: int
    gamma: int
    delta: int

    @staticmethod
    def random() -> "ToxicWaste":
        return ToxicWaste(*(1 + secrets.randbelow(R - 1) for _ in range(5)))


def lagrange_at(tau: int, n: int) -> list[int]:
    """L_i(tau) for the n-th roots of unity: (tau^n - 1) * w^i / (n * (tau - w^i))."""
    w = ROOTS[log2_exact(n)]
    zn = (pow(tau, n, R) - 1) * inv(n) % R
    out, x = [], 1
    for _ in range(n):
        out.append(zn * x % R * inv(tau - x) % R)
        x = x * w % R
    return out


def _qap_columns(r1cs: R1CS, lag: list[int]) -> tuple[list[int], list[int], list[int], list]:
    """u_j(tau), v_j(tau), w_j(tau) per wire and the zkey coefficient list (A and B, extra rows).

    Terms are taken in wire order, as in the .r1cs files we write, so the coefficient section is the
    one snarkjs derives from that file (`snarkjs zkey verify` compares it byte for byte)."""
    n_vars = r1cs.n_wires
    u, v, w = [0] * n_vars, [0] * n_vars, [0] * n_vars
    coefs = []
    for ci, (a, b, c) in enumerate(r1cs.constraints):
        for s, k in sorted(a.items()):
            u[s] = (u[s] + k * lag[ci]) % R
            coefs.append((0, ci, s, k % R))
        for s, k in sorted(b.items()):
            v[s] = (v[s] + k * lag[ci]) % R
            coefs.append((1, ci, s, k % R))
        for s, k in sorted(c.items()):
            w[s] = (w[s] + k * lag[ci]) % R
    n_c = len(r1cs.constraints)
    for s in range(r1cs.n_public + 1):
        u[s] = (u[s] + lag[n_c + s]) % R
        coefs.append((0, n_c + s, s, 1))
    return u, v, w, coefs


def dev_setup(r1cs: R1CS, toxic: ToxicWaste | None = None, backend: str = "gmpy2") -> ProvingKey:
    """A complete proving key from fresh random secrets (development only: see module doc)."""
    be = backends.get(backend)
    t = toxic or ToxicWaste.random()
    n = r1cs.domain_size
    n_pub = r1cs.n_public
    lag = lagrange_at(t.tau, n)
    u, v, w, coefs = _qap_columns(r1cs, lag)
    g1 = FixedBase(G1, G1_GEN, be)
    g2 = FixedBase(G2, G2_GEN, be)
    gi, di = inv(t.gamma), inv(t.delta)
    lc = [(t.beta * u[s] + t.alpha * v[s] + w[s]) % R for s in range(r1cs.n_wires)]
    # H: odd-index Lagrange basis of the 2n domain at tau, divided by delta.
    w2 = ROOTS[log2_exact(n) + 1]
    z2 = (pow(t.tau, 2 * n, R) - 1) * inv(2 * n) % R
    h_scalars = []
    x = w2
    step = w2 * w2 % R
    for _ in range(n):
        h_scalars.append(z2 * x % R * inv(t.tau - x) % R * di % R)
        x = x * step % R
    return ProvingKey(
        n_vars=r1cs.n_wires, n_public=n_pub, domain_size=n,
        alpha1=g1.mul(t.alpha), beta1=g1.mul(t.beta), beta2=g2.mul(t.beta), gamma2=g2.mul(t.gamma),
        delta1=g1.mul(t.delta), delta2=g2.mul(t.delta),
        ic=tuple(g1.mul(lc[s] * gi) for s in range(n_pub + 1)),
        coefs=tuple(coefs),
        a=tuple(g1.mul(x) for x in u), b1=tuple(g1.mul(x) for x in v), b2=tuple(g2.mul(x) for x in v),
        c=tuple(g1.mul(lc[s] * di) for s in range(n_pub + 1, r1cs.n_wires)),
        h=tuple(g1.mul(x) for x in h_scalars),
    )


# ---- from a phase-1 .ptau: the initial key `snarkjs groth16 setup` writes (gamma = delta = 1) ----

def _group_ifft(group: type, points: list, be) -> list:
    """[L_i(tau)] from [tau^j] on the size-n domain: an inverse FFT with points as values."""
    from . import curve

    n = len(points)
    k = log2_exact(n)
    a = bit_reverse(list(points))
    w_inv = inv(ROOTS[k])
    size = 2
    while size <= n:
        half = size >> 1
        step = pow(w_inv, n // size, R)
        for start in range(0, n, size):
            w = 1
            for t in range(half):
                u, v = a[start + t], curve.mul(group, a[start + t + half], w, be)
                a[start + t], a[start + t + half] = curve.add(group, u, v, be), curve.add(group, u, curve.neg(group, v), be)
                w = w * step % R
        size <<= 1
    n_inv = inv(n)
    return [curve.mul(group, p, n_inv, be) for p in a]


def _combine(group: type, columns: list[dict[int, int]], bases: list, be) -> list:
    """Per wire, sum of coefficient * basis point (columns[j] = {row: coefficient})."""
    from . import curve

    out = []
    for col in columns:
        acc = None
        for row, k in col.items():
            acc = curve.add(group, acc, bases[row] if k == 1 else curve.mul(group, bases[row], k, be), be)
        out.append(acc)
    return out


def from_ptau(r1cs: R1CS, ptau, backend: str = "gmpy2") -> ProvingKey:
    """The key `snarkjs groth16 setup r1cs ptau` makes (gamma = delta = the generators, i.e. no phase 2
    yet): run `snarkjs zkey contribute` on it (phase 2) before production use.

    A prepared .ptau provides the Lagrange bases directly; for a raw phase-1 file they are computed
    here by inverse FFTs over the group, O(n log n) scalar multiplications: fine for small circuits,
    minutes for 2^11 and beyond (prepare the ptau with snarkjs instead).
    """
    import hashlib

    from . import curve

    be = backends.get(backend)
    n = r1cs.domain_size
    if n > 1 << ptau.power:
        raise ZkError(f"the circuit needs a domain of {n}; the ptau has power {ptau.power} (needs >= {log2_exact(n)})",
                      ptau.name)
    n_pub, n_c, nv = r1cs.n_public, len(r1cs.constraints), r1cs.n_wires
    if ptau.prepared:
        l_tau, l_tau2 = ptau.lagrange(12, n), ptau.lagrange(13, n)
        l_alpha, l_beta = ptau.lagrange(14, n), ptau.lagrange(15, n)
        h = ptau.lagrange(12, 2 * n)[1::2]
    else:
        if 2 * n > (2 << ptau.power) - 1:
            raise ZkError(f"a raw (unprepared) ptau of power {ptau.power} holds 2^{ptau.power + 1} - 1 tau powers; the "
                          f"circuit's domain {n} needs {2 * n}: use a ptau of power {log2_exact(n) + 1} or run "
                          "`snarkjs powersoftau prepare phase2` on it", ptau.name)
        l_tau, l_tau2 = _group_ifft(G1, ptau.tau_g1(n), be), _group_ifft(G2, ptau.tau_g2(n), be)
        l_alpha, l_beta = _group_ifft(G1, ptau.alpha_tau_g1(n), be), _group_ifft(G1, ptau.beta_tau_g1(n), be)
        h = _group_ifft(G1, ptau.tau_g1(2 * n), be)[1::2]
    a_cols: list[dict[int, int]] = [{} for _ in range(nv)]
    b_cols: list[dict[int, int]] = [{} for _ in range(nv)]
    c_cols: list[dict[int, int]] = [{} for _ in range(nv)]
    coefs = []
    for ci, (a, b, c) in enumerate(r1cs.constraints):
        for s, k in sorted(a.items()):
            a_cols[s][ci] = k % R
            coefs.append((0, ci, s, k % R))
        for s, k in sorted(b.items()):
            b_cols[s][ci] = k % R
            coefs.append((1, ci, s, k % R))
        for s, k in sorted(c.items()):
            c_cols[s][ci] = k % R
    for s in range(n_pub + 1):
        a_cols[s][n_c + s] = 1
        coefs.append((0, n_c + s, s, 1))
    A = _combine(G1, a_cols, l_tau, be)
    B1 = _combine(G1, b_cols, l_tau, be)
    B2 = _combine(G2, b_cols, l_tau2, be)
    beta_a = _combine(G1, a_cols, l_beta, be)
    alpha_b = _combine(G1, b_cols, l_alpha, be)
    w_c = _combine(G1, c_cols, l_tau, be)
    lc = [curve.add(G1, curve.add(G1, beta_a[s], alpha_b[s], be), w_c[s], be) for s in range(nv)]
    alpha1, beta1, beta2 = ptau.alpha_tau_g1(1)[0], ptau.beta_tau_g1(1)[0], ptau.beta_g2()
    pk = ProvingKey(n_vars=nv, n_public=n_pub, domain_size=n, alpha1=alpha1, beta1=beta1, beta2=beta2,
                    gamma2=G2_GEN, delta1=G1_GEN, delta2=G2_GEN, ic=tuple(lc[:n_pub + 1]), coefs=tuple(coefs),
                    a=tuple(A), b1=tuple(B1), b2=tuple(B2), c=tuple(lc[n_pub + 1:]), h=tuple(h))
    # snarkjs's transcript hash (section 10), so that `snarkjs zkey contribute / verify` accept the key
    zh = ptau.tau_g1(2 * n - 1)
    hasher = hashlib.blake2b(digest_size=64)
    for p in (alpha1, beta1):
        hasher.update(_g1_u(p))
    for p in (beta2, G2_GEN):
        hasher.update(_g2_u(p))
    hasher.update(_g1_u(G1_GEN) + _g2_u(G2_GEN))
    hasher.update(len(pk.ic).to_bytes(4, "big") + b"".join(_g1_u(p) for p in pk.ic))
    hasher.update((n - 1).to_bytes(4, "big"))
    hasher.update(b"".join(_g1_u(curve.add(G1, zh[i + n], curve.neg(G1, zh[i]), be)) for i in range(n - 1)))
    for pts, g2 in ((pk.c, False), (pk.a, False), (pk.b1, False), (pk.b2, True)):
        hasher.update(len(pts).to_bytes(4, "big") + b"".join(_g2_u(p) if g2 else _g1_u(p) for p in pts))
    return dataclasses.replace(pk, cs_hash=hasher.digest())


def _g1_u(p) -> bytes:
    """ffjavascript's LEMtoU form as snarkjs hashes it: big-endian x, y; infinity is all zeros."""
    if p is None:
        return bytes(64)
    return p[0].to_bytes(32, "big") + p[1].to_bytes(32, "big")


def _g2_u(p) -> bytes:
    if p is None:
        return bytes(128)
    return b"".join(c.to_bytes(32, "big") for c in (p[0][1], p[0][0], p[1][1], p[1][0]))
