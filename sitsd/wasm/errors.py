"""Errors of the WASM host. Each names the module (name, file, SHA-256 prefix) and says how to fix it."""
from __future__ import annotations

from ..errors import SitsError


class WasmError(SitsError):
    """A module cannot be loaded or used: bad file, wrong ABI, failed self-test."""


class SelfTestError(WasmError):
    """The module's `selftest` export or its golden vectors disagree with what the module computes."""


class CacheIntegrityError(WasmError):
    """A precompiled .cwasm does not match the SHA-256 recorded when it was written (wasmtime itself
    never checks native code it deserializes): it is refused, never loaded."""


class ModuleTrap(WasmError):
    """A call into a module trapped (deadline, fuel, out-of-bounds access, unreachable) or returned a
    non-zero status. The loop turns it into the fail-safe command plus an alert."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
