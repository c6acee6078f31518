"""Constraint gate: ranges, finiteness, rates of change and linear constraints over the signals.

Compiled once from the config into arrays; a check is a handful of vector operations on the
frame's values and returns -1 (pass) or the index of the first violated constraint in `names`.
Rates use the senders' timestamps and the last accepted frame.
"""
from __future__ import annotations

import numpy as np

from ..config import LinearConstraint, Signal


class ConstraintGate:
    def __init__(self, signals: list[Signal], constraints: list[LinearConstraint]) -> None:
        n = len(signals)
        index = {s.name: i for i, s in enumerate(signals)}
        self.lo = np.array([s.lower for s in signals])
        self.hi = np.array([s.upper for s in signals])
        self.max_rate = np.array([s.max_rate if s.max_rate else np.inf for s in signals])
        self.has_rates = bool(np.isfinite(self.max_rate).any())
        self.a = np.zeros((len(constraints), n))
        for row, c in enumerate(constraints):
            for name, coef in c.coefficients.items():
                self.a[row, index[name]] = coef
        self.b = np.array([c.max if c.max is not None else np.inf for c in constraints]) + 1e-12
        # names, in index order: finite checks, ranges, rates, then the linear constraints
        self.names = ([f"{s.name}.finite" for s in signals] + [f"{s.name}.range" for s in signals]
                      + [f"{s.name}.max_rate" for s in signals] + [c.name for c in constraints])
        self._n = n
        self._prev = np.zeros(n)
        self._prev_ns = 0
        self._scratch = np.zeros(n)

    def check(self, values: np.ndarray, timestamp_ns: int) -> int:
        n = self._n
        finite = np.isfinite(values)
        if not finite.all():
            return int(np.argmin(finite))
        outside = (values < self.lo) | (values > self.hi)
        if outside.any():
            return n + int(np.argmax(outside))
        if self.has_rates and self._prev_ns and timestamp_ns > self._prev_ns:
            dt = (timestamp_ns - self._prev_ns) * 1e-9
            np.subtract(values, self._prev, out=self._scratch)
            np.abs(self._scratch, out=self._scratch)
            too_fast = self._scratch > self.max_rate * dt
            if too_fast.any():
                return 2 * n + int(np.argmax(too_fast))
        if len(self.b):
            over = self.a @ values > self.b
            if over.any():
                return 3 * n + int(np.argmax(over))
        self._prev[:] = values
        self._prev_ns = timestamp_ns
        return -1

    def describe(self, index: int, values: np.ndarray) -> str:
        """A human sentence for a violation (off the fast path)."""
        n = self._n
        name = self.names[index]
        if index < n:
            return f"{name}: value is {values[index]}"
        if index < 2 * n:
            i = index - n
            return f"{name}: {values[i]:g} outside [{self.lo[i]:g}, {self.hi[i]:g}]"
        if index < 3 * n:
            i = index - 2 * n
            return f"{name}: changed from {self._prev[i]:g} to {values[i]:g}, limit {self.max_rate[i]:g}/s"
        row = index - 3 * n
        return f"{name}: {float(self.a[row] @ values):g} > {self.b[row]:g}"
