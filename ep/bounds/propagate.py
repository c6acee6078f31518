"""Bound propagation over a batch of input boxes: exact float64 evaluation, IBP (forward
intervals) and CROWN (backward linear bounds, Zhang et al. 2018) with intermediate bounds from
the tighter of IBP and CROWN. Arrays carry a leading axis B over boxes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .activations import Relaxation
from .errors import BoundsError
from .ir import Affine, Graph
from .rounding import margin


@dataclass
class LinearBounds:
    """lower_coef @ x + lower_const <= output <= upper_coef @ x + upper_const for x in each box,
    and the concretized (sound) output bounds."""
    lower_coef: np.ndarray   # (B, m, n)
    lower_const: np.ndarray  # (B, m)
    upper_coef: np.ndarray
    upper_const: np.ndarray
    lower: np.ndarray        # (B, m)
    upper: np.ndarray


def evaluate_all(graph: Graph, x: np.ndarray) -> list[np.ndarray]:
    """Every value of the graph in float64 on rows of x (N, n)."""
    values = [np.asarray(x, np.float64)]
    for node in graph.nodes:
        if isinstance(node, Affine):
            values.append(sum(values[v] @ m.T for v, m in zip(node.inputs, node.mats)) + node.bias)
        else:
            values.append(node.act(values[node.input]))
    return values


def evaluate(graph: Graph, x: np.ndarray) -> np.ndarray:
    """The model in float64 on rows of x (N, n) -> (N, m): the reference the bounds must contain."""
    return evaluate_all(graph, x)[-1]


def _ibp_node(node, bounds: list) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(node, Affine):
        return node.act.interval(*bounds[node.input])
    center, radius, mag = node.bias, 0.0, np.abs(node.bias)
    for v, m in zip(node.inputs, node.mats):
        lo, hi = bounds[v]
        c, r = 0.5 * (lo + hi), 0.5 * (hi - lo)
        am = np.abs(m).T
        center = center + c @ m.T
        radius = radius + r @ am
        mag = mag + (np.abs(c) + r) @ am
    pad = margin(mag)
    return center - radius - pad, center + radius + pad


def ibp(graph: Graph, lower: np.ndarray, upper: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Interval bounds of every value (index 0 is the input box)."""
    bounds = [(lower, upper)]
    for node in graph.nodes:
        bounds.append(_checked(_ibp_node(node, bounds), node))
    return bounds


def crown(graph: Graph, lower: np.ndarray, upper: np.ndarray) -> tuple[list, LinearBounds]:
    """CROWN bounds: every value's interval (intersection of IBP and, where a relaxation or the
    output needs it, backward linear bounds) and the linear bounds of the output."""
    plain = ibp(graph, lower, upper)  # intersected in too, so CROWN is never wider than plain IBP
    bounds = [(lower, upper)]
    relax: dict[int, Relaxation] = {}
    wanted = graph.needs_bounds()
    out = None
    for v, node in enumerate(graph.nodes, start=1):
        lo, hi = _ibp_node(node, bounds)
        lo, hi = np.maximum(lo, plain[v][0]), np.minimum(hi, plain[v][1])
        if not isinstance(node, Affine):
            relax[v] = node.act.relax(*bounds[node.input])
        # An affine map of the input alone is bounded exactly by IBP; CROWN adds nothing there.
        direct = isinstance(node, Affine) and node.inputs == [0]
        if v == graph.output or (v in wanted and not direct):
            lin = backward(graph, v, relax, lower, upper)
            lo, hi = np.maximum(lo, lin.lower), np.minimum(hi, lin.upper)
            out = lin
        bounds.append(_checked((lo, hi), node))
    return bounds, out


