"""`int8`: onnxruntime's dynamic quantization (`quantize_dynamic`, per-channel int8 weights, uint8
activations quantized per call), on MatMul after `gemm_to_matmul`. The fastest low-precision path
on a VNNI CPU (field notes: DynamicQuantizeMatMul). Per-layer errors are recomputed here from the
quantized initializers: weight error from (q - zero_point) * scale, output error with the
activations quantized per row as DynamicQuantizeLinear does at batch 1."""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, numpy_helper

from ..errors import CompileError
from .fp8 import _rel, candidates

SCALE_LAYOUT = ("per-channel: float32 scale [N] and int8 zero point [N] over output channels; activations "
                "uint8, scale and zero point computed per call (DynamicQuantizeLinear)")


def _fake_quant_rows(x: np.ndarray) -> np.ndarray:
    """DynamicQuantizeLinear per row: uint8, range including 0, round half to even."""
    lo = np.minimum(x.min(axis=1, keepdims=True), 0.0)
    hi = np.maximum(x.max(axis=1, keepdims=True), 0.0)
    scale = (hi - lo) / 255.0
    scale = np.where(scale > 0, scale, 1.0)
    zp = np.clip(np.rint(-lo / scale), 0, 255)
    q = np.clip(np.rint(x / scale) + zp, 0, 255)
    return (q - zp) * scale


def quantize_model(model: ModelProto, activations: dict[str, np.ndarray]) -> tuple[ModelProto, dict]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    found, notes = candidates(model)
    originals = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name in found}
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # "Please consider to run pre-processing before quantization"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out_path = Path(tmp) / "int8.onnx"
            quantize_dynamic(model, out_path, per_channel=True, weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"])
            out = onnx.load(str(out_path))
    except Exception as exc:
        raise CompileError(f"onnxruntime quantize_dynamic failed: {type(exc).__name__}: {exc}") from exc
    finally:
        root.setLevel(level)
    inits = {t.name: t for t in out.graph.initializer}
    layers = []
    for w_name, consumers in found.items():
        w = originals[w_name].astype(np.float64)
        record = {"weight": w_name, "nodes": [n.name or n.output[0] for n in consumers], "shape": list(w.shape)}
        q_t, s_t, z_t = (inits.get(f"{w_name}_quantized"), inits.get(f"{w_name}_scale"),
                         inits.get(f"{w_name}_zero_point"))
        if q_t is None or s_t is None:
            record.update(format="float32", note="quantize_dynamic left this weight in FP32")
            notes.append(f"{w_name}: quantize_dynamic left it in FP32")
            layers.append(record)
            continue
        q = numpy_helper.to_array(q_t).astype(np.float64)
        scale = numpy_helper.to_array(s_t).astype(np.float64)
        zp = numpy_helper.to_array(z_t).astype(np.float64) if z_t is not None else 0.0
        if np.ndim(scale) == 1 and scale.shape[0] == w.shape[1]:
            deq = (q - zp) * scale[None, :]
        else:
            deq = (q - np.reshape(zp, (-1, 1) if np.ndim(zp) else ())) * np.reshape(scale, (-1, 1) if np.ndim(scale) else ())
        record.update(format="int8", scale=SCALE_LAYOUT, stored_as={"weight": q_t.name, "scale": s_t.name},
                      weight_rel_error={"int8": _rel(w - deq, w)})
        xs = [activations[n.input[0]].reshape(-1, w.shape[0]) for n in consumers if n.input[0] in activations]
        if xs:
            x = np.concatenate(xs).astype(np.float64)
            ref = x @ w
            record["output_rel_error"] = {"int8": _rel(ref - _fake_quant_rows(x) @ deq, ref)}
            record["chosen_by"] = f"fixed (int8); errors on {x.shape[0]} calibration rows"
        layers.append(record)
    return out, {"layers": layers, "notes": notes}
