"""Precompiled modules (.cwasm) on disk, keyed by the wasm SHA-256 and the engine fingerprint.

wasmtime deserializes native code without checking it (field notes: a .cwasm with its last bytes
zeroed is accepted). Every entry therefore has a sidecar JSON record with the .cwasm's SHA-256, written
after the code, and `load` hashes the file before `Module.deserialize` sees a byte of it.

Write order (`store`): the old record goes first, then the code (temporary file, fsync, rename, directory fsync),
then the record likewise. A crash or power loss anywhere in between leaves code without a
record, never a record that names other code: `load` treats code without a record as an ordinary miss (the
module is recompiled and the entry rewritten), not as tampering.

A hash next to the code only catches corruption: whoever can write the cache could replace both. The
record therefore also carries an HMAC-SHA256 over (wasm SHA-256, engine fingerprint, .cwasm SHA-256)
under this device's cache key, a random 32-byte key kept *outside* the cache: in the daemon's state
directory under systemd (`$STATE_DIRECTORY/wasm-cache.key`, StateDirectory= is 0750, the key 0600), else
next to the cache directory (`<cache>.key`). An entry copied from another box, restored from a backup
made with another key, or written by anything that can write the cache but not read the key is refused
and recompiled. What it does not stop: a process running as the daemon's user, which can read the key
(as it could read the daemon's memory). Where no key can be kept (read-only file systems), a key for this
process only is used: entries from earlier runs are recompiled, never trusted.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

import wasmtime

from ..durable import fsync_dir, replace_durably
from .errors import CacheIntegrityError

KEY_BYTES = 32
_MAC_DOMAIN = b"sits-cwasm-record-v1\0"


def default_cache_dir() -> Path:
    """systemd's CacheDirectory= ($CACHE_DIRECTORY), else the XDG cache of the user running sitsd."""
    base = os.environ.get("CACHE_DIRECTORY") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base.split(":")[0]) if base else Path.home() / ".cache"
    return root / ("wasm" if os.environ.get("CACHE_DIRECTORY") else "sitsd/wasm")


def default_key_path(cache_dir: Path) -> Path:
    """systemd's StateDirectory= ($STATE_DIRECTORY/wasm-cache.key), else `<cache_dir>.key` beside the cache."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "wasm-cache.key"
    cache_dir = Path(cache_dir)
    return cache_dir.with_name(cache_dir.name + ".key")


def load_or_create_key(path: Path) -> tuple[bytes, str]:
    """(key, where): the key in `path`, created (0600, exclusively) when missing; a process-only random key
    when it can be neither read nor created. A file of the wrong size is refused (not overwritten: someone
    should look at it), and the process key is used."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as exc:
        return os.urandom(KEY_BYTES), f"this process only (cannot read {path}: {exc.strerror})"
    if data is None:
        key = os.urandom(KEY_BYTES)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it meanwhile
            return load_or_create_key(path)
        except OSError as exc:
            return key, f"this process only (cannot create {path}: {exc.strerror})"
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
            fh.flush()
            os.fsync(fh.fileno())
        return key, str(path)
    if len(data) != KEY_BYTES:
        return os.urandom(KEY_BYTES), f"this process only ({path} holds {len(data)} bytes, not {KEY_BYTES}: left as is)"
    return data, str(path)


class CwasmCache:
    def __init__(self, directory: Path, fingerprint: str, key_path: Path | None = None) -> None:
        self.directory = Path(directory)
        self.fingerprint = fingerprint
        self.key_path = Path(key_path) if key_path is not None else default_key_path(self.directory)
        self._key, self.key_source = load_or_create_key(self.key_path)

    def paths(self, wasm_sha256: str) -> tuple[Path, Path]:
        stem = f"{wasm_sha256}-{self.fingerprint[:16]}"
        return self.directory / f"{stem}.cwasm", self.directory / f"{stem}.json"

    def _mac(self, wasm_sha256: str, engine: str, cwasm_sha256: str) -> str:
        msg = _MAC_DOMAIN + "\0".join((wasm_sha256, engine, cwasm_sha256)).encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def load(self, engine: wasmtime.Engine, wasm_sha256: str) -> wasmtime.Module | None:
        """The cached module, None on a miss; CacheIntegrityError when the entry does not match its record or the
        record is not this device's."""
        code_path, meta_path = self.paths(wasm_sha256)
        if not code_path.exists():
            return None
        try:
            text = meta_path.read_text()
        except FileNotFoundError:  # a store that did not finish (crash, power loss): a miss, recompiled
            return None
        except OSError as exc:
            raise CacheIntegrityError(f"{code_path}: its hash record {meta_path.name} cannot be read ({exc.strerror}); "
                                      "refused: it is recompiled from the module source") from None
        try:
            meta = json.loads(text)
            expected = meta["cwasm_sha256"]
            mac = meta["mac"]
            if not isinstance(expected, str) or not isinstance(mac, str):
                raise TypeError("cwasm_sha256 and mac must be strings")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CacheIntegrityError(f"{code_path}: no valid hash record next to it ({meta_path.name}: {exc}); "
                                      "refused: it is recompiled from the module source") from None
        if not hmac.compare_digest(mac, self._mac(wasm_sha256, self.fingerprint, expected)):
            raise CacheIntegrityError(f"{code_path}: its record {meta_path.name} is not signed with this device's "
                                      f"cache key ({self.key_source}): copied from elsewhere, restored from another "
                                      "key's backup, or forged; refused: it is recompiled from the module source")
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
        digest = hashlib.sha256(data).hexdigest()
        meta = {"wasm_sha256": wasm_sha256, "engine": self.fingerprint, "cwasm_sha256": digest,
                "mac": self._mac(wasm_sha256, self.fingerprint, digest)}
        meta_path.unlink(missing_ok=True)  # from here until the new record is in place: code without a record, a miss
        for path, content in ((code_path, data), (meta_path, json.dumps(meta).encode())):  # the record last
            replace_durably(path, content, 0o644)
            fsync_dir(self.directory)  # this rename (and the unlink) durable before the next one

    def evict(self, wasm_sha256: str) -> None:
        for path in self.paths(wasm_sha256):
            path.unlink(missing_ok=True)
