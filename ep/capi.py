"""The loop's model call through ONNX Runtime's C API, keeping the GIL.

The pybind `run_with_iobinding` releases the GIL for every run (a 10-50 µs model). On the control loop's thread
that is a GIL hand-off in the middle of each frame: a Python thread that is runnable then (a hot swap preparing,
the asyncio thread) takes the GIL, and the loop waits for it back for up to a switch interval plus the time the
kernel takes to wake it. Measured on the 2-core box with a Python thread spinning next to it: 2000 runs took
98 s with a 0.1 s switch interval (each release lost the GIL for ~50 ms on average), against 11 µs per run alone.

The onnxruntime wheel ships the C library next to its pybind module (`onnxruntime/capi/libonnxruntime.so.*`, the
same version). `CpuSession` creates a second session of the same model bytes through it, with the options
`ep.session.session_options` gives the pybind one (one intra-op and one inter-op thread, sequential, extended
graph optimisations, no CPU arena; FP8 storage folded at load), and `bind` returns a callable that runs it on
caller-owned numpy buffers through `ctypes.PYFUNCTYPE`: the call keeps the GIL. CPU execution provider only.

`OrtApi` is a table of function pointers whose order ONNX Runtime never changes (new entries are appended;
`GetApi(version)` returns NULL for a version the library does not have). The indices below are from
`onnxruntime_c_api.h`. Every session made here is checked against the pybind session on a test input by
`ep.session.ModelRunner` before it runs a frame, which then frees the pybind session (one copy of the weights
per loaded model); where the library is missing or refuses, `load_error()` says why and the runner keeps the
pybind call (correct, only GIL-releasing).
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from pathlib import Path

import numpy as np

API_VERSION = 17  # ORT 1.17: every entry used here is older; GetApi returns NULL on a library without it
ENV_DISABLE = "SITS_MODEL_RELEASES_GIL"  # "1": run the model through pybind (comparisons, diagnosis)

# OrtApi indices (onnxruntime_c_api.h; "End of Version 1" is index 101; AddSessionConfigEntry came later, at 130)
_GET_ERROR_MESSAGE = 2
_CREATE_ENV = 3
_CREATE_SESSION_FROM_ARRAY = 8
_RUN = 9
_CREATE_SESSION_OPTIONS = 10
_SET_EXECUTION_MODE = 13
_DISABLE_CPU_MEM_ARENA = 19
_SET_LOG_SEVERITY = 22
_SET_GRAPH_OPTIMIZATION = 23
_SET_INTRA_OP_THREADS = 24
_SET_INTER_OP_THREADS = 25
_SESSION_INPUT_COUNT = 30
_SESSION_OUTPUT_COUNT = 31
_CREATE_TENSOR_WITH_DATA = 49
_CREATE_CPU_MEMORY_INFO = 69
_RELEASE_ENV = 92
_RELEASE_STATUS = 93
_RELEASE_MEMORY_INFO = 94
_RELEASE_SESSION = 95
_RELEASE_VALUE = 96
_RELEASE_SESSION_OPTIONS = 100
_ADD_SESSION_CONFIG_ENTRY = 130

_LOG_ERROR = 3  # ORT_LOGGING_LEVEL_ERROR
_SEQUENTIAL = 0  # ORT_SEQUENTIAL
_ENABLE_EXTENDED = 2  # ORT_ENABLE_EXTENDED
_DEVICE_ALLOCATOR = 0  # OrtDeviceAllocator
_MEM_DEFAULT = 0  # OrtMemTypeDefault
_FLOAT = 1  # ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)


class CApiError(RuntimeError):
    """ONNX Runtime's C API refused a call (the message is ORT's)."""


class _Api:
    """The library, its OrtApi table and one OrtEnv (process lifetime)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.PyDLL(path)
        base_fn = self.lib.OrtGetApiBase
        base_fn.restype = ctypes.POINTER(_P * 2)  # struct OrtApiBase {GetApi, GetVersionString}
        base = base_fn().contents
        get_api = ctypes.PYFUNCTYPE(_P, ctypes.c_uint32)(base[0])
        version = ctypes.PYFUNCTYPE(ctypes.c_char_p)(base[1])
        self.version = version().decode()
        table = get_api(API_VERSION)
        if not table:
            raise CApiError(f"{path} (ONNX Runtime {self.version}) has no C API version {API_VERSION}")
        self._table = ctypes.cast(table, ctypes.POINTER(_P * (_ADD_SESSION_CONFIG_ENTRY + 1))).contents
        st = _P  # OrtStatus*: NULL on success
        self.get_error_message = self._fn(_GET_ERROR_MESSAGE, ctypes.c_char_p, _P)
        self.release_status = self._fn(_RELEASE_STATUS, None, _P)
        self.create_env = self._fn(_CREATE_ENV, st, ctypes.c_int, ctypes.c_char_p, _PP)
        self.create_session_from_array = self._fn(_CREATE_SESSION_FROM_ARRAY, st, _P, ctypes.c_char_p,
                                                  ctypes.c_size_t, _P, _PP)
        self.run = self._fn(_RUN, st, _P, _P, ctypes.POINTER(ctypes.c_char_p), _PP, ctypes.c_size_t,
                            ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, _PP, keep_gil=True)
        self.create_session_options = self._fn(_CREATE_SESSION_OPTIONS, st, _PP)
        self.set_execution_mode = self._fn(_SET_EXECUTION_MODE, st, _P, ctypes.c_int)
        self.disable_cpu_mem_arena = self._fn(_DISABLE_CPU_MEM_ARENA, st, _P)
        self.set_log_severity = self._fn(_SET_LOG_SEVERITY, st, _P, ctypes.c_int)
        self.set_graph_optimization = self._fn(_SET_GRAPH_OPTIMIZATION, st, _P, ctypes.c_int)
        self.set_intra_op_threads = self._fn(_SET_INTRA_OP_THREADS, st, _P, ctypes.c_int)
        self.set_inter_op_threads = self._fn(_SET_INTER_OP_THREADS, st, _P, ctypes.c_int)
        self.session_input_count = self._fn(_SESSION_INPUT_COUNT, st, _P, ctypes.POINTER(ctypes.c_size_t))
        self.session_output_count = self._fn(_SESSION_OUTPUT_COUNT, st, _P, ctypes.POINTER(ctypes.c_size_t))
        self.create_tensor_with_data = self._fn(_CREATE_TENSOR_WITH_DATA, st, _P, _P, ctypes.c_size_t,
                                                ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.c_int, _PP)
        self.create_cpu_memory_info = self._fn(_CREATE_CPU_MEMORY_INFO, st, ctypes.c_int, ctypes.c_int, _PP)
        self.release_env = self._fn(_RELEASE_ENV, None, _P)
        self.release_memory_info = self._fn(_RELEASE_MEMORY_INFO, None, _P)
        self.release_session = self._fn(_RELEASE_SESSION, None, _P)
        self.release_value = self._fn(_RELEASE_VALUE, None, _P)
        self.release_session_options = self._fn(_RELEASE_SESSION_OPTIONS, None, _P)
        self.add_session_config_entry = self._fn(_ADD_SESSION_CONFIG_ENTRY, st, _P, ctypes.c_char_p, ctypes.c_char_p)
        self.env = _P()
        self.check(self.create_env(_LOG_ERROR, b"sits2026", ctypes.byref(self.env)), "CreateEnv")
        self.memory_info = _P()
        self.check(self.create_cpu_memory_info(_DEVICE_ALLOCATOR, _MEM_DEFAULT, ctypes.byref(self.memory_info)),
                   "CreateCpuMemoryInfo")

    def _fn(self, index: int, restype, *argtypes, keep_gil: bool = False):
        """Entry `index` of the table as a callable. Only Run keeps the GIL (PYFUNCTYPE): the loop's call is
        shorter than a GIL hand-off. Everything else releases it (CFUNCTYPE): creating a session optimises the
        graph for milliseconds on the preparing thread, and the loop must not wait for that."""
        address = self._table[index]
        if not address:
            raise CApiError(f"OrtApi entry {index} is NULL in {self.path}")
        return (ctypes.PYFUNCTYPE if keep_gil else ctypes.CFUNCTYPE)(restype, *argtypes)(address)

    def check(self, status, what: str) -> None:
        if status:
            message = (self.get_error_message(status) or b"").decode(errors="replace")
            self.release_status(status)
            raise CApiError(f"{what}: {message}")


