import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plc.frame import Frame, RxStampSource
from sitsd.config import Actuator, LinearConstraint, Signal
from sitsd.gates import ConstraintGate, SafetyEnvelope, TimestampGate
from sitsd.gates.timestamp import CLOCK, DUPLICATE, FUTURE, PASS, REORDERED, REPLAY, STALE, STAMP_SOURCE, TRANSIT

MS = 1_000_000


def frame(seq, sent=10_000 * MS, rx=None, pub=7, writer=1):
    return Frame(pub, writer, seq, sent, sent + 1 * MS if rx is None else rx, RxStampSource.SOFTWARE, np.zeros(1))


class TestTimestampGate:
    def test_fresh_in_order_frames_pass_and_gaps_count_lost(self):
        g = TimestampGate(5 * MS, 1 * MS)
        assert [g.check(frame(s)) for s in (1, 2, 5)] == [PASS] * 3
        assert g.lost == 2

    def test_transit_future_duplicate_reordered_replay(self):
        g = TimestampGate(5 * MS, 1 * MS, window=8)
        assert g.check(frame(1, rx=10_000 * MS + 6 * MS)) == TRANSIT
        assert g.check(frame(1, rx=10_000 * MS - 2 * MS)) == FUTURE
        assert g.check(frame(10)) == PASS
        assert g.check(frame(10)) == DUPLICATE
        assert g.check(frame(12)) == PASS  # 11 lost so far
        assert g.check(frame(11)) == REORDERED  # arrived late, within the window: dropped, remembered
        assert g.check(frame(11)) == DUPLICATE
        assert g.check(frame(10)) == DUPLICATE
        assert g.check(frame(3)) == REPLAY  # older than the window
        assert g.lost == 1

    def test_window_survives_large_forward_steps(self):
        g = TimestampGate(5 * MS, 1 * MS, window=8)
        assert g.check(frame(1)) == PASS
        assert g.check(frame(100)) == PASS  # the window restarts at 100
        assert g.check(frame(99)) == REORDERED

    def test_stale_at_processing_time(self):
        g = TimestampGate(5 * MS, 1 * MS, max_age_ns=20 * MS)
        assert g.check(frame(1), now_ns=10_000 * MS + 10 * MS) == PASS
        assert g.check(frame(2), now_ns=10_000 * MS + 25 * MS) == STALE

    def test_hardware_stamps_required(self):
        g = TimestampGate(5 * MS, 1 * MS, require_hardware_stamps=True)
        assert g.check(frame(1)) == STAMP_SOURCE
        hw = Frame(7, 1, 1, 10_000 * MS, 10_001 * MS, RxStampSource.HARDWARE, np.zeros(1))
        assert g.check(hw) == PASS

    def test_unsynchronised_clock(self):
        g = TimestampGate(5 * MS, 1 * MS)
        g.clock_ok = False
        assert g.check(frame(1)) == CLOCK

    def test_clock_jumps(self):
        g = TimestampGate(5 * MS, 1 * MS)
        assert g.check(frame(1)) == PASS
        # the PLC's clock jumps an hour ahead of ours: frames look like they come from the future
        assert g.check(frame(2, sent=10_000 * MS + 3_600_000 * MS, rx=10_010 * MS)) == FUTURE
        # our clock jumps ahead (or the PLC's back): transit looks an hour long
        assert g.check(frame(3, sent=10_020 * MS, rx=10_020 * MS + 3_600_000 * MS)) == TRANSIT
        assert g.check(frame(4, sent=10_030 * MS)) == PASS  # back to normal, gap counted
        assert g.lost == 2

    def test_publisher_restart_is_accepted_but_replay_is_not(self):
        g = TimestampGate(5 * MS, 1 * MS)
        assert g.check(frame(500, sent=10_000 * MS)) == PASS
        assert g.check(frame(499, sent=9_990 * MS)) == REORDERED  # older stamp, within the window
        assert g.check(frame(400, sent=9_000 * MS + 9_000 * MS // 10)) == REPLAY  # older stamp, beyond it
        assert g.check(frame(1, sent=10_010 * MS)) == PASS  # newer stamp, counter reset: a restart
        assert g.restarted and g.restarts == 1
        assert g.check(frame(2, sent=10_020 * MS)) == PASS and not g.restarted
        assert g.lost == 0

    def test_sequence_wraps_at_uint16(self):
        g = TimestampGate(5 * MS, 1 * MS)
        assert g.check(frame(0xFFFF)) == PASS
        assert g.check(frame(0)) == PASS
        assert g.lost == 0

    def test_state_is_per_publisher_and_writer(self):
        g = TimestampGate(5 * MS, 1 * MS)
        assert g.check(frame(5, pub=1)) == PASS
        assert g.check(frame(5, pub=2)) == PASS
        assert g.check(frame(5, pub=1, writer=2)) == PASS


SIGNALS = [Signal(name="a", unit="mm", min=0.0, max=10.0, max_rate=100.0),
           Signal(name="b", unit="kN", min=-5.0, max=5.0)]
CONSTRAINTS = [LinearConstraint(name="a_plus_b", coefficients={"a": 1.0, "b": 1.0}, max=12.0)]


class TestConstraintGate:
    def test_names_the_violated_constraint(self):
        g = ConstraintGate(SIGNALS, CONSTRAINTS)
        cases = {(np.nan, 0.0): "a.finite", (11.0, 0.0): "a.range", (1.0, -6.0): "b.range",
                 (9.0, 4.0): "a_plus_b"}
        for values, name in cases.items():
            v = np.array(values)
            idx = g.check(v, 1)
            assert g.names[idx] == name
            assert name in g.describe(idx, v)

    def test_rate_of_change_uses_sender_timestamps(self):
        g = ConstraintGate(SIGNALS, CONSTRAINTS)
        assert g.check(np.array([1.0, 0.0]), 1_000 * MS) == -1
        # 0.5 units in 10 ms = 50/s: allowed (limit 100/s)
        assert g.check(np.array([1.5, 0.0]), 1_010 * MS) == -1
        # 2 units in 10 ms = 200/s: refused
        idx = g.check(np.array([3.5, 0.0]), 1_020 * MS)
        assert g.names[idx] == "a.max_rate"
        # the rejected frame did not move the reference: 1.5 -> 2.5 over 20 ms is 50/s
        assert g.check(np.array([2.5, 0.0]), 1_030 * MS) == -1

    @settings(max_examples=300)
    @given(st.lists(st.floats(-20, 20), min_size=2, max_size=2))
    def test_agrees_with_a_plain_reference(self, values):
        g = ConstraintGate(SIGNALS, CONSTRAINTS)
        a, b = values
        ok = 0 <= a <= 10 and -5 <= b <= 5 and a + b <= 12
        assert (g.check(np.array(values), 1) == -1) == ok


class TestSafetyEnvelope:
    def make(self):
        return SafetyEnvelope([Actuator(output="gap", min=-0.2, max=0.2, max_rate=2.0, failsafe=0.0)], ["gap"])

    def test_clamps_to_limits_and_counts(self):
        s = self.make()
        assert s.apply(np.array([0.5], dtype=np.float32), 1).tolist() == [0.2]
        assert s.clamped == 1

    def test_rate_limit_from_last_command(self):
        s = self.make()
        s.commit(np.array([0.0]), 1_000 * MS)
        out = s.apply(np.array([0.1]), 1_010 * MS)  # 2 mm/s * 10 ms = 0.02 mm
        assert out.tolist() == pytest.approx([0.02])

    def test_non_finite_output_becomes_failsafe(self):
        s = self.make()
        assert s.apply(np.array([np.nan]), 1).tolist() == [0.0]

    def test_a_stamp_before_the_last_command_allows_no_movement(self):
        # the PLC's clock jumped 5 s ahead: the fail-safe went out for a frame stamped 5 s in our future;
        # the clock is back, and the next frame's stamp is before it. No time has passed as far as the stamps
        # tell: the command holds (it used to skip the rate limit and jump to the clamp limit at once)
        s = self.make()
        s.commit(np.array([0.0]), 1_000 * MS + 5_000 * MS)
        assert s.apply(np.array([0.2]), 1_010 * MS).tolist() == [0.0]
        assert "clamped to 0" in s.violation and s.clamped == 1
        s.commit(np.array([0.0]), 1_010 * MS)  # from this command on, the limit runs from the right stamp
        assert s.apply(np.array([0.2]), 1_020 * MS).tolist() == pytest.approx([0.02])
        assert s.apply(np.array([0.1]), 1_010 * MS).tolist() == [0.0]  # the same stamp again: no time either

    def test_an_actuator_without_a_rate_limit_is_not_held(self):
        s = SafetyEnvelope([Actuator(output="gap", min=-0.2, max=0.2, failsafe=0.0)], ["gap"])
        s.commit(np.array([0.0]), 2_000 * MS)
        assert s.apply(np.array([0.15]), 1_000 * MS).tolist() == [0.15] and s.violation == ""


# -- the constraint language: types, enums, masks, two-sided and conditional constraints ------------

from sitsd.gates.constraints import evaluate_directly  # noqa: E402

TYPED = [
    Signal(name="mode", unit="1", type="enum", values=[0, 1, 2]),
    Signal(name="flags", unit="1", type="bits", mask=0b1011),
    Signal(name="count", unit="1", type="int", min=0, max=100),
    Signal(name="run", unit="1", type="bool"),
    Signal(name="speed", unit="m/s", min=0.0, max=10.0, max_rate=5.0, on_invalid="hold_last"),
    Signal(name="force", unit="kN", min=0.0, max=100.0, on_invalid="drop"),
]
RULES = [
    LinearConstraint(name="band", coefficients={"speed": 1.0, "force": -0.1}, min=-5.0, max=5.0),
    LinearConstraint(name="slow_in_setup", coefficients={"speed": 1.0}, max=2.0, when="mode == 1"),
    LinearConstraint(name="run_needs_speed", coefficients={"speed": 1.0}, min=0.5, when="run == 1 and mode >= 1"),
]
OK = [2.0, 0b1001, 7.0, 1.0, 3.0, 20.0]


def _check(values, ts=1):
    g = ConstraintGate(TYPED, RULES)
    idx = g.check(np.array(values, dtype=float), ts)
    return g, (None if idx < 0 else g.names[idx])


class TestConstraintLanguage:
    def test_valid_frame_passes(self):
        assert _check(OK)[1] is None

    @pytest.mark.parametrize("position,value,rule", [
        (0, 3.0, "mode.range"), (0, 1.5, "mode.domain"),  # above the largest value; not an enum value
        (1, 0b0100, "flags.domain"),  # bit 2 is not in the mask
        (2, 7.5, "count.domain"),  # not an integer
        (3, 0.5, "run.domain"), (3, 2.0, "run.range"),
        (5, float("inf"), "force.finite"), (2, float("nan"), "count.finite"),
    ])
    def test_each_domain_rule_is_named(self, position, value, rule):
        frame = list(OK)
        frame[position] = value
        assert _check(frame)[1] == rule

    def test_two_sided_linear_constraint(self):
        assert _check([2.0, 9, 7, 1, 9.9, 10.0])[1] == "band"  # 9.9 - 1.0 = 8.9 > 5
        assert _check([2.0, 9, 7, 1, 0.6, 80.0])[1] == "band"  # 0.6 - 8 < -5

    def test_conditional_constraints_apply_only_when_their_conditions_hold(self):
        assert _check([2.0, 9, 7, 1, 3.0, 20.0])[1] is None  # mode 2: slow_in_setup inactive
        assert _check([1.0, 9, 7, 1, 3.0, 20.0])[1] == "slow_in_setup"
        assert _check([1.0, 9, 7, 1, 0.2, 2.0])[1] == "run_needs_speed"  # run and mode >= 1
        assert _check([0.0, 9, 7, 1, 0.2, 2.0])[1] is None  # mode 0: both inactive
        assert _check([2.0, 9, 7, 0, 0.2, 2.0])[1] is None  # run 0

    def test_hold_last_substitutes_and_reports(self):
        g = ConstraintGate(TYPED, RULES)
        assert g.check(np.array(OK, dtype=float), 1_000 * MS) == -1
        frame = np.array(OK, dtype=float)
        frame[4] = np.nan
        assert g.check(frame, 1_010 * MS) == -1  # speed held at its last value
        assert frame[4] == OK[4] and g.substituted == 1 and g.last_substituted == ["speed"]

    def test_hold_last_without_a_previous_value_fails(self):
        frame = list(OK)
        frame[4] = float("nan")
        assert _check(frame)[1] == "speed.finite"

    def test_policies(self):
        g = ConstraintGate(TYPED, RULES)
        assert g.policy(g.names.index("force.finite")) == "drop"
        assert g.policy(g.names.index("mode.domain")) == "failsafe"
        assert g.policy(g.names.index("band")) == "failsafe"
        assert g.kind(g.names.index("band")) == "linear"

    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.one_of(st.floats(-5, 120), st.sampled_from([0.0, 1.0, 2.0, 3.0, 8.0, 9.0, 11.0])),
                    min_size=6, max_size=6),
           st.lists(st.floats(-5, 120), min_size=6, max_size=6), st.floats(0.001, 0.5))
    def test_compiled_checker_agrees_with_direct_evaluation(self, values, prev, dt):
        g = ConstraintGate(TYPED, RULES)
        prev_ok = evaluate_directly(TYPED, RULES, prev) is None
        if prev_ok:
            assert g.check(np.array(prev, dtype=float), 1_000_000_000) == -1
        t1 = 1_000_000_000 + int(dt * 1e9)
        frame = np.array(values, dtype=float)
        got = g.check(frame, t1)
        want = evaluate_directly(TYPED, RULES, values, prev if prev_ok else None, dt if prev_ok else None)
        assert (None if got < 0 else g.names[got]) == want


