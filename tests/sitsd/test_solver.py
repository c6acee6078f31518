import itertools
import operator
import os
import random
import signal
import threading
import time

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from sitsd.config import LinearConstraint, Signal, load_config
from sitsd.gates.solver import check_constraints, report_text
from tests.conftest import EXAMPLE_CONFIG


def sig(name, type="float", **kw):
    return Signal(name=name, unit="mm", type=type, **kw)


def lin(name, coefficients, **kw):
    return LinearConstraint(name=name, coefficients=coefficients, **kw)


class TestExampleConfig:
    def test_satisfiable_and_box_within_declared_ranges(self):
        cfg = load_config(EXAMPLE_CONFIG)
        report = check_constraints(cfg.signals, cfg.constraints)
        assert report.satisfiable and not report.contradictions and not report.unknown
        assert set(report.bounding_box) == set(cfg.signal_names)
        for s in cfg.signals:
            lo, hi = report.bounding_box[s.name]
            assert s.lower <= lo <= hi <= s.upper
        entry_hi = report.bounding_box["entry_thickness"][1]
        assert report.bounding_box["exit_thickness"][1] <= entry_hi - 0.3 + 1e-9
        text = report_text(report, cfg.signals)
        assert "satisfiable" in text and "exit_thickness" in text and "mm" in text

    def test_a_cutting_constraint_tightens_the_box(self):
        cfg = load_config(EXAMPLE_CONFIG)
        deeper = lin("deep_reduction", {"exit_thickness": 1.0, "entry_thickness": -1.0}, max=-1.2)
        report = check_constraints(cfg.signals, [*cfg.constraints, deeper])
        assert report.satisfiable
        assert report.bounding_box["exit_thickness"] == pytest.approx((2.5, 3.3))
        assert report.bounding_box["entry_thickness"] == pytest.approx((3.7, 4.5))
        assert "stand_reduces_thickness" in report.redundant  # the deeper reduction implies it
        assert "* exit_thickness" in report_text(report, cfg.signals)


class TestContradictions:
    def test_two_constraints_that_cannot_both_hold(self):
        signals = [sig("x", min=0, max=10), sig("y", min=0, max=10)]
        constraints = [lin("high", {"x": 1, "y": 1}, min=12), lin("low", {"x": 1, "y": -1}, max=-3),
                       lin("sum_small", {"x": 1, "y": 1}, max=8)]
        report = check_constraints(signals, constraints)
        assert not report.satisfiable
        assert report.contradictions == (("high", "sum_small"),)
        assert report.bounding_box == {} and report.redundant == ()
        assert "these constraints cannot hold together: high, sum_small" in report_text(report)

    def test_a_constraint_against_a_signal_range(self):
        signals = [sig("x", min=0, max=10), sig("y", min=0, max=10)]
        report = check_constraints(signals, [lin("too_big", {"x": 1}, min=12), lin("fine", {"y": 1}, max=5)])
        assert not report.satisfiable
        assert report.contradictions == (("signal:x", "too_big"),)
        assert "widen the declared range or values of x" in report_text(report)

    def test_several_distinct_minimal_cores(self):
        signals = [sig("x", min=0, max=10), sig("y", min=0, max=10)]
        report = check_constraints(signals, [lin("a", {"x": 1, "y": 1}, min=15), lin("b", {"x": 1, "y": 1}, max=5),
                                             lin("c", {"x": 1}, min=12)])
        assert set(report.contradictions) == {("a", "b"), ("signal:x", "c"), ("signal:y", "b", "c")}
        assert len(report.contradictions[0]) == 2  # smallest first


