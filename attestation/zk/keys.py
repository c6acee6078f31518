"""Typed Groth16 keys and proofs (affine int points; None is the point at infinity)."""
from __future__ import annotations

from dataclasses import dataclass

from .curve import G1Affine, G2Affine


@dataclass(frozen=True, slots=True)
class VerifyingKey:
    n_public: int
    alpha1: G1Affine
    beta2: G2Affine
    gamma2: G2Affine
    delta2: G2Affine
    ic: tuple[G1Affine, ...]  # n_public + 1 points: IC[0] constant, IC[i+1] pairs with public[i]


@dataclass(frozen=True, slots=True)
class ProvingKey:
    """What a snarkjs Groth16 .zkey holds (sections 2-9), in standard (non-Montgomery) form."""

    n_vars: int
    n_public: int
    domain_size: int
    alpha1: G1Affine
    beta1: G1Affine
    beta2: G2Affine
    gamma2: G2Affine
    delta1: G1Affine
    delta2: G2Affine
    ic: tuple[G1Affine, ...]
    coefs: tuple[tuple[int, int, int, int], ...]  # (matrix 0=A/1=B, constraint, signal, value)
    a: tuple[G1Affine, ...]
    b1: tuple[G1Affine, ...]
    b2: tuple[G2Affine, ...]
    c: tuple[G1Affine, ...]  # private wires only: n_vars - n_public - 1 points
    h: tuple[G1Affine, ...]  # domain_size points
    cs_hash: bytes = bytes(64)  # snarkjs section 10: the phase-2 transcript hash

    def verifying_key(self) -> VerifyingKey:
        return VerifyingKey(self.n_public, self.alpha1, self.beta2, self.gamma2, self.delta2, self.ic)


@dataclass(frozen=True, slots=True)
class Proof:
    a: G1Affine
    b: G2Affine
    c: G1Affine