class TestSafetyPolicies:
    def test_clamp_is_reported(self):
        s = SafetyEnvelope([Actuator(output="gap", min=-0.2, max=0.2, failsafe=0.0)], ["gap"])
        s.apply(np.array([0.5]), 1)
        assert "gap: model output 0.5 clamped to 0.2" in s.violation and not s.wants_failsafe
        s.apply(np.array([0.1]), 2)
        assert s.violation == ""

    def test_failsafe_policy_asks_for_the_failsafe(self):
        s = SafetyEnvelope([Actuator(output="gap", min=-0.2, max=0.2, failsafe=0.0, on_violation="failsafe"),
                            Actuator(output="speed", min=0.0, max=5.0, failsafe=0.0)], ["gap", "speed"])
        s.apply(np.array([0.1, 9.0]), 1)
        assert not s.wants_failsafe and "speed" in s.violation  # speed only clamps
        s.apply(np.array([0.3, 1.0]), 2)
        assert s.wants_failsafe and "gap" in s.violation
        s.apply(np.array([np.nan, 1.0]), 3)
        assert s.wants_failsafe and "not finite" in s.violation


class TestRateWindows:
    """At high frame rates sensor noise alone exceeds a physical rate limit frame to frame; a rate
    window measures the change against an accepted value at least that old instead."""

    @staticmethod
    def _run(window_ms: float, values, period_ns: int):
        s = Signal(name="tension", unit="kN", min=60.0, max=180.0, max_rate=400.0, rate_window_ms=window_ms)
        g = ConstraintGate([s], [])
        return g, [g.check(np.array([v]), (k + 1) * period_ns) for k, v in enumerate(values)]

    def test_noise_at_1khz_trips_frame_to_frame_but_not_over_20ms(self):
        rng = np.random.default_rng(3)
        noisy = 120.0 + 0.5 * rng.standard_normal(2000)  # 0.5 kN of noise, a steady process
        _, plain = self._run(0.0, noisy, 1_000_000)
        _, windowed = self._run(20.0, noisy, 1_000_000)
        assert sum(r >= 0 for r in plain) > 500  # the per-frame check is dominated by noise
        assert all(r < 0 for r in windowed)

    def test_a_real_jump_is_still_caught_within_the_window(self):
        values = [120.0] * 50 + [150.0] * 50  # +30 kN at once: 1500 kN/s even over 20 ms
        g, results = self._run(20.0, values, 1_000_000)
        first = next(k for k, r in enumerate(results) if r >= 0)
        assert first == 50 and g.names[results[first]] == "tension.max_rate"
        assert "changed from 120 to 150 kN in" in g.describe(results[first], np.array([150.0]))

    def test_rate_limits_hold_after_the_clock_steps_back(self):
        """After the sender's clock steps back 2 s, the references taken before the step lie in the future.
        They restart from the first frame after the step, so a jump is caught one window later, not only
        once the clock has caught up again; a window-0 signal measures against the previous frame."""
        tension = Signal(name="tension", unit="kN", min=60.0, max=180.0, max_rate=400.0, rate_window_ms=20.0)
        force = Signal(name="force", unit="kN", min=0.0, max=100.0, max_rate=400.0)  # window 0
        g = ConstraintGate([tension, force], [])
        t = 10_000 * MS
        for k in range(100):
            assert g.check(np.array([120.0, 50.0]), t + k * MS) == -1
        back = t - 2_000 * MS
        assert g.check(np.array([120.0, 50.0]), back) == -1  # no rate check across the step itself
        for k in range(1, 25):
            assert g.check(np.array([120.0, 50.0]), back + k * MS) == -1
        got = g.check(np.array([150.0, 50.0]), back + 25 * MS)  # +30 kN over 25 ms: 1200 kN/s
        assert got >= 0 and g.names[got] == "tension.max_rate"
        got = g.check(np.array([120.0, 51.0]), back + 26 * MS)  # +1 kN in 2 ms since the last accepted frame
        assert got >= 0 and g.names[got] == "force.max_rate"

    def test_without_a_window_the_reference_is_the_previous_accepted_frame(self):
        g, results = self._run(0.0, [120.0, 120.3, 120.6, 121.5], 1_000_000)  # 300, 300, 900 kN/s
        assert [r >= 0 for r in results] == [False, False, False, True]


