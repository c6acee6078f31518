"""The model as onnxruntime runs it, held against computed bounds: sampled and corner points of
the box must land inside them (a miss is a soundness bug, never a tolerance question)."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np
import onnxruntime as ort

from .errors import BoundsError
from .graph import ModelLike, read_model
from .ir import Graph
from .propagate import error_scale, evaluate, ibp
from .rounding import float32_inside, float32_slack

_MAX_CORNERS = 1024


class Runtime:
    """An onnxruntime CPU session for the model, fed float32 rows."""

    def __init__(self, model: ModelLike, graph: Graph) -> None:
        proto, _ = read_model(model)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.session = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.graph = graph

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        name = self.graph.input_name
        if self.graph.fixed_batch:  # the model declares batch = 1
            rows = [self.session.run(None, {name: r[None]})[0] for r in x]
            return np.concatenate(rows).astype(np.float64) if rows else np.zeros((0, self.graph.n_outputs))
        return self.session.run(None, {name: x})[0].astype(np.float64).reshape(len(x), -1)


@dataclass
class EmpiricalCheck:
    points: int
    sampled_lower: np.ndarray  # min / max of the runtime's outputs over the points
    sampled_upper: np.ndarray


def sample_points(lower: np.ndarray, upper: np.ndarray, n_random: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform points plus corners of the box (all of them if there are at most 1024), as float32."""
    n = lower.size
    if 2 ** n <= _MAX_CORNERS:
        bits = np.array(list(product((0, 1), repeat=n)), dtype=bool)
    else:
        bits = rng.random((_MAX_CORNERS, n)) < 0.5
    corners = np.where(bits, upper, lower)
    uniform = lower + rng.random((n_random, n)) * (upper - lower)
    return float32_inside(np.vstack([corners, uniform, 0.5 * (lower + upper)]), lower, upper)


def check_bounds(runtime: Runtime, lower: np.ndarray, upper: np.ndarray, out_lower: np.ndarray,
                 out_upper: np.ndarray, n_random: int, rng: np.random.Generator):
    """Raises BoundsError if onnxruntime or the float64 reference leaves [out_lower, out_upper].
    Returns the summary, the points (float32) and the runtime's outputs there."""
    graph = runtime.graph
    x = sample_points(lower, upper, n_random, rng)
    got = runtime(x)
    exact = evaluate(graph, x.astype(np.float64))
    slack = float32_slack(error_scale(graph, ibp(graph, lower[None], upper[None])))[0]
    if np.any(np.abs(got - exact) > slack):
        i = int(np.argmax(np.max(np.abs(got - exact) - slack, axis=1)))
        raise BoundsError(f"the bounds' reading of the graph differs from onnxruntime at x={x[i].tolist()}: "
                          f"{exact[i].tolist()} vs {got[i].tolist()} (tolerance {slack.tolist()})")
    for what, y, tol in (("float64 reference", exact, 0.0), ("onnxruntime", got, slack)):
        bad = (y < out_lower - tol) | (y > out_upper + tol)
        if np.any(bad):
            i, k = np.argwhere(bad)[0]
            raise BoundsError(f"soundness bug: {what} output {k} = {y[i, k]!r} at x={x[i].tolist()} lies "
                              f"outside the computed bounds [{out_lower[k]!r}, {out_upper[k]!r}]")
    return EmpiricalCheck(len(x), got.min(0), got.max(0)), x, got
