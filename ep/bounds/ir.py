"""The analysis graph: a topologically ordered list of affine and activation nodes over flat
per-sample vectors (the batch axis is dropped). Value 0 is the model input; node i makes value i+1."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .activations import Activation


@dataclass
class Affine:
    """value = sum_j mats[j] @ value[inputs[j]] + bias  (Gemm, MatMul, Add/Sub/Mul/Div, Concat...)."""
    inputs: list[int]
    mats: list[np.ndarray]  # each (size_out, size_in_j), float64
    bias: np.ndarray        # (size_out,)
    source: str             # the ONNX node(s) it came from, for messages

    @property
    def size(self) -> int:
        return self.bias.shape[0]


@dataclass
class Nonlinear:
    """value = act(value[input]) elementwise."""
    input: int
    act: Activation
    size: int
    source: str

    @property
    def inputs(self) -> list[int]:
        return [self.input]


Node = Affine | Nonlinear


@dataclass
class Graph:
    n_inputs: int
    n_outputs: int
    nodes: list[Node]
    input_name: str
    output_name: str
    fixed_batch: bool = False  # the model declares batch = 1, so the runtime takes one row per run
    sizes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sizes = [self.n_inputs] + [node.size for node in self.nodes]

    @property
    def output(self) -> int:
        return len(self.nodes)

    def node(self, value: int) -> Node:
        return self.nodes[value - 1]

    def needs_bounds(self) -> set[int]:
        """Values whose bounds feed a relaxation (activation inputs); the output is added by callers."""
        return {node.input for node in self.nodes if isinstance(node, Nonlinear)}


@dataclass(frozen=True)
class Var:
    """An input-dependent tensor during parsing: a graph value seen with a per-sample shape."""
    value: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class Builder:
    """Collects nodes while the ONNX graph is walked."""

    def __init__(self, n_inputs: int) -> None:
        self.nodes: list[Node] = []
        self.n_inputs = n_inputs

    def affine(self, terms: list[tuple[Var, np.ndarray]], bias: np.ndarray, shape: tuple[int, ...],
               source: str) -> Var:
        bias = np.asarray(bias, dtype=np.float64).reshape(-1)
        self.nodes.append(Affine([v.value for v, _ in terms], [np.asarray(m, np.float64) for _, m in terms],
                                 bias, source))
        return Var(len(self.nodes), shape)

    def nonlinear(self, x: Var, act: Activation, source: str) -> Var:
        self.nodes.append(Nonlinear(x.value, act, x.size, source))
        return Var(len(self.nodes), x.shape)
