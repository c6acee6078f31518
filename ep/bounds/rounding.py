"""The float policy of the bound computations: everything runs in float64 and every bound is moved
outward by a margin relative to the sum of absolute contributions that produced it."""
from __future__ import annotations

import numpy as np

# float64 rounds each operation by ~1.1e-16 relative; 1e-9 of the absolute contributions covers
# accumulated error (dot products, chains of layers, libm's few-ulp tanh/exp) by many orders.
REL = 1e-9
ABS = 1e-12


def margin(magnitude: np.ndarray) -> np.ndarray:
    """How far to move a computed endpoint outward, given the sum of |terms| that produced it."""
    return REL * np.abs(magnitude) + ABS


def float32_enclosure(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The smallest float32-representable box containing [lower, upper], as float64.

    The runtime sees float32 inputs; rounding an in-box float64 signal to float32 can leave the box
    by one float32 ulp, so the analysis covers the enclosing float32 box instead."""
    lo32 = lower.astype(np.float32)
    hi32 = upper.astype(np.float32)
    lo32 = np.where(lo32.astype(np.float64) > lower, np.nextafter(lo32, np.float32(-np.inf)), lo32)
    hi32 = np.where(hi32.astype(np.float64) < upper, np.nextafter(hi32, np.float32(np.inf)), hi32)
    return lo32.astype(np.float64), hi32.astype(np.float64)


def float32_inside(points: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Points rounded to float32 but kept inside the float32 enclosure of [lower, upper]."""
    lo, hi = float32_enclosure(lower, upper)
    return np.clip(points, lo, hi).astype(np.float32)


def float32_slack(magnitude: np.ndarray) -> np.ndarray:
    """Tolerance for comparing a float32 runtime result with exact (float64) bounds.

    The bounds are for exact arithmetic on the model's weights; onnxruntime computes in float32
    (unit roundoff 6e-8), whose error grows with the absolute terms of each dot product and with
    depth. 2e-5 of the absolute-contribution magnitude is a generous allowance for small MLPs."""
    return 2e-5 * np.abs(magnitude) + 1e-6
