"""G1 and G2 of BN254 on raw numbers (int or gmpy2 mpz): Jacobian coordinates, affine at the edges.

Affine points are tuples of ints: G1 (x, y), G2 ((x.c0, x.c1), (y.c0, y.c1)) with c0 + c1*u,
u^2 = -1, the order py_ecc and snarkjs JSON use. The point at infinity is None everywhere.
The formulas are the standard a = 0 ones (dbl-2009-l, madd-2007-bl, add-2007-bl); the code avoids
objects on purpose: it is the inner loop of every MSM.
"""
from __future__ import annotations

from typing import Any, Optional

from .backend import Backend
from .errors import ZkError
from .field import B2, Q, R

G1Affine = Optional[tuple[int, int]]
Fq2 = tuple[int, int]
G2Affine = Optional[tuple[Fq2, Fq2]]

# ---- Fq2 on backend numbers (tuples, unreduced sums allowed: every product is reduced) ----


def f2_mul(a: Any, b: Any, q: Any) -> tuple[Any, Any]:
    t0 = a[0] * b[0]
    t1 = a[1] * b[1]
    return (t0 - t1) % q, ((a[0] + a[1]) * (b[0] + b[1]) - t0 - t1) % q


def f2_sqr(a: Any, q: Any) -> tuple[Any, Any]:
    return (a[0] + a[1]) * (a[0] - a[1]) % q, 2 * a[0] * a[1] % q


def f2_add(a: Any, b: Any) -> tuple[Any, Any]:
    return a[0] + b[0], a[1] + b[1]


def f2_sub(a: Any, b: Any) -> tuple[Any, Any]:
    return a[0] - b[0], a[1] - b[1]


def f2_scale(a: Any, k: int) -> tuple[Any, Any]:
    return a[0] * k, a[1] * k


def f2_inv(a: Any, be: Backend) -> tuple[Any, Any]:
    q = be.q
    t = be.inv((a[0] * a[0] + a[1] * a[1]) % q)
    return a[0] * t % q, -a[1] * t % q


def f2_is_zero(a: Any, q: Any) -> bool:
    return a[0] % q == 0 and a[1] % q == 0


class G1:
    """Jacobian G1 arithmetic; a Jacobian point is (X, Y, Z) or None."""

    @staticmethod
    def double(p: Any, q: Any) -> Any:
        if p is None:
            return None
        x, y, z = p
        a = x * x % q
        b = y * y % q
        c = b * b % q
        d = 2 * ((x + b) * (x + b) - a - c) % q
        e = 3 * a
        f = e * e % q
        x3 = (f - 2 * d) % q
        y3 = (e * (d - x3) - 8 * c) % q
        z3 = 2 * y * z % q
        if z3 == 0:
            return None
        return x3, y3, z3

    @staticmethod
    def add_mixed(p: Any, a: Any, q: Any) -> Any:
        """Jacobian p plus affine a (a not None)."""
        if p is None:
            return a[0], a[1], 1
        x1, y1, z1 = p
        z1z1 = z1 * z1 % q
        u2 = a[0] * z1z1 % q
        s2 = a[1] * z1 * z1z1 % q
        h = (u2 - x1) % q
        r = 2 * (s2 - y1) % q
        if h == 0:
            return G1.double(p, q) if r == 0 else None
        hh = h * h % q
        i = 4 * hh
        j = h * i % q
        v = x1 * i % q
        x3 = (r * r - j - 2 * v) % q
        y3 = (r * (v - x3) - 2 * y1 * j) % q
        z3 = ((z1 + h) * (z1 + h) - z1z1 - hh) % q
        return x3, y3, z3

    @staticmethod
    def add(p: Any, o: Any, q: Any) -> Any:
        if p is None:
            return o
        if o is None:
            return p
        x1, y1, z1 = p
        x2, y2, z2 = o
        z1z1 = z1 * z1 % q
        z2z2 = z2 * z2 % q
        u1 = x1 * z2z2 % q
        u2 = x2 * z1z1 % q
        s1 = y1 * z2 * z2z2 % q
        s2 = y2 * z1 * z1z1 % q
        h = (u2 - u1) % q
        r = 2 * (s2 - s1) % q
        if h == 0:
            return G1.double(p, q) if r == 0 else None
        i = 4 * h * h % q
        j = h * i % q
        v = u1 * i % q
        x3 = (r * r - j - 2 * v) % q
        y3 = (r * (v - x3) - 2 * s1 * j) % q
        z3 = ((z1 + z2) * (z1 + z2) - z1z1 - z2z2) * h % q
        return x3, y3, z3

    @staticmethod
    def neg(p: Any, q: Any) -> Any:
        return None if p is None else (p[0], -p[1] % q, p[2])

    @staticmethod
    def lift(a: G1Affine, be: Backend) -> Any:
        return None if a is None else (be.lift(a[0]), be.lift(a[1]))

    @staticmethod
    def to_affine(p: Any, be: Backend) -> G1Affine:
        if p is None:
            return None
        q = be.q
        zi = be.inv(p[2] % q)
        zi2 = zi * zi % q
        return int(p[0] * zi2 % q), int(p[1] * zi2 * zi % q)