# -- property: the compiled checker against a plain reference on frame sequences, rate windows included --

WINDOWED = [
    Signal(name="mode", unit="1", type="enum", values=[0, 1, 2]),
    Signal(name="speed", unit="m/s", min=0.0, max=10.0, max_rate=5.0, rate_window_ms=20.0, on_invalid="hold_last"),
    Signal(name="force", unit="kN", min=0.0, max=100.0, max_rate=400.0, on_invalid="drop"),  # window 0: previous frame
    Signal(name="tension", unit="kN", min=60.0, max=180.0, max_rate=400.0, rate_window_ms=7.5, on_invalid="hold_last"),
    Signal(name="count", unit="1", type="int", min=0, max=100, max_rate=2000.0, rate_window_ms=3.0),
    Signal(name="gap", unit="mm", min=0.0, max=5.0),  # no rate limit
]
WINDOWED_RULES = [
    LinearConstraint(name="band", coefficients={"speed": 1.0, "force": -0.1}, min=-5.0, max=5.0),
    LinearConstraint(name="slow_in_setup", coefficients={"speed": 1.0}, max=2.0, when="mode == 1"),
    LinearConstraint(name="tension_per_force", coefficients={"tension": 1.0, "force": -1.5}, max=120.0,
                     when="mode >= 1 and speed > 0.5"),
]
# the same signals without any rate window: the gate's plain previous-frame path
UNWINDOWED = [s.model_copy(update={"rate_window_ms": 0.0}) for s in WINDOWED]


