"""One ONNX Runtime session per model, called from one thread with pre-bound buffers.

The input and output numpy arrays are allocated once and bound to the session through
IOBinding (OrtValues that share their memory), so a call is: write the input array in
place, `run()`, read the output array. A self-test at load compares that path with a plain
`InferenceSession.run` so a binding that silently copies would be caught before serving.
The model is a plain .onnx file or an artifact directory from `sitsctl compile` (`ep.artifact`).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .artifact import resolve_model
from .errors import ModelLoadError


def sha256_file(path: str | Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def session_options(threads: int = 1, fp8_storage: bool = False) -> ort.SessionOptions:
    """The options every SITS session uses; `fp8_storage` folds float8 DequantizeLinear at load."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.log_severity_level = 3
    if fp8_storage:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    return so


class ModelRunner:
    """`path` is an ONNX file or an artifact directory made by `sitsctl compile` (`ep.artifact`).

    For a file, `sha256` is the SHA-256 of its bytes. For an artifact, every hash is verified first
    (`ep.artifact.load_artifact`, `ArtifactError` naming the file or chunk at fault), `sha256` is the
    artifact SHA-256 defined by the manifest, and `manifest` holds it. FP8 is storage here: FP8
    artifacts are loaded with `session.disable_quant_qdq=1`, so ONNX Runtime folds each
    `DequantizeLinear(float8)` into an FP32 weight at load and runs FP32 kernels (FP32 speed and RAM;
    the CPU has no FP8 arithmetic); the FP8 format only makes the file smaller.
    """

    def __init__(self, path: str | Path, n_inputs: int, n_outputs: int, threads: int = 1,
                 expected_sha256: str | None = None) -> None:
        self.path = Path(path)
        data, self.sha256, self.manifest = resolve_model(self.path, expected_sha256)
        so = session_options(threads, fp8_storage=self.manifest is not None and self.manifest.fp8)
        try:
            self.session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/InvalidProtobuf types
            raise ModelLoadError(f"model {self.path}: ONNX Runtime cannot load it: {exc}") from exc
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1:
            raise ModelLoadError(f"model {self.path}: needs exactly one input and one output tensor, "
                                 f"has {len(inputs)} and {len(outputs)}")
        self.input_name, self.output_name = inputs[0].name, outputs[0].name
        for what, arg, n in (("input", inputs[0], n_inputs), ("output", outputs[0], n_outputs)):
            if arg.type != "tensor(float)":
                raise ModelLoadError(f"model {self.path}: {what} {arg.name!r} is {arg.type}, expected tensor(float)")
            shape = arg.shape
            if len(shape) != 2 or shape[1] != n:
                raise ModelLoadError(f"model {self.path}: {what} {arg.name!r} has shape {shape}, "
                                     f"the config declares [batch, {n}] ({n} {what} signals)")
        self.input = np.zeros((1, n_inputs), dtype=np.float32)
        self.output = np.zeros((1, n_outputs), dtype=np.float32)
        self._binding = self.session.io_binding()
        self._binding.bind_ortvalue_input(self.input_name, ort.OrtValue.ortvalue_from_numpy(self.input))
        self._binding.bind_ortvalue_output(self.output_name, ort.OrtValue.ortvalue_from_numpy(self.output))
        self._self_test()

    def _self_test(self) -> None:
        rng = np.random.default_rng(0)
        self.input[:] = rng.standard_normal(self.input.shape).astype(np.float32)
        expected = self.session.run([self.output_name], {self.input_name: self.input.copy()})[0]
        self.run()
        if not np.allclose(expected, self.output, rtol=1e-5, atol=1e-6):
            raise ModelLoadError(f"model {self.path}: pre-bound output differs from a plain run "
                                 f"({self.output.ravel()[:4]} vs {expected.ravel()[:4]})")
        if not np.all(np.isfinite(self.output)):
            raise ModelLoadError(f"model {self.path}: produces non-finite outputs on a test input")
        self.input[:] = 0.0

    def run(self) -> np.ndarray:
        """Runs on `self.input`; the result is in `self.output` (also returned)."""
        self.session.run_with_iobinding(self._binding)  # a RunOptions argument costs ~25 us here
        return self.output
