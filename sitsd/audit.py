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
links to the last whole record, so `verify` still proves everything before it. Only a torn final write
(the file's last bytes, without a newline) is a cut: a whole line that is no record, or a record that
breaks the chain or its hash, is damage. The start then keeps every record after it, goes on from the
last of them, records `previous_damaged_at_line` in the new header (`verify` keeps failing on that line)
and the daemon raises alert `audit`.

Clean stop: `close` writes a `close` record as the segment's last, and the next start's header says
`previous_closed`. `verify` cannot see a cut of the newest segment's tail from the chain alone; it says
so when the newest segment has no close record and no anchor follows its newest command record.

Durable watermark (`AuditLog.durability`, `sitsctl status` audit_durable): the last record this process knows
is on disk, i.e. fsynced together with its segment's directory entry, with its command sequence, hash and the
wall time of that fsync, and how many command records were written after it (in the kernel, not yet on disk).
Under `never` sitsd fsyncs only at segment rotation, retention, anchor records and close, so the watermark
mostly stands still there: that is the policy, and status says so.

Segments, compression and retention: a segment is a plain JSONL file while it is written (an append
is one write; a crash can only cut its last line). Past audit.segment_max_mb the log starts a new
segment linked to the last record of the old one, and a background thread compresses the closed
segment into one zstd frame with a content checksum (`.jsonl.zst`: written to a temporary file,
fsynced, renamed, and only then the plain file removed, so a crash at any point leaves at least one
complete copy). Retention (audit.retention_days, audit.max_total_mb) deletes the oldest compressed
segments, never the one being written; before it deletes one it appends a `retention` record naming
the file and its last hash, so `verify` tells a segment removed by policy from one deleted by hand. The
record also carries the removed segment's newest anchor counter (`removed_newest_anchor`): where no anchor
record is left (the anchor was off, or the TPM out, since), the TPM counter is compared with it.

Readers (`iter_records`, `read_records`, `iter_entries`; `sitsctl audit show`) do not stop at damage: each record is
checked on its own (it parses, its hash matches) and against the intact record before it, what is not returned is
reported as an `AuditDamage` (file, line, byte offset, kind, reason) and reading goes on; a damaged zstd frame ends
its segment (one `frame` report). `strict` readers raise AuditError at the first damage; `verify_chain` and
`verify_directory` (`sitsctl audit verify`) check the whole chain and fail on any damage.

Anchor (audit.anchor: tpm, sitsd/audit_anchor.py): the chain alone cannot show that its newest records were
cut off (what is left is a valid prefix). With an anchor, `anchor` records carrying the value of a TPM NV
counter are written at start, every audit.anchor_interval_s, as the first record of each new segment and at a
clean close; each is fsynced before the counter is incremented to its value, so the log is never behind the
TPM. A TPM counter above the newest anchor in the log means anchored records were deleted.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import queue
import re
import threading
import time
from pathlib import Path

from typing import NamedTuple

import zstandard

from .durable import fsync_dir as _fsync_dir

GENESIS = "0" * 64
DURABILITY = {  # what each audit.fsync policy promises (status: audit_durable.promise)
    "every": "each record is fsynced before the next command is written",
    "interval": "records are fsynced at least once a second",
    "never": "no fsync per record: the kernel writes back when it likes (about 30 s); fsynced only at segment "
             "rotation, retention, anchor records and close",
}
_SEGMENT = re.compile(r"^commands-(\d{6})-.*\.jsonl(\.zst)?$")
_ZST = ".zst"
_CHUNK = 1 << 16  # bytes read from a segment file at a time
_FEED = 1 << 12  # compressed bytes handed to the zstd decompressor at a time


def _zstd_chunks(fh):
    """The decompressed bytes of a compressed segment, frame after frame. Unlike a stream reader it notices a
    frame cut short (a truncated file ends without an error there) and a file with no frame at all: both raise
    zstandard.ZstdError, as a corrupt block or a checksum mismatch does."""
    dctx = zstandard.ZstdDecompressor()
    obj, fed, frames = dctx.decompressobj(), False, 0
    while block := fh.read(_CHUNK):
        # fed in small pieces: a corrupt block or a checksum mismatch raises in the call that reaches it, and the
        # output of that call is lost; the records decompressed before it are yielded already
        for at in range(0, len(block), _FEED):
            data = block[at:at + _FEED]
            while data:
                fed = True
                out = obj.decompress(data)
                if out:
                    yield out
                if not obj.eof:
                    break
                frames += 1
                data, obj, fed = obj.unused_data, dctx.decompressobj(), False
    if fed:
        raise zstandard.ZstdError("the zstd frame ends early: the file is truncated (or bytes follow its frame)")
    if not frames:
        raise zstandard.ZstdError("no zstd frame: the file is empty")


class _ZstdStream(io.RawIOBase):
    """A compressed segment's decompressed bytes as a raw stream (`_zstd_chunks`: a truncated frame raises)."""

    def __init__(self, fh) -> None:
        super().__init__()
        self._fh, self._chunks = fh, _zstd_chunks(fh)
        self._buf, self._at = memoryview(b""), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._at >= len(self._buf):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf, self._at = memoryview(chunk), 0
        n = min(len(b), len(self._buf) - self._at)
        b[:n] = self._buf[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
        super().close()


def _open_binary(path: Path):
    """A segment as bytes (decompressed for .zst) and the path actually opened; as _open_text, a plain segment
    compressed since it was listed is read from its .zst copy."""
    if not path.name.endswith(_ZST):
        try:
            return open(path, "rb"), path
        except FileNotFoundError:
            compressed = path.with_name(path.name + _ZST)
            if not compressed.exists():
                raise
            path = compressed
    return _ZstdStream(open(path, "rb")), path


def _open_text(path: Path):
    """A segment as text lines, compressed or not (a damaged zstd frame raises zstandard.ZstdError, a truncated one
    too: see _zstd_chunks).
    A plain segment that the running daemon compressed since it was listed is read from its .zst: the plain
    file is opened first and only its absence (FileNotFoundError) sends us to the copy, so a compression that
    finishes between a check and the open cannot make a complete segment look missing. Once open, the plain
    file stays readable even if it is unlinked (the .zst is complete before the plain file goes)."""
    if not path.name.endswith(_ZST):
        try:
            return open(path, encoding="utf-8", errors="replace", newline="\n")
        except FileNotFoundError:
            compressed = path.with_name(path.name + _ZST)
            if not compressed.exists():
                raise
            path = compressed
    return io.TextIOWrapper(io.BufferedReader(_ZstdStream(open(path, "rb"))), encoding="utf-8", errors="replace",
                            newline="\n")


def compress_segment(path: Path) -> Path:
    """Replace a closed plain segment by its zstd copy, crash-safely; returns the new path."""
    target = path.with_name(path.name + _ZST)
    tmp = path.with_name(path.name + _ZST + ".tmp")
    # level 3: its context is ~3 MB where level 10's is ~21 MB, which glibc keeps in the daemon's RSS
    # after the first rotation (measured by bench/soak.py); hash-chained JSON compresses well at 3 too
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        cctx.copy_stream(src, dst)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, target)
    _fsync_dir(path.parent)
    path.unlink()
    _fsync_dir(path.parent)
    return target


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class _NotARecord(ValueError):
    """A whole line that is not an audit record (garbled, or not {"hash": str, "record": {...}})."""


def _entry(line: str) -> tuple[dict, str]:
    """The record body and stored hash of one whole line; _NotARecord if it is none."""
    try:
        entry = json.loads(line)
        body, stored = entry["record"], entry["hash"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise _NotARecord(str(exc)) from None
    if not isinstance(body, dict) or not isinstance(stored, str):
        raise _NotARecord("record is not an object with a hash")
    return body, stored


class _Scan(NamedTuple):
    """What a segment holds, read once: `last` the stored hash of its last readable record (GENESIS if none),
    `whole` its lines that end in a newline, `cut` whether it ends in bytes without one (a torn final write:
    the only thing a crash can leave), `seq` the highest command sequence number, `damaged_at`/`damage` the
    first whole line that is not a record (or, with `check`, breaks the chain or its hash) and what is wrong,
    `closed` whether its last record is a `close` record (a clean stop), `last_line` the line of that record."""

    last: str
    whole: int
    cut: bool
    seq: int
    damaged_at: int | None
    damage: str | None
    closed: bool
    last_line: int


def _tail(path: Path) -> tuple[str, int, bool]:
    """Last valid hash, number of whole lines, and whether the file ends in a cut-off line."""
    scan = _scan(path)
    return scan.last, scan.whole, scan.cut


def _scan(path: Path, check: bool = False) -> _Scan:
    """Read a segment to its end: a damaged line does not end the scan (the records after it are kept and
    linked to), only the first damage is named. `check` also checks each record's hash and link (the daemon's
    start, on the newest segment), as `verify_chain` does."""
    last, whole, cut, seq, closed, last_line = None, 0, False, 0, False, 0
    damaged_at, damage, prev = None, None, None
    try:
        with _open_text(path) as fh:
            for line in fh:
                if not line.endswith("\n"):
                    cut = True
                    break
                whole += 1
                try:
                    body, stored = _entry(line)
                except _NotARecord as exc:
                    if damaged_at is None:
                        damaged_at, damage = whole, f"not an audit record ({exc})"
                    continue
                if check and damaged_at is None:
                    if prev is not None and body.get("prev") != prev:
                        damaged_at, damage = whole, "chain broken: a record before it was deleted or reordered"
                    elif _digest(body) != stored:
                        damaged_at, damage = whole, f"record {body.get('seq')} was modified (hash mismatch)"
                    prev = stored
                last, closed, last_line = stored, body.get("type") == "close", whole
                if "type" not in body:
                    try:
                        seq = max(seq, int(body.get("seq") or 0))
                    except (ValueError, TypeError):
                        if damaged_at is None:
                            damaged_at, damage = whole, f"malformed sequence number {body.get('seq')!r}"
    except zstandard.ZstdError as exc:
        if damaged_at is None:
            damaged_at, damage = whole + 1, f"compressed segment is damaged after line {whole} ({exc})"
    return _Scan(last or GENESIS, whole, cut, seq, damaged_at, damage, closed and not cut, last_line)


def segment_tail(path: str | os.PathLike) -> dict:
    """The end of one segment (`sitsctl audit verify`): whether its last record is a clean stop's `close` record,
    that record's line and hash, the whole lines and the newest command sequence number."""
    scan = _scan(Path(path))
    return {"closed": scan.closed, "line": scan.last_line, "hash": scan.last, "lines": scan.whole, "seq": scan.seq,
            "cut": scan.cut, "damaged_at": scan.damaged_at}


class _Mark(NamedTuple):
    """A point in the log: command records written by this process up to it, the command sequence number of the
    last of them (None before the first), the hash of the last record (any kind), and for a durable mark the wall
    time of the fsync that made it so."""

    records: int
    seq: int | None
    hash: str | None
    at_ns: int | None = None


class AuditLog:
    def __init__(self, directory: str | os.PathLike, fsync: str = "interval", *, segment_max_mb: float = 64.0,
                 retention_days: float | None = None, max_total_mb: float | None = None) -> None:
        if fsync not in ("every", "interval", "never"):
            raise ValueError("audit fsync policy must be every, interval or never")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        self.fsync = fsync
        self.segment_max_bytes = int(segment_max_mb * 1024 * 1024)
        self.retention_s = retention_days * 86400 if retention_days else None
        self.max_total_bytes = int(max_total_mb * 1024 * 1024) if max_total_mb else None
        self._lock = threading.Lock()
        self._prev = GENESIS
        # the newest record written, and the newest known on disk: replaced whole (never mutated), so a reader
        # without the lock (status) sees a consistent pair of fields; written is never behind durable
        self._written = _Mark(0, None, None)
        self._durable = _Mark(0, None, None)
        self._last_sync = time.monotonic()
        self.records = 0
        self.compressed = 0  # segments compressed by this process
        self.removed: list[str] = []  # segments deleted by retention
        self.housekeeping_error: str | None = None
        self.anchor = None  # sitsd.audit_anchor.AuditAnchor once attached (audit.anchor: tpm)
        self._dir_synced: Path | None = None  # the segment whose directory entry is known to be on disk
        self._closed_queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        for stale in self.directory.glob("commands-*.jsonl.zst.tmp"):  # a compression cut by a crash
            stale.unlink()
        for done in self.directory.glob("commands-*.jsonl.zst"):  # a crash between rename and unlink:
            plain = done.with_name(done.name.removesuffix(_ZST))  # the renamed copy is complete
            if plain.exists():
                plain.unlink()
        previous = audit_files(self.directory)
        self.last_sequence = 0  # the highest command sequence number of the previous segment
        # what the start found at the end of the previous segment: a crash cut {file, after_lines}, or damage
        # {file, line, damage, lines, message} (the daemon raises alert `audit` with the message)
        self.start_cut: dict | None = None
        self.start_damage: dict | None = None
        self._fh = None
        self._pending = 0
        self._idle = threading.Condition()
        self._open_segment(previous[-1] if previous else None, at_start=True)
        for f in previous:  # plain segments a crash left uncompressed (all of them are closed now)
            if not f.name.endswith(_ZST):
                self._queue_closed(f)
        if previous and (self.retention_s or self.max_total_bytes):
            self._queue_closed(None)  # apply retention once at start
        self._dirty = True  # written since the last fsync (the segment header, so far)
        self._stop_flusher = threading.Event()
        self._flusher: threading.Thread | None = None
        if self.fsync == "interval":
            # the promise is "at most the last second": a record written and then followed by silence (PLC down,
            # commands held) must still reach the disk within a second, not at the next record
            self._flusher = threading.Thread(target=self._flush_loop, name="sits-audit-fsync", daemon=True)
            self._flusher.start()

    def _flush_loop(self) -> None:
        while not self._stop_flusher.wait(0.25):
            with self._lock:
                if self._dirty and not self._fh.closed and time.monotonic() - self._last_sync >= 1.0:
                    try:
                        self._fsync_locked()
                    except OSError as exc:  # the next write reports the disk; keep trying
                        self.housekeeping_error = f"fsync of {self.path}: {exc.strerror or exc}"
                        continue

    def _open_segment(self, previous: Path | None, at_start: bool = False) -> None:
        number = int(_SEGMENT.match(previous.name).group(1)) + 1 if previous else 1
        self.path = self.directory / (f"commands-{number:06d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                                      f"-{os.getpid()}.jsonl")
        self._fh = open(self.path, "ab", buffering=0)  # one os.write per record: no half-flushed buffers
        self._size = 0
        header = {"type": "segment", "segment": number, "started_ns": time.time_ns(), "pid": os.getpid(),
                  "previous_file": previous.name.removesuffix(_ZST) if previous else None}
        if previous is not None and at_start:
            scan = _scan(previous, check=True)
            self._prev, self.last_sequence = scan.last, scan.seq
            # a clean stop ends a segment with a `close` record; without it the last run crashed, was killed or
            # lost power, or the tail of its segment was cut since (`audit verify` says so)
            header["previous_closed"] = scan.closed
            if scan.cut:  # a crash cut the previous segment's last write: say so, link to the last whole record
                header["previous_cut_after_lines"] = scan.whole
                self.start_cut = {"file": previous.name, "after_lines": scan.whole}
            if scan.damaged_at is not None:
                # damage, not a crash: a whole line that is no record, or a record that breaks the chain. The records
                # after it are kept and the chain goes on from the last of them; the header names the damage, so
                # `audit verify` keeps failing on it (naming the line) and the daemon raises alert `audit`
                header["previous_damaged_at_line"] = scan.damaged_at
                header["previous_damage"] = scan.damage
                header["previous_lines"] = scan.whole
                self.start_damage = {
                    "file": str(previous), "line": scan.damaged_at, "damage": scan.damage, "lines": scan.whole,
                    "message": f"audit log damaged: {previous}:{scan.damaged_at}: {scan.damage}; the records after it "
                               f"({scan.whole - scan.damaged_at} line(s)) are kept and the chain goes on from the last "
                               f"of them; `sitsctl audit verify` fails on this record from now on"}
        self._write_locked(header)

    def _write_locked(self, record: dict) -> str:
        body = dict(record, prev=self._prev)
        digest = _digest(body)
        line = (json.dumps({"hash": digest, "record": body}, sort_keys=True, separators=(",", ":")) + "\n").encode()
        fd = self._fh.fileno()
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)")
        except OSError as exc:
            try:  # never leave half a record: cut the file back to the last whole one
                os.ftruncate(fd, self._size)
            except OSError:
                pass
            raise AuditWriteError(f"cannot write audit record to {self.path}: {exc.strerror or exc}") from exc
        self._size += len(line)
        self._prev = digest
        written = self._written
        if "type" in record:
            self._written = written._replace(hash=digest)
        else:
            seq = record.get("seq")
            self._written = _Mark(written.records + 1, seq if isinstance(seq, int) else written.seq, digest)
        now = time.monotonic()
        if self.fsync == "every" or (self.fsync == "interval" and now - self._last_sync > 1.0):
            self._fsync_locked()
        else:
            self._dirty = True
        return digest

    def _fsync_locked(self) -> None:
        """fsync the segment being written (and, the first time, its directory entry: a record in a file the
        directory may lose after a power loss is not on disk); everything written so far is then durable."""
        os.fsync(self._fh.fileno())
        self._last_sync = time.monotonic()
        self._dirty = False
        if self._dir_synced != self.path:
            _fsync_dir(self.directory)
            self._dir_synced = self.path
        self._durable = self._written._replace(at_ns=time.time_ns())

    def durability(self) -> dict:
        """The durable watermark for status, without the lock (an fsync in progress does not hold status up):
        `durable` {records, seq, hash, at_ns} is the newest record known on disk (records/seq None/0 before
        the first fsync of this process), `not_durable` the command records written after it."""
        durable = self._durable  # first: the written mark read after it is never older
        written = self._written
        return {"policy": self.fsync, "promise": DURABILITY[self.fsync], "records": durable.records,
                "seq": durable.seq, "hash": durable.hash, "at_ns": durable.at_ns,
                "not_durable": max(0, written.records - durable.records), "head_records": written.records,
                "head_seq": written.seq}

    @property
    def head(self) -> str:
        """The hash of the last record written (what the next one links to)."""
        return self._prev

    def head_status(self) -> dict:
        """status audit_head: command records written by this process, the last one's sequence number and the
        hash of the last record (one consistent snapshot, without the lock)."""
        written = self._written
        return {"records": written.records, "seq": written.seq, "hash": written.hash or self._prev}

    def append(self, record: dict) -> str:
        with self._lock:
            digest = self._write_locked(record)
            self.records += 1
            if self._size >= self.segment_max_bytes:
                self._rotate_locked()
        return digest

    def _rotate_locked(self) -> None:
        """Close the current segment (fsynced) and continue the chain in a new one."""
        closed, old_fh, old_size, old_prev = self.path, self._fh, self._size, self._prev
        self._fsync_locked()
        old_marks = self._written, self._durable, self._dir_synced
        try:
            self._open_segment(closed)
        except OSError:  # no room for a new segment: go on in the old one, try again at the next record
            if self._fh is not old_fh:
                self._fh.close()
                self.path.unlink(missing_ok=True)
            self._fh, self._size, self._prev, self.path = old_fh, old_size, old_prev, closed
            self._written, self._durable, self._dir_synced = old_marks
            return
        old_fh.close()
        self._queue_closed(closed)
        if self.anchor is not None:  # the new segment opens with an anchor: deleting the whole file shows too
            self.anchor.on_rotation_locked()

    def sync_locked(self) -> None:
        """fsync the segment being written, and once per segment its directory entry (a record the TPM
        counter will vouch for must survive a power loss together with the file that holds it). Caller
        holds the lock (`write_typed_locked` for the anchor)."""
        self._fsync_locked()

    def write_typed_locked(self, record: dict, sync: bool = True) -> str:
        """A record of the log itself (anchor, anchor_gap), not a command; the caller holds `lock`.
        With `sync` it is on disk when this returns (AuditWriteError or OSError otherwise)."""
        if self._fh.closed:
            raise AuditWriteError(f"audit log {self.path} is closed")
        digest = self._write_locked(record)
        if sync:
            self.sync_locked()
        return digest

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    @property
    def closed(self) -> bool:
        return self._fh is None or self._fh.closed

    def _queue_closed(self, path: Path | None) -> None:
        with self._idle:
            self._pending += 1
        self._closed_queue.put(path)
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._housekeeping, name="sitsd-audit-zstd", daemon=True)
            self._worker.start()

    def _housekeeping(self) -> None:
        """Compress closed segments, then apply retention; errors are kept for status, never raised."""
        while True:
            try:
                path = self._closed_queue.get(timeout=5.0)
            except queue.Empty:
                return
            try:
                if path is not None and path.exists():
                    if path.with_name(path.name + _ZST).exists():  # a crash hit between rename and unlink
                        path.unlink()
                    else:
                        compress_segment(path)
                        self.compressed += 1
                self._apply_retention()
                self.housekeeping_error = None
            except (OSError, zstandard.ZstdError) as exc:
                self.housekeeping_error = f"audit housekeeping: {exc}"
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _apply_retention(self) -> None:
        if not (self.retention_s or self.max_total_bytes):
            return
        compressed = [f for f in audit_files(self.directory) if f.name.endswith(_ZST)]
        total = sum(f.stat().st_size for f in audit_files(self.directory))
        now = time.time()
        for f in compressed[:-1] if len(compressed) > 1 else []:  # keep the newest closed segment
            too_old = self.retention_s is not None and now - f.stat().st_mtime > self.retention_s
            too_big = self.max_total_bytes is not None and total > self.max_total_bytes
            if not (too_old or too_big):
                break
            scan = _scan(f)
            record = {"type": "retention", "removed_file": f.name.removesuffix(_ZST), "removed_last_hash": scan.last,
                      "removed_lines": scan.whole, "removed_last_seq": scan.seq, "reason": "age" if too_old else "size"}
            # the newest anchor in the removed segment goes on in its retention record: where the newer segments
            # hold no anchor (the TPM was out, or audit.anchor off for a while) the next start compares the TPM
            # counter with it, not with nothing (which would read as a deletion)
            try:
                removed_anchor = anchor_summary([f])["newest"]
            except AnchorScanError as exc:  # a malformed anchor record: the chain check names the segment
                record["removed_anchor_unreadable"] = str(exc)
            else:
                if removed_anchor is not None:
                    record["removed_newest_anchor"] = removed_anchor["counter"]
            with self._lock:  # the record first: a crash before the unlink leaves a file, never a gap
                self._write_locked(record)
                self._fsync_locked()
            size = f.stat().st_size
            f.unlink()
            total -= size
            self.removed.append(f.name)

    def flush_housekeeping(self, timeout_s: float = 30.0) -> bool:
        """Wait until queued compression and retention are done; False on timeout (tests, shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self) -> None:
        self._stop_flusher.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(timeout=5)
        anchor = self.anchor
        if anchor is not None and not self.closed:
            # the closing anchor while the file is open: a pending increment first, then the record and its increment
            # (outside the log's lock); skipped when nothing was written since the newest anchor. Never raises.
            anchor.close_anchor()
        with self._lock:
            if not self._fh.closed:
                try:
                    try:  # the clean-stop marker, last in the segment: a cut of the tail removes it, which shows
                        self._write_locked({"type": "close", "t_ns": time.time_ns(), "pid": os.getpid(),
                                            "records": self.records, "last_seq": self._written.seq})
                    except AuditWriteError:  # disk full: no marker; the next start records previous_closed false
                        pass
                    self._fsync_locked()
                finally:
                    self._fh.close()
        if anchor is not None:  # stops its thread; an increment still pending is tried once more
            anchor.close()


class AuditWriteError(OSError):
    """A record could not be written (disk full, I/O error); the file still ends on a whole record."""


class AuditError(ValueError):
    """An audit file does not verify; the message names the file, the line and what is wrong."""


def verify_chain(path: str | os.PathLike, expected_prev: str | None = None, allow_cut: bool = False,
                 cut_after_lines: int | None = None) -> int:
    """Check every link of one audit file; returns its command-record count or raises AuditError naming
    the first bad record: edited (hash mismatch), deleted or reordered (broken link), damaged (a whole line that
    is no record), or truncated. `expected_prev`: the hash the file's first record must link to (the previous
    segment's last). `allow_cut`: the file may end in bytes without a newline (a torn final write, which is all a
    crash can leave); `cut_after_lines`: ... and must, after exactly that many whole lines (what the next
    segment's header recorded). A line that cannot be read is never accepted when more follows it."""
    prev = expected_prev
    count = 0
    lineno = 0
    if cut_after_lines is not None:
        allow_cut = True
    with _open_text(Path(path)) as fh:
        for lineno, line in _lines(fh, path):
            if not line.endswith("\n"):  # only the last line can lack it
                if not allow_cut:
                    raise AuditError(f"{path}:{lineno}: truncated record (the file ends mid-line)")
                if cut_after_lines is not None and lineno - 1 != cut_after_lines:
                    raise AuditError(f"{path}:{lineno}: truncated record after {lineno - 1} whole lines, but the next "
                                     f"segment's header recorded the cut after line {cut_after_lines}")
                return count
            try:
                body, stored = _entry(line)
            except _NotARecord as exc:
                raise AuditError(f"{path}:{lineno}: not an audit record ({exc})") from None
            if prev is None and lineno == 1:
                prev = body.get("prev") if body.get("type") == "segment" else GENESIS
            if body.get("prev") != prev:
                raise AuditError(f"{path}:{lineno}: chain broken: a record before it was deleted or reordered "
                                 f"(prev {str(body.get('prev'))[:16]}, expected {str(prev)[:16]})")
            if _digest(body) != stored:
                raise AuditError(f"{path}:{lineno}: record {body.get('seq')} was modified (hash mismatch)")
            prev = stored
            count += "type" not in body
    if cut_after_lines is not None:
        raise AuditError(f"{path}:{lineno}: ends on a whole record at line {lineno}, but the next segment's header "
                         f"recorded a cut after line {cut_after_lines} (the file was changed since)")
    return count


def _lines(fh, path):
    """Numbered lines of a segment; a damaged compressed segment becomes an AuditError."""
    lineno = 0
    try:
        for line in fh:
            lineno += 1
            yield lineno, line
    except zstandard.ZstdError as exc:
        raise AuditError(f"{path}: compressed segment is damaged after line {lineno} ({exc})") from None


def verify_directory(directory: str | os.PathLike) -> list[tuple[Path, int]]:
    """Verify every segment and the links between them; a segment may end in a cut-off record only if
    the next segment's header says so. A segment missing at the start is accepted only if a retention
    record names it (deleted by policy) and the first remaining segment links to its last hash.
    Returns (file, command records) per segment."""
    files = audit_files(directory)
    results = []
    prev = None
    if files:
        first = segment_header(files[0])
        missing = first.get("previous_file") if first else None
        if missing:
            removed = _retention_records(files)
            if missing not in removed:
                raise AuditError(f"{files[0]}:1: segment {missing} before it is missing and no retention record "
                                 "says it was removed by policy (deleted by hand?)")
            prev = removed[missing]
    for i, f in enumerate(files):
        nxt = segment_header(files[i + 1]) if i + 1 < len(files) else None
        cut_after = nxt.get("previous_cut_after_lines") if nxt is not None else None
        if nxt is not None and nxt.get("previous_file") != f.name.removesuffix(_ZST):
            raise AuditError(f"{files[i + 1]}:1: follows {nxt.get('previous_file')}, but the segment before it "
                             f"is {f.name} (a segment in between was deleted)")
        damaged = nxt.get("previous_damaged_at_line") if nxt is not None else None
        try:
            # a cut is accepted only where the next header recorded it, as the file's last bytes, after exactly
            # the whole lines it names
            n = verify_chain(f, prev, cut_after_lines=cut_after if isinstance(cut_after, int) else None)
        except AuditError as exc:
            if damaged is None:
                raise
            raise AuditError(f"{exc} [sitsd found this segment damaged at its next start and recorded it in "
                             f"{files[i + 1].name}:1 (previous_damaged_at_line {damaged}); the records after it "
                             "were kept]") from None
        if damaged is not None:
            raise AuditError(f"{files[i + 1]}:1: sitsd found {f.name} damaged at line {damaged} at its start "
                             f"({nxt.get('previous_damage')}), but the file verifies now: it was changed since")
        results.append((f, n))
        prev, _, _ = _tail(f)
    return results


def _retention_records(files: list[Path]) -> dict[str, str]:
    """removed segment name -> its last hash, from the retention records of the remaining segments."""
    out = {}
    for f in files:
        try:
            with _open_text(f) as fh:
                for line in fh:
                    if '"retention"' in line:
                        body = json.loads(line)["record"]
                        if body.get("type") == "retention":
                            out[body["removed_file"]] = body["removed_last_hash"]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError, zstandard.ZstdError):
            continue  # the chain check of that file names the damage
    return out


