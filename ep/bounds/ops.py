"""ONNX op -> analysis nodes: one transfer function per supported op type, applied while walking
the graph. Input-dependent tensors are `Var`s (per-sample shape, batch axis dropped); everything
else is a numpy constant."""
from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import NodeProto, helper

from . import activations as acts
from .errors import BoundsError
from .ir import Builder, Var

Value = Var | np.ndarray | None


def describe(node: NodeProto) -> str:
    return f"node {node.name or node.output[0]!r} ({node.op_type})"


def _attrs(node: NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _fail(node: NodeProto, why: str) -> BoundsError:
    return BoundsError(f"{describe(node)}: {why}")


def _per_sample(node: NodeProto, c: np.ndarray, x: Var) -> np.ndarray:
    """A constant operand aligned with x's per-sample shape (it may carry a leading batch axis of 1)."""
    c = np.asarray(c, dtype=np.float64)
    full_rank = len(x.shape) + 1
    if c.ndim > full_rank or (c.ndim == full_rank and c.shape[0] != 1):
        raise _fail(node, f"constant of shape {list(c.shape)} would broadcast over the batch axis "
                          f"of a [batch, {', '.join(map(str, x.shape))}] tensor")
    return c[0] if c.ndim == full_rank else c


def _broadcast_matrix(shape_in: tuple[int, ...], shape_out: tuple[int, ...]) -> np.ndarray:
    """The 0/1 matrix that copies a flat tensor of shape_in into its broadcast to shape_out."""
    n_in = int(np.prod(shape_in, dtype=np.int64))
    src = np.broadcast_to(np.arange(n_in).reshape(shape_in), shape_out).reshape(-1)
    m = np.zeros((src.size, n_in))
    m[np.arange(src.size), src] = 1.0
    return m


def _out_shape(node: NodeProto, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError as exc:
        raise _fail(node, f"shapes {[list(s) for s in shapes]} do not broadcast") from exc


def _elementwise(b: Builder, node: NodeProto, ins: list[Value]) -> Var:
    """Add/Sub/Mul/Div where the result stays affine in the input."""
    op = node.op_type
    x, y = ins
    if isinstance(x, Var) and isinstance(y, Var):
        if op in ("Mul", "Div"):
            raise _fail(node, f"{op} of two input-dependent tensors is not affine; "
                              f"only {op} by a constant is supported")
        shape = _out_shape(node, x.shape, y.shape)
        sign = 1.0 if op == "Add" else -1.0
        terms = [(x, _broadcast_matrix(x.shape, shape)), (y, sign * _broadcast_matrix(y.shape, shape))]
        return b.affine(terms, np.zeros(int(np.prod(shape, dtype=np.int64))), shape, describe(node))
    var_first = isinstance(x, Var)
    v, c = (x, y) if var_first else (y, x)
    c = _per_sample(node, c, v)
    shape = _out_shape(node, v.shape, c.shape)
    cb = np.broadcast_to(c, shape).reshape(-1)
    spread = _broadcast_matrix(v.shape, shape)
    if op == "Add":
        return b.affine([(v, spread)], cb, shape, describe(node))
    if op == "Sub":
        return b.affine([(v, spread if var_first else -spread)], -cb if var_first else cb, shape, describe(node))
    if op == "Mul":
        return b.affine([(v, cb[:, None] * spread)], np.zeros(cb.size), shape, describe(node))
    if not var_first:
        raise _fail(node, "division of a constant by an input-dependent tensor is not supported (not affine)")
    if np.any(cb == 0):
        raise _fail(node, "divides by a constant that contains zero")
    return b.affine([(v, (1.0 / cb)[:, None] * spread)], np.zeros(cb.size), shape, describe(node))


def _gemm(b: Builder, node: NodeProto, ins: list[Value]) -> Var:
    a, w = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    at = _attrs(node)
    if not isinstance(a, Var) or isinstance(w, Var) or isinstance(c, Var):
        raise _fail(node, "only Gemm(input-dependent A, constant B, constant C) is supported")
    if at.get("transA", 0):
        raise _fail(node, "transA=1 on the input-dependent operand would mix the batch axis")
    if len(a.shape) != 1:
        raise _fail(node, f"A must be [batch, k], is [batch, {', '.join(map(str, a.shape))}]")
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise _fail(node, f"B must be 2-D, has shape {list(w.shape)}")
    w = w.T if at.get("transB", 0) else w
    if w.shape[0] != a.shape[0]:
        raise _fail(node, f"A is [batch, {a.shape[0]}] but B has {w.shape[0]} rows")
    n_out = w.shape[1]
    bias = np.zeros(n_out)
    if c is not None:
        cc = np.asarray(c, dtype=np.float64)
        if cc.ndim == 2 and cc.shape[0] != 1:
            raise _fail(node, f"C of shape {list(cc.shape)} would broadcast over the batch axis")
        bias = at.get("beta", 1.0) * np.broadcast_to(cc.reshape(cc.shape[-1:] if cc.ndim else ()), (n_out,))
    return b.affine([(a, at.get("alpha", 1.0) * w.T)], bias, (n_out,), describe(node))


def _matmul(b: Builder, node: NodeProto, ins: list[Value]) -> Var:
    x, w = ins
    if isinstance(x, Var) == isinstance(w, Var):
        raise _fail(node, "MatMul needs exactly one constant operand (a product of two input-dependent "
                          "tensors is not affine)")
    if isinstance(x, Var):  # x @ W over the last axis
        w = np.asarray(w, dtype=np.float64)
        if w.ndim not in (1, 2) or len(x.shape) < 1 or x.shape[-1] != w.shape[0]:
            raise _fail(node, f"cannot multiply [batch, {', '.join(map(str, x.shape))}] by constant "
                              f"{list(w.shape)} (supported: 1-D or 2-D weights on the last axis)")
        lead = x.shape[:-1]
        per_row = w.T if w.ndim == 2 else w[None, :]
        shape = lead + ((w.shape[1],) if w.ndim == 2 else ())
        mat = np.kron(np.eye(int(np.prod(lead, dtype=np.int64))), per_row)
        return b.affine([(x, mat)], np.zeros(mat.shape[0]), shape, describe(node))
    v, w = w, np.asarray(x, dtype=np.float64)  # W @ X per sample: X must be at least [batch, k, n]
    if w.ndim != 2 or len(v.shape) < 2 or v.shape[-2] != w.shape[1]:
        raise _fail(node, f"cannot multiply constant {list(w.shape)} by [batch, {', '.join(map(str, v.shape))}] "
                          f"without mixing the batch axis")
    lead, n = v.shape[:-2], v.shape[-1]
    mat = np.kron(np.eye(int(np.prod(lead, dtype=np.int64))), np.kron(w, np.eye(n)))
    return b.affine([(v, mat)], np.zeros(mat.shape[0]), lead + (w.shape[0], n), describe(node))


def _concat(b: Builder, node: NodeProto, ins: list[Value]) -> Var:
    if not all(isinstance(v, Var) for v in ins):
        raise _fail(node, "Concat of a constant with input-dependent tensors would fix the batch size")
    rank = len(ins[0].shape) + 1
    axis = _attrs(node)["axis"]
    axis = axis + rank if axis < 0 else axis
    if axis == 0 or any(len(v.shape) + 1 != rank for v in ins):
        raise _fail(node, "Concat along the batch axis (or of tensors of different rank) is not supported")
    k = axis - 1
    shape = list(ins[0].shape)
    shape[k] = sum(v.shape[k] for v in ins)
    index = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
    terms, start = [], 0
    for v in ins:
        if v.shape[:k] + v.shape[k + 1:] != ins[0].shape[:k] + ins[0].shape[k + 1:]:
            raise _fail(node, f"operand shapes {[list(u.shape) for u in ins]} differ off the concat axis")
        rows = np.take(index, range(start, start + v.shape[k]), axis=k).reshape(-1)
        m = np.zeros((index.size, v.size))
        m[rows, np.arange(v.size)] = 1.0
        terms.append((v, m))
        start += v.shape[k]
    return b.affine(terms, np.zeros(index.size), tuple(shape), describe(node))


def _reshape(b: Builder, node: NodeProto, ins: list[Value]) -> Var:
    x, target = ins[0], ins[1]
    if not isinstance(x, Var) or isinstance(target, Var) or target is None:
        raise _fail(node, "Reshape needs an input-dependent tensor and a constant shape")
    if _attrs(node).get("allowzero", 0) and 0 in target:
        raise _fail(node, "allowzero=1 with a zero in the shape is not supported")
    full = (None,) + x.shape
    dims = [full[i] if int(d) == 0 and i < len(full) else int(d) for i, d in enumerate(target)]
    rest = dims[1:]
    if dims[0] == -1 and -1 not in rest and int(np.prod(rest, dtype=np.int64)) == x.size:
        return Var(x.value, tuple(rest))
    if dims[0] is None and rest.count(-1) <= 1:
        known = int(np.prod([d for d in rest if d != -1], dtype=np.int64))
        if -1 in rest and known > 0 and x.size % known == 0:
            rest[rest.index(-1)] = x.size // known
        if -1 not in rest and int(np.prod(rest, dtype=np.int64)) == x.size:
            return Var(x.value, tuple(rest))
    raise _fail(node, f"reshape of [batch, {', '.join(map(str, x.shape))}] to {list(map(int, target))} "
                      f"does not keep the batch axis (use 0 or -1 first)")


def _flatten(b: Builder, node: NodeProto, ins: list[Value]) -> Var:
    x = ins[0]
    axis = _attrs(node).get("axis", 1)
    axis = axis + len(x.shape) + 1 if axis < 0 else axis
    if axis != 1:
        raise _fail(node, f"Flatten with axis={axis} mixes the batch axis; only axis=1 is supported")
    return Var(x.value, (x.size,))


def _clip(b: Builder, node: NodeProto, ins: list[Value]) -> Var:
    at = _attrs(node)
    limits = [at.get("min", -np.inf), at.get("max", np.inf)]  # opset < 11 keeps them as attributes
    for i, c in enumerate(ins[1:3]):  # opset >= 11: optional inputs, "" when absent
        if isinstance(c, Var):
            raise _fail(node, "Clip bounds must be constants")
        if c is not None:
            if np.size(c) != 1:
                raise _fail(node, "Clip bounds must be scalars")
            limits[i] = float(np.ravel(c)[0])
    return b.nonlinear(ins[0], acts.Clip(*limits), describe(node))


def _activation(make: Callable[[dict], acts.Activation]):
    def handler(b: Builder, node: NodeProto, ins: list[Value]) -> Var:
        return b.nonlinear(ins[0], make(_attrs(node)), describe(node))
    return handler


HANDLERS: dict[str, Callable[[Builder, NodeProto, list[Value]], Var]] = {
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Add": _elementwise, "Sub": _elementwise, "Mul": _elementwise, "Div": _elementwise,
    "Relu": _activation(lambda at: acts.Relu()),
    "LeakyRelu": _activation(lambda at: acts.LeakyRelu(at.get("alpha", 0.01))),
    "Sigmoid": _activation(lambda at: acts.Sigmoid()),
    "Tanh": _activation(lambda at: acts.Tanh()),
    "Clip": _clip,
    "Concat": _concat,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Identity": lambda b, node, ins: ins[0],
}
SUPPORTED = sorted(HANDLERS) + ["Constant"]
