"""Measured deployment: an ordered log of (kind, name, sha256) events, each extended into a PCR.

Event digest = SHA-256("sits-measurement-v1" 0x00 kind 0x00 name 0x00 sha256-bytes); the PCR after an
event = SHA-256(PCR before || event digest) (TPM2_PCR_Extend of the SHA-256 bank). With a TPM the
extension happens in the TPM (`TpmPcr`) and the log records the value the TPM reports; without one the
log keeps the same chain in software (a replay digest, evidence only of the log's own consistency).
`replay()` recomputes the chain from a log so a verifier can compare it with a quoted PCR value.

The log is JSON lines: a header {"format", "version", "pcr", "mode", "initial"} then one event per line.
"""
from __future__ import annotations

import hashlib
import json
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
    """Append-only; `record()` extends the PCR (TPM or software) and appends the event to `path`."""

    def __init__(self, path: Path | None, pcr: int = DEFAULT_PCR, tpm: TpmPcr | None = None) -> None:
        self.path = Path(path) if path else None
        self.pcr = pcr
        self.tpm = tpm
        self.mode = "tpm2" if tpm is not None else "software"
        self.initial = tpm.read() if tpm is not None else ZERO
        self.value = self.initial
        self.events: list[MeasurementEvent] = []
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            header = {"format": FORMAT, "version": 1, "pcr": pcr, "mode": self.mode, "initial": self.initial.hex()}
            self.path.write_text(json.dumps(header) + "\n")

    def record(self, kind: str, name: str, sha256_hex: str) -> MeasurementEvent:
        digest = event_digest(kind, name, sha256_hex)
        with self._lock:
            expected = extend(self.value, digest)
            if self.tpm is not None:
                value = self.tpm.extend(digest)
                if value != expected:  # someone else extended the PCR: the log alone no longer explains it
                    raise MeasurementError(f"PCR {self.pcr} is {value.hex()[:16]}… after extending {kind}/{name}, the "
                                           f"log predicts {expected.hex()[:16]}…: another writer extends this PCR; "
                                           "give the measurement log a PCR of its own (attestation.measurement_pcr)")
            self.value = expected
            event = MeasurementEvent(len(self.events), kind, name, sha256_hex, digest.hex(), expected.hex(),
                                     time.time_ns())
            self.events.append(event)
            if self.path is not None:
                with self.path.open("a") as fh:
                    fh.write(json.dumps(asdict(event)) + "\n")
        return event


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


def replay_file(path: Path) -> bytes:
    header, events = read_log(path)
    return replay(events, bytes.fromhex(header["initial"]))


__all__ = ["DEFAULT_PCR", "MeasurementError", "MeasurementEvent", "MeasurementLog", "TpmPcr", "event_digest",
           "read_log", "replay", "replay_file"]