def segment_header(path: Path) -> dict | None:
    try:
        with _open_text(path) as fh:
            body = json.loads(fh.readline())["record"]
        return body if body.get("type") == "segment" else None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError, zstandard.ZstdError):
        return None


def audit_files(target: str | os.PathLike) -> list[Path]:
    """The audit segments of a directory in order (their names start with a segment number); where a
    crash left both the plain and the compressed copy of one segment, the compressed one counts."""
    p = Path(target)
    if not p.is_dir():
        return [p] if p.exists() else []
    by_number: dict[int, Path] = {}
    for f in p.glob("commands-*.jsonl*"):
        m = _SEGMENT.match(f.name)
        if m and (int(m.group(1)) not in by_number or m.group(2)):
            by_number[int(m.group(1))] = f
    return [by_number[n] for n in sorted(by_number)]


class AuditDamage(NamedTuple):
    """What a reader found wrong at one place of a segment (`iter_records`, `read_records`, `iter_entries`).

    `path` the segment file, `line` the 1-based line (of the decompressed text for a `.zst` segment), `offset`
    the byte offset where that line starts (in the file for a plain segment, in the decompressed text for a
    `.zst` one: a zstd frame has no per-line offsets of its own), `kind` and `reason` what is wrong:

      not_a_record  a whole line that is no JSON {"hash": str, "record": {...}}: the line's bytes are damaged
      modified      a record whose hash does not match its body: edited, or damaged in a way JSON still parses
      chain         an intact record that does not link to the intact record before it: a record between them
                    was deleted, or records were reordered or duplicated (the record itself is returned)
      cut           the file ends mid-line: the torn final write a crash leaves (or a truncated copy); the
                    partial line is no record. Not damage by itself: `verify` accepts it where the next
                    segment's header recorded the cut
      frame         the compressed segment's zstd frame is damaged (bad header, corrupt block, checksum
                    mismatch) or ends early: nothing after `line` can be decompressed; the records read before
                    it were checked one by one (hash, link) and are returned
      unreadable    the file cannot be opened or read (OSError)

    `str()` reads "<file name>:<line> (byte <offset>[ of the decompressed text]): <reason>"."""

    path: str
    line: int
    offset: int
    kind: str
    reason: str

    @property
    def file(self) -> str:
        return Path(self.path).name

    @property
    def where(self) -> str:
        return f"byte {self.offset}{' of the decompressed text' if self.file.endswith(_ZST) else ''}"

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.where}): {self.reason}"


