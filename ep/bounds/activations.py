"""Elementwise nonlinearities: their values, interval images, and sound linear relaxations.

A relaxation picks a slope `a` per neuron heuristically (chord, tangents, CROWN's tangent through
an endpoint) and then sets the offset exactly: max/min of f(x) - a*x over [l, u] is attained at
l, u or a stationary point (a kink of a piecewise-linear f, or a solution of f'(x) = a for the
S-shaped ones, which has a closed form). So soundness never depends on the slope heuristics."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rounding import margin

_BISECTION_STEPS = 24  # for CROWN's tangent points; precision only affects tightness, not soundness


@dataclass
class Relaxation:
    """lower_slope*x + lower_offset <= f(x) <= upper_slope*x + upper_offset on [l, u], per neuron."""
    lower_slope: np.ndarray
    lower_offset: np.ndarray
    upper_slope: np.ndarray
    upper_offset: np.ndarray


class Activation:
    name = "?"
    value_range = (-np.inf, np.inf)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def stationary(self, a: np.ndarray) -> list[np.ndarray]:
        """Points where f(x) - a*x may have an interior extremum (NaN where there is none)."""
        raise NotImplementedError

    def slopes(self, l: np.ndarray, u: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def interval(self, l: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sound [min f, max f] over [l, u]: f at the endpoints and at the stationary points of f."""
        pts = _inside([l, u] + self.stationary(np.zeros_like(l)), l, u)
        vals = np.stack([self(p) for p in pts])
        lo, hi = vals.min(0), vals.max(0)
        lo, hi = lo - margin(lo), hi + margin(hi)
        return np.maximum(lo, self.value_range[0]), np.minimum(hi, self.value_range[1])

    def max_slope(self, l: np.ndarray, u: np.ndarray) -> np.ndarray:
        """An upper bound of |f'| on [l, u] (how much an error in x can grow through f)."""
        raise NotImplementedError

    def relax(self, l: np.ndarray, u: np.ndarray) -> Relaxation:
        best = None
        for a in self.slopes(l, u):
            a = np.where(np.isfinite(a), a, 0.0)
            pts = _inside([l, u] + self.stationary(a), l, u)
            f = [self(p) for p in pts]
            gap = np.stack([fp - a * p for fp, p in zip(f, pts)])
            mag = np.stack([np.abs(fp) + np.abs(a * p) for fp, p in zip(f, pts)]).max(0)
            up, lo = gap.max(0) + margin(mag), gap.min(0) - margin(mag)
            # Twice the mean height of each line over [l, u]: lower is better for the upper line.
            up_score, lo_score = a * (l + u) + 2 * up, a * (l + u) + 2 * lo
            if best is None:
                best = [a, lo, lo_score, a.copy(), up, up_score]
                continue
            take = lo_score > best[2]
            best[0], best[1], best[2] = (np.where(take, a, best[0]), np.where(take, lo, best[1]),
                                         np.where(take, lo_score, best[2]))
            take = up_score < best[5]
            best[3], best[4], best[5] = (np.where(take, a, best[3]), np.where(take, up, best[4]),
                                         np.where(take, up_score, best[5]))
        return Relaxation(best[0], best[1], best[3], best[4])


def _inside(points: list[np.ndarray], l: np.ndarray, u: np.ndarray) -> list[np.ndarray]:
    """Candidate points moved into [l, u]; missing ones (NaN) become l, which is always a candidate."""
    return [np.clip(np.where(np.isnan(p), l, p), l, u) for p in points]


def _chord(f, l: np.ndarray, u: np.ndarray) -> np.ndarray:
    width = u - l
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(width > 0, (f(u) - f(l)) / np.where(width > 0, width, 1.0), 0.0)


class PiecewiseLinear(Activation):
    """Continuous piecewise-linear f given by its kinks and the slopes of its pieces."""
    kinks: tuple[float, ...] = ()
    piece_slopes: tuple[float, ...] = ()

    def stationary(self, a: np.ndarray) -> list[np.ndarray]:
        return [np.full_like(a, k) for k in self.kinks]

    def max_slope(self, l, u):
        return np.full_like(l, max(abs(s) for s in self.piece_slopes))

    def slopes(self, l: np.ndarray, u: np.ndarray) -> list[np.ndarray]:
        # The lines through any two vertices of the graph of f on [l, u], plus the pieces' slopes:
        # the best bounding lines of a piecewise-linear function are among these.
        verts = _inside([l, u] + [np.full_like(l, k) for k in self.kinks], l, u)
        out = [np.full_like(l, s) for s in self.piece_slopes]
        for i, p in enumerate(verts):
            for q in verts[i + 1:]:
                lo, hi = np.minimum(p, q), np.maximum(p, q)
                out.append(_chord(self, lo, hi))
        return out


