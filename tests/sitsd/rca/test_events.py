"""The one event stream: gate alerts, PLC events of every vendor profile, signer and update events, model
anomalies; the signal ring and the dump format."""
import numpy as np
import pytest

from plc.profiles import get_profile
from plc.simulator.faults import FaultSpec
from sitsd.rca.detect import detect, model_replay
from sitsd.rca.errors import DiagnoseError
from sitsd.rca.events import EventStream, SignalRing, dump, event_from_alert, event_from_plc, load


def _codes(result) -> set[str]:
    return {e.code for e in result.events}


def test_gate_alerts_from_the_real_gates(runner):
    skew = runner.run(FaultSpec("clock_skew", 3.0), seed=1, seconds=6.0)
    assert "timestamp.future" in _codes(skew)
    assert all(e.source == "gate" for e in skew.events if e.code.startswith("timestamp."))
    delay = runner.run(FaultSpec("network_delay", 3.0), seed=1, seconds=6.0)
    assert "timestamp.transit" in _codes(delay)
    mode = runner.run(FaultSpec("plc_fault", 3.0, profile="s7-1500"), seed=1, seconds=5.0)
    assert "constraint.threading_speed" in _codes(mode)
    drift = runner.run(FaultSpec("model_drift", 2.0, magnitude=3.0), seed=1, seconds=6.0)
    safety = [e for e in drift.events if e.code == "safety.roll_gap_correction"]
    assert safety and "clamped" in safety[-1].text
    healthy = runner.run(None, seed=1, seconds=5.0)
    assert not any(c.startswith(("timestamp.", "constraint.")) for c in _codes(healthy))


@pytest.mark.parametrize("profile, text, code, severity", [
    ("s7-1500", "Distributed I/Os: station failure, entering state", "plc.S7.IO.STATION_FAILURE", "error"),
    ("controllogix", "Type 03 Code 16 I/O Connection Failure", "plc.LOGIX.MAJOR.T03.C16", "critical"),
    ("melsec-iq-r", "SM1 ON", "plc.MELSEC.SM1.ON", "error"),
])
def test_plc_events_from_each_vendor_profile(profile, text, code, severity):
    e = event_from_plc(get_profile(profile).parse_diagnostic(text, 123))
    assert (e.code, e.severity, e.source, e.t_ns) == (code, severity, "plc", 123)
    words = [event_from_plc(p) for p in get_profile(profile).decode_status(get_profile(profile).example_status()[0], 5)]
    assert words and all(w.code.startswith("plc.") for w in words)


def test_signer_update_runtime_and_link_alerts():
    # the tuples exactly as sitsd.pipeline / sitsd.daemon / sitsd.hotswap append them
    assert event_from_alert(1, "sign", "TPM2_Sign failed: TPM_RC_HANDLE", 7, 3).code == "signer.error"
    assert event_from_alert(1, "sign", "x").severity == "critical"
    assert event_from_alert(1, "rollback", "rolled back generation 4").code == "update.rollback"
    assert event_from_alert(1, "plc_rejected", "PLC refused command 9").code == "plc_link.rejected"
    assert event_from_alert(1, "deadline", "model result would arrive after the deadline").code == "deadline"
    assert event_from_alert(1, "something_new", "text").code == "something_new"  # unknown kinds pass through


def test_model_anomaly_replay_mismatch_only_when_the_model_drifts(runner, fmea):
    replay = model_replay(runner.model)
    inputs = list(runner.cfg.model.inputs)
    drifted = runner.run(FaultSpec("model_drift", 6.0), seed=2, seconds=10.0)
    codes = [e.code for e in detect(fmea, drifted.window, inputs=inputs, replay=replay)]
    assert "model.replay_mismatch" in codes
    healthy = runner.run(None, seed=2, seconds=10.0)
    assert "model.replay_mismatch" not in [e.code for e in detect(fmea, healthy.window, inputs=inputs, replay=replay)]


def test_stuck_sensor_anomaly_names_the_signal(runner, fmea):
    res = runner.run(FaultSpec("stuck_sensor", 6.0, signal="strip_tension"), seed=4, seconds=10.0)
    stuck = [e for e in detect(fmea, res.window) if e.code.startswith("anomaly.stuck.")]
    assert [e.code for e in stuck] == ["anomaly.stuck.strip_tension"]
    assert abs(stuck[0].t_ns - res.fault_start_ns) < 50_000_000


def test_signal_ring_wraps_and_filters_by_time():
    ring = SignalRing(["a", "b"], ["command"], capacity=5)
    for i in range(8):
        ring.push(i * 10, np.array([i, -i], dtype=float), np.array([i / 10]), i % 2 == 0)
    w = ring.window()
    assert w.t_ns.tolist() == [30, 40, 50, 60, 70]
    assert w.column("a").tolist() == [3, 4, 5, 6, 7] and w.column("command").tolist() == [0.3, 0.4, 0.5, 0.6, 0.7]
    assert ring.window(since_ns=55).t_ns.tolist() == [60, 70]
    with pytest.raises(DiagnoseError, match="signal 'c' is not in the window"):
        w.column("c")


def test_stream_is_bounded_and_dump_round_trips(tmp_path):
    s = EventStream(maxlen=3)
    for t in (5, 1, 4, 2):
        s.append(event_from_alert(t, "constraint", f"rule_{t}: broken"))
    assert [e.t_ns for e in s.since(0)] == [1, 2, 4] and len(s) == 3
    ring = SignalRing(["a"], ["command"], capacity=4)
    ring.push(1, np.array([1.5]), np.array([0.25]), False)
    dump(tmp_path / "d.json", s.since(0), ring.window())
    events, window = load(tmp_path / "d.json")
    assert events == s.since(0) and window.column("a").tolist() == [1.5]
    (tmp_path / "bad.json").write_text('{"events": [{"t_ns": 1}]}')
    with pytest.raises(DiagnoseError, match="wrong shape"):
        load(tmp_path / "bad.json")
    with pytest.raises(DiagnoseError, match="no such events file"):
        load(tmp_path / "missing.json")
