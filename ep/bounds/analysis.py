"""One-shot bounds over one input box: IBP and CROWN output bounds and their total widths."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .errors import BoundsError
from .graph import ModelLike, load_graph
from .ir import Graph
from .propagate import crown, ibp
from .rounding import float32_enclosure


class Widths:
    """Total widths of the IBP and CROWN output bounds (the sum over outputs): how tight each is."""

    ibp_lower: np.ndarray
    ibp_upper: np.ndarray
    crown_lower: np.ndarray
    crown_upper: np.ndarray

    @property
    def ibp_width(self) -> float:
        return float(np.sum(self.ibp_upper - self.ibp_lower))

    @property
    def crown_width(self) -> float:
        return float(np.sum(self.crown_upper - self.crown_lower))


@dataclass
class Analysis(Widths):
    ibp_lower: np.ndarray
    ibp_upper: np.ndarray
    crown_lower: np.ndarray
    crown_upper: np.ndarray
    seconds: float


def prepare_box(graph: Graph, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    """Validates the box and widens it to the float32 values the runtime can actually see."""
    lo = np.asarray(lower, dtype=np.float64).reshape(-1)
    hi = np.asarray(upper, dtype=np.float64).reshape(-1)
    if lo.shape != (graph.n_inputs,) or hi.shape != (graph.n_inputs,):
        raise BoundsError(f"input box has {lo.size} lower and {hi.size} upper values, the model input "
                          f"{graph.input_name!r} has {graph.n_inputs}")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise BoundsError("input box must be finite")
    if np.any(lo > hi):
        raise BoundsError(f"input box is empty in dimension(s) {np.flatnonzero(lo > hi).tolist()} (lower > upper)")
    return float32_enclosure(lo, hi)


def ibp_bounds(model: ModelLike | Graph, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    graph = load_graph(model)
    lo, hi = prepare_box(graph, lower, upper)
    out_lo, out_hi = ibp(graph, lo[None], hi[None])[-1]
    return out_lo[0], out_hi[0]


def crown_bounds(model: ModelLike | Graph, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    graph = load_graph(model)
    lo, hi = prepare_box(graph, lower, upper)
    out_lo, out_hi = crown(graph, lo[None], hi[None])[0][-1]
    return out_lo[0], out_hi[0]


def analyze(model: ModelLike | Graph, lower, upper) -> Analysis:
    """IBP and CROWN bounds on every output over the box [lower, upper]."""
    t0 = time.perf_counter()
    graph = load_graph(model)
    lo, hi = prepare_box(graph, lower, upper)
    i_lo, i_hi = ibp(graph, lo[None], hi[None])[-1]
    c_lo, c_hi = crown(graph, lo[None], hi[None])[0][-1]
    return Analysis(i_lo[0], i_hi[0], c_lo[0], c_hi[0], time.perf_counter() - t0)
