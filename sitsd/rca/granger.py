"""Granger causality by least squares (numpy only): does the past of x help predict y beyond y's own past?

F = ((RSS_r - RSS_u) / p) / (RSS_u / (n - 2p - 1)) with the restricted model y_t ~ 1 + y_{t-1..t-p}
and the unrestricted one adding x_{t-1..t-p}; the p-value is the F distribution's upper tail,
computed from the regularized incomplete beta function (continued fraction, as in Numerical Recipes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GrangerResult:
    f: float
    p_value: float
    lags: int
    n: int


def _lagged(v: np.ndarray, lags: int) -> np.ndarray:
    n = len(v)
    return np.column_stack([v[lags - k:n - k] for k in range(1, lags + 1)])


def granger(x: np.ndarray, y: np.ndarray, lags: int = 3) -> GrangerResult:
    """Tests x -> y. Constant or too-short series give F = 0, p = 1 (no evidence either way)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(y) - lags
    dof = n - 2 * lags - 1
    if dof < 5 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return GrangerResult(0.0, 1.0, lags, max(n, 0))
    # standardise: keeps lstsq well conditioned for signals in kN and in mm alike
    x = (x - x.mean()) / x.std()
    y = (y - y.mean()) / y.std()
    target = y[lags:]
    ones = np.ones((n, 1))
    restricted = np.hstack([ones, _lagged(y, lags)])
    unrestricted = np.hstack([restricted, _lagged(x, lags)])
    rss_r = _rss(restricted, target)
    rss_u = _rss(unrestricted, target)
    if rss_u <= 0:
        return GrangerResult(math.inf, 0.0, lags, n)
    f = max(0.0, ((rss_r - rss_u) / lags) / (rss_u / dof))
    return GrangerResult(f, f_survival(f, lags, dof), lags, n)


def _rss(a: np.ndarray, b: np.ndarray) -> float:
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    r = b - a @ coef
    return float(r @ r)


def f_survival(f: float, d1: int, d2: int) -> float:
    """P(F > f) for the F(d1, d2) distribution."""
    if f <= 0:
        return 1.0
    if not math.isfinite(f):
        return 0.0
    return regularized_beta(d2 / (d2 + d1 * f), d2 / 2.0, d1 / 2.0)


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by Lentz's continued fraction on whichever side converges."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_cf(1.0 - x, b, a) / b


def _beta_cf(x: float, a: float, b: float, iterations: int = 300, eps: float = 1e-14) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, iterations + 1):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h
