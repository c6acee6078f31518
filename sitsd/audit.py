"""Append-only audit log of the commands sent to the PLC, as a SHA-256 hash chain of JSON lines.

Written by the I/O thread once a write has an outcome: "acknowledged" by the PLC, "rejected" by it
(Bad status), or "unconfirmed" (the session broke mid-write: the PLC may or may not have applied
it). Each record carries the hash of
the previous one, so deleting, reordering or editing a record breaks `verify_chain`. Records are
flushed at once and fsynced at most once a second.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

GENESIS = "0" * 64


class AuditLog:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        self.path = self.directory / f"commands-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.jsonl"
        self._fh = open(self.path, "a", encoding="utf-8")
        self._prev = GENESIS
        self._last_sync = time.monotonic()
        self.records = 0

    def append(self, record: dict) -> str:
        body = dict(record, prev=self._prev)
        line = json.dumps(body, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(line.encode()).hexdigest()
        self._fh.write(json.dumps({"hash": digest, "record": body}, sort_keys=True, separators=(",", ":")) + "\n")
        self._fh.flush()
        self._prev = digest
        self.records += 1
        now = time.monotonic()
        if now - self._last_sync > 1.0:
            os.fsync(self._fh.fileno())
            self._last_sync = now
        return digest

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()


class AuditError(ValueError):
    """An audit file does not verify; the message names the file, the line and what is wrong."""


def verify_chain(path: str | os.PathLike) -> int:
    """Check every link of an audit file; returns the record count or raises AuditError naming the
    first bad record: edited (hash mismatch), deleted or reordered (broken link), or truncated."""
    prev = GENESIS
    count = 0
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.endswith("\n"):
                raise AuditError(f"{path}:{lineno}: truncated record (the file ends mid-line)")
            try:
                entry = json.loads(line)
                body = entry["record"]
                stored = entry["hash"]
            except (ValueError, KeyError, TypeError) as exc:
                raise AuditError(f"{path}:{lineno}: not an audit record ({exc})") from None
            if body.get("prev") != prev:
                raise AuditError(f"{path}:{lineno}: chain broken: a record before it was deleted or reordered "
                                 f"(prev {str(body.get('prev'))[:16]}, expected {prev[:16]})")
            digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
            if digest != stored:
                raise AuditError(f"{path}:{lineno}: record {body.get('seq')} was modified (hash mismatch)")
            prev = digest
            count += 1
    return count


def audit_files(target: str | os.PathLike) -> list[Path]:
    """The audit files of a directory in time order (their names start with the UTC start time)."""
    p = Path(target)
    return sorted(p.glob("commands-*.jsonl")) if p.is_dir() else [p]


def read_records(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line)["record"] for line in fh if line.strip()]
