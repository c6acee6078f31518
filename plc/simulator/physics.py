"""A small physical model of one rolling-mill stand, for the simulator and for training the demo model.

Gaugemeter and plastic curve:   h = S - theta + F / M,   F = Q (H - h) - k_T (T - T0)
so the exit thickness is        h = (M (S - theta) + Q H - k_T (T - T0)) / (M + Q).
S roll gap (hydraulic actuator, first-order lag and rate limit), theta thermal expansion of the
rolls (slow roll heating), H entry thickness (slow drift, random walk, roll eccentricity),
Q strip plasticity (hardness drift), T strip tension. Units: mm, kN, kN/mm, s, m/s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SIGNALS = ("entry_thickness", "exit_thickness", "roll_gap", "rolling_force", "strip_tension", "strip_speed",
           "mill_mode")
MEASURED = 6  # the first six are sensor readings; mill_mode is the PLC's operating mode
MODE_AUTOMATIC = 2.0  # 0 stopped, 1 threading/setup, 2 automatic gauge control


@dataclass(frozen=True)
class MillParameters:
    mill_modulus: float = 5000.0  # M, kN/mm
    plasticity: float = 8000.0  # Q nominal, kN/mm
    tension_gain: float = 2.0  # k_T, kN force per kN tension
    nominal_tension: float = 120.0  # T0, kN
    entry_nominal: float = 4.0  # H0, mm
    exit_target: float = 3.0  # h_t, mm
    entry_speed: float = 2.0  # m/s
    actuator_tau_s: float = 0.02
    actuator_rate_mm_s: float = 2.0
    heating_max_mm: float = 0.03
    heating_tau_s: float = 6.0
    # sensor noise (1 sigma)
    noise_thickness_mm: float = 0.0015
    noise_gap_mm: float = 0.0005
    noise_force_kn: float = 8.0
    noise_tension_kn: float = 0.5
    noise_speed_m_s: float = 0.002

    @property
    def nominal_gap(self) -> float:
        """S0: the gap that gives the target exit thickness with nominal entry, cold rolls."""
        m, q = self.mill_modulus, self.plasticity
        return ((m + q) * self.exit_target - q * self.entry_nominal) / m


@dataclass
class Disturbance:
    entry_thickness: float
    roll_heating: float
    plasticity: float
    tension: float
    noise: np.ndarray  # one draw per signal, already scaled


class DisturbanceSequence:
    """Deterministic for a seed, so closed- and open-loop plants see the very same disturbances."""

    def __init__(self, params: MillParameters, seed: int, dt: float) -> None:
        self.p = params
        self.dt = dt
        self.rng = np.random.default_rng(seed)
        self.t = 0.0
        self._walk_h = 0.0
        self._walk_q = 0.0
        self._walk_t = 0.0
        self._phase = self.rng.uniform(0, 2 * math.pi, size=3)
        p = params
        self._noise_scale = np.array([p.noise_thickness_mm, p.noise_thickness_mm, p.noise_gap_mm,
                                      p.noise_force_kn, p.noise_tension_kn, p.noise_speed_m_s])

    def next(self) -> Disturbance:
        p, t, rng = self.p, self.t, self.rng
        self.t += self.dt
        self._walk_h = 0.999 * self._walk_h + rng.normal(0.0, 0.0008)
        self._walk_q = 0.999 * self._walk_q + rng.normal(0.0, 12.0)
        self._walk_t = 0.995 * self._walk_t + rng.normal(0.0, 0.4)
        entry = (p.entry_nominal + 0.035 * math.sin(2 * math.pi * t / 3.7 + self._phase[0])
                 + 0.006 * math.sin(2 * math.pi * 1.3 * t + self._phase[1]) + self._walk_h)
        heating = p.heating_max_mm * (1.0 - math.exp(-t / p.heating_tau_s))
        plasticity = p.plasticity * (1.0 + 0.04 * math.sin(2 * math.pi * t / 9.0 + self._phase[2])) + self._walk_q
        tension = p.nominal_tension + 6.0 * math.sin(2 * math.pi * t / 5.3) + self._walk_t
        return Disturbance(entry, heating, plasticity, tension, rng.standard_normal(6) * self._noise_scale)


def exit_thickness(p: MillParameters, gap: float, d: Disturbance) -> float:
    m, q = p.mill_modulus, d.plasticity
    return (m * (gap - d.roll_heating) + q * d.entry_thickness - p.tension_gain * (d.tension - p.nominal_tension)) / (m + q)


def ideal_correction(p: MillParameters, entry: float, heating: float, plasticity: float, tension: float) -> float:
    """The gap correction (from S0) that puts the exit thickness exactly on target."""
    m, q = p.mill_modulus, plasticity
    gap = heating + ((m + q) * p.exit_target - q * entry + p.tension_gain * (tension - p.nominal_tension)) / m
    return gap - p.nominal_gap


class Stand:
    """One stand's state; `step` advances it by dt under a gap-correction setpoint."""

    def __init__(self, params: MillParameters, dt: float) -> None:
        self.p = params
        self.dt = dt
        self.gap = params.nominal_gap
        self.exit = params.exit_target
        self.force = 0.0

    def step(self, correction_setpoint: float, d: Disturbance) -> None:
        p = self.p
        target = p.nominal_gap + correction_setpoint
        alpha = min(1.0, self.dt / p.actuator_tau_s)
        max_move = p.actuator_rate_mm_s * self.dt
        self.gap += max(-max_move, min(max_move, alpha * (target - self.gap)))
        self.exit = exit_thickness(p, self.gap, d)
        self.force = d.plasticity * (d.entry_thickness - self.exit) - p.tension_gain * (d.tension - p.nominal_tension)

    def measure(self, d: Disturbance, out: np.ndarray) -> None:
        """Sensor readings in SIGNALS order, with noise (the first MEASURED entries; a longer `out`
        also gets the operating mode, which has no noise)."""
        p = self.p
        speed = p.entry_speed * d.entry_thickness / self.exit
        out[0] = d.entry_thickness
        out[1] = self.exit
        out[2] = self.gap
        out[3] = self.force
        out[4] = d.tension
        out[5] = speed
        out[:MEASURED] += d.noise
        if len(out) > MEASURED:
            out[MEASURED] = MODE_AUTOMATIC
