"""Loading: ONNX model (path, bytes or ModelProto) -> validated analysis `Graph`.

Walks the nodes in order, folds all-constant nodes with onnx's reference evaluator, hands the
rest to `ops.HANDLERS`, then merges chains of affine nodes (tighter IBP, fewer steps)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator

from .errors import BoundsError
from .ir import Affine, Builder, Graph, Nonlinear, Var
from .ops import HANDLERS, SUPPORTED, describe

ModelLike = str | Path | bytes | ModelProto
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def read_model(model: ModelLike) -> tuple[ModelProto, str | None]:
    """The ModelProto and the SHA-256 (hex) of the file bytes, when the model came as a file or bytes."""
    if isinstance(model, ModelProto):
        return model, None
    try:
        data = model if isinstance(model, bytes) else Path(model).read_bytes()
        return onnx.load_from_string(data), hashlib.sha256(data).hexdigest()
    except OSError as exc:
        raise BoundsError(f"model {model}: cannot read it: {exc}") from exc
    except Exception as exc:  # protobuf's DecodeError and friends
        raise BoundsError(f"model: not an ONNX file: {exc}") from exc


def load_graph(model: ModelLike | Graph) -> Graph:
    if isinstance(model, Graph):
        return model
    proto, _ = read_model(model)
    from ..lowering import REFUSAL, marked

    if marked(proto) not in (None, "fp32"):
        raise BoundsError(f"model: {REFUSAL}")
    g = proto.graph
    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    x_info, y_info = _single_io(g, consts)
    n_inputs = _io_width(x_info, "input")
    n_outputs = _io_width(y_info, "output")
    builder = Builder(n_inputs)
    env = _walk(g.node, builder, dict(consts, **{x_info.name: Var(0, (n_inputs,))}))
    out = _output_node(builder, env.get(y_info.name), y_info.name, n_inputs, n_outputs)
    nodes = _compact(_fuse_affine(builder.nodes, out.value), out.value)
    dim0 = x_info.type.tensor_type.shape.dim[0]
    return Graph(n_inputs, n_outputs, nodes, x_info.name, y_info.name,
                 fixed_batch=dim0.HasField("dim_value") and dim0.dim_value == 1)


def _walk(nodes, builder: Builder, env: dict) -> dict:
    """Every tensor name -> constant array or Var, in graph order."""
    for node in nodes:
        ins = [env.get(name) if name else None for name in node.input]
        missing = [name for name, v in zip(node.input, ins) if name and v is None]
        if missing:
            raise BoundsError(f"{describe(node)}: input {missing[0]!r} is not produced by any earlier node")
        if node.op_type == "Constant" or (ins and node.op_type not in _RANDOM_OPS
                                          and not any(isinstance(v, Var) for v in ins)):
            env[node.output[0]] = _fold(node, ins)
            continue
        handler = HANDLERS.get(node.op_type)
        if handler is None:
            raise BoundsError(f"{describe(node)}: op type {node.op_type!r} is not supported on input-dependent "
                              f"tensors; supported: {', '.join(SUPPORTED)}")
        env[node.output[0]] = handler(builder, node, ins)
    return env


def _output_node(builder: Builder, out, name: str, n_inputs: int, n_outputs: int) -> Var:
    """The output as a node of its own, checked against the declared [batch, m]."""
    if out is None:
        raise BoundsError(f"output {name!r} is not produced by any node")
    x0 = Var(0, (n_inputs,))
    if not isinstance(out, Var):  # the output does not depend on the input: a constant node
        try:
            bias = np.broadcast_to(np.asarray(out, np.float64).reshape(-1), (n_outputs,))
        except ValueError as exc:
            raise BoundsError(f"constant output {name!r} of shape {list(np.shape(out))} does not fit "
                              f"[batch, {n_outputs}]") from exc
        out = builder.affine([(x0, np.zeros((n_outputs, n_inputs)))], bias, (n_outputs,), "output")
    elif out.value == 0:  # the output is the input itself
        out = builder.affine([(x0, np.eye(n_inputs))], np.zeros(n_inputs), out.shape, "output")
    if out.shape != (n_outputs,):
        raise BoundsError(f"output {name!r} is declared [batch, {n_outputs}] but computes "
                          f"[batch, {', '.join(map(str, out.shape))}]")
    return out


def _single_io(g, consts):
    inputs = [i for i in g.input if i.name not in consts]
    if len(inputs) != 1 or len(g.output) != 1:
        raise BoundsError(f"model needs exactly one input and one output tensor, has {len(inputs)} and {len(g.output)}")
    return inputs[0], g.output[0]


def _io_width(info, what: str) -> int:
    t = info.type.tensor_type
    if t.elem_type != TensorProto.FLOAT:
        raise BoundsError(f"{what} {info.name!r} has element type "
                          f"{TensorProto.DataType.Name(t.elem_type)}, expected FLOAT")
    dims = list(t.shape.dim)
    text = "[" + ", ".join(d.dim_param or str(d.dim_value) if (d.dim_param or d.HasField("dim_value")) else "?"
                           for d in dims) + "]"
    batch_ok = len(dims) == 2 and (not dims[0].HasField("dim_value") or dims[0].dim_value == 1)
    if not batch_ok or not dims[1].HasField("dim_value") or dims[1].dim_value < 1:
        raise BoundsError(f"{what} {info.name!r} has shape {text}, expected [batch, n] with a fixed n")
    return int(dims[1].dim_value)


def _fold(node, ins) -> np.ndarray:
    try:
        feeds = {name: v for name, v in zip(node.input, ins) if name}
        return np.asarray(ReferenceEvaluator(node).run(None, feeds)[0])
    except Exception as exc:
        raise BoundsError(f"{describe(node)}: cannot evaluate this constant node: {exc}") from exc


def _consumers(nodes, output: int) -> dict[int, int]:
    count = {output: 1}  # the model output counts as a use
    for node in nodes:
        for v in node.inputs:
            count[v] = count.get(v, 0) + 1
    return count


def _fuse_affine(nodes: list, output: int) -> list:
    """Substitute an affine node into its only consumer when that consumer is affine too."""
    nodes = list(nodes)
    uses = _consumers(nodes, output)
    for i, node in enumerate(nodes):
        if not isinstance(node, Affine):
            continue
        inputs, mats, bias, sources = [], [], node.bias.copy(), [node.source]
        for v, m in zip(node.inputs, node.mats):
            prev = nodes[v - 1] if v > 0 else None
            if isinstance(prev, Affine) and uses[v] == 1:
                inputs += prev.inputs
                mats += [m @ pm for pm in prev.mats]
                bias += m @ prev.bias
                sources.insert(0, prev.source)
            else:
                inputs.append(v)
                mats.append(m)
        merged: dict[int, np.ndarray] = {}
        for v, m in zip(inputs, mats):
            merged[v] = merged[v] + m if v in merged else m
        nodes[i] = Affine(list(merged), list(merged.values()), bias, " -> ".join(sources))
    return nodes


def _compact(nodes: list, output: int) -> list:
    """Drop nodes the output does not depend on and renumber values densely."""
    live, stack = set(), [output]
    while stack:
        v = stack.pop()
        if v > 0 and v not in live:
            live.add(v)
            stack += nodes[v - 1].inputs
    renum = {0: 0}
    kept = []
    for v in range(1, len(nodes) + 1):
        if v in live:
            renum[v] = len(kept) + 1
            kept.append(nodes[v - 1])
    out = []
    for node in kept:
        if isinstance(node, Affine):
            out.append(Affine([renum[v] for v in node.inputs], node.mats, node.bias, node.source))
        else:
            out.append(Nonlinear(renum[node.input], node.act, node.size, node.source))
    if renum[output] != len(out):
        raise BoundsError("internal: the output is not the last node after compaction")
    return out