_api: _Api | None = None
_api_error = ""
_api_lock = threading.Lock()


def library_path() -> str | None:
    """The C library shipped with the imported onnxruntime package (same version), None when it ships none."""
    import onnxruntime

    capi = Path(onnxruntime.__file__).resolve().parent / "capi"
    want = capi / f"libonnxruntime.so.{onnxruntime.__version__}"
    if want.exists():
        return str(want)
    def version_key(path: str) -> tuple:
        tail = path.rsplit(".so", 1)[-1].lstrip(".")
        return tuple(int(p) if p.isdigit() else -1 for p in tail.split(".")) if tail else ()

    found = sorted(glob.glob(str(capi / "libonnxruntime.so*")), key=version_key)
    return found[-1] if found else None


def api() -> _Api | None:
    global _api, _api_error
    with _api_lock:
        if _api is None and not _api_error:
            path = library_path()
            if path is None:
                _api_error = "the onnxruntime package ships no libonnxruntime.so next to its pybind module"
            else:
                try:
                    _api = _Api(path)
                except (OSError, AttributeError, CApiError) as exc:
                    _api_error = f"cannot use {path}: {exc}"
        return _api


def load_error() -> str:
    """Why the C API path is not available ("" when it is)."""
    if os.environ.get(ENV_DISABLE) == "1":
        return f"{ENV_DISABLE}=1 in the environment"
    return "" if api() is not None else _api_error


