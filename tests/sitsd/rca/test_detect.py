"""Relation detectors on synthetic windows: the step test under a slow trend, excursions that end, and the graded
shift since an alert (no simulator: the numbers are chosen so each case is clear-cut)."""
import numpy as np

from sitsd.rca.detect import DetectorSettings, relation_events, relation_shifts
from sitsd.rca.events import SignalWindow
from sitsd.rca.fmea import Fmea

RATE_HZ = 100
T0 = 1_000_000_000_000


def _fmea() -> Fmea:
    return Fmea.model_validate({
        "version": 1, "line": "synthetic", "signals": ["a"],
        "relations": [{"name": "r", "expr": "a"}],
        "components": [{"id": "s", "name": "sensor", "kind": "sensor", "signals": ["a"], "failure_modes": [
            {"id": "s.drift", "name": "drift", "causes": ["c"], "detections": [{"code": "anomaly.relation.r"}],
             "severity": 5, "occurrence": 3, "detection": 5}]}]})


def _window(values: np.ndarray) -> SignalWindow:
    n = len(values)
    t = T0 + np.arange(n, dtype=np.int64) * (10**9 // RATE_HZ)
    return SignalWindow(["a"], ["command"], t, values.reshape(n, 1), np.zeros((n, 1)), np.zeros(n, dtype=bool))


def _at(seconds: float) -> int:
    return T0 + round(seconds * 1e9)


def _noise(seconds: float, seed: int = 1, sigma: float = 0.0015) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(int(seconds * RATE_HZ)) / RATE_HZ
    return t, np.random.default_rng(seed).normal(0.0, sigma, len(t))


def test_a_step_on_a_slow_trend_is_found_that_the_level_test_misses():
    # the relation creeps 0.03 mm with a 6 s time constant (rolls heating up from cold) and the reference holds
    # that creep; at 16 s a fault ramps it by 20 um/s. A second later the level test (reference median and
    # spread) still sees nothing, the step test (0.5 s mean against the 1.5 s before) has it.
    t, x = _noise(17.0)
    x += 0.03 * (1 - np.exp(-t / 6.0)) + np.where(t >= 16.0, 0.02 * (t - 16.0), 0.0)
    w = _window(x)
    level_only = DetectorSettings(step_reference=10**9)  # a reference too short for the step test: level only
    assert relation_events(_fmea(), w, level_only) == []
    (a,) = relation_events(_fmea(), w, DetectorSettings())
    assert a.code == "anomaly.relation.r" and a.value > 8.0 and "stepped" in a.text
    assert _at(16.0) <= a.t_ns <= _at(16.7)
    assert a.end_ns == int(w.t_ns[-1])  # still away from its level at the window's end


def test_an_excursion_that_returns_ends_there_and_its_recovery_is_no_second_step():
    t, x = _noise(20.0, seed=2)
    x += np.where((t >= 12.0) & (t < 13.5), 0.02, 0.0)
    (a,) = relation_events(_fmea(), _window(x), DetectorSettings())
    assert _at(11.7) <= a.t_ns <= _at(12.2)
    assert _at(13.3) <= a.end_ns <= _at(14.3)
    assert a.value > 8.0


def test_a_level_shift_that_lasts_is_one_anomaly_to_the_window_end():
    t, x = _noise(20.0, seed=3)
    x += np.where(t >= 14.0, -0.01, 0.0)
    w = _window(x)
    (a,) = relation_events(_fmea(), w, DetectorSettings())
    assert a.value < -8.0 and _at(13.7) <= a.t_ns <= _at(14.3) and a.end_ns == int(w.t_ns[-1])


def test_a_healthy_relation_raises_nothing():
    _, x = _noise(20.0, seed=4)
    assert relation_events(_fmea(), _window(x), DetectorSettings()) == []


def test_shift_since_an_alert_is_graded_in_step_spreads():
    # a 2 um/s ramp from the alert on: a second later it has moved the relation by 4..8 step spreads (weak
    # evidence, below the 8 sigma detection); the noise alone stays within 3
    def shift(rate: float):
        t, x = _noise(17.0, seed=5)
        x += np.where(t >= 16.0, rate * (t - 16.0), 0.0)
        (sh,) = relation_shifts(_fmea(), _window(x), _at(16.0), DetectorSettings())
        assert sh.relation == "r" and sh.t_ns == _at(16.99)
        return sh

    still, up, down = shift(0.0), shift(0.002), shift(-0.002)
    assert abs(still.z) < 3.0
    assert 4.0 < up.z - still.z < 8.0 and 4.0 < still.z - down.z < 8.0
    assert up.deviation > still.deviation > down.deviation


def test_no_graded_shift_for_an_incident_older_than_the_step_span():
    _, x = _noise(20.0, seed=6)
    assert relation_shifts(_fmea(), _window(x), _at(17.0), DetectorSettings()) == []
    assert len(relation_shifts(_fmea(), _window(x), _at(18.5), DetectorSettings())) == 1
