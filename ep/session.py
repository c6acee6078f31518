"""`Session`: one ONNX Runtime session per model, with provider choice, placement report, FP8
handling and pre-bound IOBinding; `ModelRunner`: the daemon's one-input/one-output model on top.

Call path: input and output numpy arrays are allocated once and bound through IOBinding (OrtValues
that share their memory), so a call is: write the input array in place, `run()`, read the output
array. `Binding.run` is the pybind `run_with_iobinding` and nothing else (a RunOptions argument
costs ~25 us; the public wrapper's WebGPU capture bookkeeping ~0.3 us).

FP8, plainly: no CPU has FP8 arithmetic, and no provider this layer configures computes in FP8.
An FP8 artifact is loaded with `session.disable_quant_qdq=1`, so ORT folds every
`DequantizeLinear(float8)` into an FP32 weight at load and runs FP32 kernels: FP8 makes the file
(and the download, and the measured artifact) 4x smaller; RAM and speed are FP32. `Session.notes`
says so for each session that does it. An artifact compiled with `--compute int8-blocks` instead
has its large FP8 layers re-quantized at load to int8 blocks run by MatMulNBits (`ep.lowering`):
int8 arithmetic, with the error measured by compile through the same lowering.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import onnxruntime as ort

from . import capi
from . import providers as prov
from .artifact import resolve_model
from .errors import ModelLoadError

WARMUP_RUNS = 3
FP8_NOTE = ("FP8 weights folded to FP32 at load (session.disable_quant_qdq=1): {provider} has no FP8 "
            "arithmetic here, so FP8 is storage only; compute and RAM are FP32")


def sha256_file(path: str | Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def runtime_model(data: bytes, manifest) -> bytes:
    """The graph a session runs for `data` (merged artifact bytes): the manifest's `runtime.compute`
    applied (`ep.lowering`), or `data` unchanged. `compile` measures accuracy on the same bytes."""
    compute = manifest.compute if manifest is not None else None
    if not compute or compute.get("mode") == "fp32":
        return data
    from .lowering import lower

    return lower(data, compute)


def session_options(threads: int = 1, fp8_storage: bool = False, arena: bool = True) -> ort.SessionOptions:
    """The options every SITS session uses; `fp8_storage` folds float8 DequantizeLinear at load;
    `arena=False` turns ORT's CPU memory arena off (`ep.Session` does: intermediates of a batch-1 call
    are a few KiB, and malloc/free for them is ~0.2 us per call cheaper than the arena's bookkeeping)."""
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = arena
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.log_severity_level = 3
    if fp8_storage:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    return so


class Binding:
    """Buffers bound once to a session: `run()` reads the bound inputs and writes the bound outputs in
    place. A name in both `inputs` and `outputs` with the same array is one shared OrtValue (in-place
    KV: past and present are the same memory)."""

    def __init__(self, session: ort.InferenceSession, inputs: dict[str, np.ndarray],
                 outputs: dict[str, np.ndarray]) -> None:
        self._session = session
        self.inputs, self.outputs = inputs, outputs
        self._io = session.io_binding()
        values: dict[int, ort.OrtValue] = {}

        def value(a: np.ndarray) -> ort.OrtValue:
            if not a.flags.c_contiguous:
                raise ModelLoadError("a bound buffer must be C-contiguous (ORT reads it in place)")
            key = id(a)
            if key not in values:  # one OrtValue per array: shared past/present stay one buffer
                values[key] = ort.OrtValue.ortvalue_from_numpy(a)
            return values[key]

        for name, a in inputs.items():
            self._io.bind_ortvalue_input(name, value(a))
        for name, a in outputs.items():
            self._io.bind_ortvalue_output(name, value(a))
        self._values = values  # keep the OrtValues (and so the arrays) alive as long as the binding
        # The public InferenceSession.run_with_iobinding adds WebGPU graph-capture bookkeeping per call
        # (~0.3 us here); the pybind call under it is the same run. Fall back when a build lacks it.
        c_session, c_binding = getattr(session, "_sess", None), getattr(self._io, "_iobinding", None)
        if c_session is not None and c_binding is not None and hasattr(c_session, "run_with_iobinding"):
            self.run = functools.partial(c_session.run_with_iobinding, c_binding, None)

    def run(self) -> None:
        self._session.run_with_iobinding(self._io)

    def warm_up(self, runs: int = WARMUP_RUNS) -> None:
        """`runs` calls before the first real one (first-call allocations, page faults, caches)."""
        for _ in range(runs):
            self.run()


