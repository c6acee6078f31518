"""The loop on its real parts (ORT model, gates, envelope signer), fed frames directly."""
import time
from collections import deque

import numpy as np

from attestation.envelope import EnvelopeVerifier
from attestation.signers import SoftwareSigner
from ep.session import ModelRunner
from plc.frame import Frame, RxStampSource
from sitsd.config import load_config
from sitsd.gates import ConstraintGate, SafetyEnvelope, TimestampGate
from sitsd.pipeline import ControlLoop, Counters
from sitsd.stats import STAGE_INDEX, TimingRing

from ..conftest import EXAMPLE_CONFIG

NOMINAL = [4.0, 3.0, 1.4, 8000.0, 120.0, 2.667, 2.0]  # the last is mill_mode: automatic


def build(deadline_ms=8.0, max_transit_ms=5.0, max_drops=3):
    cfg = load_config(EXAMPLE_CONFIG)
    names = cfg.signal_names
    signer = SoftwareSigner()
    sent = []
    model = ModelRunner(cfg.model.artifact, 6, 1)
    loop = ControlLoop(
        source=None, timestamp_gate=TimestampGate(int(max_transit_ms * 1e6), 1_000_000),
        constraint_gate=ConstraintGate(cfg.signals, cfg.constraints), model=model,
        input_index=[names.index(n) for n in cfg.model.inputs],
        safety=SafetyEnvelope(cfg.safety.actuators, cfg.model.outputs), signer=signer, submit=sent.append,
        target=cfg.plc.command_node, deadline_ns=int(deadline_ms * 1e6), sign_budget_ns=100_000,
        max_consecutive_drops=max_drops, timings=TimingRing(64), counters=Counters(), alerts=deque())
    verifier = EnvelopeVerifier(signer.public_key_pem(), model.sha256)
    return loop, sent, verifier


def frame(seq, values=NOMINAL, age_ns=200_000, transit_ns=50_000):
    sent = time.time_ns() - age_ns
    return Frame(7, 1, seq, sent, sent + transit_ns, RxStampSource.SOFTWARE, np.array(values, dtype=np.float64))


def test_fresh_frame_gives_signed_model_command():
    loop, sent, verifier = build()
    loop.step(frame(1))
    (out,) = sent
    env = verifier.verify(out.envelope)
    assert not env.command.failsafe and not out.failsafe
    assert env.command.frame_sequence == 1
    # the model's correction for a nominal, cold mill is small and within the actuator limits
    assert -0.15 <= env.command.values[0] <= 0.15
    assert env.command.values[0] == out.values[0]
    row = loop.timings.stages[0]
    assert all(np.isfinite(row[STAGE_INDEX[s]]) for s in ("timestamp_gate", "constraint_gate", "model", "sign"))


def test_missed_deadline_sends_failsafe_not_the_late_result():
    loop, sent, verifier = build(deadline_ms=8.0, max_transit_ms=1000.0)
    loop.step(frame(1, age_ns=50_000_000))  # sent 50 ms ago: its 8 ms deadline is long gone
    (out,) = sent
    env = verifier.verify(out.envelope)
    assert env.command.failsafe and env.command.values == (0.0,)
    assert loop.counters.deadline_missed == 1 and loop.counters.failsafe == 1
    assert loop.alerts[-1][1] == "deadline"


def test_constraint_violation_sends_failsafe_and_names_it():
    loop, sent, verifier = build()
    bad = list(NOMINAL)
    bad[0], bad[1] = 3.6, 3.4  # only 0.2 mm reduction: stand_reduces_thickness
    loop.step(frame(1, bad))
    env = verifier.verify(sent[0].envelope)
    assert env.command.failsafe
    assert loop.counters.dropped_constraint == 1
    assert "stand_reduces_thickness" in loop.alerts[-1][2]


def test_stale_frames_are_dropped_then_failsafe_after_consecutive_drops():
    loop, sent, verifier = build(max_drops=3)
    for seq in (1, 2):
        loop.step(frame(seq, transit_ns=20_000_000))
    assert sent == [] and loop.counters.dropped_timestamp == 2
    loop.step(frame(3, transit_ns=20_000_000))
    (out,) = sent
    assert verifier.verify(out.envelope).command.failsafe
    assert all(a[2].startswith("transit: 20.000 ms in transit, limit 5 ms") for a in loop.alerts)
    assert len(loop.alerts) == 3


