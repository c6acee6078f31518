"""Fault injection for the rolling-mill simulator: eight fault types, each switched on at a time.

A `FaultInjector` is asked at every physics step what to change: the plant (roll wear, actuator
stroke), the sensor readings (drift, stuck, operating mode), the frame timing (clock skew,
network delay), the command (model drift) and the controller's diagnostics (PLC fault code).
The simulator server and the offline scenario runner (`sitsd.rca.scenario`) call the same hooks,
so a live demo and the benchmark see the very same faults. The injector never reports what it
injected to anyone but its owner: the localizer only ever sees frames, alerts and events.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .physics import SIGNALS, Disturbance, MillParameters

FAULT_KINDS = ("sensor_drift", "stuck_sensor", "clock_skew", "network_delay", "actuator_saturation", "roll_wear",
               "plc_fault", "model_drift")
SENSORS = SIGNALS[:6]
MODE_INDEX = SIGNALS.index("mill_mode")
MODE_THREADING = 1.0

# the fault text a controller of each vendor would show for a lost I/O station (from the profiles' data)
PLC_FAULT_TEXTS = {
    "s7-1500": ("Distributed I/Os: station failure, entering state", 0x84),
    "controllogix": ("Type 03 Code 16 I/O Connection Failure", 0x455),
    "melsec-iq-r": ("SM1 ON", 0x3),
    "simulator": ("I/O station failure", 1),
}


class FaultError(ValueError):
    """A fault specification that cannot be injected; the message says which field and what is allowed."""


@dataclass(frozen=True)
class FaultSpec:
    """`kind` at `start_s` (simulated seconds), scaled by `magnitude` (1.0 = the nominal size below);
    `signal` picks the sensor for sensor_drift and stuck_sensor; `profile` the PLC vendor for plc_fault."""

    kind: str
    start_s: float
    magnitude: float = 1.0
    signal: str | None = None
    profile: str = "simulator"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise FaultError(f"fault kind {self.kind!r} is unknown; known: {', '.join(FAULT_KINDS)}")
        if self.signal is not None and self.signal not in SENSORS:
            raise FaultError(f"fault signal {self.signal!r} is not a sensor; sensors: {', '.join(SENSORS)}")
        if self.profile not in PLC_FAULT_TEXTS:
            raise FaultError(f"fault profile {self.profile!r}: one of {', '.join(PLC_FAULT_TEXTS)}")
        if not self.magnitude > 0:
            raise FaultError(f"fault magnitude must be > 0, got {self.magnitude}")


def parse_fault(text: str, profile: str = "simulator") -> FaultSpec:
    """`KIND@SECONDS[:SIGNAL][xMAGNITUDE]`, e.g. `stuck_sensor@20:entry_thickness`, `roll_wear@15x2`."""
    try:
        kind, rest = text.split("@", 1)
        magnitude = 1.0
        if "x" in rest:
            rest, mag = rest.rsplit("x", 1)
            magnitude = float(mag)
        start, _, signal = rest.partition(":")
        return FaultSpec(kind.strip(), float(start), magnitude, signal or None, profile)
    except FaultError:
        raise
    except ValueError:
        raise FaultError(f"cannot read fault {text!r}: write KIND@SECONDS[:SIGNAL][xMAGNITUDE], e.g. "
                         f"stuck_sensor@20:entry_thickness; kinds: {', '.join(FAULT_KINDS)}") from None


class FaultInjector:
    """The hooks for one fault. Call order per step: plant(), setpoint(), sensors(), timing(), command()."""

    def __init__(self, spec: FaultSpec, params: MillParameters | None = None) -> None:
        self.spec = spec
        self.p = params or MillParameters()
        self.rng = np.random.default_rng(spec.seed + 1000)
        self.signal_index = SIGNALS.index(spec.signal or self._default_signal())
        self._stuck_value: float | None = None
        self._stroke_center: float | None = None
        self.diagnostic_sent = False
        self._sign = 1.0 if self.rng.random() < 0.5 else -1.0  # which way a drift goes

    def _default_signal(self) -> str:
        return "exit_thickness" if self.spec.kind == "sensor_drift" else "entry_thickness"

    def elapsed(self, t_s: float) -> float:
        """Seconds since the fault started (negative before)."""
        return t_s - self.spec.start_s

    def active(self, t_s: float) -> bool:
        return t_s >= self.spec.start_s

    # -- plant -----------------------------------------------------------------------------------
    def plant(self, t_s: float, d: Disturbance) -> None:
        """Roll wear opens the loaded gap: the roll surface recedes by `wear` mm (a negative expansion)."""
        if self.spec.kind == "roll_wear" and self.active(t_s):
            wear = min(0.04, 0.02 * self.spec.magnitude * self.elapsed(t_s))
            d.roll_heating -= wear

    def setpoint(self, t_s: float, correction: float) -> float:
        """Actuator saturation: the capsule loses pressure and can move only a little way from where it was."""
        if self.spec.kind == "actuator_saturation" and self.active(t_s):
            if self._stroke_center is None:
                self._stroke_center = correction
            reach = 0.005 / self.spec.magnitude
            return min(max(correction, self._stroke_center - reach), self._stroke_center + reach)
        return correction

    # -- sensors and controller ------------------------------------------------------------------
    def sensors(self, t_s: float, reading: np.ndarray) -> None:
        k, i = self.spec.kind, self.signal_index
        if not self.active(t_s):
            return
        if k == "sensor_drift":
            scale = {0: 0.02, 1: 0.02, 2: 0.01, 3: 150.0, 4: 4.0, 5: 0.02}[i]
            reading[i] += self._sign * scale * self.spec.magnitude * self.elapsed(t_s)
        elif k == "stuck_sensor":
            if self._stuck_value is None:
                self._stuck_value = float(reading[i])
            reading[i] = self._stuck_value
        elif k == "plc_fault" and len(reading) > MODE_INDEX:
            reading[MODE_INDEX] = MODE_THREADING  # the controller dropped out of automatic gauge control

    def diagnostic(self, t_s: float) -> tuple[str, int] | None:
        """plc_fault: the vendor's diagnostic text and status word, once, at the onset."""
        if self.spec.kind == "plc_fault" and self.active(t_s) and not self.diagnostic_sent:
            self.diagnostic_sent = True
            return PLC_FAULT_TEXTS[self.spec.profile]
        return None

    # -- network and clocks ----------------------------------------------------------------------
    def timing(self, t_s: float) -> tuple[int, int]:
        """(sender clock offset ns, extra network delay ns) for a frame sent at t_s."""
        if not self.active(t_s):
            return 0, 0
        e, m = self.elapsed(t_s), self.spec.magnitude
        if self.spec.kind == "clock_skew":  # the PLC's clock runs fast: 0.4 ms step, then 1 ms per second
            return int((0.4e6 + 1.0e6 * e) * m), 0
        if self.spec.kind == "network_delay":  # congestion: queueing delay that grows, with jitter
            base = min(8e6, 3e6 + 4e6 * e) * m
            return 0, int(base + self.rng.exponential(1.5e6 * m))
        return 0, 0

    # -- model ------------------------------------------------------------------------------------
    def command(self, t_s: float, value: float) -> float:
        """model_drift: the model's output drifts off (a degraded or wrongly updated model)."""
        if self.spec.kind == "model_drift" and self.active(t_s):
            return value + self._sign * min(0.06, 0.02 * self.spec.magnitude * self.elapsed(t_s))
        return value
