"""Per-frame timings in a preallocated ring: the loop writes, the I/O thread reads percentiles.

Row i holds one frame: stage durations in microseconds and the end-to-end latency (PLC send
time to write acknowledged). NaN marks what did not happen (a dropped frame has no model time).
"""
from __future__ import annotations

import numpy as np

STAGES = ("transit", "wakeup", "timestamp_gate", "constraint_gate", "model", "safety", "sign", "handoff", "write")
STAGE_INDEX = {name: i for i, name in enumerate(STAGES)}


class TimingRing:
    def __init__(self, capacity: int = 1 << 16) -> None:
        self.capacity = capacity
        self.stages = np.full((capacity, len(STAGES)), np.nan)
        self.latency_us = np.full(capacity, np.nan)
        self.rows_written = 0

    def next_row(self) -> int:
        """Claim and clear the next row (loop thread only)."""
        row = self.rows_written % self.capacity
        self.stages[row].fill(np.nan)
        self.latency_us[row] = np.nan
        self.rows_written += 1
        return row

    def _filled(self) -> slice:
        return slice(0, min(self.rows_written, self.capacity))

    def latency_summary(self) -> dict[str, float]:
        return _percentiles(self.latency_us[self._filled()], with_max=True)

    def stage_summary(self) -> dict[str, dict[str, float]]:
        rows = self.stages[self._filled()]
        return {name: _percentiles(rows[:, i], with_max=True) for i, name in enumerate(STAGES)}


def _percentiles(values: np.ndarray, with_max: bool = False) -> dict[str, float]:
    v = values[np.isfinite(values)]
    if v.size == 0:
        out = {"p50": 0.0, "p99": 0.0}
        if with_max:
            out["max"] = 0.0
        return out
    p50, p99 = np.percentile(v, [50, 99])
    out = {"p50": round(float(p50), 1), "p99": round(float(p99), 1)}
    if with_max:
        out["max"] = round(float(v.max()), 1)
    return out
