"""`sitsctl compile`: ONNX model -> verified artifact directory (optimized graph, FP8/int8 weights in
a zstd container, manifest with hashes and an accuracy report). Needs `onnx` and `ml_dtypes`; the
runtime side (`ep.artifact`, `ep.session.ModelRunner`) needs neither."""
from ..errors import CompileError
from .graph import count_ops
from .fp8 import Fp8Decision, choose_fp8_format, quantize_fp8
from .pipeline import KV_CACHE_POLICIES, MODES, TARGETS, compile_model
from .cli import main

__all__ = ["CompileError", "Fp8Decision", "KV_CACHE_POLICIES", "MODES", "TARGETS", "choose_fp8_format",
           "compile_model", "count_ops", "main", "quantize_fp8"]
