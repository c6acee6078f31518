"""Precompiled modules (.cwasm) on disk, keyed by the wasm SHA-256 and the engine fingerprint.

wasmtime deserializes native code without checking it (field notes: a .cwasm with its last bytes
zeroed is accepted). Every entry therefore has a sidecar JSON with the .cwasm's SHA-256, written
after the code, and `load` hashes the file before `Module.deserialize` sees a byte of it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import wasmtime

from .errors import CacheIntegrityError


def default_cache_dir() -> Path:
    """systemd's CacheDirectory= ($CACHE_DIRECTORY), else the XDG cache of the user running sitsd."""
    base = os.environ.get("CACHE_DIRECTORY") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base.split(":")[0]) if base else Path.home() / ".cache"
    return root / ("wasm" if os.environ.get("CACHE_DIRECTORY") else "sitsd/wasm")


class CwasmCache:
    def __init__(self, directory: Path, fingerprint: str) -> None:
        self.directory = Path(directory)
        self.fingerprint = fingerprint

    def paths(self, wasm_sha256: str) -> tuple[Path, Path]:
        stem = f"{wasm_sha256}-{self.fingerprint[:16]}"
        return self.directory / f"{stem}.cwasm", self.directory / f"{stem}.json"

    def load(self, engine: wasmtime.Engine, wasm_sha256: str) -> wasmtime.Module | None:
        """The cached module, None on a miss; CacheIntegrityError when the entry does not match its hash."""
        code_path, meta_path = self.paths(wasm_sha256)
        if not code_path.exists():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            expected = meta["cwasm_sha256"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CacheIntegrityError(f"{code_path}: no valid hash record next to it ({meta_path.name}: {exc}); "
                                      "refused: it is recompiled from the module source") from None
        data = code_path.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected or meta.get("wasm_sha256") != wasm_sha256 or meta.get("engine") != self.fingerprint:
            raise CacheIntegrityError(f"{code_path}: SHA-256 {actual[:16]}… differs from {expected[:16]}… recorded "
                                      "when it was compiled (corrupted or tampered native code); refused: it is "
                                      "recompiled from the module source")
        return wasmtime.Module.deserialize(engine, data)

    def store(self, wasm_sha256: str, module: wasmtime.Module) -> None:
        code_path, meta_path = self.paths(wasm_sha256)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = bytes(module.serialize())
        meta = {"wasm_sha256": wasm_sha256, "engine": self.fingerprint, "cwasm_sha256": hashlib.sha256(data).hexdigest()}
        for path, content in ((code_path, data), (meta_path, json.dumps(meta).encode())):
            tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
            tmp.write_bytes(content)
            os.replace(tmp, path)

    def evict(self, wasm_sha256: str) -> None:
        for path in self.paths(wasm_sha256):
            path.unlink(missing_ok=True)
