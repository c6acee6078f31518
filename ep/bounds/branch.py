"""Proving output limits over an input box: CROWN on the whole box, then breadth-first bisection
of the boxes it cannot settle (along the input with the largest |linear coefficient| x width),
hunting for a concrete counterexample at each open box's worst-looking corners as it goes."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .analysis import Widths, prepare_box
from .empirical import EmpiricalCheck, Runtime, check_bounds
from .errors import BoundsError
from .graph import ModelLike, load_graph
from .ir import Graph
from .propagate import crown, ibp
from .rounding import float32_inside

_CHUNK = 256            # boxes bounded per CROWN call (memory ~ chunk x width^2 floats)
_MAX_CANDIDATES = 4096  # counterexample candidates evaluated per round


@dataclass
class Witness:
    """A concrete input and the runtime's output there; violation > 0 means the limit is broken."""
    input: np.ndarray
    output: np.ndarray
    index: int
    side: str        # "lower" or "upper": which limit of output `index` is nearest to breaking
    violation: float


@dataclass
class OpenRegion:
    """A sub-box where the bound on output `index` could not be brought inside its limit."""
    lower: np.ndarray
    upper: np.ndarray
    index: int
    side: str
    bound: float
    limit: float


@dataclass
class Leaf:
    lower: np.ndarray
    upper: np.ndarray
    path: str
    out_lower: np.ndarray
    out_upper: np.ndarray
    coef_lower: np.ndarray  # (m, n) linear lower / upper bound coefficients from CROWN
    coef_upper: np.ndarray


@dataclass
class ProofResult(Widths):
    proven: bool
    method: str                  # "ibp", "crown" or "crown+split" (what settled it, or was tried last)
    box_lower: np.ndarray        # the analysed box (the request widened to float32 values)
    box_upper: np.ndarray
    limits_lower: np.ndarray
    limits_upper: np.ndarray
    lower: np.ndarray            # sound output bounds over the whole box: union over the leaves
    upper: np.ndarray
    ibp_lower: np.ndarray
    ibp_upper: np.ndarray
    crown_lower: np.ndarray
    crown_upper: np.ndarray
    splits: int
    leaves: int
    split_log: list = field(default_factory=list)  # [path, dim, at] in order; replays the partition
    counterexample: Witness | None = None
    closest: Witness | None = None                  # the evaluated point nearest to (or furthest past) a limit
    open_region: OpenRegion | None = None
    empirical: EmpiricalCheck | None = None
    proven_fraction: float = 0.0                    # share of the box volume whose leaves are proven
    seconds: float = 0.0

    @property
    def width(self) -> float:
        return float(np.sum(self.upper - self.lower))


def limits_for(graph: Graph, out_lower, out_upper) -> tuple[np.ndarray, np.ndarray]:
    """Output limits as arrays of m; None means unbounded, a scalar applies to every output."""
    def one(v, default):
        a = np.full(graph.n_outputs, default) if v is None else np.asarray(v, dtype=np.float64).reshape(-1)
        a = np.broadcast_to(a, (graph.n_outputs,)) if a.size == 1 else a
        if a.shape != (graph.n_outputs,) or np.any(np.isnan(a)):
            raise BoundsError(f"output limits need 1 or {graph.n_outputs} numbers, got {np.size(v)}")
        return np.array(a, dtype=np.float64)
    lo, hi = one(out_lower, -np.inf), one(out_upper, np.inf)
    if np.any(lo > hi):
        raise BoundsError("output limits are empty (lower > upper)")
    return lo, hi


def bound_boxes(graph: Graph, lowers: np.ndarray, uppers: np.ndarray):
    """CROWN on many boxes at once: output bounds (B, m) and linear coefficients (B, m, n)."""
    parts = []
    for s in range(0, len(lowers), _CHUNK):
        bounds, lin = crown(graph, lowers[s:s + _CHUNK], uppers[s:s + _CHUNK])
        parts.append((*bounds[-1], lin.lower_coef, lin.upper_coef))
    return [np.concatenate(p) for p in zip(*parts)]


def _gap(out_lower, out_upper, lim_lo, lim_hi) -> tuple[np.ndarray, np.ndarray]:
    """How far each output bound sticks out of its limit, lower side and upper side (> 0: open)."""
    return lim_lo - out_lower, out_upper - lim_hi


def _violation(leaf: Leaf, lim_lo, lim_hi) -> float:
    below, above = _gap(leaf.out_lower, leaf.out_upper, lim_lo, lim_hi)
    return float(max(below.max(), above.max()))


