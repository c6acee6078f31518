"""Update events (config reload, model and module swaps) in the event stream and in the ranking, and the model
replay check comparing like with like (the model's own input and output, the model that ran)."""
import dataclasses

import numpy as np

from plc.simulator.faults import FaultSpec
from sitsd.rca.detect import DetectorSettings, model_replay, replay_events
from sitsd.rca.events import SignalRing, SignalWindow, dump, event_from_alert, load
from sitsd.rca.localize import event_symptoms, localize

S = 10**9


def test_update_alerts_become_info_events_naming_what_changed():
    # the tuples exactly as sitsd.hotswap (_announce) and sitsd.daemon (_announce_reload) append them
    m = event_from_alert(5, "model_swap", "model v2.onnx: sha256 aa (v1.onnx) -> bb, generation 0 -> 1 (update)")
    assert (m.code, m.source, m.severity, m.component, m.t_ns) == ("update.model", "update", "info", "model", 5)
    mod = event_from_alert(6, "module_swap", "module post_command (post) post_command.wat: v1 sha256 aa -> v2 "
                                             "sha256 bb, generation 1 -> 2 (update)")
    assert (mod.code, mod.severity, mod.component) == ("update.module", "info", "post_command")
    r = event_from_alert(7, "reload", "config c.yaml: c.yaml sha256 aa -> sha256 bb, changed: constraints")
    assert (r.code, r.severity, r.component) == ("update.reload", "info", "config")
    assert event_from_alert(8, "update_refused", "model x.onnx: refused").severity == "warning"


def test_one_update_in_the_tested_part_is_a_symptom_however_rare():
    ev = [event_from_alert(50 * S, "reload", "config c.yaml: a -> b, changed: constraints")]
    (s,) = event_symptoms(ev, 0, 100 * S, 0.4)
    assert s.code == "update.reload" and s.onset_ns == 50 * S and s.count == 1
    assert event_symptoms(ev, 0, 200 * S, 0.4) == []  # in the reference part: the healthy past, not news
    # a single warning of another kind over the same span stays background, as before
    assert event_symptoms([event_from_alert(50 * S, "safety", "roll_gap_correction: clamped")], 0, 100 * S, 0.4) == []


def test_ring_records_the_models_own_io_and_round_trips():
    ring = SignalRing(["a", "b"], ["command"], capacity=4, n_model_inputs=2)
    ring.push_model(10, np.array([1.0, 2.0]), np.array([0.5]), False, np.array([1.5, 2.5], np.float32),
                    np.array([0.25], np.float32), 3)
    ring.push(20, np.array([1.0, 2.0]), np.array([0.0]), True)  # a fail-safe: no model record
    ring.push_model(30, np.array([1.0, 2.0]), np.array([0.5]), False, np.array([1.0, 2.0], np.float32),
                    np.array([0.125], np.float32), 4)
    w = ring.window(model_tags={4})
    assert w.model_ok.tolist() == [False, False, True] and w.model_out[:, 0].tolist() == [0.25, 0.0, 0.125]
    assert ring.window().model_ok.tolist() == [True, False, True]
    back = SignalWindow.from_dict(w.as_dict())
    assert back.model_in.tolist() == w.model_in.tolist() and back.model_ok.tolist() == w.model_ok.tolist()
    sub = back.select(back.t_ns >= 20)
    assert sub.model_ok.tolist() == [False, True] and len(sub) == 2
    assert SignalRing(["a"], ["command"], capacity=2).window().model_ok is None  # no model records: old form


def _model_window(runner, seconds=6.0, seed=5):
    """A healthy run: each row holds the model's own input and output (as the daemon records them)."""
    return runner.run(None, seed=seed, seconds=seconds).window