class TestRedundancy:
    def test_implied_by_another_constraint(self):
        signals = [sig("x", min=-10, max=10), sig("y", min=-10, max=10)]
        constraints = [lin("tight", {"x": 1, "y": -1}, max=1), lin("loose", {"x": 1, "y": -1}, max=2)]
        report = check_constraints(signals, constraints)
        assert report.redundant == ("loose",)

    def test_implied_by_ranges_alone_and_a_cutting_one_is_kept(self):
        signals = [sig("x", min=0, max=1), sig("y", min=0, max=1)]
        report = check_constraints(signals, [lin("ranges_do_it", {"x": 1, "y": 1}, max=2.5),
                                             lin("cuts", {"x": 1, "y": 1}, max=1.5)])
        assert report.redundant == ("ranges_do_it",)
        assert "can be removed" in report_text(report)

    def test_two_equal_constraints_are_both_listed(self):
        signals = [sig("x", min=0, max=10)]
        report = check_constraints(signals, [lin("one", {"x": 1}, max=5), lin("two", {"x": 1}, max=5)])
        assert report.redundant == ("one", "two")
        assert "only one of them can go" in report_text(report)

    def test_conditional_redundancy_uses_the_condition(self):
        signals = [sig("x", min=0, max=10), sig("mode", "enum", values=[1, 2])]
        always = lin("always", {"x": 1}, max=4)
        when_2 = lin("when_2", {"x": 1}, max=6, when="mode == 2")
        loose_only_in_2 = lin("when_2_tight", {"x": 1}, max=3, when="mode == 2")
        report = check_constraints(signals, [always, when_2, loose_only_in_2])
        assert report.redundant == ("when_2",)  # implied by `always`; when_2_tight cuts x in mode 2


class TestConditions:
    def test_contradiction_only_under_an_avoidable_condition(self):
        constraints = [lin("hot", {"t": 1}, min=80, when="mode == 2"), lin("cold", {"t": 1}, max=50, when="mode == 2")]
        free = check_constraints([sig("t", min=0, max=100), sig("mode", "enum", values=[1, 2])], constraints)
        assert free.satisfiable
        assert free.bounding_box["mode"] == (1.0, 1.0)  # mode 2 is never admissible
        # ... which the report says: the state the two rules were written for cannot run
        assert free.unreachable == (("mode == 2", ("hot", "cold")),)
        assert "UNREACHABLE: while mode == 2" in report_text(free)
        forced = check_constraints([sig("t", min=0, max=100), sig("mode", "enum", values=[2])], constraints)
        assert not forced.satisfiable
        assert forced.contradictions == (("signal:mode", "hot", "cold"),)

    def test_strict_condition_gives_the_closure_as_bound(self):
        signals = [sig("x", min=0, max=10), sig("y", min=0, max=10)]
        report = check_constraints(signals, [lin("a", {"y": 1}, min=1, when="x >= 5"), lin("b", {"y": 1}, max=0)])
        assert report.bounding_box["x"] == (0.0, 5.0)  # x < 5: the supremum, not attained


class TestDomains:
    def test_bits_allow_only_subsets_of_the_mask(self):
        bits = [sig("v", "bits", mask=0b101)]
        assert not check_constraints(bits, [lin("two_or_three", {"v": 1}, min=2, max=3)]).satisfiable
        report = check_constraints(bits, [lin("two_to_four", {"v": 1}, min=2, max=4)])
        assert report.satisfiable and report.bounding_box["v"] == (4.0, 4.0)

    def test_enum_values_are_points(self):
        enum = [sig("v", "enum", values=[1, 3])]
        report = check_constraints(enum, [lin("between", {"v": 1}, min=1.5, max=2.5)])
        assert not report.satisfiable and report.contradictions == (("signal:v", "between"),)

    def test_int_and_bool_are_integral(self):
        signals = [sig("n", "int", min=0, max=10), sig("b", "bool")]
        assert not check_constraints(signals, [lin("half", {"n": 2}, min=3, max=3)]).satisfiable
        assert not check_constraints(signals, [lin("half_b", {"b": 1}, min=0.25, max=0.75)]).satisfiable
        report = check_constraints(signals, [lin("odd_ok", {"n": 2, "b": 1}, min=3, max=3)])
        assert report.satisfiable and report.bounding_box == {"n": (1.0, 1.0), "b": (1.0, 1.0)}

    def test_exact_rationals_not_floats(self):
        # 0.1 + 0.2 > 0.3 in binary: with exact values x = 0.1, y = 0.2 cannot meet x + y <= 0.3 (the float 0.3)
        signals = [sig("x", "enum", values=[0.1]), sig("y", "enum", values=[0.2])]
        assert not check_constraints(signals, [lin("sum", {"x": 1, "y": 1}, max=0.3)]).satisfiable
        assert check_constraints(signals, [lin("sum", {"x": 1, "y": 1}, max=0.30000000000000004)]).satisfiable

    def test_unknown_signal_is_a_value_error(self):
        with pytest.raises(ValueError, match="'ghost'"):
            check_constraints([sig("x", min=0, max=1)], [lin("c", {"ghost": 1}, max=1)])


