"""Loading and calling one module: source (.wat/.wasm) -> verified compiled code (the .cwasm cache)
-> self-test (the `selftest` export, then the golden vectors on a canary instance) -> a serving instance
with numpy views on its input and output slots and a call path without per-call argument conversion.

The fast path calls `wasmtime_func_call` directly with preallocated result/trap slots (`process`
takes no arguments: everything crosses in linear memory), and sets fuel and the epoch deadline
through the C API: ~3 µs per call instead of tens of µs for `Func.__call__`. It uses wasmtime-py
internals (`_ffi`, `_bindings`, `Store._context`, `Func._func`), so the wasmtime version is pinned.
With the native epoch ticker (sitsd/_native.c) those three C calls go through `ctypes.PyDLL`, which keeps
the GIL: a ctypes.CDLL call releases it and takes it back, and each release let any other Python thread in
(the epoch ticker 2000 times a second, a preparation), the loop thread then waiting for the GIL up to the
switch interval. Without the native ticker they release the GIL, because the Python ticker needs it to
interrupt a runaway call.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import wasmtime
from wasmtime import _bindings, _ffi as ffi

from . import abi
from .cache import CwasmCache, default_cache_dir
from .engine import EpochTicker, engine_fingerprint, make_engine
from .errors import CacheIntegrityError, ModuleTrap, SelfTestError, WasmError

REQUIRED_EXPORTS = ("memory", "process", "version", "selftest")
_FAST_PATH_CALLS = ("wasmtime_context_set_fuel", "wasmtime_context_set_epoch_deadline", "wasmtime_func_call")


def _fast_path_calls(keep_gil: bool) -> tuple:
    """The C functions of the fast path, as ctypes function objects (no wasmtime-py wrapper in between):
    from ctypes.PyDLL (the GIL stays held) or from wasmtime-py's CDLL (released during the call)."""
    if not keep_gil:
        return tuple(getattr(_bindings, "_" + name) for name in _FAST_PATH_CALLS)
    lib = ctypes.PyDLL(ffi.dll._name)  # the library wasmtime-py loaded: the same handle
    out = []
    for name in _FAST_PATH_CALLS:
        ref, fn = getattr(_bindings, "_" + name), getattr(lib, name)
        fn.argtypes, fn.restype = ref.argtypes, ref.restype
        out.append(fn)
    return tuple(out)
LOAD_CALL_FUEL = 10_000_000  # `version` and `selftest` at load time
LOAD_CALL_DEADLINE_MS = 1000.0


@dataclass(frozen=True, slots=True)
class Limits:
    """Per call: a wall-clock deadline (epoch) and an instruction budget (fuel); per store: memory."""

    deadline_ms: float = 5.0  # a wall-clock backstop: preemption counts too, so keep it generous
    fuel: int | None = 1_000_000  # ~1 ms of work; None (tests only: the config requires fuel) leaves the epoch
    # deadline alone, which a SCHED_FIFO ticker on the loop's CPU cannot enforce (wasm_modules/ABI.md)
    memory_bytes: int = 4 * abi.PAGE
    # table elements per store (all tables together): `table.grow` past it returns -1, and a module declaring a
    # bigger table is refused at load. Unlimited, one `table.grow` per call took ~1.5 GB of host memory in 300 calls
    table_elements: int = 10_000


def golden_path(source: Path) -> Path:
    return source.with_name(source.name.rsplit(".", 1)[0] + ".golden.json")


