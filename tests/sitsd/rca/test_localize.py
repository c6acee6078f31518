"""Localization ranks the injected cause first from events and signals alone (not timed: bench/rca.py times it)."""
import dataclasses
import inspect
import json
import random

import pytest

from plc.simulator.faults import FAULT_KINDS, FaultError, FaultSpec, parse_fault
from sitsd.rca.detect import model_replay
from sitsd.rca.localize import baseline_ranking, localize

CASES = [
    (FaultSpec("stuck_sensor", 20.5, signal="exit_thickness", seed=7), 7, "exit_gauge.stuck"),
    (FaultSpec("sensor_drift", 21.0, signal="roll_gap", seed=8), 8, "gap_sensor.drift"),
    (FaultSpec("roll_wear", 19.0, magnitude=1.2, seed=9), 9, "rolls.wear"),
    (FaultSpec("actuator_saturation", 20.0, seed=10), 10, "hydraulic_gap.saturation"),
    (FaultSpec("plc_fault", 22.0, profile="controllogix", seed=11), 11, "plc.fault"),
    (FaultSpec("model_drift", 20.0, magnitude=0.8, seed=12), 12, "model.prediction_drift"),
    (FaultSpec("clock_skew", 21.0, seed=13), 13, "clock.skew"),
    (FaultSpec("network_delay", 20.0, seed=14), 14, "network.congestion"),
]


def _diagnose(runner, fmea, result):
    return localize(fmea, result.events, result.window, start_ns=result.now_ns - 20 * 10**9, end_ns=result.now_ns,
                    inputs=list(runner.cfg.model.inputs), replay=model_replay(runner.model))


@pytest.fixture(scope="module")
def results(runner):
    return {spec: runner.run(spec, seed=seed, seconds=spec.start_s + 8.0) for spec, seed, _ in CASES}


@pytest.mark.parametrize("spec, seed, cause", CASES, ids=[c[2] for c in CASES])
def test_injected_cause_ranks_first_with_evidence(runner, fmea, results, spec, seed, cause):
    d = _diagnose(runner, fmea, results[spec])
    top = d.candidates[0]
    assert top.mode.id == cause, [(c.mode.id, round(c.score, 2)) for c in d.candidates[:4]]
    assert top.confidence > 0.3 and top.confidence == max(c.confidence for c in d.candidates)
    assert any(line.startswith("seen ") for line in top.evidence)
    assert abs(sum(c.confidence for c in d.candidates) - 1.0) < 1e-9


def test_the_localizer_never_sees_the_label(runner, fmea, results):
    # nothing it is given names the fault ...
    assert "label" not in inspect.signature(localize).parameters
    for spec, result in results.items():
        blob = json.dumps([e.as_dict() for e in result.events]) + json.dumps(result.window.as_dict())
        assert spec.kind not in blob
    # ... so shuffling the labels leaves every ranking where the data puts it
    specs = list(results)
    shuffled = specs[:]
    random.Random(5).shuffle(shuffled)
    before = {spec: [c.mode.id for c in _diagnose(runner, fmea, results[spec]).candidates] for spec in specs}
    relabelled = {dataclasses.replace(new, start_s=new.start_s): results[old] for old, new in zip(specs, shuffled)}
    for (new, result), old in zip(relabelled.items(), specs):
        assert [c.mode.id for c in _diagnose(runner, fmea, result).candidates] == before[old]
    assert len({ranking[0] for ranking in before.values()}) == len(specs)  # and different data, different causes


def test_a_healthy_stand_has_nothing_to_attribute(runner, fmea):
    result = runner.run(None, seed=21, seconds=28.0)
    d = _diagnose(runner, fmea, result)
    assert d.symptoms == [] and d.top is None and d.as_dict()["ranking"] == []


def test_baseline_counts_alerts(runner, fmea, results):
    spec = next(s for s in results if s.kind == "network_delay")
    assert baseline_ranking(fmea, results[spec].events)[0] == "network.congestion"


def test_fault_specs_are_checked():
    assert parse_fault("stuck_sensor@20:entry_thickness") == FaultSpec("stuck_sensor", 20.0, 1.0, "entry_thickness")
    assert parse_fault("roll_wear@10x2").magnitude == 2.0
    for bad, match in (("roll_wear", "KIND@SECONDS"), ("wear@1", "unknown"), ("stuck_sensor@1:mill_mode", "not a sensor"),
                       ("roll_wear@1x0", "magnitude")):
        with pytest.raises(FaultError, match=match):
            parse_fault(bad)
    assert len(FAULT_KINDS) >= 8