def _split_dim(leaf: Leaf, lim_lo, lim_hi) -> int | None:
    """The input whose width drives the open bounds most; None if no input can be halved any more."""
    below, above = _gap(leaf.out_lower, leaf.out_upper, lim_lo, lim_hi)
    influence = np.abs(leaf.coef_lower[below > 0]).sum(0) + np.abs(leaf.coef_upper[above > 0]).sum(0)
    width = leaf.upper - leaf.lower
    mid = 0.5 * (leaf.lower + leaf.upper)
    splittable = (mid > leaf.lower) & (mid < leaf.upper)
    if not splittable.any():
        return None
    score = np.where(splittable, influence * width, -1.0)
    if score.max() <= 0:
        score = np.where(splittable, width, -1.0)
    return int(np.argmax(score))


def _candidates(leaf: Leaf, lim_lo, lim_hi) -> list[np.ndarray]:
    """The box centre and, per open bound, the corner that extremises CROWN's linear bound."""
    below, above = _gap(leaf.out_lower, leaf.out_upper, lim_lo, lim_hi)
    pts = [0.5 * (leaf.lower + leaf.upper)]
    for k in np.flatnonzero(below > 0):
        pts.append(np.where(leaf.coef_lower[k] > 0, leaf.lower, leaf.upper))
    for k in np.flatnonzero(above > 0):
        pts.append(np.where(leaf.coef_upper[k] > 0, leaf.upper, leaf.lower))
    return pts


def _worst_witness(x: np.ndarray, y: np.ndarray, lim_lo, lim_hi) -> Witness:
    below, above = lim_lo - y, y - lim_hi
    i_lo, i_hi = np.unravel_index(np.argmax(below), below.shape), np.unravel_index(np.argmax(above), above.shape)
    if below[i_lo] >= above[i_hi]:
        (i, k), side, v = i_lo, "lower", below[i_lo]
    else:
        (i, k), side, v = i_hi, "upper", above[i_hi]
    return Witness(x[i].astype(np.float64), y[i], int(k), side, float(v))


def _worse(a: Witness | None, b: Witness) -> Witness:
    return b if a is None or b.violation > a.violation else a


def _make_leaves(graph: Graph, boxes: list[tuple[np.ndarray, np.ndarray, str]],
                 parents: list[Leaf | None]) -> list[Leaf]:
    lo = np.stack([b[0] for b in boxes])
    hi = np.stack([b[1] for b in boxes])
    out_lo, out_hi, c_lo, c_hi = bound_boxes(graph, lo, hi)
    leaves = []
    for j, ((l, u, path), parent) in enumerate(zip(boxes, parents)):
        ol, oh = out_lo[j], out_hi[j]
        if parent is not None:  # a child box is inside its parent, so the parent's bounds hold too
            ol, oh = np.maximum(ol, parent.out_lower), np.minimum(oh, parent.out_upper)
        leaves.append(Leaf(l, u, path, ol, oh, c_lo[j], c_hi[j]))
    return leaves


def prove(model: ModelLike, lower, upper, out_lower=None, out_upper=None, max_splits: int = 256,
          samples: int = 2048, seed: int = 0, keep_splitting: bool = False) -> ProofResult:
    """Tries to prove out_lower <= model(x) <= out_upper for every x in [lower, upper].

    Stops at the first counterexample unless keep_splitting, in which case it spends the split
    budget anyway: the bounds tighten and the open boxes close in on where the limit breaks.
    "Proven" is about exact arithmetic on the model's weights; onnxruntime's float32 results are
    held to the bounds within a rounding tolerance by the empirical check (a miss raises)."""
    t0 = time.perf_counter()
    graph = load_graph(model)
    box_lo, box_hi = prepare_box(graph, lower, upper)
    lim = limits_for(graph, out_lower, out_upper)
    runtime = Runtime(model, graph)

    i_lo, i_hi = (b[0] for b in ibp(graph, box_lo[None], box_hi[None])[-1])
    root = _make_leaves(graph, [(box_lo, box_hi, "")], [None])[0]
    if np.all(i_lo >= lim[0]) and np.all(i_hi <= lim[1]):
        method, leaves, log, closest = "ibp", [root], [], None
    else:
        leaves, log, closest = _search(graph, runtime, root, lim, box_lo, box_hi, max_splits, keep_splitting)
        method = "crown+split" if log else "crown"
    out_lo = np.min([lf.out_lower for lf in leaves], axis=0)
    out_hi = np.max([lf.out_upper for lf in leaves], axis=0)
    if method == "ibp":
        out_lo, out_hi = np.maximum(out_lo, i_lo), np.minimum(out_hi, i_hi)
    empirical, xs, ys = check_bounds(runtime, box_lo, box_hi, out_lo, out_hi, samples, np.random.default_rng(seed))
    closest = _worse(closest, _worst_witness(xs, ys, *lim))
    open_leaves = [lf for lf in leaves if _violation(lf, *lim) > 0] if method != "ibp" else []
    proven = not open_leaves
    # When proven, check_bounds has already held onnxruntime to the bounds (within float32 rounding),
    # so a runtime value just past a limit is rounding, not a counterexample to the exact-arithmetic proof.
    return ProofResult(
        proven=proven, method=method, box_lower=box_lo, box_upper=box_hi, limits_lower=lim[0],
        limits_upper=lim[1], lower=out_lo, upper=out_hi, ibp_lower=i_lo, ibp_upper=i_hi,
        crown_lower=root.out_lower, crown_upper=root.out_upper, splits=len(log), leaves=len(leaves),
        split_log=log, counterexample=closest if closest.violation > 0 and not proven else None,
        closest=closest, open_region=_open_region(open_leaves, *lim), empirical=empirical,
        proven_fraction=_proven_fraction(open_leaves, box_lo, box_hi), seconds=time.perf_counter() - t0)