class CpuSession:
    """One ORT session on the CPU execution provider, made through the C API from the model's bytes."""

    def __init__(self, data: bytes, threads: int = 1, fp8_storage: bool = False) -> None:
        a = api()
        if a is None:
            raise CApiError(_api_error)
        self._api = a
        self._lock = threading.Lock()  # close() never frees the session under a run, nor before a bound run's check
        self._values: list[tuple] = []  # (OrtValue, the numpy array whose memory it wraps)
        self._handle = _P()
        opts = _P()
        a.check(a.create_session_options(ctypes.byref(opts)), "CreateSessionOptions")
        try:
            a.check(a.disable_cpu_mem_arena(opts), "DisableCpuMemArena")
            a.check(a.set_intra_op_threads(opts, threads), "SetIntraOpNumThreads")
            a.check(a.set_inter_op_threads(opts, 1), "SetInterOpNumThreads")
            a.check(a.set_execution_mode(opts, _SEQUENTIAL), "SetSessionExecutionMode")
            a.check(a.set_graph_optimization(opts, _ENABLE_EXTENDED), "SetSessionGraphOptimizationLevel")
            a.check(a.set_log_severity(opts, _LOG_ERROR), "SetSessionLogSeverityLevel")
            if fp8_storage:
                a.check(a.add_session_config_entry(opts, b"session.disable_quant_qdq", b"1"), "AddSessionConfigEntry")
            a.check(a.create_session_from_array(a.env, data, len(data), opts, ctypes.byref(self._handle)),
                    "CreateSessionFromArray")
        finally:
            a.release_session_options(opts)
        n_in, n_out = ctypes.c_size_t(), ctypes.c_size_t()
        a.check(a.session_input_count(self._handle, ctypes.byref(n_in)), "SessionGetInputCount")
        a.check(a.session_output_count(self._handle, ctypes.byref(n_out)), "SessionGetOutputCount")
        self.n_inputs, self.n_outputs = n_in.value, n_out.value
        self.version = a.version

    def _tensor(self, a: np.ndarray):
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise CApiError("a bound buffer must be a C-contiguous float32 array (ORT reads and writes it in place)")
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        value = _P()
        self._api.check(self._api.create_tensor_with_data(self._api.memory_info, a.ctypes.data, a.nbytes, shape,
                                                          a.ndim, _FLOAT, ctypes.byref(value)),
                        "CreateTensorWithDataAsOrtValue")
        self._values.append((value, a))  # the OrtValue and the array it points into live as long as the session
        return value

    def bind(self, input_name: str, inp: np.ndarray, output_name: str, out: np.ndarray):
        """A callable running the session on `inp`, writing `out` in place; raises CApiError with ORT's message."""
        a = self._api
        if self._handle is None:
            raise CApiError("the session is closed")
        in_names = (ctypes.c_char_p * 1)(input_name.encode())
        out_names = (ctypes.c_char_p * 1)(output_name.encode())
        in_vals = (_P * 1)(self._tensor(inp))
        out_vals = (_P * 1)(self._tensor(out))
        run, check, lock, session = a.run, a.check, self._lock, self  # the closure keeps the session alive

        def run_bound() -> None:  # ORT writes into the caller's output value (non-NULL in out_vals)
            with lock:
                handle = session._handle
                if handle is None:
                    raise CApiError("Run: the session is closed")
                status = run(handle, None, in_names, in_vals, 1, out_names, 1, out_vals)
            if status:
                check(status, "Run")

        return run_bound

    def close(self) -> None:
        with self._lock:
            a, handle, self._handle = self._api, self._handle, None
            values, self._values = self._values, []
        for value, _ in values:
            a.release_value(value)
        if handle:
            a.release_session(handle)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
