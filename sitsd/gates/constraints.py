"""Constraint gate: the config's constraint language compiled once into arrays, checked per frame.

Per signal: finite, range, type domain (integer, bool, enum values, bit mask) and rate of change
(per second, from the senders' timestamps and the last accepted frame). Across signals: two-sided
linear constraints min <= a.x <= max, each active only while its `when` conditions hold. A check
returns -1 (pass) or the index of the first violated rule in `names`. `evaluate_directly` is the
same rules written plainly: the reference the compiled checker is tested and benchmarked against.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from ..config import Condition, LinearConstraint, Signal

_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
        ">=": operator.ge}
_OP_CODES = {op: i for i, op in enumerate(_OPS)}
KINDS = ("finite", "range", "domain", "max_rate")  # per-signal rule kinds, in index order


class ConstraintGate:
    def __init__(self, signals: list[Signal], constraints: list[LinearConstraint]) -> None:
        n = len(signals)
        index = {s.name: i for i, s in enumerate(signals)}
        self.signals = signals
        self._n = n
        self.lo = np.array([s.lower for s in signals])
        self.hi = np.array([s.upper for s in signals])
        self.max_rate = np.array([s.max_rate if s.max_rate else np.inf for s in signals])
        self.has_rates = bool(np.isfinite(self.max_rate).any())
        # Rates are measured against an accepted value at least rate_window_ms old (without a window: the
        # previous accepted frame). Two references per signal make that O(1): `cand` is sampled from the
        # accepted frames at least a window apart, `ref` is the `cand` before it, and the newer of the two
        # that is a window old is used, so the reference is one to about two windows old (not always the
        # newest accepted value a window old). An accepted frame stamped before the previous one (the clock
        # stepped back) restarts both from itself.
        self._window_ns = np.array([int(s.rate_window_ms * 1e6) for s in signals], dtype=np.int64)
        self._cand_v, self._ref_v = np.zeros(n), np.zeros(n)
        self._cand_t, self._ref_t = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self._cand_set, self._ref_set = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        self._use_v, self._dt = np.zeros(n), np.zeros(n)
        self._has_windows = bool((self._window_ns > 0).any())  # else: the previous frame, the cheap way
        self._age, self._use_t = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self._cand_ok, self._ref_ok = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        # domains: integers (int, bool, bits, integral enums) checked as a vector; enums and masks per signal
        self._integral = np.array([i for i, s in enumerate(signals) if s.type in ("int", "bool", "bits")], dtype=np.intp)
        self._enums = [(i, frozenset(s.values)) for i, s in enumerate(signals) if s.type == "enum"]
        self._masks = [(i, ~s.mask) for i, s in enumerate(signals) if s.type == "bits"]
        self._hold = np.array([s.on_invalid == "hold_last" for s in signals])
        # linear constraints: rows of A with both bounds (inf where absent)
        m = len(constraints)
        self.a = np.zeros((m, n))
        for row, c in enumerate(constraints):
            for name, coef in c.coefficients.items():
                self.a[row, index[name]] = coef
        tol = 1e-9
        self.b_hi = np.array([c.max + tol if c.max is not None else np.inf for c in constraints])
        self.b_lo = np.array([c.min - tol if c.min is not None else -np.inf for c in constraints])
        # conditions: one entry per (constraint, condition); a constraint is active when none of its fail
        conds = [(row, cond) for row, c in enumerate(constraints) for cond in c.conditions]
        self._cond_sig = np.array([index[cond.signal] for _, cond in conds], dtype=np.intp)
        self._cond_val = np.array([cond.value for _, cond in conds])
        self._cond_op = np.array([_OP_CODES[cond.op] for _, cond in conds], dtype=np.intp)
        self._cond_owner = np.zeros((m, len(conds)))
        for k, (row, _) in enumerate(conds):
            self._cond_owner[row, k] = 1.0
        self._has_conditions = bool(conds)
        self.names = ([f"{s.name}.{kind}" for kind in KINDS for s in signals] + [c.name for c in constraints])
        self.constraints = constraints
        self._prev = np.zeros(n)
        self._prev_ns = 0
        self._has_prev = False
        self._scratch = np.zeros(n)
        self.substituted = 0  # values replaced by the last accepted one (on_invalid: hold_last)
        self.last_substituted: list[str] = []

    # -- per frame -----------------------------------------------------------------------------
    def check(self, values: np.ndarray, timestamp_ns: int) -> int:
        n = self._n
        finite = np.isfinite(values)
        if not finite.all():
            bad = ~finite
            if self._has_prev and self._hold[bad].all():
                values[bad] = self._prev[bad]  # hold_last: the frame goes on with the last good value
                self.substituted += int(bad.sum())
                self.last_substituted = [self.signals[i].name for i in np.flatnonzero(bad)]
            else:
                return int(np.argmax(bad))
        outside = (values < self.lo) | (values > self.hi)
        if outside.any():
            return n + int(np.argmax(outside))
        first = n  # the lowest-numbered signal whose value is outside its type's domain
        if self._integral.size:
            ints = values[self._integral]
            frac = ints != np.floor(ints)
            if frac.any():
                first = int(self._integral[np.argmax(frac)])
        for i, allowed in self._enums:
            if i < first and values[i] not in allowed:
                first = i
                break
        for i, forbidden in self._masks:
            if i < first and int(values[i]) & forbidden:
                first = i
                break
        if first < n:
            return 2 * n + first
        if self.has_rates and self._has_prev and timestamp_ns > self._prev_ns and not self._has_windows:
            self._dt.fill((timestamp_ns - self._prev_ns) * 1e-9)
            self._use_v[:] = self._prev
            np.subtract(values, self._prev, out=self._scratch)
            np.abs(self._scratch, out=self._scratch)
            too_fast = self._scratch > self.max_rate * self._dt
            if too_fast.any():
                return 3 * n + int(np.argmax(too_fast))
        elif self.has_rates and self._has_prev and timestamp_ns > self._prev_ns:
            cand_ok, ref_ok = self._cand_ok, self._ref_ok  # preallocated: no per-frame allocation here
            np.subtract(timestamp_ns, self._cand_t, out=self._age)
            np.greater_equal(self._age, self._window_ns, out=cand_ok)
            cand_ok &= self._cand_set
            np.subtract(timestamp_ns, self._ref_t, out=self._age)
            np.greater_equal(self._age, self._window_ns, out=ref_ok)
            ref_ok &= self._ref_set
            ref_ok |= cand_ok  # usable at all
            np.copyto(self._use_v, self._ref_v)
            np.copyto(self._use_v, self._cand_v, where=cand_ok)
            np.copyto(self._use_t, self._ref_t)
            np.copyto(self._use_t, self._cand_t, where=cand_ok)
            np.subtract(timestamp_ns, self._use_t, out=self._dt, casting="unsafe")
            self._dt *= 1e-9
            np.subtract(values, self._use_v, out=self._scratch)
            np.abs(self._scratch, out=self._scratch)
            too_fast = ref_ok & (self._scratch > self.max_rate * self._dt)
            if too_fast.any():
                return 3 * n + int(np.argmax(too_fast))
        if len(self.b_hi):
            ax = self.a @ values
            over = (ax > self.b_hi) | (ax < self.b_lo)
            if over.any():
                if self._has_conditions:
                    over &= self._active(values)
                if over.any():
                    return 4 * n + int(np.argmax(over))
        stepped_back = self._has_prev and timestamp_ns < self._prev_ns
        self._prev[:] = values
        self._prev_ns = timestamp_ns
        if self._has_windows:
            if stepped_back:
                # the sender's clock stepped back: references stamped after this frame would not be a window
                # old again until the clock caught up (no rate check until then, seconds after a big step),
                # and a window-0 signal would not measure against this, the previous, frame. Restart the
                # references from this frame, as at the first frame.
                self._cand_set.fill(False)
                self._ref_set.fill(False)
            promote = self._cand_ok
            np.subtract(timestamp_ns, self._cand_t, out=self._age)
            np.greater_equal(self._age, self._window_ns, out=promote)
            promote |= ~self._cand_set
            np.copyto(self._ref_v, self._cand_v, where=promote)
            np.copyto(self._ref_t, self._cand_t, where=promote)
            np.copyto(self._ref_set, self._cand_set, where=promote)
            np.copyto(self._cand_v, values, where=promote)
            np.copyto(self._cand_t, timestamp_ns, where=promote)
            self._cand_set |= promote
        self._has_prev = True
        return -1

    def _active(self, values: np.ndarray) -> np.ndarray:
        v = values[self._cond_sig]
        c, op = self._cond_val, self._cond_op
        holds = np.select([op == 0, op == 1, op == 2, op == 3, op == 4], [v == c, v != c, v < c, v <= c, v > c],
                          default=v >= c)
        return (self._cond_owner @ (~holds)) == 0

    # -- off the fast path ---------------------------------------------------------------------
    def kind(self, index: int) -> str:
        return KINDS[index // self._n] if index < 4 * self._n else "linear"

    def policy(self, index: int) -> str:
        """What the loop does on this violation: the signal's on_invalid for bad values, else failsafe."""
        if index < 4 * self._n and index // self._n in (0, 2):
            return self.signals[index % self._n].on_invalid
        return "failsafe"

    def describe(self, index: int, values: np.ndarray) -> str:
        """A human sentence for a violation."""
        n = self._n
        name = self.names[index]
        if index >= 4 * n:
            row = index - 4 * n
            c = self.constraints[row]
            ax = float(self.a[row] @ values)
            bound = f"<= {c.max:g}" if c.max is not None and ax > self.b_hi[row] else f">= {c.min:g}"
            when = f" (active: {c.when})" if c.when else ""
            return f"{name}: {ax:g} is not {bound}{when}"
        i, kind = index % n, KINDS[index // n]
        s = self.signals[i]
        v = values[i]
        if kind == "finite":
            return f"{name}: value is {v}"
        if kind == "range":
            return f"{name}: {v:g} {s.unit} outside [{self.lo[i]:g}, {self.hi[i]:g}]"
        if kind == "domain":
            allowed = {"enum": f"one of {s.values}", "bits": f"only bits of mask 0x{s.mask or 0:x}"}.get(
                s.type, f"an integer ({s.type})")
            return f"{s.name}.{s.type}: {v:g} is not {allowed}"
        return (f"{name}: changed from {self._use_v[i]:g} to {v:g} {s.unit} in {self._dt[i] * 1e3:.3g} ms, "
                f"limit {self.max_rate[i]:g} {s.unit}/s")


def _holds(cond: Condition, values: dict[str, float]) -> bool:
    return _OPS[cond.op](values[cond.signal], cond.value)


def evaluate_directly(signals: list[Signal], constraints: list[LinearConstraint], values: list[float],
                      prev: list[float] | None = None, dt_s: float | None = None) -> str | None:
    """The rules written plainly, one at a time: the name of the first violated rule, or None.

    Same order and names as ConstraintGate (without hold_last substitution)."""
    by_name = {s.name: v for s, v in zip(signals, values)}
    for kind in KINDS:
        for i, (s, v) in enumerate(zip(signals, values)):
            if kind == "finite" and not math.isfinite(v):
                return f"{s.name}.finite"
            if kind == "range" and not s.lower <= v <= s.upper:
                return f"{s.name}.range"
            if kind == "domain":
                if s.type in ("int", "bool", "bits") and v != math.floor(v):
                    return f"{s.name}.domain"
                if s.type == "enum" and v not in s.values:
                    return f"{s.name}.domain"
                if s.type == "bits" and int(v) & ~s.mask:
                    return f"{s.name}.domain"
            if kind == "max_rate" and prev is not None and dt_s and s.max_rate is not None:
                if abs(v - prev[i]) > s.max_rate * dt_s:
                    return f"{s.name}.max_rate"
    for c in constraints:
        if not all(_holds(cond, by_name) for cond in c.conditions):
            continue
        ax = sum(coef * by_name[name] for name, coef in c.coefficients.items())
        if (c.max is not None and ax > c.max + 1e-9) or (c.min is not None and ax < c.min - 1e-9):
            return c.name
    return None