class ReferenceGate:
    """The gate's rules over a sequence of frames, written plainly, for the property test below.

    Per frame: hold_last substitution (a non-finite value of a hold_last signal takes the last accepted
    value, if all non-finite values are of such signals and a frame was accepted before), then the
    stateless rules by `evaluate_directly`, with the rate rule slotted in after the domain rules:
    a signal's change since its reference sample, over the time since that sample, must not exceed
    max_rate. Samples: the first accepted frame, then each accepted frame at least rate_window_ms after
    the signal's previous sample (every accepted frame for a window of 0). The reference is the newest
    sample at least a window old; none: no rate check. Nor is there one unless the frame is newer than
    the last accepted one. An accepted frame stamped before the last accepted one (the clock stepped
    back) restarts every signal's samples with itself. Only accepted frames change the state."""

    def __init__(self, signals, constraints):
        self.signals, self.constraints = signals, constraints
        self.window_ns = [int(s.rate_window_ms * 1e6) for s in signals]
        self.samples = [[] for _ in signals]  # per signal: [(t_ns, value)], oldest first
        self.prev, self.prev_ns = None, None

    def check(self, values, t_ns):
        values = list(values)
        bad = [i for i, v in enumerate(values) if not np.isfinite(v)]
        if bad and self.prev is not None and all(self.signals[i].on_invalid == "hold_last" for i in bad):
            for i in bad:
                values[i] = self.prev[i]
        first = evaluate_directly(self.signals, self.constraints, values)
        if first is not None and first.rsplit(".", 1)[-1] in ("finite", "range", "domain"):
            return first
        if self.prev is not None and t_ns > self.prev_ns:
            for i, s in enumerate(self.signals):
                if s.max_rate is None:
                    continue
                old = [(t, v) for t, v in self.samples[i] if t_ns - t >= self.window_ns[i]]
                if old:
                    t, v = old[-1]
                    if abs(values[i] - v) > s.max_rate * ((t_ns - t) * 1e-9):
                        return f"{s.name}.max_rate"
        if first is not None:  # a linear constraint
            return first
        if self.prev is not None and t_ns < self.prev_ns:
            self.samples = [[] for _ in self.signals]
        self.prev, self.prev_ns = values, t_ns
        for i, series in enumerate(self.samples):
            if not series or t_ns - series[-1][0] >= self.window_ns[i]:
                series.append((t_ns, values[i]))
        return None


