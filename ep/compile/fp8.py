"""`fp8-adaptive`: FP8 weight storage with per-layer E4M3/E5M2 choice from measured error.

Per MatMul weight W [K, N] (after `gemm_to_matmul`): one float32 scale per output channel
(`scale[n] = max|W[:, n]| / fmax`, axis 1), `q = clip(W / scale, -fmax, fmax)` cast with ml_dtypes
(round to nearest even; the clamp matters because ml_dtypes turns e4m3fn values >= 465 into NaN),
stored as a FLOAT8E4M3FN or FLOAT8E5M2 initializer feeding `DequantizeLinear(q, scale, axis=1)`
(opset 21) -> MatMul.

The format is chosen per layer by measurement: both formats are tried, and the one with the
lower *layer-output* relative error on the calibration activations (||X W - X W_q|| / ||X W||, X the
layer's inputs on the calibration rows) wins; without activations the weight relative error
(||W - W_q|| / ||W||) decides. Both errors, and the share of non-zero weights flushed to zero, are
recorded for both formats. E4M3 (3 mantissa bits) wins for ordinary weight distributions; E5M2
(5 exponent bits) wins when one channel spans more than ~2^17 and the small weights carry signal:
with scale = amax/fmax the smallest non-zero e4m3fn value is amax * 2^-9/448 (about amax * 2^-17.8),
for e5m2 amax * 2^-16/57344 (about amax * 2^-31.8); smaller weights flush to zero. A layer whose
best error exceeds `max_output_error` stays FP32 with a note.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ..errors import CompileError
from .graph import Names, op_key

FORMATS = {  # name in the manifest -> (ml_dtypes type, fmax, ONNX type)
    "float8e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0, TensorProto.FLOAT8E4M3FN),
    "float8e5m2": (ml_dtypes.float8_e5m2, 57344.0, TensorProto.FLOAT8E5M2),
}
SCALE_LAYOUT = "per-channel: float32 scale [N] over output channels (DequantizeLinear axis=1), no zero point"
_WEIGHTED_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "RNN", "Einsum", "Attention",
                 "com.microsoft:Attention", "com.microsoft:FusedMatMul", "com.microsoft:FusedGemm"}


def quantize_fp8(w: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q float8 [K, N], scale float32 [N], dequantized float32 [K, N]) for a 2-D weight, per output channel."""
    dtype, fmax, _ = FORMATS[fmt]
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D weight, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise CompileError("weight holds NaN or infinity; cannot quantize it")
    amax = np.max(np.abs(w), axis=0) if w.shape[0] else np.zeros(w.shape[1], np.float32)
    scale = np.where(amax > 0, amax / np.float32(fmax), np.float32(1.0)).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)  # amax/fmax can underflow to 0
    q = np.clip(w / scale, -fmax, fmax).astype(dtype)
    return q, scale, q.astype(np.float32) * scale


def _rel(diff: np.ndarray, ref: np.ndarray) -> float:
    denom = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(diff))
    return num / denom if denom > 0 else num


@dataclass
class Fp8Decision:
    format: str
    weight_rel_error: dict[str, float]
    output_rel_error: dict[str, float] | None
    flushed_to_zero: dict[str, float]
    chosen_by: str

    def to_json(self) -> dict:
        return {"format": self.format, "weight_rel_error": self.weight_rel_error,
                "output_rel_error": self.output_rel_error, "flushed_to_zero": self.flushed_to_zero,
                "chosen_by": self.chosen_by}


def choose_fp8_format(w: np.ndarray, x: np.ndarray | None = None) -> Fp8Decision:
    """Tries both FP8 formats on weight `w` [K, N] (per-channel scales) and picks one by the
    layer-output error on activations `x` [M, K] when given, else by the weight error; ties go to
    E4M3 (more mantissa)."""
    w = np.asarray(w, dtype=np.float32)
    nonzero = max(int(np.count_nonzero(w)), 1)
    ref = None
    if x is not None:
        x = np.asarray(x, dtype=np.float64).reshape(-1, w.shape[0])
        ref = x @ w.astype(np.float64)
    werr, oerr, flushed = {}, {}, {}
    for fmt in FORMATS:
        _, _, deq = quantize_fp8(w, fmt)
        werr[fmt] = _rel(w.astype(np.float64) - deq, w.astype(np.float64))
        flushed[fmt] = int(np.count_nonzero((w != 0) & (deq == 0))) / nonzero
        if ref is not None:
            oerr[fmt] = _rel(ref - x @ deq.astype(np.float64), ref)
    metric = oerr if ref is not None else werr
    a, b = "float8e4m3fn", "float8e5m2"
    fmt = b if metric[b] < metric[a] * (1 - 1e-9) else a
    how = (f"layer-output error on {x.shape[0]} calibration rows" if ref is not None else "weight error")
    return Fp8Decision(fmt, werr, oerr if ref is not None else None, flushed, how)


