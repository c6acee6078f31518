"""Measured deployment: an ordered log of (kind, name, sha256) events, each extended into a PCR.

Event digest = SHA-256("sits-measurement-v1" 0x00 kind 0x00 name 0x00 sha256-bytes); the PCR after an
event = SHA-256(PCR before || event digest) (TPM2_PCR_Extend of the SHA-256 bank). With a TPM the
extension happens in the TPM (`TpmPcr`) and the log records the value the TPM reports; without one the
log keeps the same chain in software (a replay digest, evidence only of the log's own consistency).
`replay()` recomputes the chain from a log so a verifier can compare it with a quoted PCR value.

The tpm-session signer quotes this PCR next to its session PCR (16) whenever it binds its session key: the session
credential carries the log as (kind, name, sha256) entries (attestation/session.py), and `replay_entries` and
`measured_state` give a PLC the PCR value and what runs (the newest model, module per stage and config event).
`MeasurementLog.listeners` are called after each event, so the daemon can hand the PLC a new credential at once.

Compaction (`compact_at`, `compact_bytes`; off unless set: sitsd's PLC link sets them for a tpm-session log, since a
credential carries at most 256 entries in at most 32 KiB): when a `record` finds the log that long, it first
compacts it, under the log's lock (no measurement and no quote in between): the file is archived as
`<stem>-compacted-<ns>.jsonl`, the PCR is reset and what the log says runs is measured again from reset, as one
`compacted <archive file name> <SHA-256 of the archive's bytes>` event (the link to the history) followed by the
newest `model`, each `module:<stage>` and the newest `config` (`measured_state`: the same state, so a verifier's
view does not change; other kinds, e.g. `approval`, `persisted`, stay in the archive). The archive is the file when
it replays to the log in memory, else (a torn or stale file) the log in memory written out. A compaction that fails
before the PCR reset changes nothing (retried at the next record); one that fails after it leaves the PCR unexplained
by the log (`damaged`): every record retries it first and is refused while it fails, and a bind refuses the log.

A record appends its event to the file (flushed) before it extends the PCR, and adds it to the log in memory only
once the PCR holds it: a failed append measures nothing (the file is rewritten from memory at the next record). An
extension of unknown outcome (the TPM timed out or failed, or the PCR is not what the log predicts) leaves the PCR
unexplained by the log: `damaged` is set, the record raises (the event is not in the log in memory, so the change it
measured must not go live), and the next record or bind compacts the log: the PCR is reset and what the log says runs
is measured again (the damaged case above). A record refuses, with nothing measured, an event a session credential
could not carry (kind 1..64 and name 0..255 UTF-8 bytes without NUL).

The log is JSON lines: a header {"format", "version", "pcr", "mode", "initial"} then one event per line.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import AttestationError

FORMAT = "sits-measurement-log"
LABEL = b"sits-measurement-v1"
ZERO = bytes(32)
DEFAULT_PCR = 23  # resettable, application-owned; PCR 16 carries the session signer's model measurements
MODEL_KINDS = ("model", "rollback:model")  # events that name the model that runs
CONFIG_KINDS = ("config", "rollback:config")  # events that name the config that runs
MODULE_KIND = "module:"  # module:<stage>, rollback:module:<stage>: the module that runs at <stage>
COMPACTED_KIND = "compacted"  # the first event of a compacted log: (archive file name, SHA-256 of its bytes)
# compaction thresholds sitsd uses for a tpm-session log (attestation.session: a credential carries at most 256 entries
# and 32 KiB): well under both, so a log is compacted long before a re-bind could fail for its length
COMPACT_AT_EVENTS = 128
COMPACT_AT_BYTES = 16 * 1024  # the entries' share of a credential (entry_bytes), for long kinds and names
MIN_COMPACT_AT = 8  # a compacted log holds 3 + one event per module stage: a lower threshold would compact each time
MAX_KIND_BYTES, MAX_NAME_BYTES = 64, 255  # per entry, as a session credential carries it (attestation/session.py)


def check_entry(kind, name) -> None:
    """MeasurementError unless (kind, name) is an entry a session credential carries: text, kind 1..64 and name 0..255
    UTF-8 bytes, neither with NUL (the event digest separates them by NUL)."""
    if type(kind) is not str or type(name) is not str:
        raise MeasurementError(f"measurement kind and name must be text, got {type(kind).__name__} and "
                               f"{type(name).__name__}")
    try:
        kind_bytes, name_bytes = kind.encode(), name.encode()
    except UnicodeError:  # a lone surrogate
        raise MeasurementError(f"measurement {kind!r}/{name!r}: not UTF-8 text") from None
    if "\0" in kind or "\0" in name:
        raise MeasurementError(f"measurement {kind!r}/{name!r}: NUL in the kind or name (the event digest separates "
                               "them by NUL)")
    if not 0 < len(kind_bytes) <= MAX_KIND_BYTES:
        raise MeasurementError(f"measurement kind {kind[:80]!r}: {len(kind_bytes)} bytes, a session credential "
                               f"carries 1..{MAX_KIND_BYTES}")
    if len(name_bytes) > MAX_NAME_BYTES:
        raise MeasurementError(f"measurement {kind}/{name[:80]!r}…: name of {len(name_bytes)} bytes, a session "
                               f"credential carries at most {MAX_NAME_BYTES}")


def entry_bytes(kind: str, name: str) -> int:
    """About what one (kind, name, SHA-256) entry takes in a CBOR session credential (at most 3 header bytes per item
    and the array's, 34 for the SHA-256 byte string)."""
    return len(kind.encode()) + len(name.encode()) + 42


class MeasurementError(AttestationError):
    """A measurement log that does not replay, or a PCR extension that failed."""


def event_digest(kind: str, name: str, sha256_hex: str) -> bytes:
    try:
        measured = bytes.fromhex(sha256_hex)
    except ValueError:
        raise MeasurementError(f"measurement {kind}/{name}: {sha256_hex!r} is not a hex SHA-256") from None
    if len(measured) != 32:
        raise MeasurementError(f"measurement {kind}/{name}: a SHA-256 has 32 bytes, got {len(measured)}")
    return hashlib.sha256(LABEL + b"\0" + kind.encode() + b"\0" + name.encode() + b"\0" + measured).digest()


def extend(value: bytes, digest: bytes) -> bytes:
    return hashlib.sha256(value + digest).digest()


@dataclass(frozen=True, slots=True)
class MeasurementEvent:
    index: int
    kind: str  # "model", "module:pre", "module:post", "config", "rollback:module:pre", ...
    name: str
    sha256: str
    digest: str
    pcr_after: str
    time_ns: int


class TpmPcr:
    """Extends and reads one SHA-256 PCR through a tpm2-pytss ESAPI context. `esapi` is a context or a
    callable returning one; `lock` serialises access when the context is shared (ESYS is not thread-safe)."""

    def __init__(self, esapi, pcr: int, lock: threading.Lock | None = None) -> None:
        self._esapi = esapi if callable(esapi) else (lambda: esapi)
        self.pcr = pcr
        self._lock = lock or threading.Lock()

    def read(self) -> bytes:
        from .tpm.quote import read_pcrs

        with self._lock:
            return read_pcrs(self._esapi(), [self.pcr])[self.pcr]

    def reset(self) -> None:
        """TPM2_PCR_Reset (PCR 16 and 23 only at locality 0): the log then explains the PCR from zero."""
        from .tpm.signer import _tss

        with self._lock:
            try:
                self._esapi().pcr_reset(getattr(_tss().ESYS_TR, f"PCR{self.pcr}"))
            except Exception as exc:  # TSS2_Exception: not resettable at this locality, or the TPM is gone
                raise MeasurementError(f"TPM2_PCR_Reset of PCR {self.pcr} failed: {exc} (only PCR 16 and 23 are "
                                       "resettable at locality 0)") from exc

    def extend(self, digest: bytes) -> bytes:
        from .tpm.quote import extend_pcr

        with self._lock:
            try:
                return extend_pcr(self._esapi(), self.pcr, digest)
            except Exception as exc:  # TSS2_Exception: the TPM went away or refused the PCR
                raise MeasurementError(f"TPM2_PCR_Extend of PCR {self.pcr} failed: {exc}") from exc

    def quote(self, ak_handle: int, extra_data: bytes):
        """TPM2_Quote of this PCR by the AK at `ak_handle` (created if absent), under the extensions' lock:
        (Quote, AK public PEM). Used by verify-on-boot (attestation/deploy.py)."""
        from .tpm.quote import ak_public_pem, load_or_create_ak, quote

        with self._lock:
            esapi = self._esapi()
            ak, _ = load_or_create_ak(esapi, ak_handle)
            return quote(esapi, ak, [self.pcr], extra_data), ak_public_pem(esapi, ak)


class MeasurementLog:
    """Append-only; `record()` extends the PCR (TPM or software) and appends the event to `path`. With `compact_at`
    (and/or `compact_bytes`) set, a record that finds the log that long compacts it first (see the module docstring)."""

    def __init__(self, path: Path | None, pcr: int = DEFAULT_PCR, tpm: TpmPcr | None = None, *,
                 compact_at: int | None = None, compact_bytes: int | None = None) -> None:
        self.path = Path(path) if path else None
        self.pcr = pcr
        self.tpm = tpm
        self.mode = "tpm2" if tpm is not None else "software"
        self.initial = tpm.read() if tpm is not None else ZERO
        self.value = self.initial
        self.events: list[MeasurementEvent] = []
        # called with each recorded event, after the log's lock is released (errors are swallowed: a listener
        # never fails a measurement); the daemon's PLC link re-binds the session key from here
        self.listeners: list = []
        # compaction: thresholds (None: never), what happened, and `on_compacted(info)` called after each compaction
        # (outside the lock, errors swallowed): the daemon's PLC link logs and counts it
        self.compact_at = compact_at
        self.compact_bytes = compact_bytes
        self.compactions = 0
        self.last_compaction: dict | None = None
        self.compaction_error: str | None = None  # the newest failed compaction's error, None once one succeeded
        # the log does not explain the PCR: a compaction failed in its PCR reset, or an extension's outcome is unknown
        self.damaged: str | None = None
        self.on_compacted = None
        self._entry_bytes = 0
        self._unarchived: Path | None = None  # a compacted log's old file still to be renamed to this archive name
        self._file_stale = False  # the file is not the log in memory (a compaction could not write it): rewrite
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(self._header_line())

    def _header_line(self) -> str:
        return json.dumps({"format": FORMAT, "version": 1, "pcr": self.pcr, "mode": self.mode,
                           "initial": self.initial.hex()}) + "\n"

    @property
    def entry_bytes(self) -> int:
        """About what the log's entries take in a session credential (sum of `entry_bytes`)."""
        return self._entry_bytes

    def compaction_due(self) -> str | None:
        """Why the log should be compacted now (in words), or None: damaged (a failed compaction or an extension of
        unknown outcome), or as long as `compact_at` events or `compact_bytes` credential bytes."""
        if self.damaged is not None:
            return f"the log does not explain PCR {self.pcr} ({self.damaged}): it is reset and re-measured"
        if self.compact_at is not None and len(self.events) >= self.compact_at:
            return f"{len(self.events)} events (compacted at {self.compact_at})"
        if self.compact_bytes is not None and self._entry_bytes >= self.compact_bytes:
            return f"{self._entry_bytes} bytes of credential entries (compacted at {self.compact_bytes})"
        return None

    def compact(self, reason: str = "requested", timeout_s: float = 30.0) -> dict:
        """Compact now (see the module docstring); returns what was done (also handed to `on_compacted`).
        MeasurementError when it fails: before the PCR reset nothing changed; after it, `damaged` is set."""
        if not self._lock.acquire(timeout=timeout_s):
            raise MeasurementError(f"the measurement log of PCR {self.pcr} is busy for more than {timeout_s:g} s "
                                   "(a measurement hangs in the TPM); not compacted")
        try:
            info = self._compact_locked(reason)
        except MeasurementError as exc:
            failed = self._failure(reason, exc)
            self._lock.release()
            self._compacted(failed)
            raise
        self._lock.release()
        self._compacted(info)
        return info

    def _failure(self, reason: str, exc: Exception) -> dict:
        return {"reason": reason, "error": str(exc) or type(exc).__name__, "damaged": self.damaged is not None}

    def _compacted(self, info: dict) -> None:
        callback = self.on_compacted
        if callback is not None:
            try:
                callback(info)
            except Exception:  # the callback's failure is its own: the log is compacted
                pass

    def _compact_locked(self, reason: str) -> dict:
        if self.path is None:
            raise MeasurementError("a measurement log without a file is not compacted (its history would be lost)")
        t0 = time.perf_counter()
        archive = self.path.with_name(f"{self.path.stem}-compacted-{time.time_ns()}{self.path.suffix}")
        try:
            self._settle_file_locked()
            data = self.path.read_bytes()
            from_file = self._file_replays(data)
            if not from_file:  # torn or stale (an append or extension failed): the archive is the log in memory
                data = self._serialised().encode()
                tmp = archive.with_name(archive.name + ".tmp")
                with tmp.open("wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, archive)
        except OSError as exc:
            self.compaction_error = f"cannot read {self.path} or write its archive: {exc}"
            raise MeasurementError(f"compacting the measurement log: {self.compaction_error}") from None
        state = measured_state((e.kind, e.name, e.sha256) for e in self.events)
        entries = [(COMPACTED_KIND, archive.name, hashlib.sha256(data).hexdigest()), *carried_entries(state)]
        digests = [event_digest(*e) for e in entries]
        initial = ZERO
        if self.tpm is not None:  # from the reset on, the PCR no longer holds what the old log explains
            try:
                self.tpm.reset()
                initial = self.tpm.read()
                if initial != ZERO:
                    raise MeasurementError(f"PCR {self.pcr} is {initial.hex()[:16]}… right after its reset, not zero")
                value = initial
                for (kind, name, _), digest in zip(entries, digests):
                    expected = extend(value, digest)
                    value = self.tpm.extend(digest)
                    if value != expected:
                        raise MeasurementError(f"PCR {self.pcr} is {value.hex()[:16]}… after re-measuring {kind}/"
                                               f"{name}, the compacted log predicts {expected.hex()[:16]}…: another "
                                               "writer extends this PCR")
            except Exception as exc:  # MeasurementError, TpmError (the TPM hangs or is gone)
                self.damaged = self.compaction_error = str(exc) or type(exc).__name__
                raise MeasurementError(f"compacting the measurement log of PCR {self.pcr} failed in its reset and "
                                       f"re-measurement: {self.damaged}") from exc
        now = time.time_ns()
        events, value = [], initial
        for i, ((kind, name, sha), digest) in enumerate(zip(entries, digests)):
            value = extend(value, digest)
            events.append(MeasurementEvent(i, kind, name, sha, digest.hex(), value.hex(), now))
        before = len(self.events)
        self.initial, self.value, self.events = initial, value, events
        self._entry_bytes = sum(entry_bytes(e.kind, e.name) for e in events)
        self.damaged = self.compaction_error = None
        self.compactions += 1
        # the file becomes the archive (or, when it did not replay, is replaced: the archive was written from memory)
        self._unarchived, self._file_stale = (archive if from_file else None), True
        file_error = None
        try:
            self._settle_file_locked()
        except OSError as exc:  # kept in memory (the PCR holds it); the file is written at the next record
            file_error = str(exc)
        info = {"reason": reason, "archived": str(archive), "archive_sha256": entries[0][2],
                "archive_from": "file" if from_file else "memory", "events_before": before,
                "events_after": len(events), "value": value.hex(), "ms": round((time.perf_counter() - t0) * 1000, 1),
                "file_error": file_error}
        self.last_compaction = info
        return info

    def _serialised(self) -> str:
        return self._header_line() + "".join(json.dumps(asdict(e)) + "\n" for e in self.events)

    def _file_replays(self, data: bytes) -> bool:
        """Whether the file's bytes are the log in memory: its header's initial value and its events replay to
        `value`, event for event."""
        try:
            lines = data.decode().splitlines()
            header = json.loads(lines[0])
            events = [MeasurementEvent(**json.loads(line)) for line in lines[1:] if line.strip()]
            return (header.get("format") == FORMAT and bytes.fromhex(header["initial"]) == self.initial
                    and len(events) == len(self.events)
                    and replay(events, self.initial) == self.value)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, MeasurementError):
            return False

    def _settle_file_locked(self) -> None:
        """After a compaction: the old file renamed to its archive name, the compacted log written (atomically)."""
        if self._unarchived is not None:
            if self.path.exists():
                os.replace(self.path, self._unarchived)
            self._unarchived = None
        if self._file_stale:
            tmp = self.path.with_name(self.path.name + ".tmp")
            with tmp.open("w") as fh:
                fh.write(self._serialised())
            os.replace(tmp, self.path)
            self._file_stale = False

    def status(self) -> dict:
        """For `sitsctl status`: the log's length and compactions."""
        last = self.last_compaction
        return {"pcr": self.pcr, "mode": self.mode, "events": len(self.events), "entry_bytes": self._entry_bytes,
                "value": self.value.hex(), "compact_at": self.compact_at, "compact_bytes": self.compact_bytes,
                "compactions": self.compactions,
                "last_compaction": ({k: last[k] for k in ("archived", "events_before", "events_after", "ms")}
                                    if last is not None else None),
                "compaction_error": self.compaction_error, "damaged": self.damaged}

    def record(self, kind: str, name: str, sha256_hex: str) -> MeasurementEvent:
        """Append the event to the file, then extend the PCR by it (see the module docstring). A log that is due for
        compaction (`compaction_due`, `damaged` included) is compacted first, under the same lock; MeasurementError,
        with nothing measured, while a compaction that reset the PCR fails (`damaged`), and for an entry a session
        credential could not carry (`check_entry`). OSError when the file cannot be appended (nothing measured);
        MeasurementError, `damaged` set, when the extension fails or its outcome is unknown."""
        check_entry(kind, name)
        digest = event_digest(kind, name, sha256_hex)
        compacted = None
        try:
            with self._lock:
                due = self.compaction_due()
                if due is not None and self.path is not None:
                    try:
                        compacted = self._compact_locked(due)
                    except MeasurementError as exc:
                        compacted = self._failure(due, exc)
                        if self.damaged is not None:  # the PCR is not what the log says: nothing is measured on it
                            raise MeasurementError(f"{kind}/{name} not measured: {exc}") from None
                    # else nothing changed (the file could not be read): measured as before, compacted at the next
                if self._unarchived is not None or self._file_stale:
                    self._settle_file_locked()  # OSError: as a full disk at the append below, before the PCR moves
                event = self._append_locked(kind, name, sha256_hex, digest)
        finally:
            if compacted is not None:
                self._compacted(compacted)
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:  # a listener's failure is its own; the event is measured and logged
                pass
        return event

    def _append_locked(self, kind: str, name: str, sha256_hex: str, digest: bytes) -> MeasurementEvent:
        expected = extend(self.value, digest)
        event = MeasurementEvent(len(self.events), kind, name, sha256_hex, digest.hex(), expected.hex(),
                                 time.time_ns())
        if self.path is not None:  # first in the file: a failed append leaves the PCR and the log as they were
            try:
                with self.path.open("a") as fh:
                    fh.write(json.dumps(asdict(event)) + "\n")
                    fh.flush()
            except OSError:
                self._file_stale = True  # maybe a torn line: rewritten from memory before the next event
                raise
        if self.tpm is not None:
            try:
                value = self.tpm.extend(digest)
            except Exception as exc:  # MeasurementError, TpmError (a timeout): the TPM may have extended or not
                self.damaged = (f"extending {kind}/{name} failed, so PCR {self.pcr} may or may not hold it: "
                                f"{str(exc) or type(exc).__name__}")
                raise MeasurementError(f"{kind}/{name} not measured: {self.damaged}; the log is reset and "
                                       "re-measured at the next measurement or bind") from exc
            if value != expected:  # someone else extended the PCR: the log alone no longer explains it
                self.damaged = (f"PCR {self.pcr} is {value.hex()[:16]}… after extending {kind}/{name}, the log "
                                f"predicts {expected.hex()[:16]}…")
                raise MeasurementError(f"{kind}/{name} not measured: {self.damaged}: another writer extends this "
                                       "PCR (give the measurement log a PCR of its own, attestation.measurement_pcr); "
                                       "the log is reset and re-measured at the next measurement or bind")
        self.value = expected
        self.events.append(event)
        self._entry_bytes += entry_bytes(kind, name)
        return event

    @contextlib.contextmanager
    def frozen(self, timeout_s: float = 30.0):
        """Hold the log still: no event is recorded (and so no extension of the PCR by this log) inside the block.
        Yields (events, value). For a quote whose PCR value must match the events (the tpm-session bind). A record
        holds the lock across its TPM extension, which is bounded; a longer wait raises MeasurementError."""
        if not self._lock.acquire(timeout=timeout_s):
            raise MeasurementError(f"the measurement log of PCR {self.pcr} is busy for more than {timeout_s:g} s "
                                   "(a measurement hangs in the TPM)")
        try:
            yield tuple(self.events), self.value
        finally:
            self._lock.release()


def read_log(path: Path) -> tuple[dict, list[MeasurementEvent]]:
    lines = Path(path).read_text().splitlines()
    if not lines:
        raise MeasurementError(f"{path}: empty measurement log (no header)")
    header = json.loads(lines[0])
    if header.get("format") != FORMAT:
        raise MeasurementError(f"{path}: not a {FORMAT} (header {lines[0][:80]})")
    return header, [MeasurementEvent(**json.loads(line)) for line in lines[1:] if line.strip()]


def replay(events: Iterable[MeasurementEvent], initial: bytes = ZERO) -> bytes:
    """The PCR value the events produce from `initial`; MeasurementError at the first event whose
    recorded digest or PCR value does not follow."""
    value = initial
    for i, e in enumerate(events):
        digest = event_digest(e.kind, e.name, e.sha256)
        if digest.hex() != e.digest:
            raise MeasurementError(f"event {i} ({e.kind}/{e.name}): recorded digest does not match its fields")
        value = extend(value, digest)
        if value.hex() != e.pcr_after:
            raise MeasurementError(f"event {i} ({e.kind}/{e.name}): recorded PCR value does not follow from the "
                                   "previous events (log edited or events missing)")
    return value


def replay_entries(entries: Iterable[tuple[str, str, str]], initial: bytes = ZERO) -> bytes:
    """The PCR value that (kind, name, sha256 hex) entries give from `initial`, recomputing each event digest (a
    verifier's replay: nothing recorded alongside is trusted)."""
    value = initial
    for kind, name, sha256_hex in entries:
        value = extend(value, event_digest(kind, name, sha256_hex))
    return value


@dataclass(frozen=True)
class MeasuredState:
    """What runs according to a measurement log: the newest event naming the model, each module stage and the config
    (updates and rollbacks alike), as (name, sha256 hex); None / no stage where the log names none."""

    model: tuple[str, str] | None
    modules: dict  # stage ("pre", "post") -> (name, sha256 hex)
    config: tuple[str, str] | None


def measured_state(entries: Iterable[tuple[str, str, str]]) -> MeasuredState:
    """MeasuredState of (kind, name, sha256 hex) entries in log order. Other kinds (approval, persisted) name no
    component and are skipped."""
    model = config = None
    modules: dict = {}
    for kind, name, sha256_hex in entries:
        base = kind.removeprefix("rollback:")
        if kind in MODEL_KINDS:
            model = (name, sha256_hex)
        elif kind in CONFIG_KINDS:
            config = (name, sha256_hex)
        elif base.startswith(MODULE_KIND) and len(base) > len(MODULE_KIND):
            modules[base[len(MODULE_KIND):]] = (name, sha256_hex)
    return MeasuredState(model, modules, config)


def carried_entries(state: MeasuredState) -> list[tuple[str, str, str]]:
    """The events a compaction measures after its `compacted` event, for the state the old log says runs: the newest
    `model`, each `module:<stage>` (in the order measured_state found the stages), the newest `config`. A verifier of
    an archive chain (sitsctl measurements verify) compares them with the compacted log's events 1, 2, ..."""
    entries = []
    if state.model is not None:
        entries.append(("model", *state.model))
    entries += [(f"{MODULE_KIND}{stage}", *m) for stage, m in state.modules.items()]
    if state.config is not None:
        entries.append(("config", *state.config))
    return entries


def replay_file(path: Path) -> bytes:
    header, events = read_log(path)
    return replay(events, bytes.fromhex(header["initial"]))


__all__ = ["COMPACTED_KIND", "COMPACT_AT_BYTES", "COMPACT_AT_EVENTS", "CONFIG_KINDS", "DEFAULT_PCR", "MAX_KIND_BYTES",
           "MAX_NAME_BYTES", "MIN_COMPACT_AT", "MODEL_KINDS", "carried_entries", "check_entry", "MeasuredState",
           "MeasurementError",
           "MeasurementEvent", "MeasurementLog", "TpmPcr",
           "entry_bytes", "event_digest", "measured_state", "read_log", "replay", "replay_entries", "replay_file"]
