"""Graph passes: each takes a ModelProto and returns (new ModelProto, report entry dict).

The report entry holds the pass name, the operator counts before and after and what the pass
did; `run_pass` adds the counts, so the passes only describe their own work."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ..errors import CompileError
from .graph import Names, attrs, count_ops, subgraph_inputs

_DEFAULT = ("", "ai.onnx")
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"}
MAX_FOLD_BYTES = 64 << 20


def load_model(path: str | Path) -> tuple[ModelProto, str]:
    """The model at `path` (external data resolved next to it) and the SHA-256 (hex) of the file."""
    path = Path(path)
    if not path.is_file():
        raise CompileError(f"model {path}: file not found")
    data = path.read_bytes()
    try:
        model = onnx.load_from_string(data)
        if not model.graph.node and not model.graph.output:
            raise ValueError("no graph")
    except Exception as exc:  # protobuf DecodeError and friends
        raise CompileError(f"model {path}: not an ONNX model ({type(exc).__name__}: {exc})") from exc
    try:
        from onnx.external_data_helper import load_external_data_for_model, uses_external_data

        if any(uses_external_data(t) for t in model.graph.initializer):
            load_external_data_for_model(model, str(path.parent))
        onnx.checker.check_model(model)
    except Exception as exc:
        raise CompileError(f"model {path}: the ONNX checker rejects it: {exc}") from exc
    return model, hashlib.sha256(data).hexdigest()


def run_pass(name: str, fn, model: ModelProto, *args, **kwargs) -> tuple[ModelProto, dict]:
    before = sum(count_ops(model).values())
    try:
        model, entry = fn(model, *args, **kwargs)
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"pass {name} failed: {type(exc).__name__}: {exc}") from exc
    return model, {"pass": name, "ops_before": before, "ops_after": sum(count_ops(model).values()), **entry}


def _default_opset(model: ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in _DEFAULT:
            return o.version
    return 0


# --- passes ------------------------------------------------------------------------------------

def infer_shapes(model: ModelProto) -> tuple[ModelProto, dict]:
    """ONNX shape inference (strict, with data propagation); falls back to non-strict with a note."""
    note = None
    try:
        out = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        note = f"strict shape inference failed ({str(exc).splitlines()[0][:200]}); used the non-strict result"
        out = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    entry = {"value_info": len(out.graph.value_info)}
    if note:
        entry["note"] = note
    return out, entry


def initializers_not_inputs(model: ModelProto) -> tuple[ModelProto, dict]:
    """Initializers also listed as graph inputs (old exporters) become plain constants (IR >= 4)."""
    model = _copy(model)
    g = model.graph
    inits = {t.name for t in g.initializer}
    keep = [v for v in g.input if v.name not in inits]
    removed = len(g.input) - len(keep)
    if removed:
        del g.input[:]
        g.input.extend(keep)
        model.ir_version = max(model.ir_version, 4)
    return model, {"inputs_made_constant": removed}


def fold_constants(model: ModelProto) -> tuple[ModelProto, dict]:
    """Evaluates every node whose inputs are all constants (and `Constant` nodes) with onnx's
    reference evaluator and replaces it with initializers. Skips nodes with subgraphs, random ops,
    non-default domains, nodes producing graph outputs and results above 64 MiB."""
    from onnx.reference import ReferenceEvaluator

    model = _copy(model)
    g = model.graph
    consts: dict[str, TensorProto] = {t.name: t for t in g.initializer}
    graph_outputs = {o.name for o in g.output}
    new_nodes, folded, skipped = [], [], []
    new_inits: list[TensorProto] = []
    for node in g.node:
        inputs = [i for i in node.input if i]
        foldable = (node.domain in _DEFAULT and node.op_type not in _NONDETERMINISTIC
                    and not subgraph_inputs(node) and not any(o in graph_outputs for o in node.output)
                    and (node.op_type == "Constant" or (inputs and all(i in consts for i in inputs))))
        if not foldable:
            new_nodes.append(node)
            continue
        try:
            mini = helper.make_graph([node], "fold", [], [helper.make_empty_tensor_value_info(o)
                                                          for o in node.output if o],
                                     initializer=[consts[i] for i in dict.fromkeys(inputs)])
            mini_model = helper.make_model(mini, opset_imports=model.opset_import, ir_version=model.ir_version)
            values = ReferenceEvaluator(mini_model).run(None, {})
        except Exception as exc:
            skipped.append(f"{node.op_type} {node.name or node.output[0]}: {str(exc).splitlines()[0][:120]}")
            new_nodes.append(node)
            continue
        outs = [o for o in node.output if o]
        if sum(np.asarray(v).nbytes for v in values) > MAX_FOLD_BYTES:
            skipped.append(f"{node.op_type} {node.name or outs[0]}: result larger than {MAX_FOLD_BYTES} bytes")
            new_nodes.append(node)
            continue
        for name, value in zip(outs, values):
            t = numpy_helper.from_array(np.asarray(value), name)
            consts[name] = t
            new_inits.append(t)
        folded.append(f"{node.op_type} {node.name or outs[0]}")
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    entry: dict = {"folded": folded}
    if skipped:
        entry["not_folded"] = skipped
    return model, entry


def eliminate_dead_code(model: ModelProto) -> tuple[ModelProto, dict]:
    """Removes nodes no graph output depends on, and unused initializers and value_info."""
    model = _copy(model)
    g = model.graph
    needed = {o.name for o in g.output}
    keep = []
    for node in reversed(g.node):
        if any(o in needed for o in node.output if o):
            keep.append(node)
            needed.update(i for i in node.input if i)
            needed |= subgraph_inputs(node)
    keep.reverse()
    removed_nodes = len(g.node) - len(keep)
    inits = [t for t in g.initializer if t.name in needed]
    removed_inits = len(g.initializer) - len(inits)
    produced = {o for n in keep for o in n.output} | {v.name for v in g.input} | {t.name for t in inits}
    vinfo = [v for v in g.value_info if v.name in produced]
    del g.node[:]
    g.node.extend(keep)
    del g.initializer[:]
    g.initializer.extend(inits)
    del g.value_info[:]
    g.value_info.extend(vinfo)
    return model, {"removed_nodes": removed_nodes, "removed_initializers": removed_inits}


_AFFINE_OPS = {"Sub", "Add", "Mul", "Div"}


def fuse_input_affine_into_gemm(model: ModelProto) -> tuple[ModelProto, dict]:
    """A chain of per-feature Sub/Add/Mul/Div by constants that feeds a Gemm (input normalisation:
    `(x - mean) / std`) folded into that Gemm's weights and bias: `(a*x + c) @ W + b` is
    `x @ (a[:, None] * W) + (c @ W + b)`. onnxruntime does not fuse elementwise ops *into* a following
    Gemm, so each frame pays for two full-width elementwise kernels that are pure constants here.
    Only chains whose intermediate results feed nothing else, with scalar or [features] constants,
    and Gemms with alpha = beta = 1, transA = 0 and constant B (and C) are fused."""
    model = _copy(model)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, int] = {}
    for node in g.node:
        for i in node.input:
            consumers[i] = consumers.get(i, 0) + 1
    for o in g.output:
        consumers[o.name] = consumers.get(o.name, 0) + 1
    producer = {o: node for node in g.node for o in node.output}
    names = Names(g)
    fused, removed = [], set()
    new_inits = []
    for gemm in g.node:
        if gemm.op_type != "Gemm" or gemm.domain not in _DEFAULT:
            continue
        a_ = attrs(gemm)
        if (float(a_.get("alpha", 1.0)) != 1.0 or float(a_.get("beta", 1.0)) != 1.0 or int(a_.get("transA", 0))
                or gemm.input[1] not in inits or (len(gemm.input) > 2 and gemm.input[2] and gemm.input[2] not in inits)):
            continue
        w = numpy_helper.to_array(inits[gemm.input[1]]).astype(np.float64)
        if w.ndim != 2:
            continue
        w_kn = w.T if int(a_.get("transB", 0)) else w  # [in, out]
        features = w_kn.shape[0]
        chain, x = [], gemm.input[0]
        while x in producer and producer[x].op_type in _AFFINE_OPS and producer[x].domain in _DEFAULT \
                and consumers.get(x, 0) == 1:
            node = producer[x]
            const = [i for i in node.input[1:2] if i in inits]
            if len(node.input) != 2 or not const or node.input[0] in inits:
                break
            k = numpy_helper.to_array(inits[const[0]]).astype(np.float64).reshape(-1)
            if k.size not in (1, features):
                break
            chain.append((node.op_type, k, node))
            x = node.input[0]
        if not chain:
            continue
        scale, shift = np.ones(features), np.zeros(features)
        for op, k, _ in reversed(chain):  # innermost (closest to the input) first
            if op == "Sub":
                shift = shift - k
            elif op == "Add":
                shift = shift + k
            elif op == "Mul":
                scale, shift = scale * k, shift * k
            else:
                if np.any(k == 0):
                    break
                scale, shift = scale / k, shift / k
        else:
            bias = numpy_helper.to_array(inits[gemm.input[2]]).astype(np.float64) if len(gemm.input) > 2 \
                and gemm.input[2] else np.zeros(w_kn.shape[1])
            w_new = scale[:, None] * w_kn
            b_new = shift @ w_kn + bias
            dtype = numpy_helper.to_array(inits[gemm.input[1]]).dtype
            w_name, b_name = names.fresh(f"{gemm.input[1]}.affine"), names.fresh(f"{gemm.name or 'gemm'}.affine_bias")
            new_inits += [numpy_helper.from_array(w_new.T.astype(dtype) if int(a_.get("transB", 0))
                                                  else w_new.astype(dtype), w_name),
                          numpy_helper.from_array(b_new.astype(dtype), b_name)]
            del gemm.input[:]
            gemm.input.extend([x, w_name, b_name])
            removed.update(node.output[0] for _, _, node in chain)
            fused.append(f"{'/'.join(op for op, _, _ in reversed(chain))} -> Gemm {gemm.name or gemm.output[0]}")
    keep = [n for n in g.node if not n.output or n.output[0] not in removed]
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new_inits)
    return model, {"fused": fused}


def upgrade_opset(model: ModelProto, version: int) -> tuple[ModelProto, dict]:
    """The default-domain opset raised to `version` (onnx version converter), IR version to match."""
    old = _default_opset(model)
    if old >= version:
        # contrib domains (com.microsoft: GroupQueryAttention) have no IR table entry: the default domain decides
        ir = max(model.ir_version, helper.find_min_ir_version_for(
            [o for o in model.opset_import if o.domain in ("", "ai.onnx")]), 9)
        if ir != model.ir_version:
            model = _copy(model)
            model.ir_version = ir  # float8 tensors need IR >= 9
        return model, {"opset": old}
    try:
        out = onnx.version_converter.convert_version(model, version)
    except Exception as exc:
        raise CompileError(f"cannot convert the model from opset {old} to {version} (needed for float8 "
                           f"DequantizeLinear): {str(exc).splitlines()[0]}; re-export it at opset {version}, "
                           f"or compile with --quantization int8 or none") from exc
    out.ir_version = max(out.ir_version, helper.find_min_ir_version_for(list(out.opset_import)))
    return out, {"opset": f"{old} -> {version}"}


def gemm_to_matmul(model: ModelProto) -> tuple[ModelProto, dict]:
    """`Gemm` with a constant B (and constant or no C) -> [Transpose] -> MatMul(+Add), with alpha, beta
    and transB folded into the constants. float8 Gemm has no CPU kernel, and onnxruntime's dynamic
    quantizer handles MatMul only. The MatMul keeps the Gemm's node name."""
    model = _copy(model)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    names = Names(g)
    new_nodes, new_inits, rewritten, kept = [], [], [], []
    for node in g.node:
        if node.op_type != "Gemm" or node.domain not in _DEFAULT:
            new_nodes.append(node)
            continue
        a = attrs(node)
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        trans_a, trans_b = int(a.get("transA", 0)), int(a.get("transB", 0))
        b_name = node.input[1]
        c_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
        label = node.name or node.output[0]
        if b_name not in inits or (c_name is not None and c_name not in inits):
            kept.append(f"Gemm {label}: B or C is not a constant; kept as Gemm")
            new_nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[b_name])
        if w.ndim != 2 or w.dtype.kind != "f":
            kept.append(f"Gemm {label}: B is {w.dtype}{list(w.shape)}; kept as Gemm")
            new_nodes.append(node)
            continue
        w = w.T if trans_b else w
        if alpha != 1.0:
            w = (w * np.asarray(alpha, dtype=w.dtype)).astype(w.dtype)
        w_name = names.fresh(f"{b_name}.kn")
        new_inits.append(numpy_helper.from_array(np.ascontiguousarray(w), w_name))
        x = node.input[0]
        if trans_a:
            xt = names.fresh(f"{label}/transA_output")
            new_nodes.append(helper.make_node("Transpose", [x], [xt], name=names.fresh(f"{label}/transA"),
                                              perm=[1, 0]))
            x = xt
        mm_out = node.output[0] if c_name is None else names.fresh(f"{label}/MatMul_output")
        new_nodes.append(helper.make_node("MatMul", [x, w_name], [mm_out], name=node.name or names.fresh("MatMul")))
        if c_name is not None:
            bias_name = c_name
            if beta != 1.0:
                c = numpy_helper.to_array(inits[c_name])
                bias_name = names.fresh(f"{c_name}.beta")
                new_inits.append(numpy_helper.from_array((c * np.asarray(beta, dtype=c.dtype)).astype(c.dtype),
                                                         bias_name))
            new_nodes.append(helper.make_node("Add", [mm_out, bias_name], [node.output[0]],
                                              name=names.fresh(f"{label}/bias")))
        rewritten.append(label)
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    entry: dict = {"rewritten": rewritten}
    if kept:
        entry["notes"] = kept
    return model, entry


def _copy(model: ModelProto) -> ModelProto:
    out = ModelProto()
    out.CopyFrom(model)
    return out
