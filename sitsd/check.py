"""`sitsctl check`: what can be proven about a config before it runs.

1. The constraint set, with z3: satisfiable, contradictions by name, redundant constraints, and the
   bounding box of the admissible region.
2. The model over that region: sound output bounds (IBP, CROWN, input splitting) proven inside
   the actuator limits of the safety envelope, or the counterexample / open sub-region that
   prevents it. A proven result can be written as a certificate for the model.
"""
from __future__ import annotations

import numpy as np

from ep.artifact import resolve_model
from ep.bounds import BoundsError, prove
from ep.errors import ModelLoadError

from .config import Config
from .gates.solver import check_constraints, report_text


def run_check(cfg: Config, max_splits: int = 256) -> dict:
    rep = check_constraints(cfg.signals, cfg.constraints)
    by_output = {a.output: a for a in cfg.safety.actuators}
    limits = {o: [by_output[o].min, by_output[o].max] for o in cfg.model.outputs}
    result = {
        "satisfiable": rep.satisfiable,
        "contradictions": [list(core) for core in rep.contradictions],
        "redundant": list(rep.redundant),
        "undecided": list(rep.unknown),
        "bounding_box": {k: [float(lo), float(hi)] for k, (lo, hi) in rep.bounding_box.items()},
        "bounds_proven": False,
        "output_bounds": {},
        "actuator_limits": limits,
        "ibp_width": None,
        "crown_width": None,
    }
    report = [report_text(rep, cfg.signals)]
    if not rep.satisfiable:
        report.append("model bounds: not analysed (no input satisfies the constraints)")
        return {**result, "report": "\n".join(report)}
    lower = np.array([rep.bounding_box[n][0] for n in cfg.model.inputs])
    upper = np.array([rep.bounding_box[n][1] for n in cfg.model.inputs])
    out_lo = np.array([limits[o][0] for o in cfg.model.outputs])
    out_hi = np.array([limits[o][1] for o in cfg.model.outputs])
    try:
        model_bytes = resolve_model(cfg.model.artifact)[0]  # a compiled artifact: its deployed (dequantized) weights
        proof = prove(model_bytes, lower, upper, out_lo, out_hi, max_splits=max_splits)
    except (BoundsError, ModelLoadError) as exc:
        report.append(f"model bounds: cannot analyse {cfg.model.artifact}: {exc}")
        return {**result, "bounds_error": str(exc), "report": "\n".join(report)}
    result.update({
        "bounds_proven": bool(proof.proven),
        "output_bounds": {o: [float(proof.lower[i]), float(proof.upper[i])] for i, o in enumerate(cfg.model.outputs)},
        "ibp_width": float(proof.ibp_width), "crown_width": float(proof.crown_width),
        "method": proof.method, "splits": proof.splits, "seconds": round(proof.seconds, 3),
    })
    report.append(f"model {cfg.model.artifact.name} over that region ({proof.method}, {proof.splits} splits, "
                  f"{proof.seconds:.2f} s):")
    for i, o in enumerate(cfg.model.outputs):
        verdict = "inside" if proof.lower[i] >= out_lo[i] and proof.upper[i] <= out_hi[i] else "NOT proven inside"
        report.append(f"  {o}: proven bounds [{proof.lower[i]:.6g}, {proof.upper[i]:.6g}], {verdict} the actuator "
                      f"limits [{out_lo[i]:g}, {out_hi[i]:g}]")
    report.append(f"  widths: IBP {proof.ibp_width:.6g}, CROWN {proof.crown_width:.6g}")
    if not proof.proven:
        if proof.counterexample is not None:
            w = proof.counterexample
            point = ", ".join(f"{n}={v:.6g}" for n, v in zip(cfg.model.inputs, w.input))
            result["counterexample"] = {"input": dict(zip(cfg.model.inputs, map(float, w.input))),
                                        "output": float(w.output[w.index])}
            report.append(f"  counterexample: {cfg.model.outputs[w.index]} = {w.output[w.index]:.6g} at {point}")
        elif proof.open_region is not None:
            r = proof.open_region
            box = ", ".join(f"{n} [{lo:.6g}, {hi:.6g}]" for n, lo, hi in zip(cfg.model.inputs, r.lower, r.upper))
            report.append(f"  not proven within the split budget; worst sub-region: {box} "
                          f"({r.side} bound {r.bound:.6g} vs limit {r.limit:g})")
        report.append("  fix: constrain the inputs more tightly, bound the model's output head, or widen the limits")
    return {**result, "report": "\n".join(report)}