class G2:
    """Jacobian G2 arithmetic over Fq2 (same formulas as G1)."""

    @staticmethod
    def double(p: Any, q: Any) -> Any:
        if p is None:
            return None
        x, y, z = p
        a = f2_sqr(x, q)
        b = f2_sqr(y, q)
        c = f2_sqr(b, q)
        xb = f2_sqr(f2_add(x, b), q)
        d = f2_scale(f2_sub(f2_sub(xb, a), c), 2)
        e = f2_scale(a, 3)
        f = f2_sqr(e, q)
        x3 = f2_sub(f, f2_scale(d, 2))
        x3 = (x3[0] % q, x3[1] % q)
        y3 = f2_sub(f2_mul(e, f2_sub(d, x3), q), f2_scale(c, 8))
        z3 = f2_scale(f2_mul(y, z, q), 2)
        z3 = (z3[0] % q, z3[1] % q)
        if z3 == (0, 0):
            return None
        return x3, (y3[0] % q, y3[1] % q), z3

    @staticmethod
    def add_mixed(p: Any, a: Any, q: Any) -> Any:
        if p is None:
            return a[0], a[1], (1, 0)
        x1, y1, z1 = p
        z1z1 = f2_sqr(z1, q)
        u2 = f2_mul(a[0], z1z1, q)
        s2 = f2_mul(a[1], f2_mul(z1, z1z1, q), q)
        h = f2_sub(u2, x1)
        h = (h[0] % q, h[1] % q)
        r = f2_scale(f2_sub(s2, y1), 2)
        r = (r[0] % q, r[1] % q)
        if h == (0, 0):
            return G2.double(p, q) if r == (0, 0) else None
        hh = f2_sqr(h, q)
        i = f2_scale(hh, 4)
        j = f2_mul(h, i, q)
        v = f2_mul(x1, i, q)
        x3 = f2_sub(f2_sub(f2_sqr(r, q), j), f2_scale(v, 2))
        x3 = (x3[0] % q, x3[1] % q)
        y3 = f2_sub(f2_mul(r, f2_sub(v, x3), q), f2_scale(f2_mul(y1, j, q), 2))
        z3 = f2_sub(f2_sub(f2_sqr(f2_add(z1, h), q), z1z1), hh)
        return x3, (y3[0] % q, y3[1] % q), (z3[0] % q, z3[1] % q)

    @staticmethod
    def add(p: Any, o: Any, q: Any) -> Any:
        if p is None:
            return o
        if o is None:
            return p
        x1, y1, z1 = p
        x2, y2, z2 = o
        z1z1 = f2_sqr(z1, q)
        z2z2 = f2_sqr(z2, q)
        u1 = f2_mul(x1, z2z2, q)
        u2 = f2_mul(x2, z1z1, q)
        s1 = f2_mul(y1, f2_mul(z2, z2z2, q), q)
        s2 = f2_mul(y2, f2_mul(z1, z1z1, q), q)
        h = f2_sub(u2, u1)
        h = (h[0] % q, h[1] % q)
        r = f2_scale(f2_sub(s2, s1), 2)
        r = (r[0] % q, r[1] % q)
        if h == (0, 0):
            return G2.double(p, q) if r == (0, 0) else None
        i = f2_sqr(f2_scale(h, 2), q)
        j = f2_mul(h, i, q)
        v = f2_mul(u1, i, q)
        x3 = f2_sub(f2_sub(f2_sqr(r, q), j), f2_scale(v, 2))
        x3 = (x3[0] % q, x3[1] % q)
        y3 = f2_sub(f2_mul(r, f2_sub(v, x3), q), f2_scale(f2_mul(s1, j, q), 2))
        z3 = f2_mul(f2_sub(f2_sub(f2_sqr(f2_add(z1, z2), q), z1z1), z2z2), h, q)
        return x3, (y3[0] % q, y3[1] % q), z3

    @staticmethod
    def neg(p: Any, q: Any) -> Any:
        return None if p is None else (p[0], (-p[1][0] % q, -p[1][1] % q), p[2])

    @staticmethod
    def lift(a: G2Affine, be: Backend) -> Any:
        if a is None:
            return None
        return (be.lift(a[0][0]), be.lift(a[0][1])), (be.lift(a[1][0]), be.lift(a[1][1]))

    @staticmethod
    def to_affine(p: Any, be: Backend) -> G2Affine:
        if p is None:
            return None
        q = be.q
        zi = f2_inv(p[2], be)
        zi2 = f2_sqr(zi, q)
        x = f2_mul(p[0], zi2, q)
        y = f2_mul(p[1], f2_mul(zi2, zi, q), q)
        return (int(x[0]), int(x[1])), (int(y[0]), int(y[1]))