_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@st.composite
def small_systems(draw):
    n = draw(st.integers(2, 3))
    names = ["a", "b", "c"][:n]
    signals = []
    for name in names:
        lo = draw(st.integers(-3, 0))
        signals.append(sig(name, "int", min=lo, max=draw(st.integers(lo + 1, 3))))
    constraints = []
    for k in range(draw(st.integers(1, 3))):
        used = draw(st.lists(st.sampled_from(names), min_size=1, max_size=n, unique=True))
        coefs = {s: draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for s in used}
        lo, hi = draw(st.one_of(st.none(), st.integers(-8, 8))), draw(st.one_of(st.none(), st.integers(-8, 8)))
        if lo is None and hi is None:
            hi = draw(st.integers(-8, 8))
        if lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo
        when = None
        if draw(st.booleans()):
            when = f"{draw(st.sampled_from(names))} {draw(st.sampled_from(list(_OPS)))} {draw(st.integers(-3, 3))}"
        constraints.append(lin(f"c{k}", coefs, min=lo, max=hi, when=when))
    return signals, constraints


def _holds(c, point):
    if not all(_OPS[cond.op](point[cond.signal], cond.value) for cond in c.conditions):
        return True
    total = sum(coef * point[name] for name, coef in c.coefficients.items())
    return (c.min is None or total >= c.min) and (c.max is None or total <= c.max)


def _grid(signals):
    axes = [range(int(s.min), int(s.max) + 1) for s in signals]
    return [dict(zip([s.name for s in signals], values)) for values in itertools.product(*axes)]


@settings(max_examples=150, deadline=None)
@given(small_systems())
def test_matches_brute_force_on_integer_grids(system):
    signals, constraints = system
    grid = _grid(signals)
    feasible = [p for p in grid if all(_holds(c, p) for c in constraints)]
    report = check_constraints(signals, constraints)
    assert not report.unknown
    assert report.satisfiable == bool(feasible)
    if not feasible:
        assert report.contradictions
        return
    for s in signals:
        values = [p[s.name] for p in feasible]
        assert report.bounding_box[s.name] == (min(values), max(values))
    for c in constraints:
        others = [o for o in constraints if o is not c]
        implied = all(_holds(c, p) for p in grid if all(_holds(o, p) for o in others))
        assert (c.name in report.redundant) == implied, c.name


def _hard_system():
    """40 integer signals under 40 narrow random bands: z3 needs far longer than these tests wait."""
    rng = random.Random(0)
    signals = [sig(f"s{i}", "int", min=-1000, max=1000) for i in range(40)]
    constraints = []
    for j in range(40):
        lo = rng.randint(-100, 100)
        coefs = {f"s{i}": rng.choice([k for k in range(-50, 51) if k]) for i in rng.sample(range(40), 8)}
        constraints.append(lin(f"c{j}", coefs, min=lo, max=lo + 1))
    return signals, constraints