def test_signer_failure_sends_nothing_and_alerts():
    loop, sent, _ = build()

    class Broken:
        def sign_command(self, cmd):
            raise RuntimeError("TPM gone")

    loop.signer = Broken()
    loop.step(frame(1))
    assert sent == [] and loop.counters.sign_errors == 1
    assert loop.alerts[-1][1:3] == ("sign", "TPM gone")


def test_loop_thread_scheduling_applied_or_refusal_reported():
    import os

    loop, _, _ = build()

    class Idle:
        def receive(self, timeout_s):
            time.sleep(timeout_s)
            return None

    loop.source = Idle()
    loop.loop_cpu, loop.realtime_priority = 0, 10
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while loop.counters.heartbeat < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        tid = loop.thread.native_id
        refused = [a[2] for a in loop.alerts if a[1] == "runtime"]
        if any("SCHED_FIFO" in r for r in refused):
            assert "LimitRTPRIO" in refused[-1]
        else:
            assert os.sched_getscheduler(tid) == os.SCHED_FIFO
            assert os.sched_getaffinity(tid) == {0}
    finally:
        loop.stop()


def test_conditional_constraint_of_the_demo_config():
    loop, sent, verifier = build()
    threading_fast = list(NOMINAL)
    threading_fast[6] = 1.0  # mill_mode 1 (threading) while the strip runs at 2.7 m/s
    loop.step(frame(1, threading_fast))
    assert verifier.verify(sent[-1].envelope).command.failsafe
    assert "threading_speed" in loop.alerts[-1][2] and "mill_mode == 1" in loop.alerts[-1][2]


def test_invalid_strip_speed_is_held_at_its_last_value():
    loop, sent, verifier = build()
    loop.step(frame(1))
    bad = list(NOMINAL)
    bad[5] = float("nan")  # strip_speed has on_invalid: hold_last
    loop.step(frame(2, bad, age_ns=100_000))
    env = verifier.verify(sent[-1].envelope)
    assert not env.command.failsafe  # the model still ran, on the held value
    assert loop.alerts[-1][1] == "hold_last" and "strip_speed" in loop.alerts[-1][2]
    assert loop.constraints.substituted == 1


def test_strict_actuator_turns_a_clamp_into_the_failsafe():
    loop, sent, verifier = build()
    loop.safety._strict[:] = True  # as with on_violation: failsafe
    loop.safety.lo[:] = 0.5  # no model output can be inside [0.5, 0.6]
    loop.safety.hi[:] = 0.6
    loop.safety.failsafe[:] = 0.55
    loop.step(frame(1))
    env = verifier.verify(sent[-1].envelope)
    assert env.command.failsafe and env.command.values == (0.55,)
    assert loop.alerts[-1][1] == "safety" and "clamped to" in loop.alerts[-1][2]


def test_a_signer_that_refuses_every_command_is_counted_each_time_and_alerted_once_a_second():
    """Nothing unsigned leaves; every refusal is counted, but the `sign` alert comes once per distinct cause
    (a TPM outage at 1 kHz must not bury every other alert)."""
    from attestation.errors import TpmError

    loop, sent, _ = build()

    class Refusing:
        public_key_pem = loop.signer.public_key_pem
        key_id = loop.signer.key_id
        text = "not signed: the session key is not bound to the TPM (TPM reset)"

        def sign_command(self, cmd):
            raise TpmError(self.text)

    loop.signer = Refusing()
    for seq in range(1, 51):
        loop.step(frame(seq))
    assert sent == [] and loop.counters.sign_errors == 50
    signs = [a for a in loop.alerts if a[1] == "sign"]
    assert len(signs) == 1 and "TPM reset" in signs[0][2]
    Refusing.text = "TPM2_Sign failed: TPM unreachable"  # another cause: alerted at once
    loop.step(frame(51))
    assert [a[2] for a in loop.alerts if a[1] == "sign"][-1] == Refusing.text and loop.counters.sign_errors == 51