_STEP_NS = st.one_of(st.sampled_from([0, 500_000, 1_000_000, 3_000_000, 7_500_000, 20_000_000, 19_999_999]),
                     st.integers(0, 30_000_000), st.integers(-60_000_000, -1))  # the last: the clock steps back


@st.composite
def frame_sequences(draw):
    """Random walks through the signals' ranges: small steps (that mostly pass), jumps (that trip rate
    limits or ranges), repeats, and now and then a NaN; sender stamps that advance by 0 to 30 ms, or
    now and then step back by up to 60 ms."""
    lows = [s.lower for s in WINDOWED]
    highs = [s.upper for s in WINDOWED]
    values = [draw(st.sampled_from([0.0, 1.0, 2.0])), 1.0, 40.0, 120.0, 50.0, 2.0]
    t = 1_000_000_000
    frames = []
    for _ in range(draw(st.integers(1, 40))):
        t += draw(_STEP_NS)
        nxt = []
        for i, v in enumerate(values):
            span = highs[i] - lows[i]
            kind = draw(st.sampled_from(["same", "small", "small", "jump", "nan"] if i else ["same", "jump"]))
            if i == 0 and kind == "jump":
                v = draw(st.sampled_from([0.0, 1.0, 2.0, 1.5]))
            elif kind == "small":
                v = v + draw(st.floats(-0.004, 0.004)) * span
                v = round(v) if WINDOWED[i].type == "int" else v
            elif kind == "jump":
                v = draw(st.floats(lows[i] - 0.05 * span, highs[i] + 0.05 * span))
                v = round(v) if WINDOWED[i].type == "int" and draw(st.booleans()) else v
            elif kind == "nan":
                v = float("nan") if draw(st.integers(0, 9)) == 0 else v
            nxt.append(v)
        frames.append((t, nxt))
        values = [v if np.isfinite(v) else values[i] for i, v in enumerate(nxt)]
    return frames