def test_replay_compares_the_models_own_io_not_the_command(runner):
    replay = model_replay(runner.model)
    inputs = list(runner.cfg.model.inputs)
    w = _model_window(runner)
    assert w.model_ok is not None and w.model_ok.sum() > 100
    s = DetectorSettings()
    assert replay_events(w, inputs, replay, s) == []
    # what a pre module (low-pass) and a post module (gain, offset) make of it: the command and the raw signals
    # no longer match the model on the raw signals, but the model's own records still do
    shaped = dataclasses.replace(w, command=w.command * 0.5 + 0.01)
    assert replay_events(shaped, inputs, replay, s) == []
    assert replay_events(dataclasses.replace(shaped, model_in=None, model_out=None, model_ok=None), inputs, replay,
                         s), "the old comparison (command against the raw signals) would flag it"
    # a model that is not the verified artifact: its own outputs are off
    off = dataclasses.replace(w, model_out=w.model_out + np.float32(0.01))
    (e,) = replay_events(off, inputs, replay, s)
    assert e.code == "model.replay_mismatch" and abs(e.value - 0.01) < 1e-3
    # rows from before a swap to another model are not replayed with the running one
    ok = w.model_ok.copy()
    ok[: len(ok) // 2] = False
    before_swap = off.model_out.copy()
    before_swap[len(ok) // 2:] = w.model_out[len(ok) // 2:]
    assert replay_events(dataclasses.replace(w, model_out=before_swap, model_ok=ok), inputs, replay, s) == []


def test_dump_keeps_the_model_records(runner, tmp_path):
    w = _model_window(runner, seconds=2.0)
    dump(tmp_path / "d.json", [], w)
    _, back = load(tmp_path / "d.json")
    assert np.array_equal(back.model_in, w.model_in) and np.array_equal(back.model_out, w.model_out)


def _bad_update(runner, fmea, kind, text, symptoms_kind, symptoms_text, seed=21):
    """A healthy 20 s run; at 14 s an update goes live, from 14.3 s alerts follow (about 20 per second)."""
    res = runner.run(None, seed=seed, seconds=20.0)
    t0 = res.now_ns - 6 * S
    events = list(res.events) + [event_from_alert(t0, kind, text)]
    events += [event_from_alert(t0 + 300_000_000 + i * 50_000_000, symptoms_kind, symptoms_text) for i in range(100)]
    d = localize(fmea, sorted(events, key=lambda e: e.t_ns), res.window, start_ns=res.now_ns - 20 * S,
                 end_ns=res.now_ns, inputs=list(runner.cfg.model.inputs), replay=model_replay(runner.model))
    return d


def test_a_bad_config_reload_followed_by_constraint_alerts_ranks_the_update_first(runner, fmea):
    d = _bad_update(runner, fmea, "reload", "config c.yaml: c.yaml sha256 aa -> sha256 bb, changed: constraints",
                    "constraint", "force_in_band_under_agc: 1.0*rolling_force = 8e3 outside [4e3, 6e3]")
    top = d.candidates[0]
    assert top.mode.id == "update.bad_config", [(c.mode.id, round(c.score, 2)) for c in d.candidates[:4]]
    assert any(line.startswith("seen update.reload") for line in top.evidence)
    assert "precedence: its own detection fired first" in top.evidence


def test_a_bad_model_swap_followed_by_clamps_ranks_the_model_update_first(runner, fmea):
    d = _bad_update(runner, fmea, "model_swap", "model v2.onnx: sha256 aa (v1.onnx) -> bb, generation 0 -> 1 "
                    "(update)", "safety", "roll_gap_correction: clamped 0.2 to 0.15")
    assert d.candidates[0].mode.id == "update.bad_model", [(c.mode.id, round(c.score, 2)) for c in d.candidates[:4]]


def test_a_bad_module_swap_ranks_the_module_update_first(runner, fmea):
    d = _bad_update(runner, fmea, "module_swap", "module post_command (post) post_command.wat: v1 sha256 aa -> "
                    "v2 sha256 bb, generation 1 -> 2 (update)", "safety", "roll_gap_correction: clamped 0.2 to 0.15")
    assert d.candidates[0].mode.id == "update.bad_module", [(c.mode.id, round(c.score, 2)) for c in d.candidates[:4]]


def test_without_an_update_the_update_modes_do_not_rank(runner, fmea):
    res = runner.run(FaultSpec("actuator_saturation", 14.0, seed=10), seed=10, seconds=20.0)
    d = localize(fmea, res.events, res.window, start_ns=res.now_ns - 20 * S, end_ns=res.now_ns,
                 inputs=list(runner.cfg.model.inputs), replay=model_replay(runner.model))
    assert not d.candidates[0].mode.id.startswith("update."), [c.mode.id for c in d.candidates[:3]]


def test_updates_alone_are_listed_but_nothing_is_ranked(runner, fmea):
    from sitsd.rca.render import to_text

    res = runner.run(None, seed=21, seconds=20.0)
    ev = list(res.events) + [event_from_alert(res.now_ns - 6 * S, "model_swap", "model v2.onnx: sha256 aa (v1.onnx) "
                                              "-> bb, generation 0 -> 1 (update)")]
    d = localize(fmea, ev, res.window, start_ns=res.now_ns - 20 * S, end_ns=res.now_ns)
    assert [s.code for s in d.symptoms] == ["update.model"] and d.candidates == [] and d.top is None
    assert d.as_dict()["ranking"] == [] and "only updates went live" in to_text(d)