class Session:
    """One ORT session for `model`: an .onnx file, an artifact directory (`sitsctl compile`, verified)
    or ONNX bytes. `policy` picks the execution provider (`ep.providers`); `threads` intra-op threads
    (1 by default: one frame, one core, no thread-pool wake-ups).

    After construction: `choice` (provider, device, how chosen), `placement` (provider -> nodes, as
    ORT assigned them), `fp8_folded` and `notes` (plain statements about what runs how), `sha256`
    (file or artifact hash), `manifest` (artifacts), `compute` (the manifest's `runtime.compute`:
    an `int8-blocks` artifact has its large FP8 layers re-quantized at load, `ep.lowering`).
    ORT's CPU memory arena is off: measured ~0.4 us per call faster with MatMulNBits (its per-call
    workspace), neutral for FP32 MLPs and the streaming model."""

    def __init__(self, model: str | Path | bytes, *, policy: str = "auto", threads: int = 1,
                 expected_sha256: str | None = None, fp8_storage: bool | None = None,
                 provider_options: dict[str, str] | None = None, use_device_api: bool | None = None,
                 label: str | None = None, held_gil: bool = False) -> None:
        if isinstance(model, (bytes, bytearray)):
            data, self.path, self.manifest = bytes(model), None, None
            self.sha256 = hashlib.sha256(data).digest()
            if expected_sha256 is not None and self.sha256.hex() != expected_sha256.lower():
                raise ModelLoadError(f"model bytes: SHA-256 {self.sha256.hex()} differs from the expected "
                                     f"{expected_sha256.lower()}")
        else:
            self.path = Path(model)
            data, self.sha256, self.manifest = resolve_model(self.path, expected_sha256)
        self.label = label or (str(self.path) if self.path is not None else "model bytes")
        self.fp8_folded = bool(self.manifest is not None and self.manifest.fp8) if fp8_storage is None else fp8_storage
        self.choice = prov.choose_provider(policy, use_device_api=use_device_api)
        self.compute = self.manifest.compute if self.manifest is not None else None
        if self.compute and self.compute.get("mode") != "fp32":
            data = runtime_model(data, self.manifest)
        so = session_options(threads, fp8_storage=self.fp8_folded, arena=False)
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        self._pybind_args = (so, prov.apply(self.choice, so, provider_options))
        self._session: ort.InferenceSession | None = self._pybind_session(data)
        self.pybind_released = False
        self.placement = prov.node_placement(self._session)
        self._providers = self._session.get_providers()
        self.notes = [f"provider: {self.choice.describe()}"]
        # `held_gil`: also a session of the same bytes through ORT's C API, whose run keeps the GIL (ep.capi)
        self.capi: capi.CpuSession | None = None
        self.capi_error = "not asked for" if not held_gil else ""
        if held_gil and self.choice.provider != prov.CPU:
            self.capi_error = f"the C API path runs the CPU execution provider only ({self.choice.provider} chosen)"
        elif held_gil:
            self.capi_error = capi.load_error()
            if not self.capi_error:
                try:
                    self.capi = capi.CpuSession(data, threads, fp8_storage=self.fp8_folded)
                except capi.CApiError as exc:
                    self.capi_error = str(exc)
        if self.compute and self.compute.get("mode") != "fp32":
            from .lowering import describe

            self.notes.append(describe(self.compute))
        elif self.fp8_folded:
            self.notes.append(FP8_NOTE.format(provider=self.choice.provider))
        if self.placement:
            self.notes.append("nodes: " + "; ".join(f"{p} {len(n)}" for p, n in self.placement.items()))

    def _pybind_session(self, data: bytes) -> ort.InferenceSession:
        so, providers = self._pybind_args
        try:
            return ort.InferenceSession(data, so, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/InvalidProtobuf types
            raise ModelLoadError(f"model {self.label}: ONNX Runtime cannot load it on "
                                 f"{self.choice.provider}: {exc}") from exc

    @property
    def session(self) -> ort.InferenceSession:
        """The pybind `InferenceSession`. After `release_pybind` it is made again on first use, from the
        file read and verified again (`ModelLoadError` if its bytes are no longer the ones loaded)."""
        if self._session is None:
            data, _, manifest = resolve_model(self.path, self.sha256.hex())
            if self.compute and self.compute.get("mode") != "fp32":
                data = runtime_model(data, manifest)
            self._session = self._pybind_session(data)
        return self._session

    def release_pybind(self) -> bool:
        """Frees the pybind session when the C API session (`capi`) runs this model: each ORT session holds
        its own copy of the weights, so keeping both doubles the model's memory (and a hot swap keeps the
        previous model loaded too). Only for a model loaded from a path; True if released."""
        if self.capi is None or self.path is None or self._session is None:
            return False
        self._session = None
        self.pybind_released = True
        return True

    @property
    def providers(self) -> list[str]:
        return list(self._providers)

    def run(self, feeds: dict[str, np.ndarray], names: list[str] | None = None) -> list[np.ndarray]:
        """A plain `InferenceSession.run` (allocates its outputs; for checks, not the fast path)."""
        return self.session.run(names, feeds)

    def bind(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> Binding:
        return Binding(self.session, inputs, outputs)

    def report(self) -> str:
        """Multi-line: provider, FP8 handling, and the nodes on each provider."""
        lines = list(self.notes)
        for p, nodes in self.placement.items():
            lines.append(f"  {p}: {', '.join(nodes)}")
        return "\n".join(lines)


class ModelRunner:
    """`path` is an ONNX file or an artifact directory made by `sitsctl compile` (`ep.artifact`).

    For a file, `sha256` is the SHA-256 of its bytes. For an artifact, every hash is verified first
    (`ep.artifact.load_artifact`, `ArtifactError` naming the file or chunk at fault), `sha256` is the
    artifact SHA-256 defined by the manifest, and `manifest` holds it. FP8 artifacts are folded to
    FP32 at load (see the module doc). The session is an `ep.Session` (`self.ep`: `choice`,
    `placement`, `notes`): provider by `policy`, one intra-op thread by default, a self-test and a
    warm-up before the first frame. `policy` defaults to "cpu", the daemon's choice on a control box
    (`model.provider` in the config; `ep.providers`): every caller that does not pass one (hot swap,
    persisted models, replay) gets the CPU EP, never an accelerator by surprise.
    """

    def __init__(self, path: str | Path, n_inputs: int, n_outputs: int, threads: int = 1,
                 expected_sha256: str | None = None, policy: str = "cpu") -> None:
        self.path = Path(path)
        self.ep = Session(self.path, policy=policy, threads=threads, expected_sha256=expected_sha256, held_gil=True)
        self.sha256, self.manifest = self.ep.sha256, self.ep.manifest
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
        self._binding = self.ep.bind({self.input_name: self.input}, {self.output_name: self.output})
        self._run = self._binding.run
        self.run_path = f"pybind run_with_iobinding, GIL released ({self.ep.capi_error})"
        if self.ep.capi is not None:  # the loop's call keeps the GIL (ep.capi); checked against pybind below
            self._run = self.ep.capi.bind(self.input_name, self.input, self.output_name, self.output)
            self.run_path = f"ONNX Runtime C API {self.ep.capi.version}, GIL held"
        self._self_test()
        for _ in range(WARMUP_RUNS):  # first-call allocations, page faults, caches: before the first frame
            self._run()
        if self._run is not self._binding.run:  # the C session runs the frames: pybind's copy of the weights goes
            self._binding = None
            self.ep.release_pybind()

    @property
    def session(self) -> ort.InferenceSession:
        """The pybind session, for checks and batched replays (not the frame path); made again on first use
        when the C API session runs the frames (`ep.Session.release_pybind`)."""
        return self.ep.session

    def _self_test(self) -> None:
        rng = np.random.default_rng(0)
        self.input[:] = rng.standard_normal(self.input.shape).astype(np.float32)
        expected = self.session.run([self.output_name], {self.input_name: self.input.copy()})[0]
        if self._run is not self._binding.run:  # the C API session: it must give what pybind gives, else unused
            try:
                self._run()
                why = "" if np.allclose(expected, self.output, rtol=1e-5, atol=1e-6) else (
                    f"its output {self.output.ravel()[:4]} differs from pybind's {expected.ravel()[:4]}")
            except capi.CApiError as exc:
                why = str(exc)
            if why:
                self._run = self._binding.run
                self.run_path = f"pybind run_with_iobinding, GIL released (the C API session failed its check: {why})"
                self.ep.capi.close()  # not used: its memory back
                self.ep.capi = None
        self.run()
        if not np.allclose(expected, self.output, rtol=1e-5, atol=1e-6):
            raise ModelLoadError(f"model {self.path}: pre-bound output differs from a plain run "
                                 f"({self.output.ravel()[:4]} vs {expected.ravel()[:4]})")
        if not np.all(np.isfinite(self.output)):
            raise ModelLoadError(f"model {self.path}: produces non-finite outputs on a test input")
        self.input[:] = 0.0

    def run(self) -> np.ndarray:
        """Runs on `self.input`; the result is in `self.output` (also returned)."""
        self._run()
        return self.output
