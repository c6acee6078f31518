"""Multi-scalar multiplication (Pippenger's bucket method) for G1 and G2 on a number backend.

Scalars 0 and 1 are handled before the buckets: circuits are full of boolean wires, and a plain
mixed addition is far cheaper than a pass through every window. Window width ~ log2(N) - 3.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .backend import Backend
from .field import R


def _window(n: int) -> int:
    """The width minimising windows * (n mixed additions + 2 * 2^c full additions, ~2x as dear)."""
    return min(range(2, 17), key=lambda c: -(-254 // c) * (n + 4 * (1 << c)))


@dataclass(frozen=True, slots=True)
class NativePoints:
    """Points held by a native backend (e.g. an mcl array), made once per key by `lift_points`."""

    g2: bool
    handle: Any


def msm(group: type, points: Sequence[Any] | NativePoints, scalars: Sequence[int], be: Backend) -> Any:
    """sum(scalars[i] * points[i]) as an affine point (None for infinity).

    `points` come from `lift_points` for the same backend (affine tuples in its numbers, or a native
    array); scalars are ints, reduced mod r here.
    """
    if isinstance(points, NativePoints):
        return be.msm(points.g2, points.handle, scalars)  # type: ignore[attr-defined]
    q = be.q
    add_mixed = group.add_mixed
    add = group.add
    double = group.double
    ones = None
    big: list[tuple[int, Any]] = []
    for p, k in zip(points, scalars):
        if p is None:
            continue
        k %= R
        if k == 0:
            continue
        if k == 1:
            ones = add_mixed(ones, p, q)
        else:
            big.append((k, p))
    if not big:
        return group.to_affine(ones, be)
    c = _window(len(big))
    mask = (1 << c) - 1
    nbits = max(k.bit_length() for k, _ in big)
    n_windows = (nbits + c - 1) // c
    acc = None
    for w in range(n_windows - 1, -1, -1):
        for _ in range(c):
            acc = double(acc, q)
        shift = w * c
        buckets: list[Any] = [None] * (mask + 1)
        for k, p in big:
            idx = (k >> shift) & mask
            if idx:
                buckets[idx] = add_mixed(buckets[idx], p, q)
        running = None
        total = None
        for idx in range(mask, 0, -1):
            b = buckets[idx]
            if b is not None:
                running = add(running, b, q)
            if running is not None:
                total = add(total, running, q)
        acc = add(acc, total, q)
    acc = add(acc, ones, q)
    return group.to_affine(acc, be)


def lift_points(group: type, points: Sequence[Any], be: Backend) -> Any:
    """Affine int points to the backend's representation, once per key (not per proof)."""
    native = getattr(be, "native_points", None)
    if native is not None:
        from .curve import G2

        return NativePoints(group is G2, native(group is G2, list(points)))
    return [group.lift(p, be) for p in points]