class Records(list):
    """The command records of a segment (a list), with `damage`: what was skipped or is wrong (AuditDamage)."""

    damage: list[AuditDamage]


def _raw_lines(fh):
    """(line bytes, ends in a newline) of a binary stream, split on b"\\n" only; read errors propagate after the
    whole lines before them were yielded."""
    rest = b""
    while True:
        chunk = fh.read(_CHUNK)
        if not chunk:
            break
        rest += chunk
        start = 0
        while (end := rest.find(b"\n", start)) >= 0:
            yield rest[start:end + 1], True
            start = end + 1
        rest = rest[start:]
    if rest:
        yield rest, False


def _read_segment(path: Path):
    """Every line of one segment, checked on its own and against the intact record before it, as (line, offset,
    record body or None, AuditDamage or None): body None with a damage for a line that is not returned; a body
    with a damage (kind chain) for an intact record out of place. Never raises for what is in the file: a
    damaged compressed frame or a read error ends it with one last damage. The link check restarts after a
    damaged line (whose stored hash cannot be trusted) and at the start of the segment (its header links to the
    previous segment)."""
    lineno = offset = 0
    shown = path
    prev = None
    try:
        fh, shown = _open_binary(path)
        with fh:
            try:
                for raw, whole in _raw_lines(fh):
                    lineno += 1
                    here, offset = offset, offset + len(raw)
                    if not whole:
                        yield lineno, here, None, AuditDamage(str(shown), lineno, here, "cut",
                                                              f"cut off: the file ends mid-line ({len(raw)} bytes "
                                                              "after the last newline; what a crash leaves)")
                        break
                    try:
                        body, stored = _entry(raw.decode("utf-8", errors="replace"))
                    except _NotARecord as exc:
                        prev = None
                        yield lineno, here, None, AuditDamage(str(shown), lineno, here, "not_a_record",
                                                              f"not an audit record ({exc})")
                        continue
                    if _digest(body) != stored:
                        prev = None
                        yield lineno, here, None, AuditDamage(
                            str(shown), lineno, here, "modified",
                            f"record {body.get('seq', body.get('type'))} was modified (hash mismatch)")
                        continue
                    damage = None
                    if prev is not None and body.get("prev") != prev:
                        damage = AuditDamage(str(shown), lineno, here, "chain",
                                             "chain broken: the record before it is not the one it links to "
                                             "(a record was deleted, or records reordered or duplicated)")
                    prev = stored
                    yield lineno, here, body, damage
            except zstandard.ZstdError as exc:
                yield lineno + 1, offset, None, AuditDamage(
                    str(shown), lineno + 1, offset, "frame",
                    f"compressed segment is damaged: nothing after line {lineno} (decompressed byte {offset}) "
                    f"can be read (zstd: {exc})")
    except OSError as exc:
        yield lineno + 1, offset, None, AuditDamage(str(shown), lineno + 1, offset, "unreadable",
                                                    f"cannot read {shown}: {exc.strerror or exc}")


