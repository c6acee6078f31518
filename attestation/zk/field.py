"""BN254 (alt_bn128, snarkjs "bn128") constants and scalar-field helpers on plain Python ints.

Elements are ints in [0, modulus); signed values v are stored as r - |v|, as snarkjs writes them.
"""
from __future__ import annotations

Q = 21888242871839275222246405745257275088696311157297823662689037894645226208583  # base field
R = 21888242871839275222246405745257275088548364400416034343698204186575808495617  # scalar field
B2 = (19485874751759354771024239261021720505790618469301721065564631296452457478373,
      266929791119991161246907387137283842545076965332900288569378510910307636690)  # 3/(9+u)
G1_GEN = (1, 2)
G2_GEN = ((10857046999023057135944570762232829481370756359578518086990519993285655852781,
           11559732032986387107991004021392285783925812861821192530917403151452391805634),
          (8495653923123431417604973247489272438418190587263600148770280649306958101930,
           4082367875863433681332203403145435568316851327593401208105741076214120093531))

# 2-adicity of r - 1 and its quadratic non-residue 5: ffjavascript derives its roots of unity from
# these, and the prover's odd coset must use exactly the same ones for snarkjs to agree.
TWO_ADICITY = 28
_ODD_PART = (R - 1) >> TWO_ADICITY


def roots_of_unity() -> list[int]:
    """w[k] is a primitive 2^k-th root of unity; w[28] = 5^t, w[k] = w[k+1]^2 (as ffjavascript)."""
    w = [0] * (TWO_ADICITY + 1)
    w[TWO_ADICITY] = pow(5, _ODD_PART, R)
    for k in range(TWO_ADICITY - 1, -1, -1):
        w[k] = w[k + 1] * w[k + 1] % R
    return w


ROOTS = roots_of_unity()


def to_field(v: int) -> int:
    """A signed integer as a field element (negative v becomes r - |v|)."""
    return v % R


def to_signed(v: int) -> int:
    """A field element read back as the signed integer it encodes (|v| < r/2)."""
    v %= R
    return v - R if v > R // 2 else v


def inv(v: int) -> int:
    if v % R == 0:
        raise ZeroDivisionError("inverse of zero in Fr")
    return pow(v, -1, R)