def mul(group: type, point: Any, k: int, be: Backend, reduce: bool = True) -> Any:
    """k * point (affine in, affine out) by double-and-add. k is reduced mod r unless `reduce` is
    False, which the subgroup check needs (r * P == O only holds without the reduction)."""
    if point is None:
        return None
    if reduce:
        k %= R
    q = be.q
    a = group.lift(point, be)
    acc = None
    for bit in bin(k)[2:]:
        acc = group.double(acc, q)
        if bit == "1":
            acc = group.add_mixed(acc, a, q)
    return group.to_affine(acc, be)


def to_jacobian(group: type, a: Any, be: Backend) -> Any:
    if a is None:
        return None
    la = group.lift(a, be)
    return la[0], la[1], ((be.lift(1), be.lift(0)) if group is G2 else be.lift(1))


def add(group: type, a: Any, b: Any, be: Backend) -> Any:
    """a + b for affine points of `group` (either may be None)."""
    if b is None:
        return a
    return group.to_affine(group.add_mixed(to_jacobian(group, a, be), group.lift(b, be), be.q), be)


def neg(group: type, a: Any) -> Any:
    if a is None:
        return None
    if group is G1:
        return a[0], -a[1] % Q
    return a[0], (-a[1][0] % Q, -a[1][1] % Q)


def g1_on_curve(p: G1Affine) -> bool:
    if p is None:
        return True
    x, y = p
    return 0 <= x < Q and 0 <= y < Q and (y * y - x * x * x - 3) % Q == 0


def g2_on_curve(p: G2Affine) -> bool:
    if p is None:
        return True
    x, y = p
    if not all(0 <= c < Q for c in (*x, *y)):
        return False
    lhs = f2_sqr(y, Q)
    rhs = f2_add(f2_mul(f2_sqr(x, Q), x, Q), B2)
    return (lhs[0] - rhs[0]) % Q == 0 and (lhs[1] - rhs[1]) % Q == 0


def g2_in_subgroup(p: G2Affine, be: Backend) -> bool:
    """G2 has a cofactor: an on-curve point is only valid if r * P is infinity."""
    return p is None or mul(G2, p, R, be, reduce=False) is None


def check_g1(p: G1Affine, where: str) -> G1Affine:
    if not g1_on_curve(p):
        raise ZkError("G1 point is not on the BN254 curve (y^2 = x^3 + 3 mod q)", where)
    return p


def check_g2(p: G2Affine, where: str, be: Backend) -> G2Affine:
    if not g2_on_curve(p):
        raise ZkError("G2 point is not on the BN254 twist curve", where)
    if not g2_in_subgroup(p, be):
        raise ZkError("G2 point is on the twist but not in the order-r subgroup", where)
    return p
