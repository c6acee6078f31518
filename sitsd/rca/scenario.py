"""Offline fault scenarios in simulated time: the simulator's physics and fault, the daemon's real gates and
the real model through ONNX Runtime, faster than real time.

Per 10 ms step: the plant moves under the last applied setpoint, the PLC "sends" a frame (its clock,
the network's delay), the frame walks TimestampGate -> ConstraintGate -> model -> SafetyEnvelope as in
`sitsd.pipeline`, alerts go into the event stream in the pipeline's tuple form, and the command reaches
the PLC. What comes out is what the daemon would hold: events and the signal window, no fault label.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ep.session import ModelRunner
from plc.frame import Frame, RxStampSource
from plc.profiles import get_profile
from plc.simulator.faults import FaultInjector, FaultSpec
from plc.simulator.physics import SIGNALS, DisturbanceSequence, MillParameters, Stand

from ..config import Config, load_config
from ..gates import ConstraintGate, SafetyEnvelope, TimestampGate
from ..gates.timestamp import REASONS
from .events import Event, EventStream, SignalRing, SignalWindow, event_from_alert, event_from_plc

EPOCH_NS = 1_800_000_000_000_000_000  # simulated wall clock starts here (any fixed instant will do)


@dataclass
class ScenarioResult:
    events: list[Event]
    window: SignalWindow
    now_ns: int
    fault_start_ns: int


def load_example_config(path: str | Path) -> Config:
    return load_config(path, {"attestation.mode": "software", "plc.security": "none"})


class ScenarioRunner:
    """Holds the model session and config across scenarios (loading ORT once keeps the bench short)."""

    def __init__(self, config_path: str | Path, rate_hz: float = 100.0) -> None:
        self.cfg = load_example_config(config_path)
        cfg = self.cfg
        if cfg.signal_names != list(SIGNALS):
            raise ValueError(f"{config_path}: scenarios need the rolling-mill signals {SIGNALS}")
        self.model = ModelRunner(cfg.model.artifact, len(cfg.model.inputs), len(cfg.model.outputs))
        self.input_index = np.array([cfg.signal_names.index(n) for n in cfg.model.inputs])
        self.dt = 1.0 / rate_hz

    def run(self, fault: FaultSpec | None, seed: int, seconds: float, profile: str = "simulator") -> ScenarioResult:
        cfg, dt = self.cfg, self.dt
        t_cfg = cfg.timing
        ts_gate = TimestampGate(int(t_cfg.max_transit_ms * 1e6), int(t_cfg.max_future_ms * 1e6),
                                max_age_ns=int(t_cfg.max_age_ms * 1e6) if t_cfg.max_age_ms else None,
                                window=t_cfg.replay_window)
        gate = ConstraintGate(cfg.signals, cfg.constraints)
        safety = SafetyEnvelope(cfg.safety.actuators, cfg.model.outputs)
        params = MillParameters()
        disturbances = DisturbanceSequence(params, seed, dt)
        stand = Stand(params, dt)
        injector = FaultInjector(fault, params) if fault is not None else None
        plc_profile = get_profile(profile if fault is None else fault.profile)
        ring = SignalRing(cfg.signal_names, cfg.model.outputs, capacity=int(seconds / dt) + 1,
                          n_model_inputs=len(cfg.model.inputs))
        model_out = np.zeros(len(cfg.model.outputs), dtype=np.float32)
        stream = EventStream(maxlen=100_000)
        alerts: list[tuple] = []
        reading = np.zeros(len(SIGNALS))
        rng = np.random.default_rng(seed + 7)
        setpoint, last_cmd_step, drops = 0.0, 0, 0
        in_flight: list[tuple[int, Frame]] = []  # frames on the wire: (arrival step, frame)
        steps = int(seconds / dt)
        for k in range(steps):
            t = k * dt
            now = EPOCH_NS + int(t * 1e9)
            d = disturbances.next()
            if injector is not None:
                injector.plant(t, d)
            if k - last_cmd_step > 10:  # no command for 100 ms: the PLC falls back to its safe setpoint
                setpoint = 0.0
            stand.step(injector.setpoint(t, setpoint) if injector else setpoint, d)
            stand.measure(d, reading)
            offset_ns, delay_ns = (0, 0)
            if injector is not None:
                injector.sensors(t, reading)
                offset_ns, delay_ns = injector.timing(t)
                diag = injector.diagnostic(t)
                if diag is not None:
                    text, word = diag
                    stream.append(event_from_plc(plc_profile.parse_diagnostic(text, now)))
                    for e in plc_profile.decode_status(word, now):
                        stream.append(event_from_plc(e))
            transit = int(60_000 + rng.exponential(40_000)) + delay_ns
            frame = Frame(7, 1, (k + 1) & 0xFFFF, now + offset_ns, now + transit, RxStampSource.SOFTWARE,
                          reading.copy())
            in_flight.append((k + transit // int(dt * 1e9), frame))
            arrived = [f for step, f in in_flight if step <= k]
            in_flight = [(s, f) for s, f in in_flight if s > k]
            for f in sorted(arrived, key=lambda f: f.rx_timestamp_ns):
                pickup = f.rx_timestamp_ns + 20_000
                cmd, failsafe = self._step(f, pickup, ts_gate, gate, safety, injector, t, alerts, model_out)
                if cmd is None:
                    drops += 1
                    if drops < t_cfg.max_consecutive_drops:
                        continue
                    drops, cmd, failsafe = 0, safety.failsafe.copy(), True
                else:
                    drops = drops if failsafe else 0
                safety.commit(cmd, f.sender_timestamp_ns)
                if failsafe:
                    ring.push(f.sender_timestamp_ns, f.values, cmd, failsafe)
                else:  # as the daemon records it: the model's input and (here drifted) output of this frame
                    ring.push_model(f.sender_timestamp_ns, f.values, cmd, failsafe, self.model.input[0], model_out, 0)
                setpoint, last_cmd_step = float(cmd[0]), k
            for a in alerts:
                stream.append(event_from_alert(*a))
            alerts.clear()
        end = EPOCH_NS + int(steps * dt * 1e9)
        start = EPOCH_NS + int(fault.start_s * 1e9) if fault is not None else end
        return ScenarioResult(stream.since(0), ring.window(0), end, start)

    def _step(self, frame: Frame, now: int, ts_gate, gate, safety, injector, t: float, alerts: list,
              model_out: np.ndarray):
        """The pipeline's gate sequence for one frame: (command, failsafe), or (None, False) when dropped.
        `model_out` receives the model's output (a model_drift fault drifts it: the running model is off)."""
        reason = ts_gate.check(frame, now)
        if reason:
            detail = f"{ts_gate.last_transit_ns / 1e6:.3f} ms transit" if reason in (1, 2) else \
                f"sequence {frame.sequence_number}"
            alerts.append((now, "timestamp", f"{REASONS[reason]}: {detail}", frame.publisher_id, frame.sequence_number))
            return None, False
        violated = gate.check(frame.values, frame.sender_timestamp_ns)
        if violated >= 0:
            alerts.append((now, "constraint", gate.describe(violated, frame.values), frame.publisher_id,
                           frame.sequence_number))
            if gate.policy(violated) == "drop":
                return None, False
            return safety.failsafe.copy(), True
        self.model.input[0, :] = frame.values[self.input_index]
        proposed = self.model.run()[0].astype(np.float64)
        if injector is not None:
            proposed[0] = injector.command(t, float(proposed[0]))
        model_out[:] = proposed
        values = safety.apply(proposed, frame.sender_timestamp_ns).copy()
        if safety.violation:
            alerts.append((now, "safety", safety.violation, frame.publisher_id, frame.sequence_number))
            if safety.wants_failsafe:
                return safety.failsafe.copy(), True
        return values, False