def candidates(model: ModelProto) -> tuple[dict[str, list], list[str]]:
    """MatMul weights FP8 can take (constant float32 2-D B, non-constant A): weight -> consumer nodes;
    plus notes for weighted operators it leaves in FP32."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    found: dict[str, list] = {}
    notes = []
    for node in g.node:
        key = op_key(node)
        label = f"{key} {node.name or node.output[0]}"
        if key == "MatMul":
            b = node.input[1]
            t = inits.get(b)
            if t is None:
                if node.input[0] not in inits:
                    continue  # activation x activation (attention scores): nothing to store
                notes.append(f"{label}: the weight is the first operand; left in FP32")
            elif len(t.dims) != 2 or t.data_type != TensorProto.FLOAT:
                notes.append(f"{label}: weight {b} is {TensorProto.DataType.Name(t.data_type)}{list(t.dims)}, "
                             f"fp8-adaptive takes float32 2-D weights; left in FP32")
            elif node.input[0] in inits:
                notes.append(f"{label}: both operands are constant; left in FP32")
            else:
                found.setdefault(b, []).append(node)
        elif key in _WEIGHTED_OPS and any(i in inits and len(inits[i].dims) >= 2 for i in node.input):
            notes.append(f"{label}: unsupported operator for fp8 (fp8-adaptive covers MatMul and Gemm with "
                         f"constant 2-D weights); left in FP32")
    return found, notes


def quantize_model(model: ModelProto, activations: dict[str, np.ndarray], max_output_error: float,
                   progress=None) -> tuple[ModelProto, dict]:
    """Rewrites every candidate MatMul weight to float8 + DequantizeLinear. `activations`: node input
    name -> calibration activations of that tensor."""
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    found, notes = candidates(out)
    names = Names(g)
    dq_for: dict[str, str] = {}
    dq_nodes: dict[str, object] = {}
    layers = []
    for i, (w_name, consumers) in enumerate(found.items()):
        if progress:
            progress(f"fp8: layer {i + 1}/{len(found)} {w_name}")
        w = numpy_helper.to_array(inits[w_name]).astype(np.float32)
        xs = [activations[n.input[0]].reshape(-1, w.shape[0]) for n in consumers if n.input[0] in activations]
        decision = choose_fp8_format(w, np.concatenate(xs) if xs else None)
        record = {"weight": w_name, "nodes": [n.name or n.output[0] for n in consumers], "shape": list(w.shape),
                  **decision.to_json(), "scale": SCALE_LAYOUT}
        best = (decision.output_rel_error or decision.weight_rel_error)[decision.format]
        if best > max_output_error:
            record["format"] = "float32"
            record["note"] = (f"best FP8 error {best:.3g} exceeds max_output_error {max_output_error}; "
                              f"left in FP32")
            notes.append(f"{w_name}: {record['note']}")
            layers.append(record)
            continue
        q, scale, _ = quantize_fp8(w, decision.format)
        q_name, s_name = names.fresh(f"{w_name}.{decision.format}"), names.fresh(f"{w_name}.scale")
        dq_out = names.fresh(f"{w_name}.dequantized")
        g.initializer.extend([numpy_helper.from_array(q, q_name), numpy_helper.from_array(scale, s_name)])
        dq_nodes[w_name] = helper.make_node("DequantizeLinear", [q_name, s_name], [dq_out],
                                            name=names.fresh(f"{w_name}/DequantizeLinear"), axis=1)
        dq_for[w_name] = dq_out
        record["stored_as"] = {"weight": q_name, "scale": s_name}
        layers.append(record)
    new_nodes = []
    for node in g.node:
        if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in dq_for:
            w_name = node.input[1]
            if w_name in dq_nodes:
                new_nodes.append(dq_nodes.pop(w_name))
            node.input[1] = dq_for[w_name]
        new_nodes.append(node)
    del g.node[:]
    g.node.extend(new_nodes)
    return out, {"layers": layers, "notes": notes}
