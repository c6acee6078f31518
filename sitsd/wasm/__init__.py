"""The WASM host: sandboxed pre-/post-processing modules in the loop (ABI: wasm_modules/ABI.md)."""
from .cache import CwasmCache, default_cache_dir
from .errors import CacheIntegrityError, ModuleTrap, SelfTestError, WasmError
from .module import Limits, ModuleInstance, ModuleVersion, WasmHost, golden_path, read_source, run_golden, source_wasm

__all__ = ["CacheIntegrityError", "CwasmCache", "Limits", "ModuleInstance", "ModuleTrap", "ModuleVersion",
           "SelfTestError", "WasmError", "WasmHost", "default_cache_dir", "golden_path", "read_source", "run_golden",
           "source_wasm"]
