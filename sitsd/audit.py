"""Append-only audit log of the commands sent to the PLC, as a SHA-256 hash chain of JSON lines.

Written by the I/O thread once a write has an outcome: "acknowledged" by the PLC, "rejected" by it
(Bad status), or "unconfirmed" (the session broke mid-write: the PLC may or may not have applied
it). Each record carries the hash of the previous one, so deleting, reordering or editing a record
breaks `verify_chain`. Each daemon start opens a new segment file whose first record links to the
last record of the previous segment, so the chain runs across restarts and crashes.

Durability promise (audit.fsync):
  every     each record is fsynced before the next command is written: after a power loss the log
            holds every command that reached the wire, except at most the one being written.
  interval  (default) records reach the kernel at once and the disk at least once a second: a crash
            of sitsd (kill -9) loses nothing; a power loss loses at most the last second.
  never     the kernel writes back when it likes (about 30 s): crash-safe, not power-loss-safe.
A record cut off by a crash is detected at the next start; the new segment names the cut and
links to the last whole record, so `verify` still proves everything before it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

GENESIS = "0" * 64
_SEGMENT = re.compile(r"^commands-(\d{6})-")


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _tail(path: Path) -> tuple[str, int, bool]:
    """Last valid hash, number of whole lines, and whether the file ends in a cut-off line."""
    last, whole, cut, _ = _scan(path)
    return last, whole, cut


def _scan(path: Path) -> tuple[str, int, bool, int]:
    """_tail plus the highest command sequence number recorded (0 if none)."""
    last, whole, cut, seq = None, 0, False, 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.endswith("\n"):
                cut = True
                break
            try:
                entry = json.loads(line)
                last = entry["hash"]
                seq = max(seq, int(entry["record"].get("seq") or 0))
            except (ValueError, KeyError, TypeError, AttributeError):
                cut = True
                break
            whole += 1
    return last or GENESIS, whole, cut, seq


class AuditLog:
    def __init__(self, directory: str | os.PathLike, fsync: str = "interval") -> None:
        if fsync not in ("every", "interval", "never"):
            raise ValueError("audit fsync policy must be every, interval or never")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        self.fsync = fsync
        previous = audit_files(self.directory)
        number = int(_SEGMENT.match(previous[-1].name).group(1)) + 1 if previous else 1
        self.path = self.directory / (f"commands-{number:06d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                                      f"-{os.getpid()}.jsonl")
        self._fh = open(self.path, "a", encoding="utf-8")
        self._prev = GENESIS
        self._last_sync = time.monotonic()
        self.records = 0
        self.last_sequence = 0  # the highest command sequence number of the previous segment
        header = {"type": "segment", "segment": number, "started_ns": time.time_ns(), "pid": os.getpid(),
                  "previous_file": previous[-1].name if previous else None}
        if previous:
            last_hash, whole, cut, self.last_sequence = _scan(previous[-1])
            self._prev = last_hash
            if cut:  # a crash cut the previous segment's last record: say so, link to the last whole one
                header["previous_cut_after_lines"] = whole
        self._write(header)

    def _write(self, record: dict) -> str:
        body = dict(record, prev=self._prev)
        digest = _digest(body)
        self._fh.write(json.dumps({"hash": digest, "record": body}, sort_keys=True, separators=(",", ":")) + "\n")
        self._fh.flush()
        self._prev = digest
        now = time.monotonic()
        if self.fsync == "every" or (self.fsync == "interval" and now - self._last_sync > 1.0):
            os.fsync(self._fh.fileno())
            self._last_sync = now
        return digest

    def append(self, record: dict) -> str:
        digest = self._write(record)
        self.records += 1
        return digest

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()


class AuditError(ValueError):
    """An audit file does not verify; the message names the file, the line and what is wrong."""


def verify_chain(path: str | os.PathLike, expected_prev: str | None = None, allow_cut: bool = False) -> int:
    """Check every link of one audit file; returns its command-record count or raises AuditError naming
    the first bad record: edited (hash mismatch), deleted or reordered (broken link), or truncated.
    `expected_prev`: the hash the file's first record must link to (the previous segment's last)."""
    prev = expected_prev
    count = 0
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.endswith("\n"):
                if allow_cut:
                    return count
                raise AuditError(f"{path}:{lineno}: truncated record (the file ends mid-line)")
            try:
                entry = json.loads(line)
                body = entry["record"]
                stored = entry["hash"]
            except (ValueError, KeyError, TypeError) as exc:
                if allow_cut:
                    return count
                raise AuditError(f"{path}:{lineno}: not an audit record ({exc})") from None
            if prev is None and lineno == 1:
                prev = body.get("prev") if body.get("type") == "segment" else GENESIS
            if body.get("prev") != prev:
                raise AuditError(f"{path}:{lineno}: chain broken: a record before it was deleted or reordered "
                                 f"(prev {str(body.get('prev'))[:16]}, expected {str(prev)[:16]})")
            if _digest(body) != stored:
                raise AuditError(f"{path}:{lineno}: record {body.get('seq')} was modified (hash mismatch)")
            prev = stored
            count += body.get("type") != "segment"
    return count


def verify_directory(directory: str | os.PathLike) -> list[tuple[Path, int]]:
    """Verify every segment and the links between them; a segment may end in a cut-off record only if
    the next segment's header says so. Returns (file, command records) per segment."""
    files = audit_files(directory)
    results = []
    prev = None
    for i, f in enumerate(files):
        nxt = _header(files[i + 1]) if i + 1 < len(files) else None
        cut_ok = nxt is not None and "previous_cut_after_lines" in nxt
        results.append((f, verify_chain(f, prev, allow_cut=cut_ok)))
        prev, _, _ = _tail(f)
    return results


def _header(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            body = json.loads(fh.readline())["record"]
        return body if body.get("type") == "segment" else None
    except (ValueError, KeyError, OSError):
        return None


def audit_files(target: str | os.PathLike) -> list[Path]:
    """The audit segments of a directory in order (their names start with a segment number)."""
    p = Path(target)
    if not p.is_dir():
        return [p]
    return sorted((f for f in p.glob("commands-*.jsonl") if _SEGMENT.match(f.name)),
                  key=lambda f: int(_SEGMENT.match(f.name).group(1)))


def read_records(path: str | os.PathLike) -> list[dict]:
    """The command records of one segment (without its header; a cut-off last line is skipped)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            body = json.loads(line)["record"]
            if body.get("type") != "segment":
                out.append(body)
    return out