def _search(graph: Graph, runtime: Runtime, root: Leaf, lim, box_lo, box_hi, max_splits: int,
            keep_splitting: bool) -> tuple[list[Leaf], list, Witness | None]:
    """Breadth-first: each round tries the open leaves' candidate points, then halves every open
    leaf (worst first) while the budget lasts. Returns the final partition, the split log and the
    evaluated point closest to (or furthest past) a limit."""
    leaves, log, closest = [root], [], None
    while True:
        open_leaves = sorted((lf for lf in leaves if _violation(lf, *lim) > 0), key=lambda lf: -_violation(lf, *lim))
        if not open_leaves:
            break
        pts = [p for lf in open_leaves for p in _candidates(lf, *lim)][:_MAX_CANDIDATES]
        x = float32_inside(np.stack(pts), box_lo, box_hi)
        closest = _worse(closest, _worst_witness(x, runtime(x), *lim))
        if (closest.violation > 0 and not keep_splitting) or len(log) >= max_splits:
            break
        chosen, boxes = [], []
        for lf in open_leaves[:max_splits - len(log)]:
            d = _split_dim(lf, *lim)
            if d is None:
                continue  # down to single float values along every input
            at = 0.5 * (lf.lower[d] + lf.upper[d])
            left_hi, right_lo = lf.upper.copy(), lf.lower.copy()
            left_hi[d], right_lo[d] = at, at
            boxes += [(lf.lower, left_hi, lf.path + "0"), (right_lo, lf.upper, lf.path + "1")]
            chosen.append(lf)
            log.append([lf.path, d, float(at)])
        if not chosen:
            break
        done = {id(lf) for lf in chosen}
        parents = [lf for lf in chosen for _ in (0, 1)]
        leaves = [lf for lf in leaves if id(lf) not in done] + _make_leaves(graph, boxes, parents)
    return leaves, log, closest


def _open_region(open_leaves: list[Leaf], lim_lo, lim_hi) -> OpenRegion | None:
    """The open leaf whose bound sticks out furthest, and which bound that is."""
    if not open_leaves:
        return None
    worst = max(open_leaves, key=lambda lf: _violation(lf, lim_lo, lim_hi))
    below, above = _gap(worst.out_lower, worst.out_upper, lim_lo, lim_hi)
    if below.max() >= above.max():
        k = int(np.argmax(below))
        return OpenRegion(worst.lower, worst.upper, k, "lower", float(worst.out_lower[k]), float(lim_lo[k]))
    k = int(np.argmax(above))
    return OpenRegion(worst.lower, worst.upper, k, "upper", float(worst.out_upper[k]), float(lim_hi[k]))


def _proven_fraction(open_leaves: list[Leaf], box_lo, box_hi) -> float:
    width = box_hi - box_lo
    flat = width <= 0  # a degenerate axis contributes a factor 1 for every leaf

    def share(lf):
        return float(np.prod(np.where(flat, 1.0, (lf.upper - lf.lower) / np.where(flat, 1.0, width))))
    return max(0.0, 1.0 - sum(share(lf) for lf in open_leaves))
