"""Optional native MSM backend: libmcl as embedded in the `mclbn256` wheel (MIT), through raw ctypes.

mclbn256 initialises libmcl for the curve Fp254BNb, which is NOT alt_bn128/BN254 as Ethereum and
snarkjs use it; `mclBn_init(MCL_BN_SNARK1)` re-initialises it for BN254 and from then on only the raw
C API is used (the package's Python classes assume the other curve). mcl's Fp2 strings are "c0 c1",
the same order as py_ecc and snarkjs JSON. Points cross the boundary as decimal strings (once per
key, in `lift`); scalars as 32-byte little-endian integers (per proof).
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

from .errors import ZkError
from .field import Q

_MCL_BN_SNARK1 = 4
_lib: Any = None
_types: dict[str, Any] = {}


def _load() -> Any:
    global _lib
    if _lib is None:
        try:
            from mclbn256 import mclbn256 as m
        except Exception as e:  # ImportError, or the embedded library failing to load
            raise ImportError(f"mclbn256 unavailable: {e}") from e
        if m.lib.mclBn_init(_MCL_BN_SNARK1, m.MCLBN_COMPILED_TIME_VAR) != 0:
            raise ImportError("libmcl refused to initialise for BN254 (MCL_BN_SNARK1)")
        m.lib.mclBn_verifyOrderG2(1)  # setStr refuses G2 points outside the order-r subgroup
        _types["gt"] = m.mclBnGT_bytes
        _types.update(g1=m.mclBnG1_bytes, g2=m.mclBnG2_bytes, fr=m.mclBnFr_bytes)
        _lib = m.lib
    return _lib


class MclBackend:
    """Curve formulas still run on Python ints (q, inv); `msm` is delegated to mclBnG1/G2_mulVec."""

    name = "mcl"
    q = Q

    def __init__(self) -> None:
        self.lib = _load()

    def lift(self, x: int) -> int:
        return x

    def inv(self, x: int) -> int:
        return pow(x, -1, Q)

    def native_points(self, g2: bool, points: Sequence[Any]) -> tuple[Any, list[int]]:
        """An mcl array of the non-infinity points and their indices in `points`."""
        idx = [i for i, p in enumerate(points) if p is not None]
        arr = ((_types["g2"] if g2 else _types["g1"]) * max(1, len(idx)))()
        set_str = self.lib.mclBnG2_setStr if g2 else self.lib.mclBnG1_setStr
        for k, i in enumerate(idx):
            p = points[i]
            s = (f"1 {p[0][0]} {p[0][1]} {p[1][0]} {p[1][1]}" if g2 else f"1 {p[0]} {p[1]}").encode()
            if set_str(ctypes.byref(arr[k]), s, len(s), 10) != 0:
                raise ZkError(f"libmcl refused point {i} (not on the curve or not in the subgroup)")
        return arr, idx

    def msm(self, g2: bool, native: tuple[Any, list[int]], scalars: Sequence[int]) -> Any:
        arr, idx = native
        n = len(idx)
        frs = (_types["fr"] * max(1, n))()
        set_fr = self.lib.mclBnFr_setLittleEndianMod
        for k, i in enumerate(idx):
            b = (scalars[i] % (1 << 256)).to_bytes(32, "little")
            set_fr(ctypes.byref(frs[k]), b, 32)
        out = (_types["g2"] if g2 else _types["g1"])()
        if g2:
            self.lib.mclBnG2_mulVec(ctypes.byref(out), arr, frs, n)
            self.lib.mclBnG2_normalize(ctypes.byref(out), ctypes.byref(out))
        else:
            self.lib.mclBnG1_mulVec(ctypes.byref(out), arr, frs, n)
            self.lib.mclBnG1_normalize(ctypes.byref(out), ctypes.byref(out))
        buf = ctypes.create_string_buffer(1024)
        get = self.lib.mclBnG2_getStr if g2 else self.lib.mclBnG1_getStr
        get(buf, 1024, ctypes.byref(out), 10)
        parts = [int(v) for v in buf.value.split()]
        if parts[0] == 0:
            return None
        if g2:
            return (parts[1], parts[2]), (parts[3], parts[4])
        return parts[1], parts[2]

    def pairing_product_is_one(self, pairs: Sequence[tuple[Any, Any]]) -> bool:
        """prod e(P_i, Q_i) == 1 for affine (G1, G2) pairs: one Miller loop vector, one final exponentiation.

        ZkError if libmcl refuses a point (off the curve, or a G2 point outside the subgroup)."""
        pairs = [(p, q) for p, q in pairs if p is not None and q is not None]  # e(O, Q) = e(P, O) = 1
        if not pairs:
            return True
        g1s, _ = self.native_points(False, [p for p, _ in pairs])
        g2s, _ = self.native_points(True, [q for _, q in pairs])
        gt = _types["gt"]()
        self.lib.mclBn_millerLoopVec(ctypes.byref(gt), g1s, g2s, len(pairs))
        self.lib.mclBn_finalExp(ctypes.byref(gt), ctypes.byref(gt))
        return bool(self.lib.mclBnGT_isOne(ctypes.byref(gt)))
