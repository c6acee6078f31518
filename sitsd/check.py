"""`sitsctl check`: what can be proven about a config before it runs.

1. The constraint set, with z3: satisfiable, contradictions by name, redundant constraints, and the
   bounding box of the admissible region.
2. The model over that region: sound output bounds (IBP, CROWN, input splitting) proven inside
   the actuator limits of the safety envelope, or the counterexample / open sub-region that
   prevents it. A proven result can be written as a certificate for the model, tied to the constraint
   set by `constraints_sha256` (below) and re-checked against the running config before a hot swap.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from ep.artifact import resolve_model
from ep.bounds import BoundsError, prove
from ep.errors import ModelLoadError

from .config import Config, LinearConstraint, Signal
from .gates.solver import check_constraints, report_text

CONSTRAINTS_FORMAT = "sits2026.constraints/1"


def _num(x: float) -> float:
    return float(x) + 0.0  # -0.0 -> 0.0: equal values serialise alike


def canonical_constraints(signals: list[Signal], constraints: list[LinearConstraint]) -> bytes:
    """What defines the admissible input region, serialised so that equal regions as written give equal
    bytes regardless of the order in the YAML. Compact JSON (sorted keys, no spaces, ASCII):

        {"format": "sits2026.constraints/1",
         "signals": [{"name", "type", "unit", "min", "max", "values", "mask"}, ...]   sorted by name
         "constraints": [{"coefficients": [[signal, coef], ...] sorted by signal,
                          "min", "max", "when": [[signal, op, value], ...] sorted}, ...]}

    Absent fields are null; numbers are floats (`mask` an integer), -0.0 written as 0.0, enum values
    sorted and deduplicated. Constraints are sorted by their own serialisation and deduplicated (a
    conjunction: order and repeats do not change the region); `when` is the parsed conditions, so
    spacing and the order of `and`-ed terms do not count. Left out, because they do not change the
    region the bounds are proven over: constraint names, max_rate, rate_window_ms, on_invalid."""
    sigs = [{"name": s.name, "type": s.type, "unit": s.unit,
             "min": None if s.min is None else _num(s.min), "max": None if s.max is None else _num(s.max),
             "values": None if s.values is None else sorted({_num(v) for v in s.values}),
             "mask": s.mask}
            for s in sorted(signals, key=lambda s: s.name)]
    rows = set()
    for c in constraints:
        row = {"coefficients": sorted([name, _num(coef)] for name, coef in c.coefficients.items()),
               "min": None if c.min is None else _num(c.min), "max": None if c.max is None else _num(c.max),
               "when": sorted({(d.signal, d.op, _num(d.value)) for d in c.conditions})}
        rows.add(json.dumps(row, sort_keys=True, separators=(",", ":")))
    data = {"format": CONSTRAINTS_FORMAT, "signals": sigs, "constraints": [json.loads(r) for r in sorted(rows)]}
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def constraints_sha256(signals: list[Signal], constraints: list[LinearConstraint]) -> str:
    """SHA-256 (hex) of `canonical_constraints`: the constraint set a bounds certificate was made for.
    The only place it is computed; `sitsctl check` writes it, `swap_bounds_check` compares it."""
    return hashlib.sha256(canonical_constraints(signals, constraints)).hexdigest()


def run_check(cfg: Config, max_splits: int = 256, model_bytes: bytes | None = None) -> dict:
    """`model_bytes`: the ONNX bytes to prove, already read (and hash-checked) by the caller; default: read
    from `cfg.model.artifact`."""
    rep = check_constraints(cfg.signals, cfg.constraints)
    digest = constraints_sha256(cfg.signals, cfg.constraints)
    by_output = {a.output: a for a in cfg.safety.actuators}
    limits = {o: [by_output[o].min, by_output[o].max] for o in cfg.model.outputs}
    result = {
        "satisfiable": rep.satisfiable,
        "contradictions": [list(core) for core in rep.contradictions],
        "unreachable": [{"when": when, "core": list(core)} for when, core in rep.unreachable],
        "redundant": list(rep.redundant),
        "undecided": list(rep.unknown),
        "bounding_box": {k: [float(lo), float(hi)] for k, (lo, hi) in rep.bounding_box.items()},
        "bounds_proven": False,
        "output_bounds": {},
        "actuator_limits": limits,
        "ibp_width": None,
        "crown_width": None,
        "constraints_sha256": digest,
    }
    report = [report_text(rep, cfg.signals),
              f"constraints SHA-256 {digest} (canonical signals and constraints; a bounds certificate is tied to it)"]
    if not rep.satisfiable:
        report.append("model bounds: not analysed (no input satisfies the constraints)")
        return {**result, "report": "\n".join(report)}
    if cfg.model.kind == "streaming":
        return _check_streaming(cfg, result, report, limits)
    lower = np.array([rep.bounding_box[n][0] for n in cfg.model.inputs])
    upper = np.array([rep.bounding_box[n][1] for n in cfg.model.inputs])
    out_lo = np.array([limits[o][0] for o in cfg.model.outputs])
    out_hi = np.array([limits[o][1] for o in cfg.model.outputs])
    try:
        if model_bytes is None:  # a compiled artifact: its deployed (dequantized) weights
            model_bytes = resolve_model(cfg.model.artifact)[0]
        proof = prove(model_bytes, lower, upper, out_lo, out_hi, max_splits=max_splits)
    except (BoundsError, ModelLoadError) as exc:
        report.append(f"model bounds: cannot analyse {cfg.model.artifact}: {exc}")
        return {**result, "bounds_error": str(exc), "report": "\n".join(report)}
    result.update({
        "bounds_proven": bool(proof.proven),
        "output_bounds": {o: [float(proof.lower[i]), float(proof.upper[i])] for i, o in enumerate(cfg.model.outputs)},
        "ibp_width": float(proof.ibp_width), "crown_width": float(proof.crown_width),
        "output_width": float(proof.ibp_width), "width_at": "output",
        "method": proof.method, "splits": proof.splits, "seconds": round(proof.seconds, 3),
    })
    head = _pre_head_widths(model_bytes, lower, upper)
    if head is not None:  # a saturating head makes both methods report its range: compare before it
        op, ibp_w, crown_w = head
        result.update({"ibp_width": ibp_w, "crown_width": crown_w, "width_at": f"before the output head ({op})",
                       "output_width": float(proof.ibp_width)})
    report.append(f"model {cfg.model.artifact.name} over that region ({proof.method}, {proof.splits} splits, "
                  f"{proof.seconds:.2f} s):")
    for i, o in enumerate(cfg.model.outputs):
        verdict = "inside" if proof.lower[i] >= out_lo[i] and proof.upper[i] <= out_hi[i] else "NOT proven inside"
        report.append(f"  {o}: proven bounds [{proof.lower[i]:.6g}, {proof.upper[i]:.6g}], {verdict} the actuator "
                      f"limits [{out_lo[i]:g}, {out_hi[i]:g}]")
    if head is not None:
        op, ibp_w, crown_w = head
        report.append(f"  widths before the output head ({op}): IBP {ibp_w:.6g}, CROWN {crown_w:.6g} "
                      f"(CROWN {100 * (1 - crown_w / ibp_w):.0f}% tighter); at the output both are "
                      f"{proof.ibp_width:.6g}, the head's range")
    else:
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


def _check_streaming(cfg: Config, result: dict, report: list[str], limits: dict) -> dict:
    """The streaming transformer: ep/bounds has no transfer function for attention over a context, so
    nothing is propagated through it. Its output head is mid + half * tanh(z), so each output lies in
    [mid - half, mid + half] for any input and any context: a sound bound, and the only one stated."""
    from .model import head_range

    try:
        rng = head_range(cfg)
    except ModelLoadError as exc:
        report.append(f"model bounds: cannot read the streaming model: {exc}")
        return {**result, "bounds_error": str(exc), "report": "\n".join(report)}
    if rng is None:
        report.append("model: streaming transformer whose graph has no tanh output head. Its outputs are NOT "
                      "bounded: ep/bounds cannot analyse attention, and sitsd refuses to start this model.\n"
                      "  fix: export it with `python -m sitsd.model export-streaming --config CONFIG`")
        return {**result, "report": "\n".join(report)}
    lo, hi = rng
    inside = [bool(lo[i] >= limits[o][0] and hi[i] <= limits[o][1]) for i, o in enumerate(cfg.model.outputs)]
    result.update({"bounds_proven": all(inside), "method": "output head range (tanh), attention not analysed",
                   "output_bounds": {o: [float(lo[i]), float(hi[i])] for i, o in enumerate(cfg.model.outputs)},
                   "width_at": "output", "output_width": float(np.sum(hi - lo))})
    report.append("model: streaming transformer (model.kind streaming). Its attention layers are NOT analysed: "
                  "ep/bounds cannot propagate bounds through attention over a context. The bound below comes "
                  "from the tanh output head alone and holds for any input and any context:")
    for i, o in enumerate(cfg.model.outputs):
        verdict = "inside" if inside[i] else "NOT inside"
        report.append(f"  {o}: head range [{lo[i]:.6g}, {hi[i]:.6g}], {verdict} the actuator limits "
                      f"[{limits[o][0]:g}, {limits[o][1]:g}]")
    report.append("  no certificate: a certificate replays input splits through the network, which needs the "
                  "bounds analysis this model does not have")
    return {**result, "report": "\n".join(report)}


_SATURATING = ("Clip", "Tanh", "Sigmoid")


def _pre_head_widths(model_bytes: bytes, lower, upper) -> tuple[str, float, float] | None:
    """If the model ends in a saturating head (Clip, Tanh or Sigmoid, then only constant scaling),
    the IBP and CROWN widths of the network just before it: (head op, ibp width, crown width).
    At the output both methods meet the head's range, so that is where their tightness shows."""
    import onnx

    from ep.bounds import crown_bounds, ibp_bounds

    model = onnx.load_from_string(model_bytes)
    nodes = list(model.graph.node)
    consts = {i.name for i in model.graph.initializer} | {o for n in nodes if n.op_type == "Constant" for o in n.output}
    heads = [k for k, n in enumerate(nodes) if n.op_type in _SATURATING]
    if not heads:
        return None
    k = heads[-1]
    for n in nodes[k + 1:]:  # after the head: only Mul/Add/Sub/Div by constants (or Constant nodes)
        if n.op_type == "Constant":
            continue
        if n.op_type not in ("Mul", "Add", "Sub", "Div") or not any(i in consts for i in n.input):
            return None
    head = nodes[k]
    for n in nodes[k + 1:]:
        for i, name in enumerate(n.input):
            if name == head.output[0]:
                n.input[i] = head.input[0]
    for out in model.graph.output:
        if out.name == head.output[0]:
            out.name = head.input[0]
    model.graph.node.remove(head)
    data = model.SerializeToString()
    try:
        ibp_lo, ibp_hi = ibp_bounds(data, lower, upper)
        crown_lo, crown_hi = crown_bounds(data, lower, upper)
    except BoundsError:
        return None
    return head.op_type, float(np.sum(ibp_hi - ibp_lo)), float(np.sum(crown_hi - crown_lo))


