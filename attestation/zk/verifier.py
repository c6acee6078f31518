"""The Groth16 verifier: point and input validation on raw ints, the pairing check with py_ecc.

e(A, B) = e(alpha, beta) * e(vk_x, gamma) * e(C, delta), checked as one product of four Miller
loops and one final exponentiation (py_ecc, the reference; or libmcl when installed). Every point is checked on its curve and B, beta, gamma, delta
in the order-r subgroup of G2 (the twist has a cofactor; G1 has none). Public signals must be < r:
snarkjs rejects them otherwise, and accepting x + r would make one proof valid for two statements.
"""
from __future__ import annotations

from typing import Sequence

from . import backend as backends
from .curve import G1, G1Affine, G2Affine, check_g1, check_g2, g2_on_curve, neg
from .errors import ZkError
from .field import R
from .keys import Proof, VerifyingKey
from .msm import lift_points, msm


def _bn():
    """py_ecc, imported when the reference path runs (the prover and the mcl verifier do not need it). The
    image carries it all the same: it is the verifier where mclbn256 is missing, and the daemon's key setup
    writes vk.json through it (yocto/meta-sits/README.md)."""
    from py_ecc import optimized_bn128

    return optimized_bn128


def _pe_g1(p: G1Affine):  # type: ignore[no-untyped-def]
    bn = _bn()
    return bn.Z1 if p is None else (bn.FQ(p[0]), bn.FQ(p[1]), bn.FQ.one())


def _pe_g2(p: G2Affine):  # type: ignore[no-untyped-def]
    bn = _bn()
    if p is None:
        return bn.Z2
    return bn.FQ2(list(p[0])), bn.FQ2(list(p[1])), bn.FQ2.one()


def check_verifying_key(vk: VerifyingKey, backend: str = "gmpy2", subgroup: bool = True) -> None:
    """Shapes and curve membership; G2 subgroup membership unless the caller checks it natively."""
    be = backends.get(backend)
    if len(vk.ic) != vk.n_public + 1:
        raise ZkError(f"IC has {len(vk.ic)} points, nPublic {vk.n_public} needs {vk.n_public + 1}", "vk.IC")
    check_g1(vk.alpha1, "vk.vk_alpha_1")
    for name, p in (("vk_beta_2", vk.beta2), ("vk_gamma_2", vk.gamma2), ("vk_delta_2", vk.delta2)):
        if subgroup:
            check_g2(p, f"vk.{name}", be)
        elif not g2_on_curve(p):
            raise ZkError("G2 point is not on the BN254 twist curve", f"vk.{name}")
    for i, p in enumerate(vk.ic):
        check_g1(p, f"vk.IC[{i}]")


def verify(vk: VerifyingKey, public: Sequence[int], proof: Proof, backend: str | None = None) -> bool:
    """True iff the proof is valid for these public signals; ZkError if anything is malformed.

    `backend`: "mcl" does the pairing product natively (~ms), "int"/"gmpy2" use py_ecc (the
    reference, ~0.5 s); default: the fastest installed. The decision is the same on every backend."""
    name = backend or backends.available()[-1]
    be = backends.get(name)
    if len(public) != vk.n_public:
        raise ZkError(f"{len(public)} public signals given, the verification key has nPublic {vk.n_public}",
                      "public")
    for i, x in enumerate(public):
        if not 0 <= x < R:
            raise ZkError(f"public signal {i} is not a field element (0 <= x < r)", f"public[{i}]")
    native = getattr(be, "pairing_product_is_one", None)
    check_verifying_key(vk, name, subgroup=native is None)
    check_g1(proof.a, "proof.pi_a")
    check_g1(proof.c, "proof.pi_c")
    if native is None:
        check_g2(proof.b, "proof.pi_b", be)
    elif not g2_on_curve(proof.b):
        raise ZkError("G2 point is not on the BN254 twist curve", "proof.pi_b")
    vk_x = msm(G1, lift_points(G1, vk.ic, be), [1, *public], be)
    if native is not None:
        for name_, p in (("proof.pi_b", proof.b), ("vk.vk_beta_2", vk.beta2), ("vk.vk_gamma_2", vk.gamma2),
                         ("vk.vk_delta_2", vk.delta2)):
            if p is None:
                continue
            try:
                be.native_points(True, [p])  # type: ignore[attr-defined]
            except ZkError:
                raise ZkError("G2 point is on the twist but not in the order-r subgroup", name_) from None
        return native([(neg(G1, proof.a), proof.b), (vk.alpha1, vk.beta2), (vk_x, vk.gamma2), (proof.c, vk.delta2)])
    bn = _bn()
    ml = (bn.pairing(_pe_g2(proof.b), bn.neg(_pe_g1(proof.a)), final_exponentiate=False)
          * bn.pairing(_pe_g2(vk.beta2), _pe_g1(vk.alpha1), final_exponentiate=False)
          * bn.pairing(_pe_g2(vk.gamma2), _pe_g1(vk_x), final_exponentiate=False)
          * bn.pairing(_pe_g2(vk.delta2), _pe_g1(proof.c), final_exponentiate=False))
    return bool(bn.final_exponentiate(ml) == bn.FQ12.one())
