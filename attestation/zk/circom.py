"""Witnesses for circom circuits: the compiler's `.wasm` witness generator, run under wasmtime.

This follows the protocol of circom 2's generated witness_calculator.js: input signals are found by
the 64-bit FNV-1a hash of their name, values pass through a shared read/write window of
getFieldNumLen32() 32-bit limbs (least significant first), and the module reports failures through
the `runtime.exceptionHandler` import with an error code and a message read via getMessageChar.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import wasmtime

from .errors import ZkError
from .field import R

_ERRORS = {1: "signal not found", 2: "too many signals set", 3: "signal already set", 4: "assert failed",
           5: "not enough memory", 6: "input signal array access exceeds the size", 7: "out of bounds array access"}


def fnv1a64(name: str) -> int:
    h = 0xCBF29CE484222325
    for ch in name:
        h = ((h ^ ord(ch)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class _Trap(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _flatten(v: Any) -> list[int]:
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _flatten(item)]
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ZkError(f"input values must be integers (or decimal strings), got {type(v).__name__}")
    try:
        return [int(v)]
    except ValueError:
        raise ZkError(f"input value {v!r} is not an integer") from None


class WitnessCalculator:
    """One instance per .wasm; `calculate` may be called repeatedly (each call re-initialises)."""

    def __init__(self, wasm: Path | bytes) -> None:
        self.source = str(wasm) if isinstance(wasm, Path) else "<wasm>"
        self.engine = wasmtime.Engine()
        try:
            module = wasmtime.Module(self.engine, wasm.read_bytes() if isinstance(wasm, Path) else wasm)
        except (wasmtime.WasmtimeError, OSError) as e:
            raise ZkError(f"not a loadable circom witness generator ({e})", self.source) from None
        self.store = wasmtime.Store(self.engine)
        void = wasmtime.FuncType([], [])

        def exception_handler(code: int) -> None:
            raise _Trap(code)

        imports = {"exceptionHandler": wasmtime.Func(self.store, wasmtime.FuncType([wasmtime.ValType.i32()], []),
                                                     exception_handler),
                   "printErrorMessage": wasmtime.Func(self.store, void, self._collect_message),
                   "writeBufferMessage": wasmtime.Func(self.store, void, self._collect_message),
                   "showSharedRWMemory": wasmtime.Func(self.store, void, lambda: None)}
        try:
            externs = [imports[i.name] for i in module.imports if i.module == "runtime"]
            if len(externs) != len(module.imports):
                raise KeyError("unexpected imports")
            self.instance = wasmtime.Instance(self.store, module, externs)
        except (KeyError, wasmtime.WasmtimeError) as e:
            raise ZkError(f"not a circom 2 witness generator ({e})", self.source) from None
        self.ex = self.instance.exports(self.store)
        self.messages: list[str] = []
        self.n32 = self._call("getFieldNumLen32")
        self._call("getRawPrime")
        if self._read_shared() != R:
            raise ZkError("the circuit was not compiled for BN254 (circom --prime bn128)", self.source)

    def _collect_message(self) -> None:
        chars = []
        while True:
            c = self._call("getMessageChar")
            if c == 0:
                break
            chars.append(chr(c))
        self.messages.append("".join(chars))

    def _call(self, name: str, *args: int) -> Any:
        try:
            return self.ex[name](self.store, *args)
        except KeyError:
            raise ZkError(f"the module does not export {name}", self.source) from None
        except wasmtime.Trap as e:
            raise ZkError(f"witness generator trapped in {name}: {e}", self.source) from None
        except wasmtime.WasmtimeError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, _Trap):
                detail = _ERRORS.get(cause.code, f"error code {cause.code}")
                raise ZkError(f"{detail} in {name}" + (f": {' '.join(self.messages)}" if self.messages else ""),
                              self.source) from None
            raise ZkError(f"witness generator failed in {name}: {e}", self.source) from None

    def _read_shared(self) -> int:
        return sum((self._call("readSharedRWMemory", j) & 0xFFFFFFFF) << (32 * j) for j in range(self.n32))

    def calculate(self, inputs: Mapping[str, Any]) -> list[int]:
        """The full witness (w[0] = 1) for circom input signals {name: int or nested list}."""
        self.messages.clear()
        self._call("init", 0)
        n_set = 0
        for name, value in inputs.items():
            h = fnv1a64(name)
            size = self._call("getInputSignalSize", h >> 32, h & 0xFFFFFFFF)
            values = _flatten(value)
            if size < 0:
                raise ZkError(f"the circuit has no input signal {name!r}", self.source)
            if len(values) != size:
                raise ZkError(f"input {name!r} takes {size} values, got {len(values)}", self.source)
            for i, v in enumerate(values):
                v %= R
                for j in range(self.n32):
                    limb = (v >> (32 * j)) & 0xFFFFFFFF
                    self._call("writeSharedRWMemory", j, limb - (1 << 32) if limb >= 1 << 31 else limb)
                self._call("setInputSignal", h >> 32, h & 0xFFFFFFFF, i)
                n_set += 1
        expected = self._call("getInputSize")
        if n_set < expected:
            raise ZkError(f"only {n_set} of the circuit's {expected} input values were given", self.source)
        out = []
        for i in range(self._call("getWitnessSize")):
            self._call("getWitness", i)
            out.append(self._read_shared())
        return out
