"""The wasmtime engine every module runs on (epoch interruption + fuel, fixed memory base) and the
epoch ticker: a persistent thread that advances the engine's epoch on the wall clock, so a call that
outlives its deadline traps (INTERRUPT) no matter how few instructions it runs per iteration.

The ticker is a native thread (sitsd/_native.c) that never takes the GIL. Where that extension was not
built, a Python thread does the same, and module calls then release the GIL so that it can tick during
them (sitsd/wasm/module.py); `EpochTicker.native` says which one runs."""
from __future__ import annotations

import ctypes
import hashlib
import json
import platform
import threading
import time
import weakref
from importlib.metadata import version

import wasmtime
import wasmtime._bindings as _bindings

try:
    from .. import _native
except ImportError:  # not built (a source tree without `pip install`): the Python ticker below
    _native = None

NATIVE_TICKER_AVAILABLE = _native is not None
# the wasmtime.Config settings every engine is built with (make_engine applies exactly these) and the .cwasm cache
# key covers (engine_fingerprint): one dict, so the key cannot drift from what compiled the code
ENGINE_SETTINGS = {"epoch_interruption": True, "consume_fuel": True,
                   "memory_may_move": False,  # numpy views on linear memory stay valid for the instance's life
                   "cranelift_opt_level": "speed"}
# settings that do not change the compiled code, so not part of the cache key
BUILD_SETTINGS = {"parallel_compilation": False}  # compiling happens next to a 1 kHz loop on a small box


def make_engine() -> wasmtime.Engine:
    cfg = wasmtime.Config()
    for name, value in (ENGINE_SETTINGS | BUILD_SETTINGS).items():
        if not isinstance(getattr(wasmtime.Config, name, None), property):  # setattr would just add an attribute
            raise RuntimeError(f"wasmtime.Config has no setting {name!r} (wasmtime {version('wasmtime')})")
        setattr(cfg, name, value)
    return wasmtime.Engine(cfg)


def engine_fingerprint() -> str:
    """What a .cwasm depends on besides the wasm bytes: wasmtime version, CPU architecture, settings."""
    desc = {"wasmtime": version("wasmtime"), "machine": platform.machine(), **ENGINE_SETTINGS}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()


def _address(obj) -> int:
    return ctypes.cast(obj, ctypes.c_void_p).value or 0


class EpochTicker:
    """Increments the engine epoch every `tick_s` seconds until closed (one thread per engine): a native
    thread where sitsd._native is built (`native=None`, the default), else, or with `native=False`, a
    Python thread. `native=True` insists on the native one."""

    def __init__(self, engine: wasmtime.Engine, tick_s: float, native: bool | None = None) -> None:
        self.engine = engine  # kept alive until the thread is joined
        self.tick_s = tick_s
        if native and _native is None:
            raise RuntimeError("the native epoch ticker (sitsd._native) is not built: reinstall sits2026 "
                               "with a C compiler and the Python headers (`pip install .`)")
        self.native = _native is not None if native is None else native
        self._ticker = None
        self._thread = None
        if self.native:
            # the Ticker holds a reference to `engine` itself and drops it only after joining its thread: the engine
            # cannot be freed under the thread, whatever order the interpreter tears objects down in (at exit after
            # an uncaught exception, wasmtime's Engine.__del__ ran first: a SIGSEGV on the next tick)
            self._ticker = _native.Ticker(_address(_bindings._wasmtime_engine_increment_epoch),
                                         _address(engine.ptr()), int(round(tick_s * 1e9)), engine)
            stop = self._ticker.close
        else:
            self._stop = threading.Event()
            self._count = 0
            self._thread = threading.Thread(target=self._run, name="sitsd-wasm-epoch", daemon=True)
            self._thread.start()
            stop = self._stop.set
        # stops the thread when this object goes, and at interpreter exit (atexit, before modules are torn down)
        self._finalizer = weakref.finalize(self, stop)

    @property
    def ticks(self) -> int:
        """Epoch increments done so far."""
        return self._ticker.ticks if self._ticker is not None else self._count

    def _run(self) -> None:
        try:  # a 1 µs timer slack keeps the tick close to its period (field notes: p99 418 µs overshoot)
            ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK
        except (OSError, AttributeError):
            pass
        increment, wait, period = self.engine.increment_epoch, self._stop.wait, self.tick_s
        while not wait(period):
            increment()
            self._count += 1

    def close(self) -> None:
        self._finalizer()  # once: the thread stops (the native one is joined)
        if self._thread is not None:
            self._thread.join(1.0)


def now_ms() -> float:
    return time.perf_counter_ns() / 1e6
