"""Field, curve, MSM and NTT against py_ecc (the reference) and direct evaluation."""
from __future__ import annotations

import platform
import random

import pytest
from py_ecc import optimized_bn128 as bn

from attestation.zk import backend, curve, msm, ntt
from attestation.zk.curve import G1, G2
from attestation.zk.field import G1_GEN, G2_GEN, Q, R, ROOTS

BACKENDS = backend.available()


def _aff1(p):
    p = bn.normalize(p)
    return int(p[0]), int(p[1])


def _aff2(p):
    p = bn.normalize(p)
    return tuple(int(c) for c in p[0].coeffs), tuple(int(c) for c in p[1].coeffs)


def test_pinned_backends_present():
    expect = ["int", "gmpy2"] + (["mcl"] if platform.machine() == "x86_64" else [])
    assert BACKENDS == expect, "gmpy2 and (on x86_64) mclbn256 are pinned dependencies: pip install -e ."


def test_constants_match_py_ecc():
    assert Q == bn.field_modulus and R == bn.curve_order
    assert G2_GEN == _aff2(bn.G2) and G1_GEN == _aff1(bn.G1)


@pytest.mark.parametrize("name", BACKENDS)
def test_scalar_mul_and_add_match_py_ecc(name):
    be = backend.get(name)
    rng = random.Random(1)
    for _ in range(3):
        k, m = rng.randrange(R), rng.randrange(R)
        assert curve.mul(G1, G1_GEN, k, be) == _aff1(bn.multiply(bn.G1, k))
        assert curve.mul(G2, G2_GEN, k, be) == _aff2(bn.multiply(bn.G2, k))
        s1 = curve.add(G1, curve.mul(G1, G1_GEN, k, be), curve.mul(G1, G1_GEN, m, be), be)
        assert s1 == _aff1(bn.multiply(bn.G1, (k + m) % R))
        s2 = curve.add(G2, curve.mul(G2, G2_GEN, k, be), curve.mul(G2, G2_GEN, m, be), be)
        assert s2 == _aff2(bn.multiply(bn.G2, (k + m) % R))
    # doubling through add, and P + (-P) = infinity
    p = curve.mul(G1, G1_GEN, 5, be)
    assert curve.add(G1, p, p, be) == _aff1(bn.multiply(bn.G1, 10))
    assert curve.add(G1, p, curve.neg(G1, p), be) is None
    p2 = curve.mul(G2, G2_GEN, 5, be)
    assert curve.add(G2, p2, curve.neg(G2, p2), be) is None


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("group,gen,n", [(G1, G1_GEN, 70), (G2, G2_GEN, 12)])
def test_msm_matches_sum_of_products(name, group, gen, n):
    be = backend.get(name)
    rng = random.Random(n)
    pts = [curve.mul(group, gen, rng.randrange(1, R), be) for _ in range(n)]
    pts[3] = None
    pts[5] = pts[4]  # repeated point: the bucket sum must handle P + P
    scalars = [rng.choice([0, 1, 2, R - 1, rng.randrange(R)]) for _ in range(n)]
    expect = None
    for p, k in zip(pts, scalars):
        expect = curve.add(group, expect, curve.mul(group, p, k, be) if p else None, be)
    assert msm.msm(group, msm.lift_points(group, pts, be), scalars, be) == expect


def test_roots_are_ffjavascript_roots():
    assert pow(ROOTS[28], 1 << 28, R) == 1 and pow(ROOTS[28], 1 << 27, R) == R - 1
    assert ROOTS[28] == pow(5, (R - 1) >> 28, R)
    for k in range(1, 28):
        assert ROOTS[k] == pow(ROOTS[k + 1], 2, R)
        assert pow(ROOTS[k], 1 << (k - 1), R) == R - 1


def test_ntt_round_trip_and_odd_coset():
    rng = random.Random(2)
    n = 16
    vals = [rng.randrange(R) for _ in range(n)]
    coeffs = ntt.ifft(vals)
    assert ntt.fft(coeffs) == vals
    w, g = ROOTS[4], ROOTS[5]
    coset = ntt.to_odd_coset(vals)
    for i in (0, 3, 15):
        x = g * pow(w, i, R) % R
        assert coset[i] == sum(c * pow(x, j, R) for j, c in enumerate(coeffs)) % R
        assert pow(x, n, R) == R - 1  # odd powers of the 2n-th root: X^n - 1 = -2 there
