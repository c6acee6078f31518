"""Bounds certificates: what was proven for which model file, input box and constraint set, serialisable,
and re-checkable quickly (replay the recorded splits, bound the leaves once) before a hot swap.

`constraints_sha256` ties a certificate to the constraints whose admissible region gave the box: the
SHA-256 of their canonical serialisation, computed in one place, `sitsd.check.constraints_sha256`
(this layer treats it as an opaque hex string). A certificate written before the field existed has it
empty; it still loads, but `check_constraints_hash` refuses it."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .branch import bound_boxes, prove
from .empirical import Runtime, check_bounds
from .errors import BoundsError, CertificateError
from .graph import load_graph
from .ir import Graph

FORMAT = "sits2026.ep.bounds/1"
_CLAIM_PAD = 1e-6  # unconstrained sides are certified a hair wider than computed, to survive a rerun


def box_sha256(lower, upper) -> str:
    data = np.concatenate([np.asarray(lower, "<f8").ravel(), np.asarray(upper, "<f8").ravel()])
    return hashlib.sha256(data.tobytes()).hexdigest()


@dataclass
class Certificate:
    model_sha256: str
    input_lower: list[float]    # the analysed box (float32 enclosure of the requested one)
    input_upper: list[float]
    output_lower: list[float]   # certified: lower <= model(x) <= upper for all x in the box
    output_upper: list[float]
    method: str                 # "ibp", "crown" or "crown+split"
    splits: int
    ibp_width: float
    crown_width: float
    width: float                # total width of the bounds found (<= certified width)
    split_log: list = field(default_factory=list)  # [path, dim, at]: replays the partition
    box_sha256: str = ""
    # SHA-256 of the canonical constraint set the box came from ("" in certificates that predate it)
    constraints_sha256: str = ""
    format: str = FORMAT

    def __post_init__(self) -> None:
        if not self.box_sha256:
            self.box_sha256 = box_sha256(self.input_lower, self.input_upper)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "Certificate":
        try:
            data = json.loads(text)
            cert = cls(**data)
        except (TypeError, ValueError) as exc:
            raise CertificateError(f"not a bounds certificate: {exc}") from exc
        if cert.format != FORMAT:
            raise CertificateError(f"certificate format {cert.format!r}, expected {FORMAT!r}")
        n, m = len(cert.input_lower), len(cert.output_lower)
        if len(cert.input_upper) != n or len(cert.output_upper) != m or n == 0 or m == 0:
            raise CertificateError("certificate box or bounds have inconsistent lengths")
        if cert.box_sha256 != box_sha256(cert.input_lower, cert.input_upper):
            raise CertificateError("certificate box does not match its hash (edited?)")
        if cert.constraints_sha256 and not _is_sha256(cert.constraints_sha256):
            raise CertificateError(f"certificate constraints_sha256 {cert.constraints_sha256!r} is not a SHA-256 "
                                   "(64 lowercase hex digits)")
        return cert


def _is_sha256(text) -> bool:
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def check_constraints_hash(cert: Certificate, expected: str) -> None:
    """Raises CertificateError unless `cert` was made for the constraint set whose hash is `expected`
    (`sitsd.check.constraints_sha256` of the running config). A certificate without the hash (written
    before certificates carried it) is refused too: nothing says which constraints its box came from."""
    if not cert.constraints_sha256:
        raise CertificateError("certificate predates constraint hashing (it has no constraints_sha256), so "
                               "nothing ties it to the running constraints: refused; re-run `sitsctl check "
                               "--config CONFIG` to certify the model for them")
    if cert.constraints_sha256 != expected.lower():
        raise CertificateError(f"certificate was made for other constraints: its constraints SHA-256 is "
                               f"{cert.constraints_sha256}, the running config's is {expected.lower()}: refused; "
                               "run `sitsctl check --config CONFIG` again to certify the model for these constraints")


def _model_bytes(model: str | Path | bytes) -> bytes:
    return bytes(model) if isinstance(model, (bytes, bytearray)) else Path(model).read_bytes()


def certify(model_path: str | Path | bytes, lower, upper, out_lower=None, out_upper=None, max_splits: int = 256,
            samples: int = 2048, constraints_sha256: str = "") -> Certificate:
    """Proves the limits (or, where a limit is None, finds bounds) and returns a certificate;
    raises BoundsError with the counterexample or the open sub-box when it cannot. `model_path` may
    be the serialized model itself (a compiled artifact's deployed graph). `constraints_sha256`: the
    hash of the constraint set the box was derived from (`sitsd.check.constraints_sha256`), recorded."""
    if constraints_sha256 and not _is_sha256(constraints_sha256):
        raise ValueError(f"constraints_sha256 {constraints_sha256!r} is not a lowercase hex SHA-256")
    data = _model_bytes(model_path)
    res = prove(data, lower, upper, out_lower, out_upper, max_splits=max_splits, samples=samples)
    if not res.proven:
        raise BoundsError(f"cannot certify: {describe_failure(res)}")
    pad_lo = _CLAIM_PAD * (1.0 + np.abs(res.lower))
    pad_hi = _CLAIM_PAD * (1.0 + np.abs(res.upper))
    claim_lo = np.where(np.isfinite(res.limits_lower), res.limits_lower, res.lower - pad_lo)
    claim_hi = np.where(np.isfinite(res.limits_upper), res.limits_upper, res.upper + pad_hi)
    return Certificate(hashlib.sha256(data).hexdigest(), res.box_lower.tolist(), res.box_upper.tolist(),
                       claim_lo.tolist(), claim_hi.tolist(), res.method, res.splits, res.ibp_width,
                       res.crown_width, res.width, res.split_log, constraints_sha256=constraints_sha256)


def describe_failure(res) -> str:
    if res.counterexample is not None:
        w = res.counterexample
        limit = res.limits_lower[w.index] if w.side == "lower" else res.limits_upper[w.index]
        return (f"counterexample: output {w.index} = {w.output[w.index]:.6g} at x={w.input.tolist()} "
                f"(limit {limit:.6g})")
    r = res.open_region
    return (f"after {res.splits} splits output {r.index}'s {r.side} bound {r.bound:.6g} is still past "
            f"{r.limit:.6g} on the box {r.lower.tolist()} .. {r.upper.tolist()}")


@dataclass
class Verification:
    lower: np.ndarray  # bounds recomputed over the recorded partition
    upper: np.ndarray
    leaves: int
    seconds: float


def verify_certificate(model_path: str | Path | bytes, cert: Certificate, samples: int = 256,
                       constraints_sha256: str | None = None) -> Verification:
    """Raises CertificateError unless the file (or serialized model) is the certified model and its
    bounds still hold; given `constraints_sha256`, also unless the certificate was made for that
    constraint set (check_constraints_hash)."""
    t0 = time.perf_counter()
    if constraints_sha256 is not None:
        check_constraints_hash(cert, constraints_sha256)
    data = _model_bytes(model_path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != cert.model_sha256:
        where = "the model" if isinstance(model_path, (bytes, bytearray)) else f"model {model_path}"
        raise CertificateError(f"{where}: SHA-256 {digest} is not the certified {cert.model_sha256}")
    if cert.box_sha256 != box_sha256(cert.input_lower, cert.input_upper):
        raise CertificateError("certificate box does not match its hash (edited?)")
    graph = load_graph(data)
    box_lo, box_hi = np.array(cert.input_lower), np.array(cert.input_upper)
    claim_lo, claim_hi = np.array(cert.output_lower), np.array(cert.output_upper)
    if box_lo.size != graph.n_inputs or claim_lo.size != graph.n_outputs:
        raise CertificateError(f"certificate is for {box_lo.size} inputs / {claim_lo.size} outputs, the model "
                               f"has {graph.n_inputs} / {graph.n_outputs}")
    lo, hi = _leaf_bounds(graph, box_lo, box_hi, cert.split_log)
    bad = (lo < claim_lo) | (hi > claim_hi)
    if np.any(bad):
        i, k = np.argwhere(bad)[0]
        raise CertificateError(f"bounds no longer hold: output {k} is bounded by [{lo[i, k]:.6g}, {hi[i, k]:.6g}] "
                               f"on a sub-box, the certificate claims [{claim_lo[k]:.6g}, {claim_hi[k]:.6g}]")
    out_lo, out_hi = lo.min(0), hi.max(0)
    if samples:
        check_bounds(Runtime(data, graph), box_lo, box_hi, out_lo, out_hi, samples, np.random.default_rng(1))
    return Verification(out_lo, out_hi, len(lo), time.perf_counter() - t0)


def _leaf_bounds(graph: Graph, box_lo: np.ndarray, box_hi: np.ndarray, split_log: list):
    """Replays the splits (each must halve an existing leaf strictly inside it, so the leaves
    always partition the box), bounds every box once, and intersects each with its ancestors'."""
    boxes, leaves, order = {"": (box_lo, box_hi)}, {""}, [""]
    for entry in split_log:
        try:
            path, d, at = str(entry[0]), int(entry[1]), float(entry[2])
        except (TypeError, ValueError, IndexError) as exc:
            raise CertificateError(f"malformed split {entry!r}") from exc
        if path not in leaves or not 0 <= d < box_lo.size:
            raise CertificateError(f"split {entry!r} does not refine a current leaf")
        lo, hi = boxes[path]
        if not lo[d] < at < hi[d]:
            raise CertificateError(f"split {entry!r} is not strictly inside its box")
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[d], right_lo[d] = at, at
        boxes[path + "0"], boxes[path + "1"] = (lo, left_hi), (right_lo, hi)
        leaves.remove(path)
        leaves.update((path + "0", path + "1"))
        order += [path + "0", path + "1"]
    out_lo, out_hi, _, _ = bound_boxes(graph, np.stack([boxes[p][0] for p in order]),
                                       np.stack([boxes[p][1] for p in order]))
    eff = {}
    for j, p in enumerate(order):  # parents come before children in `order`
        lo, hi = out_lo[j], out_hi[j]
        if p:
            lo, hi = np.maximum(lo, eff[p[:-1]][0]), np.minimum(hi, eff[p[:-1]][1])
        eff[p] = (lo, hi)
    final = [p for p in order if p in leaves]
    return np.stack([eff[p][0] for p in final]), np.stack([eff[p][1] for p in final])