class Relu(PiecewiseLinear):
    name = "Relu"
    kinks = (0.0,)
    piece_slopes = (0.0, 1.0)
    value_range = (0.0, np.inf)

    def __call__(self, x):
        return np.maximum(x, 0.0)


class LeakyRelu(PiecewiseLinear):
    name = "LeakyRelu"
    kinks = (0.0,)

    def __init__(self, alpha: float) -> None:
        self.alpha = float(alpha)
        self.piece_slopes = (self.alpha, 1.0)

    def __call__(self, x):
        return np.where(x >= 0, x, self.alpha * x)


class Clip(PiecewiseLinear):
    name = "Clip"
    piece_slopes = (0.0, 1.0)

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = float(lo), float(hi)
        self.kinks = tuple(k for k in (self.lo, self.hi) if np.isfinite(k))
        self.value_range = (min(self.lo, self.hi), self.hi)

    def __call__(self, x):
        return np.minimum(np.maximum(x, self.lo), self.hi)  # ONNX order: lo > hi yields hi


class SShaped(Activation):
    """Increasing, convex below 0 and concave above 0 (tanh, sigmoid)."""

    def derivative(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def solve_derivative(self, a: np.ndarray) -> np.ndarray:
        """The x >= 0 with f'(x) = a (f' is even), NaN if there is none."""
        raise NotImplementedError

    def stationary(self, a: np.ndarray) -> list[np.ndarray]:
        x = self.solve_derivative(a)
        return [x, -x]

    def max_slope(self, l, u):
        return self.derivative(np.clip(0.0, l, u))  # f' peaks at 0

    def slopes(self, l: np.ndarray, u: np.ndarray) -> list[np.ndarray]:
        mid = 0.5 * (l + u)
        return [_chord(self, l, u), self.derivative(l), self.derivative(u), self.derivative(mid),
                self._tangent_through(l, u, upper=True), self._tangent_through(l, u, upper=False)]

    def _tangent_through(self, l: np.ndarray, u: np.ndarray, upper: bool) -> np.ndarray:
        """CROWN's slope for l < 0 < u: the line through (l, f(l)) touching f at some d in [0, u]
        (upper bound), or through (u, f(u)) touching at d in [l, 0] (lower bound). Falls back to
        the chord where that tangent point lies outside the box."""
        end = l if upper else u
        f_end = self(end)

        def excess(d):  # > 0 once the tangent at d passes above (upper) / below (lower) the end point
            g = self(d) - f_end - self.derivative(d) * (d - end)
            return g if upper else -g

        a, b = (np.zeros_like(l), np.maximum(u, 0.0)) if upper else (np.minimum(l, 0.0), np.zeros_like(u))
        far = b if upper else a
        found = excess(far) > 0
        for _ in range(_BISECTION_STEPS):
            m = 0.5 * (a + b)
            hit = excess(m) > 0
            if upper:
                b, a = np.where(hit, m, b), np.where(hit, a, m)
            else:
                a, b = np.where(hit, m, a), np.where(hit, b, m)
        d = b if upper else a
        mixed = (l < 0) & (u > 0) & found
        return np.where(mixed, _chord(self, np.minimum(end, d), np.maximum(end, d)), _chord(self, l, u))


class Tanh(SShaped):
    name = "Tanh"
    value_range = (-1.0, 1.0)

    def __call__(self, x):
        return np.tanh(x)

    def derivative(self, x):
        with np.errstate(over="ignore"):
            return 1.0 / np.cosh(x) ** 2

    def solve_derivative(self, a):
        # sech^2(x) = a  <=>  cosh(x) = 1/sqrt(a); acosh is well conditioned for small a.
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where((a > 0) & (a <= 1), np.arccosh(1.0 / np.sqrt(np.where(a > 0, a, 1.0))), np.nan)

    def interval(self, l, u):  # increasing
        lo, hi = np.tanh(l), np.tanh(u)
        return np.maximum(lo - margin(lo), -1.0), np.minimum(hi + margin(hi), 1.0)


class Sigmoid(SShaped):
    name = "Sigmoid"
    value_range = (0.0, 1.0)

    def __call__(self, x):
        e = np.exp(-np.abs(x))  # never overflows
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    def derivative(self, x):
        s = self(x)
        return s * (1.0 - s)

    def solve_derivative(self, a):
        # sigma'(x) = 1 / (4 cosh^2(x/2)) = a  <=>  x = 2 acosh(1 / (2 sqrt(a))).
        with np.errstate(divide="ignore", invalid="ignore"):
            ok = (a > 0) & (a <= 0.25)
            return np.where(ok, 2.0 * np.arccosh(1.0 / (2.0 * np.sqrt(np.where(ok, a, 0.25)))), np.nan)

    def interval(self, l, u):  # increasing
        lo, hi = self(l), self(u)
        return np.maximum(lo - margin(lo), 0.0), np.minimum(hi + margin(hi), 1.0)
