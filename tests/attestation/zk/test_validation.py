"""The verifier refuses malformed statements: points off the curve or outside the G2 subgroup,
public signals >= r, wrong counts; snarkjs refuses the same proofs."""
from __future__ import annotations

import copy

import pytest
from py_ecc import optimized_bn128 as bn

from attestation.zk import ZkError, backend, curve, verify
from attestation.zk.field import B2, Q, R
from attestation.zk.formats import snarkjs_json as sj
from attestation.zk.keys import Proof

from .conftest import snarkjs_verifies


def _fq2_sqrt(a: bn.FQ2) -> bn.FQ2 | None:
    """Square root in Fq2 for q = 3 mod 4 (Adj and Rodriguez-Henriquez, algorithm 9)."""
    a1 = a ** ((Q - 3) // 4)
    alpha = a1 * a1 * a
    if alpha ** Q * alpha == bn.FQ2([Q - 1, 0]):
        return None
    x0 = a1 * a
    if alpha == bn.FQ2([Q - 1, 0]):
        return bn.FQ2([0, 1]) * x0
    return (bn.FQ2.one() + alpha) ** ((Q - 1) // 2) * x0


def twist_point_outside_subgroup():
    """A point on the twist y^2 = x^3 + b2 whose order is not r (the twist has cofactor ~2^254)."""
    for x0 in range(1, 100):
        x = bn.FQ2([x0, 1])
        y = _fq2_sqrt(x ** 3 + bn.FQ2(list(B2)))
        if y is not None:
            assert y * y == x ** 3 + bn.FQ2(list(B2))
            p = (tuple(int(c) for c in x.coeffs), tuple(int(c) for c in y.coeffs))
            if not curve.g2_in_subgroup(p, backend.get("gmpy2")):
                return p
    raise AssertionError("no point found")


def test_g2_point_outside_subgroup_rejected(generated, tmp_path):
    p = twist_point_outside_subgroup()
    assert curve.g2_on_curve(p)
    bad = Proof(generated.proof.a, p, generated.proof.c)
    with pytest.raises(ZkError, match="subgroup"):
        verify(generated.pk.verifying_key(), generated.public, bad)
    assert not snarkjs_verifies(generated.vk_json, generated.public_json, sj.proof_to_json(bad), tmp_path)


def test_g1_point_off_curve_rejected(generated, tmp_path):
    a = generated.proof.a
    bad = Proof((a[0], (a[1] + 1) % Q), generated.proof.b, generated.proof.c)
    with pytest.raises(ZkError, match="pi_a.*not on the BN254 curve"):
        verify(generated.pk.verifying_key(), generated.public, bad)
    assert not snarkjs_verifies(generated.vk_json, generated.public_json, sj.proof_to_json(bad), tmp_path)


def test_g2_point_off_curve_rejected(generated):
    b = generated.proof.b
    bad = Proof(generated.proof.a, (b[0], (b[1][0], (b[1][1] + 1) % Q)), generated.proof.c)
    with pytest.raises(ZkError, match="pi_b.*twist"):
        verify(generated.pk.verifying_key(), generated.public, bad)


def test_vk_points_checked(generated):
    vk = copy.deepcopy(generated.vk_json)
    vk["IC"][0][1] = str((int(vk["IC"][0][1]) + 1) % Q)
    with pytest.raises(ZkError, match=r"IC\[0\]"):
        verify(sj.vk_from_json(vk), generated.public, generated.proof)
    p = twist_point_outside_subgroup()
    vk = copy.deepcopy(generated.vk_json)
    vk["vk_delta_2"] = sj.g2_to(p)
    with pytest.raises(ZkError, match="vk_delta_2.*subgroup"):
        verify(sj.vk_from_json(vk), generated.public, generated.proof)


def test_public_signal_not_reduced_rejected(generated):
    bad = [generated.public[0] + R, *generated.public[1:]]  # same residue: must not verify a second statement
    with pytest.raises(ZkError, match="field element"):
        verify(generated.pk.verifying_key(), bad, generated.proof)
    with pytest.raises(ZkError, match="out of range"):
        sj.public_from_json([str(R)])
    with pytest.raises(ZkError, match="nPublic"):
        verify(generated.pk.verifying_key(), generated.public[:-1], generated.proof)


def test_coordinates_not_reduced_rejected(generated):
    pj = copy.deepcopy(generated.proof_json)
    pj["pi_a"][0] = str(int(pj["pi_a"][0]) + Q)
    with pytest.raises(ZkError, match="pi_a"):
        sj.proof_from_json(pj)


@pytest.mark.parametrize("name", backend.available())
def test_every_verifier_backend_decides_the_same(generated, name):
    """py_ecc (int, gmpy2) is the reference; libmcl (mcl) must accept and refuse exactly the same."""
    vk, pub, p = generated.pk.verifying_key(), generated.public, generated.proof
    assert verify(vk, pub, p, name)
    assert not verify(vk, [(pub[0] + 1) % R, *pub[1:]], p, name)
    assert not verify(vk, pub, Proof(p.a, p.b, curve.neg(curve.G1, p.c)), name)
    with pytest.raises(ZkError, match="pi_b.*subgroup"):
        verify(vk, pub, Proof(p.a, twist_point_outside_subgroup(), p.c), name)
    with pytest.raises(ZkError, match="pi_a.*not on the BN254 curve"):
        verify(vk, pub, Proof((p.a[0], (p.a[1] + 1) % Q), p.b, p.c), name)