def iter_entries(path: str | os.PathLike):
    """Every line of one segment as (line, record body or None, AuditDamage or None), to its end, typed records
    (segment, anchor, close, ...) included: a line that is not returned (damaged, modified, cut off, or the point
    where a damaged compressed frame or a read error ends the segment) comes with body None and its damage; an
    intact record that does not link to the intact record before it comes with its body and a `chain` damage.
    Never raises for what is in the file (`sitsctl audit show`)."""
    for lineno, _offset, body, damage in _read_segment(Path(path)):
        yield lineno, body, damage


def iter_records(path: str | os.PathLike, on_damage=None, *, strict: bool = False, typed: bool = False):
    """The records of one segment whose own hash verifies, in order: command records only (without the segment
    header and the other typed records) unless `typed`. Each line that is not returned, and each intact record
    that breaks the chain (returned), is handed to `on_damage(AuditDamage)`; reading goes on where it can (a
    damaged zstd frame or a read error ends the segment). With `strict`, the first damage raises AuditError
    naming the file, line, byte offset and what is wrong (after on_damage saw it), except a cut-off last line:
    that is what a crash leaves, reported to on_damage and never raised. The reader checks each record on its
    own and its link to the intact record before it; `verify_chain`/`verify_directory` (`sitsctl audit verify`)
    check the whole chain across segments and stay the test of a complete log."""
    for _lineno, _offset, body, damage in _read_segment(Path(path)):
        if damage is not None:
            if on_damage is not None:
                on_damage(damage)
            if strict and damage.kind != "cut":
                raise AuditError(str(damage))
        if body is not None and (typed or "type" not in body):
            yield body


