"""Reads the provable part of an ONNX model into a chain of dense layers and activations.

The ONNX graph must be a single chain: elementwise Sub/Add/Mul/Div by constants, Gemm or MatMul
(+Add bias), Relu and Clip with constant bounds, and Identity/Flatten/Reshape-to-same-rows. Every
affine piece between two activations is folded (in float64) into one dense layer, so the demo's
input normalisation (Sub, Div) disappears into the first layer and its `* limit` output scale
becomes the last one. Anything else (tanh, softmax, attention...) is refused with the node named.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ZkError


@dataclass(frozen=True, slots=True)
class Dense:
    weight: np.ndarray  # (out, in) float64
    bias: np.ndarray  # (out,)


@dataclass(frozen=True, slots=True)
class Relu:
    pass


@dataclass(frozen=True, slots=True)
class Clip:
    lo: float
    hi: float


Stage = Dense | Relu | Clip


@dataclass(frozen=True, slots=True)
class ModelChain:
    stages: tuple[Stage, ...]  # Dense, activation, Dense, ..., Dense (always ends with Dense)
    n_inputs: int
    n_outputs: int
    sha256: str
    source: str

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The folded network in float64: the reference the quantized circuit is compared with."""
        a = np.asarray(x, dtype=np.float64)
        for st in self.stages:
            if isinstance(st, Dense):
                a = st.weight @ a + st.bias
            elif isinstance(st, Relu):
                a = np.maximum(a, 0.0)
            else:
                a = np.clip(a, st.lo, st.hi)
        return a


def load_onnx(path: Path) -> ModelChain:
    """The chain of a plain .onnx file, bound to the SHA-256 of its bytes."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ZkError(f"cannot read the ONNX model ({e})", str(path)) from None
    return parse_onnx(raw, hashlib.sha256(raw).hexdigest(), Path(path))


def parse_onnx(raw: bytes, sha256: str, path: Path) -> ModelChain:
    """The chain of ONNX bytes; `sha256` is what the circuit binds (the daemon's model hash, which for
    an artifact directory is the artifact's SHA-256, not the hash of these bytes)."""
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load_from_string(raw)
    except Exception as e:  # onnx raises DecodeError and friends; one typed error for the caller
        raise ZkError(f"cannot read the ONNX model ({e})", str(path)) from None
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in g.initializer}
    inputs = [i for i in g.input if i.name not in consts]
    if len(inputs) != 1 or len(g.output) != 1:
        raise ZkError("the provable model must have one input and one output tensor", str(path))
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != 2 or not dims[1].dim_value:
        raise ZkError("the input must be [batch, n] with a fixed n", str(path))
    n_in = int(dims[1].dim_value)
    cur = inputs[0].name
    m, v = np.eye(n_in), np.zeros(n_in)  # pending affine map: value = m @ x + v
    stages: list[Stage] = []

    def const(name: str, node: str) -> np.ndarray:
        if name not in consts:
            raise ZkError(f"operand {name!r} must be a constant (initializer or Constant node)", node)
        return consts[name]

    for node in g.node:
        where = f"{path.name}: node {node.name or node.op_type} ({node.op_type})"
        op = node.op_type
        if op == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    consts[node.output[0]] = numpy_helper.to_array(a.t).astype(np.float64)
            continue
        ins = list(node.input)
        if ins and ins[0] != cur:
            if len(ins) > 1 and ins[1] == cur and op in ("Add", "Mul"):
                ins = [ins[1], ins[0]] + ins[2:]
            else:
                raise ZkError("the provable model must be a single chain of operations", where)
        if op in ("Sub", "Add", "Mul", "Div"):
            c = np.broadcast_to(const(ins[1], where).reshape(-1), (m.shape[0],)).copy()
            if op == "Sub":
                v = v - c
            elif op == "Add":
                v = v + c
            elif op == "Mul":
                m, v = m * c[:, None], v * c
            else:
                m, v = m / c[:, None], v / c
        elif op == "Gemm":
            at = {a.name: a for a in node.attribute}
            w = const(ins[1], where)
            if at.get("transA") is not None and at["transA"].i:
                raise ZkError("Gemm with transA is not supported", where)
            w = w if (at.get("transB") is not None and at["transB"].i) else w.T
            alpha = at["alpha"].f if "alpha" in at else 1.0
            beta = at["beta"].f if "beta" in at else 1.0
            b = np.broadcast_to(const(ins[2], where).reshape(-1), (w.shape[0],)) if len(ins) > 2 and ins[2] else 0.0
            m, v = alpha * w @ m, alpha * w @ v + beta * b
        elif op == "MatMul":
            w = const(ins[1], where)
            m, v = w.T @ m, w.T @ v
        elif op in ("Relu", "Clip"):
            stages.append(Dense(m, v))
            if op == "Relu":
                stages.append(Relu())
            else:
                lo = float(const(ins[1], where)) if len(ins) > 1 and ins[1] else -np.inf
                hi = float(const(ins[2], where)) if len(ins) > 2 and ins[2] else np.inf
                if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                    raise ZkError("Clip needs finite constant bounds min < max", where)
                stages.append(Clip(lo, hi))
            m, v = np.eye(m.shape[0]), np.zeros(m.shape[0])
        elif op in ("Identity", "Flatten"):
            pass
        else:
            raise ZkError(f"operator {op} has no circuit; the provable part supports Sub/Add/Mul/Div by "
                          "constants, Gemm, MatMul, Relu and Clip", where)
        cur = node.output[0]
    if cur != g.output[0].name:
        raise ZkError("the chain does not end at the model output", str(path))
    stages.append(Dense(m, v))
    return ModelChain(tuple(stages), n_in, m.shape[0], sha256, str(path))