def backward(graph: Graph, target: int, relax: dict[int, Relaxation], lower: np.ndarray,
             upper: np.ndarray) -> LinearBounds:
    """Linear bounds of value `target` in terms of the input, substituting each node's definition
    (affine: exactly; nonlinear: its relaxation, upper or lower by the sign of the coefficient)."""
    batch, m = lower.shape[0], graph.sizes[target]
    eye = np.broadcast_to(np.eye(m), (batch, m, m))
    lam, om = {target: eye}, {target: eye}  # coefficients of the lower / upper bound on each value
    c_lo, c_hi, mag = np.zeros((batch, m)), np.zeros((batch, m)), np.zeros((batch, m))
    for v in range(target, 0, -1):
        if v not in lam:
            continue
        L, U = lam.pop(v), om.pop(v)
        node = graph.node(v)
        if isinstance(node, Affine):
            c_lo = c_lo + L @ node.bias
            c_hi = c_hi + U @ node.bias
            mag = mag + (np.abs(L) + np.abs(U)) @ np.abs(node.bias)
            for u, w in zip(node.inputs, node.mats):
                _add(lam, u, L @ w)
                _add(om, u, U @ w)
            continue
        r = relax[v]
        Lp, Ln, Up, Un = np.maximum(L, 0), np.minimum(L, 0), np.maximum(U, 0), np.minimum(U, 0)
        c_lo = c_lo + _dot(Lp, r.lower_offset) + _dot(Ln, r.upper_offset)
        c_hi = c_hi + _dot(Up, r.upper_offset) + _dot(Un, r.lower_offset)
        off = np.maximum(np.abs(r.lower_offset), np.abs(r.upper_offset))
        mag = mag + _dot(np.abs(L) + np.abs(U), off)
        _add(lam, node.input, Lp * r.lower_slope[:, None, :] + Ln * r.upper_slope[:, None, :])
        _add(om, node.input, Up * r.upper_slope[:, None, :] + Un * r.lower_slope[:, None, :])
    n = graph.n_inputs
    A_lo = lam.get(0, np.zeros((batch, m, n)))
    A_hi = om.get(0, np.zeros((batch, m, n)))
    center, radius = 0.5 * (lower + upper), 0.5 * (upper - lower)
    size = np.abs(center) + radius
    lo = _dot(A_lo, center) - _dot(np.abs(A_lo), radius) + c_lo
    hi = _dot(A_hi, center) + _dot(np.abs(A_hi), radius) + c_hi
    lo = lo - margin(_dot(np.abs(A_lo), size) + mag)
    hi = hi + margin(_dot(np.abs(A_hi), size) + mag)
    return LinearBounds(A_lo, c_lo, A_hi, c_hi, lo, hi)


def _dot(coef: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """(B, m, s) x (B, s) -> (B, m)."""
    return (coef @ vec[:, :, None])[:, :, 0]


def _add(acc: dict, v: int, coef: np.ndarray) -> None:
    acc[v] = acc[v] + coef if v in acc else coef


def _checked(bounds, node):
    lo, hi = bounds
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise BoundsError(f"bounds overflowed at {node.source}; the input box is too wide for float64")
    if np.any(lo > hi):
        raise BoundsError(f"internal: empty interval at {node.source} (IBP and CROWN disagree)")
    return lo, hi


def error_scale(graph: Graph, bounds: list) -> np.ndarray:
    """Per output, the size of the absolute terms a float32 evaluation rounds on its way there
    (|W| times incoming scales through affine nodes; activations pass scale on times their
    steepest slope and add their own output size). Used to size tolerances against onnxruntime."""
    lo, hi = bounds[0]
    scales = [np.maximum(np.abs(lo), np.abs(hi))]
    for v, node in enumerate(graph.nodes, start=1):
        if isinstance(node, Affine):
            scales.append(sum(scales[u] @ np.abs(m).T for u, m in zip(node.inputs, node.mats)) + np.abs(node.bias))
        else:
            out_lo, out_hi = bounds[v]
            steep = node.act.max_slope(*bounds[node.input])
            scales.append(steep * scales[node.input] + np.maximum(np.abs(out_lo), np.abs(out_hi)))
    return scales[-1]
