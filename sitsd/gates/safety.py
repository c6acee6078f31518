"""Safety envelope on the model's outputs: actuator limits and rate limits, and the fail-safe values.

A model output is clamped into [min, max], then moved at most max_rate * dt from the last
command sent (dt from the frames' sender timestamps). A stamp that is not after the last
command's (the PLC's clock jumped: a fail-safe went out for a frame stamped ahead of ours, and
the clock is back) allows no movement for that frame, never an unlimited one. A non-finite
output becomes the fail-safe value. An actuator with on_violation: failsafe turns any needed
clamp into the fail-safe command instead (`violation` says which and why, for the loop's
alert). Every command that leaves must have passed through here or be the fail-safe.
"""
from __future__ import annotations

import numpy as np

from ..config import Actuator


class SafetyEnvelope:
    def __init__(self, actuators: list[Actuator], outputs: list[str]) -> None:
        by_name = {a.output: a for a in actuators}
        ordered = [by_name[o] for o in outputs]
        self.lo = np.array([a.min for a in ordered])
        self.hi = np.array([a.max for a in ordered])
        self.max_rate = np.array([a.max_rate if a.max_rate else np.inf for a in ordered])
        self._hold_step = np.where(np.isfinite(self.max_rate), 0.0, np.inf)  # the step when no time has passed
        self.failsafe = np.array([a.failsafe for a in ordered])
        self.names = [a.output for a in ordered]
        self._strict = np.array([a.on_violation == "failsafe" for a in ordered])
        self.violation = ""  # set by apply: what was clamped; empty when the output was inside
        self.wants_failsafe = False
        self.last = self.failsafe.copy()
        self._last_ns = 0
        self.out = np.zeros(len(ordered))
        self.clamped = 0  # commands changed by the envelope

    def apply(self, proposed: np.ndarray, timestamp_ns: int) -> np.ndarray:
        out = self.out
        out[:] = proposed
        bad = ~np.isfinite(out)
        if bad.any():
            out[bad] = self.failsafe[bad]
        np.clip(out, self.lo, self.hi, out=out)
        if self._last_ns:
            dt_ns = timestamp_ns - self._last_ns
            # dt <= 0: the stamps went back (a clock jump); holding the last command is the only safe reading
            step = self.max_rate * (dt_ns * 1e-9) if dt_ns > 0 else self._hold_step
            np.clip(out, self.last - step, self.last + step, out=out)
        changed = bad | (out != proposed)
        if changed.any():
            self.clamped += 1
            i = int(np.argmax(changed))
            self.violation = (f"{self.names[i]}: model output {float(proposed[i]):g} "
                              f"{'is not finite' if bad[i] else f'clamped to {out[i]:g}'} "
                              f"(limits [{self.lo[i]:g}, {self.hi[i]:g}], rate {self.max_rate[i]:g}/s)")
            self.wants_failsafe = bool((changed & self._strict).any())
        else:
            self.violation = ""
            self.wants_failsafe = False
        return out

    def commit(self, values: np.ndarray, timestamp_ns: int) -> None:
        self.last[:] = values
        self._last_ns = timestamp_ns