class TestRateWindowProperty:
    @pytest.mark.parametrize("signals", [WINDOWED, UNWINDOWED], ids=["windows", "no-windows"])
    @settings(max_examples=300, deadline=None)
    @given(frames=frame_sequences())
    def test_compiled_checker_agrees_with_the_reference_over_frame_sequences(self, signals, frames):
        gate, ref = ConstraintGate(signals, WINDOWED_RULES), ReferenceGate(signals, WINDOWED_RULES)
        for k, (t, values) in enumerate(frames):
            got = gate.check(np.array(values, dtype=float), t)
            want = ref.check(values, t)
            assert (None if got < 0 else gate.names[got]) == want, f"frame {k} at {t} ns: {values}"

    def test_the_sequences_reach_every_outcome(self):
        """The strategy is not vacuous: across examples, rate violations of windowed and unwindowed
        signals, linear violations and passes all occur."""
        seen = set()

        @settings(max_examples=200, deadline=None, database=None)
        @given(frames=frame_sequences())
        def collect(frames):
            ref = ReferenceGate(WINDOWED, WINDOWED_RULES)
            for t, values in frames:
                seen.add(ref.check(values, t))

        collect()
        assert {None, "speed.max_rate", "force.max_rate", "tension.max_rate", "band"} <= seen, seen


class TestWrongUnits:
    """A publisher sending a signal in another unit than the config declares (µm for mm, N for kN,
    mm/min for m/s) is caught by the example line's own rules, and the alert names the rule."""

    @staticmethod
    def _line():
        from sitsd.config import load_config

        from ..conftest import EXAMPLE_CONFIG

        cfg = load_config(EXAMPLE_CONFIG)
        return cfg, ConstraintGate(cfg.signals, cfg.constraints)

    OK = [4.0, 3.0, 2.4, 9000.0, 120.0, 2.5, 2.0]

    @pytest.mark.parametrize("index, factor, rule", [
        (0, 1000.0, "entry_thickness.range"),   # µm sent where the config says mm
        (3, 1000.0, "rolling_force.range"),     # N where kN
        (5, 60000.0, "strip_speed.range"),      # mm/min where m/s
        (1, 0.001, "exit_thickness.range"),     # m where mm
    ])
    def test_a_signal_in_the_wrong_unit_is_rejected_by_name(self, index, factor, rule):
        cfg, gate = self._line()
        assert gate.check(np.array(self.OK), 1_000_000_000) == -1
        frame = np.array(self.OK)
        frame[index] *= factor
        got = gate.check(frame, 1_010_000_000)
        assert got >= 0 and gate.names[got] == rule
        assert cfg.signals[index].unit in gate.describe(got, frame)  # the alert says which unit is expected