class TestTimeouts:
    def test_a_tiny_timeout_on_a_hard_system_reports_unknown(self):
        signals, constraints = _hard_system()
        report = check_constraints(signals, constraints, timeout_ms=10)
        assert report.unknown == ("satisfiability",)
        assert not report.satisfiable and report.contradictions == () and report.seconds < 5
        assert "ran out of time" in report_text(report)

    def test_an_optimiser_timeout_falls_back_to_declared_ranges(self, monkeypatch):
        monkeypatch.setattr(z3.Optimize, "check", lambda self, *a: z3.unknown)
        signals = [sig("x", min=0, max=10)]
        report = check_constraints(signals, [lin("cut", {"x": 1}, max=4)])
        assert report.satisfiable
        assert report.bounding_box == {"x": (0.0, 10.0)}
        assert report.unknown == ("bounds:x.min", "bounds:x.max")
        assert "not decided within the time limit" in report_text(report)


class TestInterrupt:
    """z3 catches SIGINT during a call and answers `unknown`, reason "canceled", as for a timeout. Ctrl-C
    must stop `sitsctl check` (KeyboardInterrupt), and a timeout must still be reported as one."""

    @pytest.fixture(autouse=True)
    def python_sigint_handler(self):
        """Python's own SIGINT handler for each test, as an interactive `sitsctl check` has it: a suite started in
        the background (CI) inherits SIGINT ignored, and an ignored Ctrl-C is nothing to raise."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    @staticmethod
    def _contexts(monkeypatch):
        made = []

        class Recording(z3.Context):
            def __init__(self, *args, **kw):
                super().__init__(*args, **kw)
                made.append(self)

        monkeypatch.setattr(z3, "Context", Recording)
        return made

    @staticmethod
    def _later(seconds, action):
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.start()
        return timer

    def test_an_interrupted_check_raises_keyboard_interrupt(self, monkeypatch):
        made = self._contexts(monkeypatch)
        signals, constraints = _hard_system()
        timer = self._later(0.3, lambda: made[0].interrupt())
        start = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt, match="z3 check interrupted"):
                check_constraints(signals, constraints, timeout_ms=60_000)
        finally:
            timer.cancel()
        assert time.monotonic() - start < 10  # stopped by the interrupt, not after the 60 s limit

    @pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
    def test_ctrl_c_during_a_check_raises_keyboard_interrupt(self):
        """A real SIGINT: z3's handler takes it during the call, check_constraints raises it again."""
        signals, constraints = _hard_system()
        timer = self._later(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        start = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                check_constraints(signals, constraints, timeout_ms=60_000)
        finally:
            timer.cancel()
        assert time.monotonic() - start < 10

    def test_a_timeout_is_still_reported_as_a_timeout(self):
        signals, constraints = _hard_system()
        report = check_constraints(signals, constraints, timeout_ms=200)
        assert report.unknown == ("satisfiability",) and not report.satisfiable
        assert "ran out of time" in report_text(report)

    def test_a_short_limit_never_turns_into_a_keyboard_interrupt(self):
        """The limit's timer never fires into a later call (which would then look interrupted): many calls
        under a 1 ms limit may run out of time, but never raise."""
        cfg = load_config(EXAMPLE_CONFIG)
        for _ in range(5):
            report = check_constraints(cfg.signals, cfg.constraints, timeout_ms=1)
            assert report.satisfiable or report.unknown  # a 1 ms limit may run out, but never raises

    @pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
    def test_a_program_s_own_sigint_handler_gets_the_signal_and_the_check_stays_unknown(self, monkeypatch):
        made = self._contexts(monkeypatch)
        got = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
        try:
            signals, constraints = _hard_system()
            timer = self._later(0.3, lambda: made[0].interrupt())
            report = check_constraints(signals, constraints, timeout_ms=60_000)
            timer.cancel()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert got == [signal.SIGINT]
        assert report.unknown == ("satisfiability",) and not report.satisfiable
