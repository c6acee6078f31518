"""The wasmtime engine every module runs on (epoch interruption + fuel, fixed memory base) and the
epoch ticker: a persistent thread that advances the engine's epoch on the wall clock, so a call that
outlives its deadline traps (INTERRUPT) no matter how few instructions it runs per iteration."""
from __future__ import annotations

import hashlib
import json
import platform
import threading
import time
from importlib.metadata import version

import wasmtime

ENGINE_SETTINGS = {"epoch_interruption": True, "consume_fuel": True, "memory_may_move": False,
                   "cranelift_opt_level": "speed"}


def make_engine() -> wasmtime.Engine:
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    cfg.consume_fuel = True
    cfg.memory_may_move = False  # numpy views on linear memory stay valid for the instance's life
    cfg.cranelift_opt_level = "speed"
    cfg.parallel_compilation = False  # compiling happens next to a 1 kHz loop on a small box
    return wasmtime.Engine(cfg)


def engine_fingerprint() -> str:
    """What a .cwasm depends on besides the wasm bytes: wasmtime version, CPU architecture, settings."""
    desc = {"wasmtime": version("wasmtime"), "machine": platform.machine(), **ENGINE_SETTINGS}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()


class EpochTicker:
    """Increments the engine epoch every `tick_s` seconds until closed (one thread per engine)."""

    def __init__(self, engine: wasmtime.Engine, tick_s: float) -> None:
        self.engine = engine
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sitsd-wasm-epoch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:  # a 1 µs timer slack keeps the tick close to its period (field notes: p99 418 µs overshoot)
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK
        except (OSError, AttributeError):
            pass
        increment, wait, period = self.engine.increment_epoch, self._stop.wait, self.tick_s
        while not wait(period):
            increment()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)


def now_ms() -> float:
    return time.perf_counter_ns() / 1e6
