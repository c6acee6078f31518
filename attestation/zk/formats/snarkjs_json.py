"""Proof, public signals and verification key as snarkjs 0.7 writes them (decimal strings,
affine points with a projective "1", G2 coordinates as [c0, c1]). Readers are strict: any shape,
type or range problem is a ZkError naming the JSON field."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


from ..errors import ZkError
from ..field import Q, R
from ..keys import Proof, VerifyingKey


def _int(v: Any, where: str, bound: int = Q) -> int:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise ZkError(f"expected a decimal string, got {type(v).__name__}", where)
    if isinstance(v, str):
        if not v.isascii() or not v.isdigit() or len(v) > 80:
            raise ZkError(f"expected a non-negative decimal string, got {v[:40]!r}", where)
        v = int(v)
    if not 0 <= v < bound:
        raise ZkError(f"value out of range (must be < {'q' if bound == Q else 'r'})", where)
    return v


def _list(v: Any, n: int, where: str) -> list:
    if not isinstance(v, list) or len(v) != n:
        raise ZkError(f"expected a list of {n} items", where)
    return v


def g1_from(v: Any, where: str) -> tuple[int, int] | None:
    x, y, z = (_int(c, f"{where}[{i}]") for i, c in enumerate(_list(v, 3, where)))
    if z == 0:
        return None
    if z != 1:
        raise ZkError("expected an affine point (third coordinate \"1\", or \"0\" for infinity)", where)
    return x, y


def g2_from(v: Any, where: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
    coords = [tuple(_int(c, f"{where}[{i}][{j}]") for j, c in enumerate(_list(e, 2, f"{where}[{i}]")))
              for i, e in enumerate(_list(v, 3, where))]
    if coords[2] == (0, 0):
        return None
    if coords[2] != (1, 0):
        raise ZkError("expected an affine point (third coordinate [\"1\", \"0\"])", where)
    return coords[0], coords[1]  # type: ignore[return-value]


def g1_to(p: tuple[int, int] | None) -> list[str]:
    return ["0", "1", "0"] if p is None else [str(p[0]), str(p[1]), "1"]


def g2_to(p: tuple[tuple[int, int], tuple[int, int]] | None) -> list[list[str]]:
    if p is None:
        return [["0", "0"], ["1", "0"], ["0", "0"]]
    return [[str(p[0][0]), str(p[0][1])], [str(p[1][0]), str(p[1][1])], ["1", "0"]]


def _obj(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise ZkError("expected a JSON object", where)
    if v.get("protocol") != "groth16" or v.get("curve") != "bn128":
        raise ZkError("expected protocol \"groth16\" and curve \"bn128\"", where)
    return v


def proof_from_json(obj: Any, where: str = "proof") -> Proof:
    o = _obj(obj, where)
    for k in ("pi_a", "pi_b", "pi_c"):
        if k not in o:
            raise ZkError(f"missing field {k}", where)
    return Proof(g1_from(o["pi_a"], f"{where}.pi_a"), g2_from(o["pi_b"], f"{where}.pi_b"),
                 g1_from(o["pi_c"], f"{where}.pi_c"))


def proof_to_json(p: Proof) -> dict:
    return {"pi_a": g1_to(p.a), "pi_b": g2_to(p.b), "pi_c": g1_to(p.c), "protocol": "groth16", "curve": "bn128"}


def public_from_json(obj: Any, where: str = "public") -> list[int]:
    if not isinstance(obj, list):
        raise ZkError("expected a JSON list of decimal strings", where)
    return [_int(v, f"{where}[{i}]", R) for i, v in enumerate(obj)]


def public_to_json(values: Sequence[int]) -> list[str]:
    return [str(v % R) for v in values]


def vk_from_json(obj: Any, where: str = "vk") -> VerifyingKey:
    o = _obj(obj, where)
    for k in ("nPublic", "vk_alpha_1", "vk_beta_2", "vk_gamma_2", "vk_delta_2", "IC"):
        if k not in o:
            raise ZkError(f"missing field {k}", where)
    n = o["nPublic"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ZkError("nPublic must be a non-negative integer", f"{where}.nPublic")
    ic = o["IC"]
    if not isinstance(ic, list) or len(ic) != n + 1:
        raise ZkError(f"IC must list nPublic + 1 = {n + 1} points", f"{where}.IC")
    return VerifyingKey(n, g1_from(o["vk_alpha_1"], f"{where}.vk_alpha_1"), g2_from(o["vk_beta_2"], f"{where}.vk_beta_2"),
                        g2_from(o["vk_gamma_2"], f"{where}.vk_gamma_2"), g2_from(o["vk_delta_2"], f"{where}.vk_delta_2"),
                        tuple(g1_from(p, f"{where}.IC[{i}]") for i, p in enumerate(ic)))


def _fq12_tower(f: Any) -> list:
    """py_ecc's FQ12 (basis w^0..w^11, w^6 = 9 + u) in snarkjs's tower Fq2[v]/(v^3 - (9+u))[w]/(w^2 - v):
    the Fq2 coefficient of w^j is (a_j + 9 a_{j+6}) + a_{j+6} u; even j go to c0, odd j to c1."""
    a = [int(c) for c in f.coeffs]
    c = [[str((a[j] + 9 * a[j + 6]) % Q), str(a[j + 6] % Q)] for j in range(6)]
    return [[c[0], c[2], c[4]], [c[1], c[3], c[5]]]


# ffjavascript's final exponentiation (Fuentes-Castaneda et al.) computes the reduced pairing raised to
# m = 2x(6x^2 + 3x + 1), x the BN parameter; py_ecc's is the plain (q^12 - 1)/r power. Both are valid
# pairings; vk_alphabeta_12 is only informative, but we write exactly what snarkjs writes.
_BN_X = 4965661367192848881
_FFJS_PAIRING_POWER = 2 * _BN_X * (6 * _BN_X * _BN_X + 3 * _BN_X + 1) % R


def vk_to_json(vk: VerifyingKey) -> dict:
    from py_ecc import optimized_bn128 as bn  # only for writing vk_alphabeta_12 (zk-setup, and the daemon's key setup)

    ab = bn.pairing((bn.FQ2(list(vk.beta2[0])), bn.FQ2(list(vk.beta2[1])), bn.FQ2.one()),
                    (bn.FQ(vk.alpha1[0]), bn.FQ(vk.alpha1[1]), bn.FQ.one())) ** _FFJS_PAIRING_POWER if vk.alpha1 and vk.beta2 else bn.FQ12.one()
    return {"protocol": "groth16", "curve": "bn128", "nPublic": vk.n_public,
            "vk_alpha_1": g1_to(vk.alpha1), "vk_beta_2": g2_to(vk.beta2), "vk_gamma_2": g2_to(vk.gamma2),
            "vk_delta_2": g2_to(vk.delta2), "vk_alphabeta_12": _fq12_tower(ab),
            "IC": [g1_to(p) for p in vk.ic]}


def load(path: Path) -> Any:
    """JSON from a file; unreadable or invalid JSON is a ZkError naming the file."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ZkError(f"cannot read JSON ({e})", str(path)) from None


def dump(path: Path, obj: Any) -> None:
    Path(path).write_text(json.dumps(obj, indent=1) + "\n")