def read_records(path: str | os.PathLike, on_damage=None, *, strict: bool = False, typed: bool = False) -> Records:
    """The command records of one segment (without its header), as `iter_records` reads them: tolerant by default,
    a damaged line is skipped and reported (`on_damage`, and the returned list's `damage`), the records before and
    after it are returned; `strict` raises AuditError at the first damage instead."""
    damage: list[AuditDamage] = []

    def seen(d: AuditDamage) -> None:
        damage.append(d)
        if on_damage is not None:
            on_damage(d)

    out = Records(iter_records(path, seen, strict=strict, typed=typed))
    out.damage = damage
    return out


def read_entries(path: str | os.PathLike):
    """`iter_entries` with the damage as text (its reason): (line, record body or None, what is wrong or None). A
    chain break comes as its own entry (body None) before the intact record it concerns."""
    for lineno, body, damage in iter_entries(path):
        if damage is not None:
            yield lineno, None, damage.reason
        if body is not None:
            yield lineno, body, None


class AnchorScanError(Exception):
    """The anchor records of a log could not be read reliably: a segment that cannot be read (while the daemon's
    start check looks for the newest anchor), or a malformed anchor record; the message names the file."""


def _anchor_int(body: dict, key: str, where: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AnchorScanError(f"{where}: malformed {body.get('type')} record: {key} is {value!r}, not a counter value "
                              "(the record was edited or forged; `sitsctl audit verify` checks the chain)")
    return value


def _segment_anchors(f: Path, strict: bool) -> dict | None:
    """One segment's anchor records, in order: the last anchor, the anchor_init marker after it, the command
    records after it, anchor_gap records, and the newest anchor that retention records say a removed segment
    held. None if the segment cannot be read and not `strict`."""
    last, init, gaps, anchors, after, removed = None, None, [], 0, 0, None
    try:
        with _open_text(f) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.endswith("\n"):
                    break  # a cut-off last line is no record
                if '"type":"anchor' not in line and '"removed_newest_anchor"' not in line:
                    after += '"type":' not in line  # a command record (typed records name their type)
                    continue
                where = f"{f.name}:{lineno}"
                try:
                    body = json.loads(line)["record"]
                    kind = body.get("type")
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise AnchorScanError(f"{where}: malformed anchor record ({exc}): the record was edited or "
                                          "damaged; `sitsctl audit verify` checks the chain") from None
                if kind == "anchor":
                    anchors += 1
                    last = {"counter": _anchor_int(body, "counter", where), "nv_index": body.get("nv_index"),
                            "t_ns": body.get("t_ns"), "reason": body.get("reason"), "file": f.name, "line": lineno}
                    after, init = 0, None
                elif kind == "anchor_init":
                    init = {**{k: v for k, v in body.items() if k not in ("prev", "type")}, "file": f.name,
                            "line": lineno}
                elif kind == "anchor_gap":
                    gaps.append({**{k: v for k, v in body.items() if k not in ("prev", "type")},
                                 "file": f.name, "line": lineno})
                elif kind == "retention" and "removed_newest_anchor" in body:
                    counter = _anchor_int(body, "removed_newest_anchor", where)
                    if removed is None or counter >= removed["counter"]:
                        removed = {"counter": counter, "nv_index": None, "t_ns": None, "reason": "removed_by_retention",
                                   "file": f.name, "line": lineno, "removed_file": body.get("removed_file")}
    except (OSError, zstandard.ZstdError) as exc:
        if strict:
            raise AnchorScanError(f"cannot read {f}: {exc}") from exc
        return None  # the chain check names a damaged segment
    return {"last": last, "init": init, "gaps": gaps, "anchors": anchors, "after": after, "removed": removed}


def anchor_summary(files: list[Path], newest_only: bool = False) -> dict:
    """The anchor records of a log (audit.anchor: tpm): `newest` anchor {"counter", "nv_index", "t_ns", "reason",
    "file", "line"} or None, `init` (the newest anchor_init marker after it: a first use, or a counter defined again,
    not yet followed by an anchor), `gaps` (anchor_gap records with their file and line), `anchors` (how many) and
    `after_newest` (command records after the newest anchor, or all of them without one: not covered).
    Without any anchor record left, `newest` is the newest anchor a `retention` record says a removed segment held
    (reason "removed_by_retention"; file and line are those of the retention record).
    `newest_only` (the daemon's start check) reads segments from the newest back and stops at the first that
    holds an anchor; `gaps` and `after_newest` then only cover what it read, and a segment that cannot be read
    raises AnchorScanError (falling back to an older anchor would read as a deletion). A malformed anchor record
    raises AnchorScanError in both modes."""
    newest, init, gaps, anchors, after, removed = None, None, [], 0, 0, None
    for f in reversed(files) if newest_only else files:
        seg = _segment_anchors(f, strict=newest_only)
        if seg is None:
            continue
        anchors += seg["anchors"]
        gaps = seg["gaps"] + gaps if newest_only else gaps + seg["gaps"]  # in log order either way
        if seg["removed"] is not None and (removed is None or seg["removed"]["counter"] >= removed["counter"]):
            removed = seg["removed"]
        if newest_only:  # newest segment first
            after += seg["after"]
            init = init or seg["init"]
            if seg["last"] is not None:
                newest = seg["last"]
                break
        else:
            if seg["last"] is not None:
                newest, init, after = seg["last"], seg["init"], seg["after"]
            else:
                init, after = seg["init"] or init, after + seg["after"]
    if newest is None and removed is not None:
        newest = removed  # removed segments are older than every remaining one: only without an anchor left
    return {"newest": newest, "init": init, "gaps": gaps, "anchors": anchors, "after_newest": after}
