"""The Groth16 prover, step for step as snarkjs's groth16_prove.js (its "CircomReduction").

A_T, B_T are the A and B matrices applied to the witness on the domain, C_T = A_T * B_T; all three
move to the odd coset (ntt.to_odd_coset) where P = A*B - C is the MSM scalar vector for the H
points. Blinding r, s come from `secrets` unless given (tests pass them to compare backends).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Sequence

from . import backend as backends
from .backend import Backend
from .curve import G1, G2, add
from .errors import ZkError
from .field import R
from .keys import Proof, ProvingKey
from .msm import lift_points, msm
from .ntt import to_odd_coset


@dataclass(slots=True)
class PreparedKey:
    """A proving key with its points converted to one backend's numbers (done once per key)."""

    pk: ProvingKey
    be: Backend
    a: Any  # lifted points (lists of backend numbers, or a native backend's arrays)
    b1: Any
    b2: Any
    c: Any
    h: Any


def prepare(pk: ProvingKey, backend: str = "gmpy2") -> PreparedKey:
    be = backends.get(backend)
    extra1 = [pk.alpha1, pk.beta1, pk.delta1]
    return PreparedKey(pk, be,
                       lift_points(G1, list(pk.a) + extra1, be), lift_points(G1, list(pk.b1) + extra1, be),
                       lift_points(G2, list(pk.b2) + [pk.beta2, pk.delta2], be),
                       lift_points(G1, list(pk.c) + [pk.delta1], be), lift_points(G1, pk.h, be))


def prove(key: PreparedKey | ProvingKey, witness: Sequence[int], r: int | None = None,
          s: int | None = None) -> Proof:
    """A proof for `witness` (w[0] = 1, all wires); the witness is not re-checked against the R1CS."""
    pk_ = key if isinstance(key, PreparedKey) else prepare(key)
    pk, be = pk_.pk, pk_.be
    if len(witness) != pk.n_vars:
        raise ZkError(f"witness has {len(witness)} values, the proving key expects {pk.n_vars}")
    r = secrets.randbelow(R) if r is None else r % R
    s = secrets.randbelow(R) if s is None else s % R
    n = pk.domain_size
    a_t, b_t = [0] * n, [0] * n
    for matrix, row, signal, value in pk.coefs:
        if matrix == 0:
            a_t[row] += value * witness[signal]
        else:
            b_t[row] += value * witness[signal]
    a_t = [x % R for x in a_t]
    b_t = [x % R for x in b_t]
    c_t = [x * y % R for x, y in zip(a_t, b_t)]
    a_o, b_o, c_o = to_odd_coset(a_t), to_odd_coset(b_t), to_odd_coset(c_t)
    p = [(x * y - z) % R for x, y, z in zip(a_o, b_o, c_o)]
    w = list(witness)
    pi_a = msm(G1, pk_.a, w + [1, 0, r], be)
    pi_b = msm(G2, pk_.b2, w + [1, s], be)
    b1 = msm(G1, pk_.b1, w + [0, 1, s], be)
    n_pub = pk.n_public
    c_part = msm(G1, pk_.c, w[n_pub + 1:] + [-r * s % R], be)
    h_part = msm(G1, pk_.h, p, be)
    blind = msm(G1, lift_points(G1, [pi_a, b1], be), [s, r], be)
    pi_c = add(G1, add(G1, c_part, h_part, be), blind, be)
    return Proof(pi_a, pi_b, pi_c)
