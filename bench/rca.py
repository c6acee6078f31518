"""Fault attribution: inject each fault type into the simulated stand, localize it, and compare with a baseline.

    python bench/rca.py [--seeds 5] [--json] [--dump DIR]

Each scenario runs the simulator's physics with one fault (plc/simulator/faults.py) through the
daemon's real gates and the real model (ONNX Runtime) in simulated time (sitsd.rca.scenario),
then localizes over the last 20 s with sitsd.rca.localize, 8 s after the onset. The fault's label is
used only here, to score the ranking; the localizer sees events and signals only. Per seed the onset,
the magnitude, the faulty sensor and the PLC vendor vary. Baseline: failure modes ranked by the number
of events matching their detections (alert count). localize_ms is the wall time of one localization
(detectors, Granger tests, model replay, scoring), i.e. the time from having the alerts to the ranking.

early_top1/early_top3: the same scenario ranked again with only what was known 1 s after the incident's
first alert (the 8 s diagnosis's `first_alert_ns`): events up to then and a 20 s window ending then.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plc.simulator.faults import FAULT_KINDS, FaultSpec  # noqa: E402
from sitsd.rca.detect import model_replay  # noqa: E402
from sitsd.rca.events import dump  # noqa: E402
from sitsd.rca.fmea import load_fmea  # noqa: E402
from sitsd.rca.localize import baseline_ranking, localize  # noqa: E402
from sitsd.rca.scenario import ScenarioRunner  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WINDOW_S = 20.0
AFTER_ONSET_S = 8.0
EARLY_NS = 1_000_000_000  # also rank with only the data up to 1 s after the first alert
SENSOR_COMPONENT = {"entry_thickness": "entry_gauge", "exit_thickness": "exit_gauge", "roll_gap": "gap_sensor",
                    "rolling_force": "load_cell", "strip_tension": "tension_sensor", "strip_speed": "speed_sensor"}
DRIFT_SIGNALS = ("exit_thickness", "entry_thickness", "roll_gap")
STUCK_SIGNALS = ("entry_thickness", "exit_thickness", "roll_gap", "rolling_force", "strip_tension", "strip_speed")
PROFILES = ("s7-1500", "controllogix", "melsec-iq-r")
TRUTH = {"clock_skew": "clock.skew", "network_delay": "network.congestion",
         "actuator_saturation": "hydraulic_gap.saturation", "roll_wear": "rolls.wear", "plc_fault": "plc.fault",
         "model_drift": "model.prediction_drift"}


def plan(seeds: int) -> list[FaultSpec]:
    out = []
    for kind in FAULT_KINDS:
        for seed in range(seeds):
            rng = np.random.default_rng([seed, FAULT_KINDS.index(kind)])
            signal = {"sensor_drift": DRIFT_SIGNALS[seed % len(DRIFT_SIGNALS)],
                      "stuck_sensor": STUCK_SIGNALS[seed % len(STUCK_SIGNALS)]}.get(kind)
            out.append(FaultSpec(kind, float(rng.uniform(18.0, 24.0)), float(rng.uniform(0.7, 1.5)), signal,
                                 PROFILES[seed % len(PROFILES)], seed))
    return out


def true_cause(spec: FaultSpec) -> str:
    if spec.kind == "sensor_drift":
        return SENSOR_COMPONENT[spec.signal] + ".drift"
    if spec.kind == "stuck_sensor":
        return SENSOR_COMPONENT[spec.signal] + ".stuck"
    return TRUTH[spec.kind]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="scenarios per fault type (default 5)")
    ap.add_argument("--config", type=Path, default=REPO / "examples" / "rolling-mill.yaml")
    ap.add_argument("--fmea", type=Path, default=REPO / "examples" / "fmea" / "rolling-mill.yaml")
    ap.add_argument("--dump", type=Path, default=None, help="write each scenario's events + signals here "
                    "(for `sitsctl diagnose --events FILE`)")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object on the last line")
    args = ap.parse_args()

    runner = ScenarioRunner(args.config)
    fmea = load_fmea(args.fmea)
    replay = model_replay(runner.model)
    inputs = list(runner.cfg.model.inputs)
    rows = []
    print(f"{'fault':<20} {'seed':>4} {'signal / vendor':<16} {'true cause':<26} {'rank':>4} {'top-1 (confidence)':<34} "
          f"{'baseline top-1':<26} {'1st alert':>9} {'ms':>6}")
    for spec in plan(args.seeds):
        res = runner.run(spec, seed=spec.seed, seconds=spec.start_s + AFTER_ONSET_S)
        start = res.now_ns - int(WINDOW_S * 1e9)
        d = localize(fmea, res.events, res.window, start_ns=start, end_ns=res.now_ns, inputs=inputs, replay=replay)
        ranking = [c.mode.id for c in d.candidates]
        baseline = baseline_ranking(fmea, [e for e in res.events if e.t_ns >= start])
        truth = true_cause(spec)
        rank = ranking.index(truth) + 1 if truth in ranking else 0
        first_s = (d.first_alert_ns - res.fault_start_ns) / 1e9 if d.first_alert_ns is not None else None
        early_rank = 0  # the same, with only what was known 1 s after the first alert
        if d.first_alert_ns is not None:
            cut = d.first_alert_ns + EARLY_NS
            early = localize(fmea, [e for e in res.events if e.t_ns <= cut], res.window, start_ns=cut - int(WINDOW_S * 1e9),
                             end_ns=cut, inputs=inputs, replay=replay)
            early_ids = [c.mode.id for c in early.candidates]
            early_rank = early_ids.index(truth) + 1 if truth in early_ids else 0
        rows.append({"fault": spec.kind, "seed": spec.seed, "signal": spec.signal, "profile": spec.profile,
                     "true_cause": truth, "rank": rank, "top1": rank == 1, "top3": 1 <= rank <= 3,
                     "ranked_first": ranking[0] if ranking else None,
                     "confidence": round(d.candidates[0].confidence, 3) if d.candidates else 0.0,
                     "baseline_first": baseline[0], "baseline_top1": baseline[0] == truth,
                     "first_alert_after_onset_s": first_s, "localize_ms": d.localize_ms,
                     "early_top1": early_rank == 1, "early_top3": 1 <= early_rank <= 3})
        if args.dump is not None:
            args.dump.mkdir(parents=True, exist_ok=True)
            res.window.meta = {"model": str(runner.cfg.model.artifact), "inputs": inputs, "line": runner.cfg.line}
            dump(args.dump / f"{spec.kind}-{spec.seed}.json", [e for e in res.events if e.t_ns >= start], res.window)
        r = rows[-1]
        top = f"{r['ranked_first']} ({r['confidence']:.2f})" if r["ranked_first"] else "-"
        first = f"{first_s:+.2f} s" if first_s is not None else "-"
        print(f"{spec.kind:<20} {spec.seed:>4} {(spec.signal or spec.profile):<16} {truth:<26} {rank or '-':>4} "
              f"{top:<34} {r['baseline_first']:<26} {first:>9} {d.localize_ms:6.1f}")
    ms = np.array([r["localize_ms"] for r in rows])
    summary = {"scenarios": len(rows), "top1": round(float(np.mean([r["top1"] for r in rows])), 4),
               "top3": round(float(np.mean([r["top3"] for r in rows])), 4),
               "baseline_top1": round(float(np.mean([r["baseline_top1"] for r in rows])), 4),
               "localize_ms": {"p50": round(float(np.median(ms)), 2), "max": round(float(ms.max()), 2)},
               "early_top1": round(float(np.mean([r["early_top1"] for r in rows])), 4),
               "early_top3": round(float(np.mean([r["early_top3"] for r in rows])), 4)}
    print()
    for kind in FAULT_KINDS:
        sel = [r for r in rows if r["fault"] == kind]
        print(f"  {kind:<20} top-1 {sum(r['top1'] for r in sel)}/{len(sel)}  top-3 {sum(r['top3'] for r in sel)}/{len(sel)}"
              f"  baseline top-1 {sum(r['baseline_top1'] for r in sel)}/{len(sel)}"
              f"  (1 s after first alert: top-1 {sum(r['early_top1'] for r in sel)}/{len(sel)})")
    print(f"  all: top-1 {summary['top1']:.2f}  top-3 {summary['top3']:.2f}  baseline top-1 {summary['baseline_top1']:.2f}"
          f"  localize p50 {summary['localize_ms']['p50']} ms, max {summary['localize_ms']['max']} ms")
    print(f"  ranked 1 s after the first alert: top-1 {summary['early_top1']:.2f}  top-3 {summary['early_top3']:.2f}")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