def certify_model(cfg: Config, result: dict, max_splits: int = 256):
    """A bounds certificate for the config's model over the admissible box `run_check` found (the
    deployed graph: for a compiled artifact, its dequantized weights), carrying the hash of the
    config's constraint set (`constraints_sha256`)."""
    from ep.bounds import certify

    lower = [result["bounding_box"][n][0] for n in cfg.model.inputs]
    upper = [result["bounding_box"][n][1] for n in cfg.model.inputs]
    limits = [result["actuator_limits"][o] for o in cfg.model.outputs]
    model_bytes = resolve_model(cfg.model.artifact)[0]
    return certify(model_bytes, lower, upper, [lo for lo, _ in limits], [hi for _, hi in limits],
                   max_splits=max_splits, constraints_sha256=constraints_sha256(cfg.signals, cfg.constraints))


def swap_bounds_check(cfg: Config, candidate, expected_sha256: str | None = None) -> tuple[bool, str]:
    """Before a model is swapped in: re-check the certificate its manifest carries, if it covers the
    running config's admissible box and actuator limits (fast: replays the recorded splits); else
    prove the bounds from scratch as `sitsctl check` does. Returns (proven, report).
    A certificate made for another constraint set than the running config's (its constraints_sha256
    differs), or one without that hash (it predates it), is refused: run `sitsctl check` again.
    `expected_sha256` (the hash of what the daemon loaded): the candidate is read once, checked against
    it, and those very bytes are proven, so a file replaced after the daemon loaded it is refused rather
    than proven in its new form."""
    from pathlib import Path

    from ep.artifact import read_certificate
    from ep.bounds import CertificateError
    from ep.bounds.certificate import Certificate, check_constraints_hash, verify_certificate

    candidate = Path(candidate)
    trial = cfg.model_copy(update={"model": cfg.model.model_copy(update={"artifact": candidate})})
    model_bytes = None
    if expected_sha256 is not None and cfg.model.kind == "mlp":
        try:
            model_bytes, digest, _ = resolve_model(candidate)
        except ModelLoadError as exc:
            return False, f"model {candidate}: {exc}"
        if digest.hex() != expected_sha256.lower():
            return False, (f"model {candidate}: SHA-256 {digest.hex()} is not the {expected_sha256.lower()} the "
                           "daemon loaded (the file changed in between); refused, run the update again")
    cert_data = None
    if candidate.is_dir():
        try:
            cert_data = read_certificate(candidate)
        except ModelLoadError as exc:
            return False, f"model {candidate}: {exc}"
    if cert_data is not None:
        try:
            cert = Certificate.from_json(json.dumps(cert_data))
        except CertificateError as exc:
            return False, f"model {candidate}: certificate in the manifest does not hold: {exc}"
        running = constraints_sha256(cfg.signals, cfg.constraints)
        try:
            check_constraints_hash(cert, running)
        except CertificateError as exc:
            return False, f"model {candidate}: certificate in its manifest refused: {exc}"
        rep = check_constraints(cfg.signals, cfg.constraints)
        if not rep.satisfiable:
            return False, "the running config's constraints are not satisfiable"
        lower = np.array([rep.bounding_box[n][0] for n in cfg.model.inputs])
        upper = np.array([rep.bounding_box[n][1] for n in cfg.model.inputs])
        by_output = {a.output: a for a in cfg.safety.actuators}
        lim_lo = np.array([by_output[o].min for o in cfg.model.outputs])
        lim_hi = np.array([by_output[o].max for o in cfg.model.outputs])
        try:
            covers = (np.all(np.array(cert.input_lower) <= lower) and np.all(np.array(cert.input_upper) >= upper)
                      and np.all(np.array(cert.output_lower) >= lim_lo) and np.all(np.array(cert.output_upper) <= lim_hi))
            if covers:
                v = verify_certificate(model_bytes or resolve_model(candidate)[0], cert, constraints_sha256=running)
                return True, (f"model {candidate.name}: certificate in its manifest re-checked (constraints SHA-256 "
                              f"{running[:16]}.. as running, {v.leaves} boxes, {v.seconds * 1e3:.0f} ms): outputs in "
                              f"[{', '.join(f'{x:.6g}' for x in v.lower)}] .. "
                              f"[{', '.join(f'{x:.6g}' for x in v.upper)}], inside the actuator limits")
            note = "its certificate does not cover the running config's input box or limits; proving anew"
        except (CertificateError, ModelLoadError) as exc:
            return False, f"model {candidate}: certificate in the manifest does not hold: {exc}"
    else:
        note = "no certificate in its manifest; proving anew"
    result = run_check(trial, model_bytes=model_bytes)
    return bool(result["bounds_proven"]), f"{note}\n{result['report']}"