def read_source(path: Path, expected_file_sha256: str | None = None) -> bytes:
    """The wasm bytes of a .wasm file, or of a .wat file through wasmtime's own WAT parser. With
    `expected_file_sha256` (the hash a signature check covered) the file is read once and refused unless its
    bytes have that hash, so what is compiled is what was checked, even if the file is replaced meanwhile."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WasmError(f"module {path}: cannot read it: {exc.strerror}") from None
    if expected_file_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_file_sha256:
        raise WasmError(f"module {path}: the file changed after its signature was checked (SHA-256 "
                        f"{hashlib.sha256(data).hexdigest()[:16]}…, checked {expected_file_sha256[:16]}…); refused")
    return source_wasm(path, data)


def source_wasm(path: Path, data: bytes) -> bytes:
    """The wasm bytes of a module file's bytes `data` already read (a .wat through wasmtime's WAT parser): for a
    caller that hashes the file bytes itself (a signature covers those) and must convert the very same bytes."""
    path = Path(path)
    if path.suffix == ".wat" or not data.startswith(b"\0asm"):
        try:
            return bytes(wasmtime.wat2wasm(data.decode()))
        except (UnicodeDecodeError, wasmtime.WasmtimeError) as exc:
            raise WasmError(f"module {path}: neither a wasm binary nor valid WAT: {str(exc).splitlines()[0]}") from None
    return data


class ModuleInstance:
    """One instance in its own store. `input`/`output` are float64 views on linear memory; `process()`
    runs the module on `input` and leaves the result in `output` (raises ModuleTrap). One thread calls it."""

    def __init__(self, host: "WasmHost", module: wasmtime.Module, label: str, limits: Limits) -> None:
        self.label = label
        self._fuel = limits.fuel if limits.fuel is not None else (1 << 62)
        self._load_ticks = host.deadline_ticks(LOAD_CALL_DEADLINE_MS)
        self.store = wasmtime.Store(host.engine)
        self.store.set_limits(memory_size=limits.memory_bytes, table_elements=limits.table_elements, instances=1,
                              tables=1, memories=1)
        try:
            self.instance = wasmtime.Instance(self.store, module, [])
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            raise WasmError(f"{label}: cannot instantiate: {str(exc).splitlines()[0]} (modules import nothing and "
                            f"need at most {limits.memory_bytes // abi.PAGE} pages of memory, one table of at most "
                            f"{limits.table_elements} elements)") from None
        exports = self.instance.exports(self.store)
        missing = [n for n in REQUIRED_EXPORTS if n not in exports]
        if missing:
            raise WasmError(f"{label}: missing exports {', '.join(missing)}; see wasm_modules/ABI.md")
        memory = exports["memory"]
        if not isinstance(memory, wasmtime.Memory):
            raise WasmError(f"{label}: export `memory` is not a memory; see wasm_modules/ABI.md")
        for fname, params in (("process", 0), ("version", 0), ("selftest", 0)):
            f = exports[fname]
            ty = f.type(self.store) if isinstance(f, wasmtime.Func) else None
            if ty is None or len(ty.params) != params or [str(r) for r in ty.results] != ["i32"]:
                raise WasmError(f"{label}: export `{fname}` must be a function () -> i32; see wasm_modules/ABI.md")
        size = memory.data_len(self.store)
        if size < abi.STATE:
            raise WasmError(f"{label}: memory of {size} bytes is below the ABI's {abi.STATE}")
        base = ctypes.addressof(memory.data_ptr(self.store).contents)
        self.memory = np.ctypeslib.as_array((ctypes.c_ubyte * size).from_address(base))
        header = self.memory[:16].view(np.int32)
        self._header = header
        self.abi, self.n_in, self.n_out = int(header[0]), int(header[1]), int(header[2])
        if self.abi != abi.ABI_VERSION:
            raise WasmError(f"{label}: header says ABI {self.abi}, this host speaks ABI {abi.ABI_VERSION}")
        if not (1 <= self.n_in <= abi.MAX_VALUES and 1 <= self.n_out <= abi.MAX_VALUES):
            raise WasmError(f"{label}: header n_in={self.n_in} n_out={self.n_out}, each must be 1..{abi.MAX_VALUES}")
        self.input = self.memory[abi.INPUT:abi.INPUT + 8 * self.n_in].view(np.float64)
        self.output = self.memory[abi.OUTPUT:abi.OUTPUT + 8 * self.n_out].view(np.float64)
        # output.dot(zeros) is 0 when every output is finite and NaN otherwise (inf * 0 is NaN): ~0.3 µs a call
        self._zeros = np.zeros(self.n_out)
        self._zeros_in = np.zeros(self.n_in)
        self.version = int(self._slow_call(exports["version"]))
        self._process = exports["process"]
        self._selftest = exports["selftest"]
        # the fast path's preallocated pieces
        self._ctx = self.store._context()
        self._func_ref = ctypes.byref(self._process._func)
        self._results = (ffi.wasmtime_val_t * 1)()
        self._trap = ctypes.POINTER(ffi.wasm_trap_t)()
        self._trap_ref = ctypes.byref(self._trap)
        self._ticks = host.deadline_ticks(limits.deadline_ms)
        self.deadline_ms = limits.deadline_ms
        self._set_fuel, self._set_deadline, self._call = host.fast_path_calls
        self._released = host.released_calls

    def _slow_call(self, func: wasmtime.Func) -> int:
        """`version`/`selftest` at load: the public call path, bounded like `process` but more loosely."""
        self.store.set_fuel(min(self._fuel, LOAD_CALL_FUEL))
        self.store.set_epoch_deadline(self._load_ticks)
        try:
            return func(self.store)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            raise SelfTestError(f"{self.label}: trapped outside `process`: {str(exc).splitlines()[0]}") from None

    def selftest(self) -> int:
        return int(self._slow_call(self._selftest))

    def reset(self) -> None:
        """Ask the module to restart its state from the next input (header.reset = 1)."""
        self._header[3] = 1

    def process(self) -> None:
        """The fast path. Raises ModuleTrap on a trap, a non-zero status or a non-finite output."""
        ctx = self._ctx
        self._set_fuel(ctx, self._fuel)
        self._set_deadline(ctx, self._ticks)
        err = self._call(ctx, self._func_ref, None, 0, self._results, 1, self._trap_ref)
        if err or self._trap or self._results[0].of.i32:
            self._failed(err)
        if self.output.dot(self._zeros) != 0.0:
            self._nonfinite()

    def process_off_loop(self) -> None:
        """`process` for a thread other than the loop's (golden vectors and warm-up while preparing a swap):
        the C calls release the GIL, so a slow or hostile module's self-test (up to its fuel per step) never
        holds the loop thread up."""
        ctx = self._ctx
        set_fuel, set_deadline, call = self._released
        set_fuel(ctx, self._fuel)
        set_deadline(ctx, self._ticks)
        err = call(ctx, self._func_ref, None, 0, self._results, 1, self._trap_ref)
        if err or self._trap or self._results[0].of.i32:
            self._failed(err)
        if self.output.dot(self._zeros) != 0.0:
            self._nonfinite()

    def check_input(self) -> None:
        """Raises ModuleTrap (code "nonfinite") when `input` holds a NaN or an infinity, before any call: the loop
        refuses such an input (a model's NaN) to the post module. The module's state is left as it was."""
        if self.input.dot(self._zeros_in) != 0.0:
            raise ModuleTrap(f"{self.label}: non-finite input {self.input.tolist()} (NaN or infinity) refused before "
                             "the call", "nonfinite")

    def _nonfinite(self) -> None:
        """A NaN or infinite output is a fault like a trap: the module's state may hold it too (a filter fed a NaN
        keeps it forever), so it restarts from the next input, and the frame gets the fail-safe command."""
        self._header[3] = 1
        raise ModuleTrap(f"{self.label}: non-finite output {self.output.tolist()} (NaN or infinity); its state is "
                         "reset", "nonfinite")

    def call_public(self) -> None:
        """The same call through `Func.__call__` (for the benchmark's comparison)."""
        self.store.set_fuel(self._fuel)
        self.store.set_epoch_deadline(self._ticks)
        status = self._process(self.store)
        if status:
            raise ModuleTrap(f"{self.label}: process returned status {status}", "status")

    def _failed(self, err) -> None:
        self._header[3] = 1  # the state may be half-updated: restart it from the next input
        if err:
            exc = wasmtime.WasmtimeError._from_ptr(err)
            raise ModuleTrap(f"{self.label}: {str(exc).splitlines()[0]}", "error")
        if self._trap:
            trap = wasmtime.Trap._from_ptr(self._trap)
            self._trap = ctypes.POINTER(ffi.wasm_trap_t)()
            self._trap_ref = ctypes.byref(self._trap)
            code = trap.trap_code
            if code == wasmtime.TrapCode.INTERRUPT:
                raise ModuleTrap(f"{self.label}: stopped at its wall-clock deadline ({self.deadline_ms:g} ms)", "deadline")
            if code == wasmtime.TrapCode.OUT_OF_FUEL:
                raise ModuleTrap(f"{self.label}: stopped after its fuel ({self._fuel} instructions) ran out", "fuel")
            name = code.name.lower() if code is not None else "trap"
            detail = next((line.strip() for line in trap.message.splitlines() if "wasm trap" in line), name)
            raise ModuleTrap(f"{self.label}: trapped ({name}): {detail}", name)
        raise ModuleTrap(f"{self.label}: process returned status {self._results[0].of.i32}", "status")


@dataclass(eq=False)
class ModuleVersion:
    """A loaded, self-tested module version ready to serve. `frames` and `traps` are written by the loop."""

    name: str
    stage: str
    path: Path
    sha256: str
    instance: ModuleInstance
    origin: str  # "compiled", "cwasm cache", "compiled (cache entry refused: …)"
    prepare_ms: float  # wall time, including waits for frame boundaries
    frames: int = 0
    traps: int = 0
    work_ms: float = 0.0  # prepare_ms without those waits
    # why this load refused the .cwasm cache entry of these wasm bytes (it was recompiled from the source), None
    # when there was none to refuse: an entry that fails its hash or its HMAC under the device's cache key means
    # something wrote into the cache, a security event the daemon alerts on (an entry from another wasmtime
    # build that merely does not deserialize is not one: it is recompiled, and `origin` says so)
    cache_refused: str | None = None

    @property
    def version(self) -> int:
        return self.instance.version

    def describe(self) -> dict:
        return {"name": self.name, "stage": self.stage, "path": str(self.path), "sha256": self.sha256,
                "version": self.version, "origin": self.origin, "cache_refused": self.cache_refused,
                "prepare_ms": round(self.prepare_ms, 3), "work_ms": round(self.work_ms, 3),
                "frames": self.frames, "traps": self.traps}


class WasmHost:
    """One engine, one epoch ticker and one .cwasm cache for all modules of a daemon."""

    def __init__(self, cache_dir: Path | None = None, tick_ms: float = 0.5, limits: Limits = Limits(),
                 native_ticker: bool | None = None) -> None:
        self.engine = make_engine()
        self.fingerprint = engine_fingerprint()
        self.cache = CwasmCache(cache_dir or default_cache_dir(), self.fingerprint)
        self.tick_ms = tick_ms
        self.limits = limits
        self._ticker = EpochTicker(self.engine, tick_ms / 1000, native_ticker)
        # module calls keep the GIL only where the ticker does not need it
        self.fast_path_calls = _fast_path_calls(keep_gil=self._ticker.native)
        self.released_calls = _fast_path_calls(keep_gil=False)  # for calls off the loop thread

    @property
    def ticker(self) -> dict:
        """Which epoch ticker runs, and how many increments it did (`sitsctl versions`, diagnostics)."""
        return {"native": self._ticker.native, "tick_ms": self.tick_ms, "ticks": self._ticker.ticks,
                "module_calls_keep_gil": self._ticker.native}

    def deadline_ticks(self, deadline_ms: float) -> int:
        # the first tick may come right after the call starts and each later one at least a period after the one
        # before (both tickers; sitsd/_native.c never catches up), so the trap comes (ticks - 1) periods or more
        # after the start: never before deadline_ms; at most `ticks` periods plus the ticks' wake-up latencies
        return math.ceil(deadline_ms / self.tick_ms) + 1

    def close(self) -> None:
        self._ticker.close()

    def compile(self, wasm: bytes, sha256: str, label: str) -> tuple[wasmtime.Module, str, str | None]:
        """From the cache when its entry verifies, else compiled (and cached). Returns (module, origin, refused):
        `refused` is the CacheIntegrityError's text when the cache held an entry that failed its integrity check
        (hash or HMAC: see ModuleVersion.cache_refused), else None."""
        origin, refused = "compiled", None
        try:
            cached = self.cache.load(self.engine, sha256)
            if cached is not None:
                return cached, "cwasm cache", None
        except CacheIntegrityError as exc:
            self.cache.evict(sha256)
            refused = str(exc)
            origin = f"compiled (cache entry refused: {exc})"
        except wasmtime.WasmtimeError as exc:  # verified bytes from another engine build: recompile
            self.cache.evict(sha256)
            origin = f"compiled (cache entry unusable: {str(exc).splitlines()[0]})"
        try:
            module = wasmtime.Module(self.engine, wasm)
        except wasmtime.WasmtimeError as exc:
            raise WasmError(f"{label}: wasmtime refuses it: {str(exc).splitlines()[0]}") from None
        try:
            self.cache.store(sha256, module)
        except OSError as exc:  # a read-only cache slows the next load, nothing else
            origin += f" (not cached: {exc})"
        return module, origin, refused

    def load(self, name: str, stage: str, path: Path, n_in: int, n_out: int, *,
             expected_sha256: str | None = None, limits: Limits | None = None, between=None,
             expected_file_sha256: str | None = None) -> ModuleVersion:
        """Verify, compile, self-test and instantiate; raises WasmError/SelfTestError saying what failed.

        `between()`, when given, is called between the steps (each well under a millisecond with a cached
        .cwasm): the hot swap passes one that waits for the loop to finish a frame, so the steps that hold
        the GIL run in the loop's idle time instead of delaying a frame."""
        t0 = time.perf_counter_ns()
        waited = 0
        pause = between or (lambda: 0)
        limits = limits or self.limits
        path = Path(path)
        wasm = read_source(path, expected_file_sha256)
        sha = hashlib.sha256(wasm).hexdigest()
        label = f"module {name} ({path.name}, sha256 {sha[:12]})"
        if expected_sha256 and expected_sha256 != sha:
            raise WasmError(f"{label}: SHA-256 differs from the expected {expected_sha256}; refused")
        golden = self._golden(path, label)
        waited += pause()
        module, origin, refused = self.compile(wasm, sha, label)
        waited += pause()
        canary = ModuleInstance(self, module, label, limits)
        if (canary.n_in, canary.n_out) != (n_in, n_out):
            raise WasmError(f"{label}: takes {canary.n_in} inputs and gives {canary.n_out} outputs; the {stage} "
                            f"stage needs {n_in} -> {n_out} (the config's model inputs/outputs)")
        waited += pause()
        run_golden(canary, golden, label)
        waited += pause()
        serving = ModuleInstance(self, module, label, limits)  # fresh state for the loop
        warm_up(serving, golden, label)
        total = time.perf_counter_ns() - t0
        return ModuleVersion(name, stage, path, sha, serving, origin, total / 1e6, work_ms=(total - waited) / 1e6,
                             cache_refused=refused)

    @staticmethod
    def _golden(path: Path, label: str) -> dict:
        gp = golden_path(path)
        try:
            golden = json.loads(gp.read_text())
            steps = golden["steps"]
            if not steps:
                raise ValueError("no steps")
        except FileNotFoundError:
            raise SelfTestError(f"{label}: no golden vectors at {gp}; every module ships them "
                                "(wasm_modules/ABI.md, 'Golden vectors')") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise SelfTestError(f"{label}: golden vectors {gp} unreadable: {exc}") from None
        return golden


def run_golden(inst: ModuleInstance, golden: dict, label: str) -> None:
    """`selftest` must return 0, then each step's inputs must give its outputs within the tolerance."""
    code = inst.selftest()
    if code:
        raise SelfTestError(f"{label}: its selftest export returned {code} (parameter block refused; see the "
                            "module source for the codes)")
    tol = float(golden.get("tolerance", 1e-12))
    for i, step in enumerate(golden["steps"]):
        x, want = np.asarray(step["in"], dtype=np.float64), np.asarray(step["out"], dtype=np.float64)
        if x.shape != inst.input.shape or want.shape != inst.output.shape:
            raise SelfTestError(f"{label}: golden step {i} has {x.size} inputs/{want.size} outputs, the module "
                                f"{inst.n_in}/{inst.n_out}")
        inst.input[:] = x
        try:
            inst.process_off_loop()
        except ModuleTrap as exc:
            raise SelfTestError(f"{label}: golden step {i} trapped: {exc}") from None
        if not np.allclose(inst.output, want, rtol=0.0, atol=tol):
            raise SelfTestError(f"{label}: golden step {i}: got {inst.output.tolist()}, expected {want.tolist()} "
                                f"(tolerance {tol:g})")


def warm_up(inst: ModuleInstance, golden: dict, label: str) -> None:
    """One golden step on a fresh instance, then a state reset: the first frame after a swap then finds
    the instance's memory pages and code already touched (it was ~80 µs slower cold)."""
    step = golden["steps"][0]
    inst.input[:] = step["in"]
    try:
        inst.process_off_loop()  # the same code as the loop's calls, the GIL released around it
    except ModuleTrap as exc:
        raise SelfTestError(f"{label}: warm-up call trapped: {exc}") from None
    if not np.allclose(inst.output, step["out"], rtol=0.0, atol=float(golden.get("tolerance", 1e-12))):
        raise SelfTestError(f"{label}: the serving instance disagrees with golden step 0")
    inst.reset()
