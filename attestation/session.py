"""The `tpm-session` signing mode: a software session key bound to the TPM by one TPM2_Quote.

Per-command TPM2_Sign costs ~0.5 ms on swtpm and tens of ms on a discrete TPM. Instead, at start:

1. `measure_model` extends the model hash into a resettable PCR (16 by default; reset at start,
   so the PCR holds exactly the measurements this signer made);
2. a fresh ECDSA P-256 session key is generated in process memory;
3. `bind(verifier_nonce)` quotes that PCR with the restricted attestation key (AK, 0x81000002)
   and extraData = SHA-256("sits-session-v1" || session key SubjectPublicKeyInfo DER || nonce):
   the result is a `SessionCredential`, sent to the PLC once;
4. every command is then a COSE_Sign1 (ES256) made with the session key, without the TPM.

The PLC side (`SessionVerifier`) trusts only the AK public key (the device identity) and the
model hash; `accept(credential, nonce)` checks the binding once and returns the
`EnvelopeVerifier` for that session's commands. It remembers earlier sessions (`SessionReplayState`):
each nonce is good for one credential, a superseded session key is refused, and sequence numbers must
rise across sessions, so neither a replayed credential nor an earlier session's key reopens old commands.

Certification (optional, `attestation.certify_session`): at start, right after the model and modules
are measured into the measurement PCR and before anything else is, `certify` has the
PolicyAuthorize-bound device key (attestation.device_key_handle, 0x81000003; attestation.tpm.policy) sign
SHA-256("sits-session-certify-v1" 0 || session key SPKI DER || approved PCR value). The TPM does
that only while the PCR holds the state the authority approved: for an unapproved model or module
the TPM refuses and there is no certified session key. A verifier given the device key
(`trusted_device_key_pem`) accepts only certified session keys.

Measured modules and config (credential version 2): `bind(nonce, measurement_log)` quotes the session PCR and the
measurement PCR (attestation.measurement_pcr, 23: model, modules, config, hot swaps, rollbacks, approvals; see
attestation/measurement.py) in one TPM2_Quote, and the credential carries that PCR's log as (kind, name, SHA-256)
entries. The verifier replays the entries to the quoted value (code `measurement` when they do not add up), exposes
what runs (`SessionEnvelopeVerifier.measured`: the newest model, module per stage and config) and checks the pins it
was given (`expected_modules`, `expected_config_sha256`: codes `module`, `config`). In version 2 the model check is
the log's: the newest model it names (a hot swap or rollback included) must be the expected one (`model`); PCR 16,
measured once at start and never by a hot swap, is only quoted and replayed. In version 1 the expected model must be
among the PCR 16 measurements. The daemon binds again (a new nonce, a new credential) after every measurement, so the
PLC's view never lags behind a reload or a hot swap for longer than one re-bind.
A version 1 credential (an older sitsd, or no measurement log: `bind` without one, or with a log kept in software
because there is no TPM for it) is still accepted, unless the verifier pins modules or config or sets
`require_measurements` (`unmeasured`).

Trade-off: the session private key lives in process memory until the signer is closed, while
the AK never leaves the TPM. PCR 16 is resettable at locality 0: the binding to the model holds
only while nothing but the daemon may use the TPM.

Credential CBOR (one canonical encoding; anything else is refused):
    {1: version (1, or 2 with keys 13..15), 2: session key SPKI DER, 3: AK SPKI DER, 4: TPMS_ATTEST bytes,
     5: quote signature r||s (64 bytes), 6: PCR index, 7: PCR value (32 bytes),
     8: [* measurement (32 bytes)], 9: verifier nonce (16..64 bytes)
     and, only for a certified session key, all three of:
     10: device key SPKI DER, 11: approved PCR value (32 bytes), 12: device key signature r||s (64 bytes)
     and, only in version 2, all three of:
     13: measurement PCR index, 14: its value as quoted (32 bytes),
     15: [* [kind (text), name (text), SHA-256 (32 bytes)]]: every event extended into it since its reset}
    The quote (4, 5) covers the PCR named by key 6 alone (version 1) or the PCRs named by keys 6 and 13 (version 2).
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import cbor2
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from . import cose, fastsign
from .measurement import DEFAULT_PCR as MEASUREMENT_PCR
from .measurement import MAX_KIND_BYTES, MAX_NAME_BYTES, MeasuredState, MeasurementError, measured_state, replay_entries
from .cose import es256_from_der
from .envelope import (ALG_ECDSA_P256_SHA256, DEFAULT_DEADLINE_GRACE_NS, DEFAULT_MAX_AGE_NS, DEFAULT_MAX_FUTURE_NS,
                       DEFAULT_MAX_VALIDITY_NS, Command, EnvelopeVerifier, assemble, key_id_of, to_be_signed)
from .errors import AttestationError, EnvelopeError, TpmError
from .tpm.quote import AK_HANDLE, PCR_COUNT, Quote, QuoteError, extend_pcr, load_or_create_ak, quote, verify_quote
from .tpm.quote import ak_public_pem as _ak_public_pem
from .tpm.quote import read_pcrs
from .tpm.signer import DEFAULT_DEVICE_KEY_HANDLE, MODEL_PCR, _tss
from .tpm.worker import TPM_SETUP_TIMEOUT_S, BoundedEsapi, TpmLock, TpmWorker, call_in_thread  # noqa: F401 (re-export)

BINDING_LABEL = b"sits-session-v1"
CERTIFY_LABEL = b"sits-session-certify-v1\0"
CREDENTIAL_VERSION = 1  # PCR 16 only
CREDENTIAL_VERSION_MEASURED = 2  # PCR 16 and the measurement PCR with its log (keys 13..15)
MIN_NONCE, MAX_NONCE = 16, 64
MAX_MEASUREMENTS = 64
MAX_LOG_EVENTS = 256  # measurement-log entries a credential carries (a restart measures from reset)
MAX_CREDENTIAL_BYTES = 32768
(K_VERSION, K_SESSION_KEY, K_AK, K_ATTEST, K_SIGNATURE, K_PCR, K_PCR_VALUE, K_MEASUREMENTS,
 K_NONCE, K_DEVICE_KEY, K_APPROVED_VALUE, K_DEVICE_SIGNATURE,
 K_MEASUREMENT_PCR, K_MEASUREMENT_VALUE, K_MEASUREMENT_LOG) = range(1, 16)
_PLAIN_KEYS = frozenset(range(K_VERSION, K_NONCE + 1))
_CERTIFIED_KEYS = frozenset(range(K_VERSION, K_DEVICE_SIGNATURE + 1))
_MEASURED_KEYS = frozenset((K_MEASUREMENT_PCR, K_MEASUREMENT_VALUE, K_MEASUREMENT_LOG))
_KEY_SETS = {CREDENTIAL_VERSION: (_PLAIN_KEYS, _CERTIFIED_KEYS),
             CREDENTIAL_VERSION_MEASURED: (_PLAIN_KEYS | _MEASURED_KEYS, _CERTIFIED_KEYS | _MEASURED_KEYS)}
_ZERO = b"\0" * 32


class CredentialError(AttestationError):
    """A session credential is malformed or does not prove what it must. `reason` says what in words;
    `code` is one of: malformed, ak, pcr, nonce, binding, signature, magic, type, pcr-selection,
    pcr-digest, pcr-value, model, key, uncertified, device-key, certification, approval, measurement (the
    measurement log does not replay to the quoted PCR), unmeasured (no measurement log, but the verifier needs one),
    module, config (a pinned module or config is not what the log says runs), and, from the
    verifier's memory of earlier sessions (SessionReplayState): nonce-used (a credential was already accepted for
    this nonce: replayed), retired (the session key of an earlier session, superseded by a later one)."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def session_binding(session_public_pem: bytes, verifier_nonce: bytes) -> bytes:
    """The quote's extraData: SHA-256("sits-session-v1" || session key SPKI DER || nonce).
    DER is self-delimiting, so the concatenation is unambiguous."""
    der = _der(serialization.load_pem_public_key(session_public_pem))
    return hashlib.sha256(BINDING_LABEL + der + bytes(verifier_nonce)).digest()


def certification_digest(session_public_pem: bytes, approved_pcr_value: bytes) -> bytes:
    """What the policy-bound device key signs to certify a session key: SHA-256("sits-session-certify-v1" 0 ||
    session key SPKI DER || approved PCR value)."""
    der = _der(serialization.load_pem_public_key(session_public_pem))
    return hashlib.sha256(CERTIFY_LABEL + der + bytes(approved_pcr_value)).digest()


@dataclass(frozen=True)
class Certification:
    """The device key's signature over one session key, made by the TPM under the authority's approval of
    `approved_pcr_value` (the measurement PCR after the model and modules)."""

    device_public_pem: bytes
    approved_pcr_value: bytes
    signature: bytes  # ECDSA P-256 r||s

    def __post_init__(self) -> None:
        if len(self.approved_pcr_value) != 32 or len(self.signature) != 64:
            raise CredentialError("certification: approved PCR value must be 32 bytes, signature 64 (r||s)",
                                  "malformed")


def replay_measurements(measurements: Sequence[bytes]) -> bytes:
    """The SHA-256 PCR value after extending each measurement in turn from zero (a reset PCR)."""
    value = _ZERO
    for m in measurements:
        value = hashlib.sha256(value + m).digest()
    return value


def _der(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _pem(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _sha_hex(value, what: str) -> str:
    """A SHA-256 pin as lowercase hex, from 32 bytes or 64 hex digits; ValueError otherwise."""
    if isinstance(value, (bytes, bytearray)) and len(value) == 32:
        return bytes(value).hex()
    if isinstance(value, str) and len(value) == 64:
        try:
            decoded = bytes.fromhex(value)  # fromhex skips whitespace: "ab cd…" of 64 characters is fewer bytes
        except ValueError:
            decoded = b""
        if len(decoded) == 32:
            return decoded.hex()
    raise ValueError(f"{what} must be a SHA-256: 32 bytes or 64 hex digits")


def _check_nonce(nonce) -> bytes:
    if not isinstance(nonce, (bytes, bytearray)) or not MIN_NONCE <= len(nonce) <= MAX_NONCE:
        raise ValueError(f"verifier nonce must be {MIN_NONCE}..{MAX_NONCE} random bytes")
    return bytes(nonce)


# --- the credential --------------------------------------------------------------------------

@dataclass(frozen=True)
class SessionCredential:
    """What the daemon sends the PLC at each bind. `quote.pcrs` must be {pcr: pcr_value} (plus {measurement_pcr:
    measurement_value} in version 2) and `quote.ak_public_pem` the credential's AK: an inconsistent credential cannot
    be built. `measurement_log`: (kind, name, SHA-256 32 bytes) entries, every event extended into `measurement_pcr`
    since its reset, in order (attestation/measurement.py); with `measurement_pcr` None there is none (version 1)."""

    session_public_pem: bytes
    ak_public_pem: bytes
    quote: Quote
    pcr_value: bytes
    measurements: tuple[bytes, ...]  # every digest extended into `pcr` since its reset, in order
    verifier_nonce: bytes
    pcr: int = MODEL_PCR
    certification: Certification | None = None  # set when the device key certified the session key
    measurement_pcr: int | None = None
    measurement_value: bytes | None = None
    measurement_log: tuple[tuple[str, str, bytes], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "measurements", tuple(self.measurements))
        object.__setattr__(self, "measurement_log", tuple(tuple(e) for e in self.measurement_log))
        quoted = {self.pcr: self.pcr_value}
        if self.measurement_pcr is not None:
            if self.measurement_pcr == self.pcr or self.measurement_value is None:
                raise CredentialError("the measurement PCR must be another PCR than the session PCR, with its value",
                                      "malformed")
            quoted[self.measurement_pcr] = self.measurement_value
        elif self.measurement_value is not None or self.measurement_log:
            raise CredentialError("a measurement value or log without the measurement PCR", "malformed")
        if dict(self.quote.pcrs) != quoted:
            raise CredentialError("the quote's PCR values are not the credential's: " + " and ".join(
                f"PCR {i}" for i in sorted(quoted)), "malformed")
        if self.quote.ak_public_pem != self.ak_public_pem:
            raise CredentialError("the quote's AK is not the credential's AK", "malformed")
        for entry in self.measurement_log:
            _check_entry(entry)

    @property
    def version(self) -> int:
        return CREDENTIAL_VERSION if self.measurement_pcr is None else CREDENTIAL_VERSION_MEASURED

    def measured_entries(self) -> tuple[tuple[str, str, str], ...]:
        """The measurement log as (kind, name, sha256 hex), as attestation.measurement writes it."""
        return tuple((kind, name, sha.hex()) for kind, name, sha in self.measurement_log)

    def to_cbor(self) -> bytes:
        fields = {
            K_VERSION: self.version,
            K_SESSION_KEY: _der(serialization.load_pem_public_key(self.session_public_pem)),
            K_AK: _der(serialization.load_pem_public_key(self.ak_public_pem)),
            K_ATTEST: bytes(self.quote.attest),
            K_SIGNATURE: bytes(self.quote.signature),
            K_PCR: self.pcr,
            K_PCR_VALUE: bytes(self.pcr_value),
            K_MEASUREMENTS: [bytes(m) for m in self.measurements],
            K_NONCE: bytes(self.verifier_nonce),
        }
        if self.certification is not None:
            c = self.certification
            fields[K_DEVICE_KEY] = _der(serialization.load_pem_public_key(c.device_public_pem))
            fields[K_APPROVED_VALUE] = bytes(c.approved_pcr_value)
            fields[K_DEVICE_SIGNATURE] = bytes(c.signature)
        if self.measurement_pcr is not None:
            fields[K_MEASUREMENT_PCR] = self.measurement_pcr
            fields[K_MEASUREMENT_VALUE] = bytes(self.measurement_value)
            fields[K_MEASUREMENT_LOG] = [[kind, name, bytes(sha)] for kind, name, sha in self.measurement_log]
        return cbor2.dumps(fields)

    @classmethod
    def from_cbor(cls, data: bytes) -> "SessionCredential":
        """Strict: one canonical CBOR map with exactly the keys 1..9 (or 1..12: certified; plus 13..15 in version 2) of
        the right types and sizes, keys that load as P-256 or Ed25519 public keys; anything else is
        CredentialError('malformed')."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CredentialError(f"credential must be bytes, got {type(data).__name__}", "malformed")
        data = bytes(data)
        if len(data) > MAX_CREDENTIAL_BYTES:
            raise CredentialError(f"credential is {len(data)} bytes, more than {MAX_CREDENTIAL_BYTES}", "malformed")
        try:
            fields = cose.loads_strict(data, "session credential", max_depth=4)
        except EnvelopeError as exc:
            raise CredentialError(exc.reason, "malformed") from None
        if not isinstance(fields, dict) or not all(type(k) is int for k in fields):
            raise CredentialError("credential must be a map with integer keys", "malformed")
        version = fields.get(K_VERSION)
        if type(version) is not int or version not in _KEY_SETS:
            raise CredentialError(f"credential version must be {CREDENTIAL_VERSION} or {CREDENTIAL_VERSION_MEASURED}",
                                  "malformed")
        if set(fields) not in _KEY_SETS[version]:
            extra = "" if version == CREDENTIAL_VERSION else f", plus {K_MEASUREMENT_PCR}..{K_MEASUREMENT_LOG}"
            raise CredentialError(f"a version {version} credential must be a map with exactly the keys 1..{K_NONCE} "
                                  f"(1..{K_DEVICE_SIGNATURE} when certified){extra}", "malformed")
        pcr = fields[K_PCR]
        if type(pcr) is not int or not 0 <= pcr < PCR_COUNT:
            raise CredentialError(f"credential PCR index must be in 0..{PCR_COUNT - 1}", "malformed")
        attest = _field_bytes(fields, K_ATTEST, "quote attest", 1, 1024)
        signature = _field_bytes(fields, K_SIGNATURE, "quote signature", 64, 64)
        pcr_value = _field_bytes(fields, K_PCR_VALUE, "PCR value", 32, 32)
        nonce = _field_bytes(fields, K_NONCE, "verifier nonce", MIN_NONCE, MAX_NONCE)
        measurements = fields[K_MEASUREMENTS]
        if (not isinstance(measurements, (list, tuple)) or len(measurements) > MAX_MEASUREMENTS
                or not all(type(m) is bytes and len(m) == 32 for m in measurements)):
            raise CredentialError(f"credential measurements must be an array of at most {MAX_MEASUREMENTS} "
                                  "32-byte digests", "malformed")
        session_pem = _field_key(fields, K_SESSION_KEY, "session key")
        ak_pem = _field_key(fields, K_AK, "AK")
        certification = None
        if K_DEVICE_KEY in fields:
            device_pem = _field_key(fields, K_DEVICE_KEY, "device key")
            certification = Certification(device_pem, _field_bytes(fields, K_APPROVED_VALUE, "approved PCR value", 32, 32),
                                          _field_bytes(fields, K_DEVICE_SIGNATURE, "device key signature", 64, 64))
        quoted = {pcr: pcr_value}
        measurement_pcr = measurement_value = None
        log: list = []
        if version == CREDENTIAL_VERSION_MEASURED:
            measurement_pcr = fields[K_MEASUREMENT_PCR]
            if type(measurement_pcr) is not int or not 0 <= measurement_pcr < PCR_COUNT or measurement_pcr == pcr:
                raise CredentialError(f"credential measurement PCR must be in 0..{PCR_COUNT - 1} and not the session "
                                      f"PCR {pcr}", "malformed")
            measurement_value = _field_bytes(fields, K_MEASUREMENT_VALUE, "measurement PCR value", 32, 32)
            log = fields[K_MEASUREMENT_LOG]
            if not isinstance(log, list) or len(log) > MAX_LOG_EVENTS:
                raise CredentialError(f"credential measurement log (key {K_MEASUREMENT_LOG}) must be an array of at "
                                      f"most {MAX_LOG_EVENTS} entries", "malformed")
            for entry in log:
                _check_entry(entry)
            quoted[measurement_pcr] = measurement_value
        cred = cls(session_pem, ak_pem, Quote(attest, signature, quoted, ak_pem), pcr_value,
                   tuple(measurements), nonce, pcr, certification, measurement_pcr, measurement_value,
                   tuple(tuple(e) for e in log))
        if cred.to_cbor() != data:
            raise CredentialError("credential is not in its one canonical encoding", "malformed")
        return cred


def _check_entry(entry) -> None:
    """One measurement-log entry: [kind, name, SHA-256]: kind 1..64 and name 0..255 UTF-8 bytes without NUL (the
    event digest separates them by NUL), 32 bytes of SHA-256."""
    try:
        ok = (isinstance(entry, (list, tuple)) and len(entry) == 3 and type(entry[0]) is str
              and type(entry[1]) is str and type(entry[2]) is bytes and len(entry[2]) == 32
              and 0 < len(entry[0].encode()) <= MAX_KIND_BYTES and len(entry[1].encode()) <= MAX_NAME_BYTES
              and "\0" not in entry[0] and "\0" not in entry[1])
    except UnicodeError:  # a lone surrogate: no UTF-8 text
        ok = False
    if not ok:
        raise CredentialError(f"credential measurement log entries must be [kind (text, 1..{MAX_KIND_BYTES} bytes), "
                              f"name (text, at most {MAX_NAME_BYTES} bytes), SHA-256 (32 bytes)], without NUL",
                              "malformed")


def _field_bytes(fields: dict, key: int, what: str, lo: int, hi: int) -> bytes:
    value = fields[key]
    if type(value) is not bytes or not lo <= len(value) <= hi:
        size = f"{lo}" if lo == hi else f"{lo}..{hi}"
        raise CredentialError(f"credential {what} (key {key}) must be {size} bytes", "malformed")
    return value


def _field_key(fields: dict, key: int, what: str) -> bytes:
    value = fields[key]
    if type(value) is not bytes:
        raise CredentialError(f"credential {what} (key {key}) must be a byte string", "malformed")
    try:
        public_key = serialization.load_der_public_key(value)
        cose.algorithm_for_key(public_key)
    except Exception:  # cryptography raises ValueError or UnsupportedAlgorithm; any failure means the same
        raise CredentialError(f"credential {what} (key {key}) is not a P-256 or Ed25519 public key", "malformed") \
            from None
    return _pem(public_key)


# --- bounded TPM access (attestation/tpm/worker.py; the old private names stay importable from here) -------------

_TpmLock, _TpmWorker, _BoundedEsapi = TpmLock, TpmWorker, BoundedEsapi


class TpmIdentityLost(TpmError):
    """The TPM answers, but the attestation key the PLC trusts is not in it (cleared, or another TPM)."""


# --- the daemon side -------------------------------------------------------------------------

class TpmSessionSigner:
    """Signs commands with an in-memory ECDSA P-256 session key bound to the TPM by one quote.

    `device_key_handle` is the PolicyAuthorize-bound device key (attestation.device_key_handle): used only
    by `certify` (never for commands; tpm-session has no password key). `measure_model`, `certify` and
    `bind` use the TPM under a lock; `sign_command` never does and needs no lock. `certification_active`, when set, says whether the certification still
    describes what runs (a hot swap away from the certified model ends it): `bind` leaves it out
    of the credential while it returns False.

    Every TPM call runs on the signer's own TPM thread and is bounded (TPM_CALL_TIMEOUT_S): a hung TPM costs a
    TpmError, never a blocked caller. TPM reset (TPM2_Startup(CLEAR): PCRs back at zero, resetCount + 1): `probe`
    notices it (the clock's reset/restart counts, and the PCR against the replay of `measurements`) and returns
    what it saw; from then until `remeasure` the key is *unbound*: `sign_command` and `bind` refuse, since the TPM
    no longer attests what the key signs for. The same holds while the TPM answers without the attestation key the
    PLC trusts (`TpmIdentityLost`: cleared, or another TPM).
    """

    kind = "tpm-session"
    algorithm = ALG_ECDSA_P256_SHA256

    def __init__(self, tcti: str, device_key_handle: int = DEFAULT_DEVICE_KEY_HANDLE, ak_handle: int = AK_HANDLE,
                 pcr: int = MODEL_PCR, *, reset_pcr: bool = True) -> None:
        if not tcti:
            raise TpmError("no TCTI given; use device:/dev/tpmrm0 for the kernel resource manager "
                           "or swtpm:path=<socket> for swtpm (the library default is never used)")
        if ak_handle == device_key_handle:
            raise ValueError(f"AK handle 0x{ak_handle:08x} must differ from the device key handle")
        if type(pcr) is not int or not 0 <= pcr < PCR_COUNT:
            raise ValueError(f"PCR must be in 0..{PCR_COUNT - 1}, got {pcr!r}")
        t = _tss()
        self.tcti, self.device_key_handle, self.ak_handle, self.pcr = tcti, device_key_handle, ak_handle, pcr
        self._lock = _TpmLock(f"the TPM at {tcti!r}")  # 2 x TPM_CALL_TIMEOUT_S + 1 s, read at each wait
        self._worker = _TpmWorker(tcti)
        self._esapi = None
        try:
            self._esapi = self._worker.call("opening the TPM", t.ESAPI, tcti, timeout_s=TPM_SETUP_TIMEOUT_S)
        except TpmError as exc:
            self._worker.stop()
            raise TpmError(f"cannot open TPM through TCTI {tcti!r}: {exc}") from exc
        except Exception as exc:  # TSS2_Exception or TCTI load failure
            self._worker.stop()
            raise TpmError(f"cannot open TPM through TCTI {tcti!r}: {exc}") from exc

        def setup(esapi):
            ak, created = load_or_create_ak(esapi, ak_handle)
            pem = _ak_public_pem(esapi, ak)
            if reset_pcr:
                esapi.pcr_reset(getattr(t.ESYS_TR, f"PCR{pcr}"))
            return ak, created, pem, read_pcrs(esapi, [pcr])[pcr], _clock_counts(esapi)

        try:
            self._ak, self.ak_created, self._ak_public_pem, start, self._counts = self._worker.call(
                "setting up the attestation key", setup, self._esapi, timeout_s=TPM_SETUP_TIMEOUT_S)
        except TpmError:
            self._abandon()
            raise
        except Exception as exc:
            self._abandon()
            raise TpmError(f"TPM at {tcti!r}: cannot set up the attestation key at 0x{ak_handle:08x} or "
                           f"reset PCR {pcr} (only 16 and 23 are resettable at locality 0): {exc}") from exc
        if start != _ZERO:
            self._abandon()
            raise TpmError(f"PCR {pcr} is {start.hex()[:16]}…, not zero: its earlier measurements are unknown; "
                           "reset it (reset_pcr=True) or use a PCR nothing else extends")
        self._measurements: list[bytes] = []
        self._last_reopen = 0.0
        self.reconnects = 0
        self.resets = 0  # TPM resets (or foreign PCR changes) seen by `probe`
        self.unbound_reason: str | None = None  # set while the TPM does not attest what the key signs for
        self._bind_state = threading.Lock()  # unbind vs remeasure's commit (never held across a TPM call)
        self.certification: Certification | None = None
        self.certification_active: Callable[[], bool] | None = None
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._session_public_pem = _pem(self._key.public_key())
        self.key_id = key_id_of(self._key.public_key())
        self._ecdsa = ec.ECDSA(hashes.SHA256())
        # the loop's signature keeps the GIL where libcrypto is there (attestation.fastsign)
        self._held, why = fastsign.load(self._key)
        self.sign_path = "libcrypto, GIL held" if self._held is not None else f"cryptography, GIL released ({why})"

    def _abandon(self) -> None:
        esapi, self._esapi = self._esapi, None
        self._worker.abandon(esapi)

    def public_key_pem(self) -> bytes:
        """The session key: what each command's signature verifies with (after `SessionVerifier.accept`)."""
        return self._session_public_pem

    def device_public_key_pem(self) -> bytes:
        """The AK: the device identity a PLC is provisioned to trust."""
        return self._ak_public_pem

    @property
    def measurements(self) -> tuple[bytes, ...]:
        return tuple(self._measurements)

    @property
    def bound(self) -> bool:
        return self.unbound_reason is None

    def measure_model(self, model_sha256: bytes) -> bytes:
        """Extend the model hash into the PCR and remember it; returns the new PCR value."""
        model_sha256 = bytes(model_sha256)
        if len(model_sha256) != 32:
            raise ValueError("model_sha256 must be 32 bytes")
        if len(self._measurements) >= MAX_MEASUREMENTS:
            raise ValueError(f"at most {MAX_MEASUREMENTS} measurements per session")
        with self._lock:
            esapi = self._open_esapi()
            try:
                value = extend_pcr(esapi, self.pcr, model_sha256)
            except _tss().TSS2_Exception as exc:
                raise TpmError(f"TPM2_PCR_Extend of PCR {self.pcr} through {self.tcti!r} failed: {exc}") from exc
            self._measurements.append(model_sha256)
            return value

    def remeasure(self, measurements: Sequence[bytes], still_current: Callable[[], bool] | None = None) -> bytes:
        """After a TPM reset: reset the PCR, extend `measurements` (what runs now, measured by the caller, never the
        old list) and make them the session's; the key is bound again. Returns the PCR value. TpmError when the TPM
        does not take it (the key stays unbound). `still_current`, when given, is asked right before the result is
        committed, atomically with `unbind`: False (the caller gave up on this attempt meanwhile, and may have
        unbound the key for it) leaves the key unbound and raises TpmError."""
        measurements = [bytes(m) for m in measurements]
        if not measurements or len(measurements) > MAX_MEASUREMENTS or any(len(m) != 32 for m in measurements):
            raise ValueError(f"remeasure needs 1..{MAX_MEASUREMENTS} SHA-256 digests")
        t = _tss()
        with self._lock:
            esapi = self._open_esapi()
            try:
                esapi.pcr_reset(getattr(t.ESYS_TR, f"PCR{self.pcr}"))
                value = read_pcrs(esapi, [self.pcr])[self.pcr]
                for m in measurements:
                    value = extend_pcr(esapi, self.pcr, m)
                counts = _clock_counts(esapi)
            except t.TSS2_Exception as exc:
                raise TpmError(f"re-measuring PCR {self.pcr} through {self.tcti!r} failed: {exc}") from exc
            if value != replay_measurements(measurements):
                raise TpmError(f"PCR {self.pcr} is {value.hex()[:16]}… after re-measuring, not the replay "
                               f"{replay_measurements(measurements).hex()[:16]}…: something else extends it meanwhile")
            with self._bind_state:
                if still_current is not None and not still_current():
                    raise TpmError("re-measurement abandoned (superseded or timed out): not committed")
                self._measurements, self._counts = measurements, counts
                self.unbound_reason = None
            return value

    def unbind(self, reason: str) -> None:
        """From now until `remeasure`: no command is signed and no credential made (the daemon's fail-safe)."""
        with self._bind_state:
            self.unbound_reason = reason

    def certify(self, approval, authority) -> Certification:
        """Have the policy-bound device key at `device_key_handle` (created when absent, bound to `authority`)
        sign this session key under `approval`. The TPM checks the approval's PCR state against the PCR's current
        value: PolicyError(code "refused") when the measured model or modules are not the approved ones.
        Call it right after the approved measurements (model, modules) and before any other."""
        from .tpm.policy import PolicyError, key_public_pem, load_or_create_policy_key, policy_sign

        approved = bytes.fromhex(approval.pcr_value)
        digest = certification_digest(self._session_public_pem, approved)
        with self._lock:
            esapi = self._open_esapi()
            step = f"provisioning the policy-bound device key at 0x{self.device_key_handle:08x}"
            try:
                key, self.device_key_created = load_or_create_policy_key(esapi, self.device_key_handle, authority)
                step = "reading the device key's public part"
                device_pem = key_public_pem(esapi, key)
                step = "TPM2_Sign under the approval's policy"
                signature = policy_sign(esapi, key, approval, authority, digest)
            except PolicyError:
                raise
            except Exception as exc:  # TSS2_Exception (no owner auth, TPM gone), a key that does not parse
                raise PolicyError(f"{step} through {self.tcti!r} failed: {exc}", "tpm") from exc
        self.certification = Certification(device_pem, approved, signature)
        return self.certification

    def bind(self, verifier_nonce: bytes, measurement_log=None) -> SessionCredential:
        """Quote the PCR with extraData = the binding of the session key to `verifier_nonce` (16..64
        bytes the PLC chose). The credential carries what the TPM quoted; the verifier judges it (a reset PCR the
        probe has not seen yet: refused there, `pcr-value`). TpmError while the key is unbound (a reset seen, not yet
        re-measured; the attestation key gone).

        `measurement_log` (attestation.measurement.MeasurementLog, the daemon's PCR 23 log): the same quote also
        covers its PCR, read while the log is held still, and the credential carries the log (version 2); TpmError
        when the quoted value is not the log's (another writer of that PCR), or the log is longer than a credential
        holds (MAX_LOG_EVENTS). A log kept in software (no TPM) or None: a version 1 credential (PCR 16 only).
        ValueError for a log on the session PCR itself."""
        nonce = _check_nonce(verifier_nonce)
        extra = session_binding(self._session_public_pem, nonce)
        cert = self.certification  # judged before the quote: a swap meanwhile cannot carry it over
        if cert is not None and self.certification_active is not None and not self.certification_active():
            cert = None
        if self.unbound_reason is not None:
            raise TpmError(f"no session credential: the session key is not bound ({self.unbound_reason})")
        log = measurement_log if measurement_log is not None and measurement_log.tpm is not None else None
        if log is not None and log.pcr == self.pcr:
            raise ValueError(f"the measurement log is on the session PCR {self.pcr}: it needs a PCR of its own")
        pcrs = [self.pcr] if log is None else [self.pcr, log.pcr]
        held = log.frozen(2 * self._lock.timeout_s) if log is not None else contextlib.nullcontext(((), None))
        try:
            with held as (events, value):
                with self._lock:
                    esapi = self._open_esapi()
                    try:
                        q = quote(esapi, self._ak, pcrs, extra)
                    except _tss().TSS2_Exception as exc:
                        raise TpmError(f"TPM2_Quote with AK 0x{self.ak_handle:08x} through {self.tcti!r} failed: "
                                       f"{exc}") from exc
                    measurements = tuple(self._measurements)
        except MeasurementError as exc:
            raise TpmError(f"no session credential: {exc}") from exc
        if log is None:
            return SessionCredential(self._session_public_pem, self._ak_public_pem, q, q.pcrs[self.pcr], measurements,
                                     nonce, self.pcr, cert)
        if log.initial != _ZERO:
            raise TpmError(f"no session credential: the measurement log of PCR {log.pcr} does not start from a reset "
                           "PCR, so a verifier cannot replay it")
        if q.pcrs[log.pcr] != value:
            damaged = getattr(log, "damaged", None)
            why = (f"the log is damaged ({damaged})" if damaged is not None else
                   "another writer extends it, or a measurement failed half-way")
            raise TpmError(f"no session credential: PCR {log.pcr} is {q.pcrs[log.pcr].hex()[:16]}…, its measurement "
                           f"log gives {value.hex()[:16]}…: {why}; compacting the log (log.compact(), done by "
                           "sitsd's PLC link before each bind and by the next measurement) resets the PCR and "
                           "measures what runs again")
        if len(events) > MAX_LOG_EVENTS:
            raise TpmError(f"no session credential: the measurement log of PCR {log.pcr} has {len(events)} events, a "
                           f"credential carries at most {MAX_LOG_EVENTS}; compact it (log.compact(): sitsd's PLC link "
                           "does before each bind) or restart sitsd (it measures from reset)")
        entries = tuple((e.kind, e.name, bytes.fromhex(e.sha256)) for e in events)
        return SessionCredential(self._session_public_pem, self._ak_public_pem, q, q.pcrs[self.pcr], measurements,
                                 nonce, self.pcr, cert, log.pcr, q.pcrs[log.pcr], entries)

    def probe(self) -> str | None:
        """TPM2_ReadPublic of the AK, TPM2_ReadClock and TPM2_PCR_Read. TpmError when the TPM does not answer
        (the connection is then reopened, rate-limited, so measurements, quotes and anchors work again once it is
        back; commands never need the TPM); TpmIdentityLost when it answers without our AK (the key is unbound).
        Returns None, or what shows that the PCR no longer holds this session's measurements: a TPM reset or
        restart (resetCount/restartCount moved) or a foreign PCR change; the key is then unbound until
        `remeasure`."""
        with self._lock:
            esapi = self._open_esapi()
            try:
                pub, _, _ = esapi.read_public(self._ak)
            except Exception as exc:  # TSS2_Exception, a dead socket, no answer in time
                self._reopen_locked()
                raise TpmError(f"TPM at {self.tcti!r} does not answer: {exc}") from exc
            try:
                same_ak = _pem_of(pub) == self._ak_public_pem
                counts = _clock_counts(esapi)
                value = read_pcrs(esapi, [self.pcr])[self.pcr]
            except Exception as exc:
                self._reopen_locked()
                raise TpmError(f"TPM at {self.tcti!r} does not answer: {exc}") from exc
        if not same_ak:
            self._identity_lost("holds another key at 0x%08x than the attestation key the PLC trusts" % self.ak_handle)
        expected = replay_measurements(self._measurements)
        if counts == self._counts and value == expected:
            return None
        if counts != self._counts:
            (r0, s0), (r1, s1) = self._counts, counts
            what = (f"TPM reset (resetCount {r0}→{r1}, restartCount {s0}→{s1}): PCR {self.pcr} is "
                    + ("back at zero" if value == _ZERO else f"{value.hex()[:16]}…"))
        else:
            what = (f"PCR {self.pcr} is {value.hex()[:16]}…, not the replay {expected.hex()[:16]}… of this session's "
                    f"{len(self._measurements)} measurements: something else reset or extended it")
        self.resets += 1
        self.unbind(what + "; re-measurement pending")
        return what

    def _identity_lost(self, what: str) -> None:
        reason = (f"the TPM at {self.tcti!r} answers but {what} (0x{self.ak_handle:08x}): the TPM was cleared or "
                  "replaced. Nothing is signed (the PLC would have to trust a new attestation key). Fix: bring back "
                  "the TPM with this device's identity, or re-provision: restart sitsd (it creates a new AK) and "
                  "enrol the new <audit.directory>/device.pub.pem in the PLC")
        self.unbind(reason)
        raise TpmIdentityLost(reason)

    def _reopen_locked(self, min_interval_s: float = 1.0) -> bool:
        """A fresh context on the TPM worker (bounded). TpmIdentityLost when the TPM answers without our AK."""
        from .tpm.signer import reopen

        if self._worker.hung:
            return False  # the old context is still inside a call: reopening would race it; retried next probe
        try:
            fresh = self._worker.call("reconnecting to the TPM", reopen, self, self.ak_handle, min_interval_s)
        except TpmError:
            return False
        if fresh is None:
            if self._last_reopen and self._tpm_answers_without_ak():
                self._identity_lost(f"has no attestation key at 0x{self.ak_handle:08x}")
            return False
        self._esapi, self._ak = fresh
        return True

    def _tpm_answers_without_ak(self) -> bool:
        """Whether a fresh connection reaches a TPM that lacks the AK (vs. a TPM that is not there)."""
        t = _tss()

        def check() -> bool:
            try:
                esapi = t.ESAPI(self.tcti)
            except Exception:
                return False
            try:
                esapi.tr_from_tpmpublic(self.ak_handle)
                return False
            except t.TSS2_Exception as exc:
                return (int(exc.rc) & 0xFFF) in _HANDLE_ERRORS
            except Exception:
                return False
            finally:
                esapi.close()

        try:
            return self._worker.call("looking for the attestation key", check)
        except TpmError:
            return False

    def sign_command(self, cmd: Command) -> bytes:
        key = self._key
        if key is None:
            raise TpmError("TpmSessionSigner is closed")
        reason = self.unbound_reason
        if reason is not None:
            raise TpmError(f"not signed: the session key is not bound to the TPM ({reason})")
        signed, parts = to_be_signed(cmd, self.algorithm, self.key_id)
        held = self._held
        if held is not None:
            try:
                der = held.sign(signed)
            except fastsign.SignError as exc:  # closed meanwhile, or libcrypto refused: nothing unsigned leaves
                raise TpmError(f"not signed: {exc}") from None
        else:
            der = key.sign(signed, self._ecdsa)
        return assemble(parts, es256_from_der(der))  # COSE wants r||s, not DER

    def _open_esapi(self):
        if self._esapi is None:
            raise TpmError("TpmSessionSigner is closed")
        return _BoundedEsapi(self._worker, self._esapi)

    def close(self) -> None:
        """Never waits for a hung TPM: the key is dropped at once, the context closed only if the TPM thread is free."""
        self._key = None
        held = getattr(self, "_held", None)
        if held is not None:
            held.close()
        if not self._lock.acquire(timeout=1.0):
            self._esapi = None  # a hung call holds the context: the process exit reclaims it
            self._worker.stop()
            return
        try:
            self._abandon()
        finally:
            self._lock.release()


_HANDLE_ERRORS = {0x08B, 0x084, 0x18B}  # TPM_RC_HANDLE (format 0 / 1 variants), TPM_RC_VALUE: no object there


def _clock_counts(esapi) -> tuple[int, int]:
    """(resetCount, restartCount) from TPM2_ReadClock: unobfuscated there, unlike in a quote's clockInfo."""
    info = esapi.read_clock()
    return int(info.clockInfo.resetCount), int(info.clockInfo.restartCount)


def _pem_of(public) -> bytes:
    return _pem(serialization.load_pem_public_key(public.to_pem()))


# --- the PLC side ----------------------------------------------------------------------------

MAX_REMEMBERED_SESSIONS = 1024  # session key ids and consumed nonces a SessionReplayState keeps (oldest dropped)
# CredentialError codes that only a genuine credential reaches: its quote verified (trusted AK, this nonce, this
# session key) and, for module and config, its log replayed to the quoted PCR 23, yet it says something runs that
# the PLC does not accept. A PLC gateway ends the open session on these (SessionReplayState.end_current_session):
# the device re-binds after each measurement, so the earlier credential no longer says what runs. Not `measurement`
# nor the certification codes: the log and the certification fields are outside the quote, so someone on the path
# could alter them in a genuine credential to end the session.
SESSION_ENDING_CODES = frozenset({"model", "module", "config", "unmeasured"})


class SessionReplayState:
    """What a PLC remembers across sessions, so that a new session cannot reopen an earlier one:

    - the sequence high-water mark: the highest command sequence any session accepted. Each session's
      EnvelopeVerifier starts there, so a command at or below it is refused (`replay`) even after a new credential
      (sitsd's sequence numbers rise across reconnects and restarts: they start above the microsecond clock);
    - the nonces credentials were accepted for (a credential is usable once: `nonce-used`);
    - the current session key, and the earlier ones it superseded (`retired`): a credential for an earlier daemon
      run's key is refused. The current key may bind again (a reconnect, a TPM reset re-bind) with a fresh nonce;
    - which accept is current: the EnvelopeVerifier of a superseded accept refuses every command (`superseded`).

    At most `max_remembered` retired keys and consumed nonces are kept (the oldest are forgotten). One state is
    shared by every SessionVerifier of one PLC (pass it as `replay_state`, e.g. when the verifier is rebuilt for a
    re-provisioned device key). Thread-safe. It lives in memory: a PLC restart starts afresh, with a fresh nonce,
    which no earlier credential was quoted for."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED_SESSIONS) -> None:
        if max_remembered < 1:
            raise ValueError(f"max_remembered must be at least 1, got {max_remembered}")
        self.max_remembered = max_remembered
        self.lock = threading.Lock()
        self.sequence_high_water = -1
        self.current_key_id: bytes | None = None
        self.generation = 0  # bumped by every accept: only the newest session's commands are accepted
        self.ended: tuple[int, str] | None = None  # (generation, why) of the session end_current_session ended
        self._retired: OrderedDict[bytes, None] = OrderedDict()
        self._nonces: OrderedDict[bytes, None] = OrderedDict()

    def is_retired(self, key_id: bytes) -> bool:
        with self.lock:
            return key_id in self._retired

    def _admit(self, key_id: bytes, nonce: bytes) -> int:
        """Record an accepted credential (caller holds `lock` and has checked it); returns its generation."""
        if self.current_key_id is not None and self.current_key_id != key_id:
            self._remember(self._retired, self.current_key_id)
        self.current_key_id = key_id
        self._remember(self._nonces, nonce)
        self.generation += 1
        return self.generation

    def end_current_session(self, reason: str = "ended by the PLC") -> bool:
        """End the currently accepted session: its verifier refuses every further command (`ended`) until a new
        credential is accepted. For a gateway that refuses a genuine re-bind (`SESSION_ENDING_CODES`). The session
        key stays current (not retired): the device may bind it again, with a fresh nonce, once what runs is
        accepted. Returns whether a session was open."""
        with self.lock:
            if self.current_key_id is None or (self.ended is not None and self.ended[0] + 1 == self.generation):
                return False
            self.ended = (self.generation, reason)
            self.generation += 1
            return True

    def _remember(self, seen: OrderedDict, item: bytes) -> None:
        seen[item] = None
        seen.move_to_end(item)
        while len(seen) > self.max_remembered:
            seen.popitem(last=False)


class SessionVerifier:
    """Trusts one device (its AK public key) running one model. `accept` checks a session credential
    against the nonce this verifier sent and returns the EnvelopeVerifier for that session's commands.

    Replay protection across sessions (`replay_state`, SessionReplayState; a fresh one unless given): a credential
    is accepted once per nonce, so the PLC must issue a fresh nonce after every credential written to it (accepted or
    refused); a session key superseded by a later one is refused; each session's commands must carry sequence numbers
    above every sequence an earlier session accepted; accepting a credential ends the previous session.

    With `trusted_device_key_pem` (the device's PolicyAuthorize-bound key, device_key_handle) only a session key
    that key certified is accepted, i.e. one the TPM certified while the measured model and modules were
    some approved ones. Pin which: `approval` with its `authority` (the approval is verified here and must
    approve `expected_model_sha256`; its modules are then the only ones accepted), or `approved_pcr_value`.
    Without a pin, any approval the authority ever signed for this device key is accepted.

    Measured modules and config (version 2 credentials: the quote also covers `measurement_pcr`, 23, and the
    credential carries its log): the log must replay to the quoted value (`measurement`), the newest model it names
    must be `expected_model_sha256` (`model`), and the accepted session's `measured` says what runs (MeasuredState:
    model, modules by stage, config). Pins: `expected_modules` {stage: SHA-256 (hex or 32 bytes)} must be exactly the
    modules the log says run (`module`), `expected_config_sha256` the config (`config`). A version 1 credential (no
    log: an older sitsd, or measurement off) is accepted only without pins and without `require_measurements`
    (`unmeasured`); its session's `measured` is None.

    `also_accepted_models` (SHA-256 digests): models a session may run besides `expected_model_sha256`, for a hot
    swap the plant has planned (`sitsctl plcsim --also-accept-model-sha256`). A credential must measure one of the
    accepted models (the log's newest model; for version 1, the newest model measured into PCR 16), and its
    session's commands may carry any of them, for as long as the session lasts: right after a swap the new
    model's commands come before the credential that measures it (sitsd re-binds once the new model runs), and
    the accepted session's `measured` then says which runs. A plant that lists a model here accepts commands
    from it; the credential tells which one ran when it was made. Not with an approval or
    `approved_pcr_value`, which pin one measured state."""

    def __init__(self, trusted_ak_public_pem: bytes, expected_model_sha256: bytes, pcr: int = MODEL_PCR, *,
                 freshness: bool = True, max_age_ns: int | None = DEFAULT_MAX_AGE_NS,
                 clock: Callable[[], int] | None = None, deadline_grace_ns: int = DEFAULT_DEADLINE_GRACE_NS,
                 max_future_ns: int | None = DEFAULT_MAX_FUTURE_NS,
                 max_validity_ns: int | None = DEFAULT_MAX_VALIDITY_NS, trusted_device_key_pem: bytes | None = None,
                 approved_pcr_value: bytes | None = None, approval=None, authority=None,
                 replay_state: SessionReplayState | None = None, measurement_pcr: int = MEASUREMENT_PCR,
                 expected_modules=None, expected_config_sha256: bytes | str | None = None,
                 require_measurements: bool = False, also_accepted_models: Iterable[bytes] = ()) -> None:
        ak = serialization.load_pem_public_key(trusted_ak_public_pem)
        if not isinstance(ak, ec.EllipticCurvePublicKey) or ak.curve.name != "secp256r1":
            raise ValueError("trusted AK must be an ECDSA P-256 public key")
        if len(expected_model_sha256) != 32:
            raise ValueError("expected_model_sha256 must be 32 bytes")
        self._ak_der = _der(ak)
        self.trusted_ak_public_pem = _pem(ak)
        self.expected_model_sha256 = bytes(expected_model_sha256)
        self.pcr = pcr
        self._device_der = None
        if approval is not None:
            if authority is None or approved_pcr_value is not None:
                raise ValueError("approval needs its authority's public key, and replaces approved_pcr_value")
            approval.verify(authority)  # PolicyError when it is not the authority's or does not add up
            if approval.model_sha256 != bytes(expected_model_sha256).hex():
                raise ValueError(f"the approval is for model {approval.model_sha256[:16]}…, this verifier expects "
                                 f"{bytes(expected_model_sha256).hex()[:16]}…")
            approved_pcr_value = bytes.fromhex(approval.pcr_value)
        if trusted_device_key_pem is not None:
            device = serialization.load_pem_public_key(trusted_device_key_pem)
            if not isinstance(device, ec.EllipticCurvePublicKey) or device.curve.name != "secp256r1":
                raise ValueError("trusted device key must be an ECDSA P-256 public key")
            self._device_der = _der(device)
        elif approved_pcr_value is not None:
            raise ValueError("approved_pcr_value needs trusted_device_key_pem")
        if approved_pcr_value is not None and len(approved_pcr_value) != 32:
            raise ValueError("approved_pcr_value must be 32 bytes")
        self.approved_pcr_value = approved_pcr_value
        # models besides expected_model_sha256 a session may run (a planned hot swap): the session's commands must
        # then carry the model the credential's log says runs, whichever of these it is
        also = tuple(bytes(m) for m in also_accepted_models)
        if any(len(m) != 32 for m in also):
            raise ValueError("also_accepted_models must be SHA-256 digests (32 bytes each)")
        if also and approved_pcr_value is not None:
            raise ValueError("also_accepted_models cannot go with an approval or approved_pcr_value: they pin one "
                             "measured state")
        self.also_accepted_models = frozenset(also) - {self.expected_model_sha256}
        self._accepted_hex = {self.expected_model_sha256.hex()} | {m.hex() for m in self.also_accepted_models}
        if type(measurement_pcr) is not int or not 0 <= measurement_pcr < PCR_COUNT or measurement_pcr == pcr:
            raise ValueError(f"measurement_pcr must be in 0..{PCR_COUNT - 1} and not the session PCR {pcr}")
        self.measurement_pcr = measurement_pcr
        self.expected_modules = ({str(stage): _sha_hex(sha, f"expected_modules[{stage!r}]")
                                  for stage, sha in dict(expected_modules).items()}
                                 if expected_modules is not None else None)
        self.expected_config_sha256 = (_sha_hex(expected_config_sha256, "expected_config_sha256")
                                       if expected_config_sha256 is not None else None)
        self.require_measurements = bool(require_measurements or self.expected_modules is not None
                                         or self.expected_config_sha256 is not None)
        self.replay_state = replay_state if replay_state is not None else SessionReplayState()
        # the session's EnvelopeVerifier: freshness on by default, as EnvelopeVerifier's (freshness=False: offline)
        self._envelope_options = {"freshness": freshness, "max_age_ns": max_age_ns, "clock": clock,
                                  "deadline_grace_ns": deadline_grace_ns,
                                  "max_future_ns": max_future_ns, "max_validity_ns": max_validity_ns}

    def accept(self, credential_bytes: bytes, nonce: bytes) -> SessionEnvelopeVerifier:
        """Raises CredentialError naming the failed check; ValueError for a bad `nonce` argument. A credential is
        accepted once per nonce (`nonce-used` after), never for a superseded session key (`retired`); the returned
        verifier ends the previous session's and starts at the sequence high-water mark of every earlier one."""
        nonce = _check_nonce(nonce)
        cred = SessionCredential.from_cbor(credential_bytes)
        if _der(serialization.load_pem_public_key(cred.ak_public_pem)) != self._ak_der:
            raise CredentialError("credential is quoted by an AK this verifier does not trust", "ak")
        if cred.pcr != self.pcr:
            raise CredentialError(f"credential quotes PCR {cred.pcr}, the model is measured into PCR {self.pcr}", "pcr")
        if cred.verifier_nonce != nonce:
            raise CredentialError("credential was made for another nonce: an old session replayed", "nonce")
        extra = session_binding(cred.session_public_pem, nonce)
        try:
            verify_quote(cred.quote, self.trusted_ak_public_pem, extra,
                         {cred.pcr: replay_measurements(cred.measurements)})
        except QuoteError as exc:
            if exc.code == "nonce":
                raise CredentialError("quote extraData is not the binding of this session key to this nonce: "
                                      "session key substituted or quote replayed from another session",
                                      "binding") from None
            if exc.code == "pcr-value":
                raise CredentialError(f"PCR {cred.pcr} as quoted is not the replay of the credential's "
                                      f"{len(cred.measurements)} measurements: something else was extended",
                                      "pcr-value") from None
            raise CredentialError(f"quote: {exc.reason}", exc.code) from None
        running = self.expected_model_sha256
        if cred.measurement_pcr is None and not self.also_accepted_models:
            # version 1: PCR 16 is the only record of the model (version 2: the PCR 23 log's newest model, below)
            if self.expected_model_sha256 not in cred.measurements:
                raise CredentialError(f"model {self.expected_model_sha256.hex()[:16]}… was not measured into "
                                      f"PCR {cred.pcr} in this session", "model")
        elif cred.measurement_pcr is None:
            # version 1 with more than one accepted model: the newest model measured is the one that runs, and
            # it must be an accepted one (an older accepted measurement proves nothing about what runs now)
            newest = cred.measurements[-1] if cred.measurements else None
            if newest is None or newest.hex() not in self._accepted_hex:
                what = f"model {newest.hex()[:16]}… was measured last" if newest else "no model was measured"
                raise CredentialError(f"{what} into PCR {cred.pcr}; this verifier accepts "
                                      f"{self.expected_model_sha256.hex()[:16]}…{self._also_text()}", "model")
            running = newest
        measured = self._check_measurements(cred)
        if measured is not None:
            running = bytes.fromhex(measured.model[1])
        if self._device_der is not None:
            self._check_certification(cred)
        # the session's commands may carry any accepted model: right after a swap the commands of the new model come
        # before the credential that measures it (sitsd re-binds once the new model runs)
        session = SessionEnvelopeVerifier(cred.session_public_pem, running, **self._envelope_options,
                                          also_accepted_models=(self.also_accepted_models
                                                                | {self.expected_model_sha256}) - {running}
                                          if self.also_accepted_models else ())
        session.measured = measured
        session.measurement_log = cred.measured_entries()
        state = self.replay_state
        with state.lock:
            if nonce in state._nonces:
                raise CredentialError(f"a session credential was already accepted for nonce {nonce.hex()[:16]}…: "
                                      "replayed (the PLC must issue a fresh nonce after every credential written to "
                                      "it)", "nonce-used")
            if session.key_id in state._retired:
                raise CredentialError(f"session key {session.key_id.hex()} belongs to an earlier session that a later "
                                      "session key superseded: an old session replayed (rolling back to it is refused)",
                                      "retired")
            session._join(state, state._admit(session.key_id, nonce))
        return session

    @property
    def sequence_high_water(self) -> int:
        """The highest command sequence any session of this verifier accepted (-1: none yet)."""
        return self.replay_state.sequence_high_water

    def end_current_session(self, reason: str = "ended by the PLC") -> bool:
        """SessionReplayState.end_current_session of this verifier's state: the accepted session refuses every
        further command (`ended`)."""
        return self.replay_state.end_current_session(reason)

    def _check_measurements(self, cred: SessionCredential) -> MeasuredState | None:
        """The measurement PCR's log against its quoted value, the model it says runs, and the pins."""
        if cred.measurement_pcr is None:
            if self.require_measurements:
                raise CredentialError(f"the credential carries no measurement log of PCR {self.measurement_pcr} (a "
                                      "version 1 credential: an older sitsd, or measurement off), so it does not "
                                      "prove which modules and config run; this verifier pins them", "unmeasured")
            return None
        if cred.measurement_pcr != self.measurement_pcr:
            raise CredentialError(f"credential quotes measurement PCR {cred.measurement_pcr}, this verifier expects "
                                  f"PCR {self.measurement_pcr}", "pcr")
        entries = cred.measured_entries()
        if replay_entries(entries) != cred.measurement_value:
            raise CredentialError(f"PCR {cred.measurement_pcr} as quoted is not the replay of the credential's "
                                  f"{len(entries)} measurement events: the log was edited or events are missing",
                                  "measurement")
        state = measured_state(entries)
        if state.model is None:
            raise CredentialError(f"measurement PCR {cred.measurement_pcr}: the log names no model, this verifier "
                                  f"expects {self.expected_model_sha256.hex()[:16]}…{self._also_text()}", "model")
        if state.model[1] not in self._accepted_hex:
            raise CredentialError(f"measurement PCR {cred.measurement_pcr}: model {state.model[0]} "
                                  f"{state.model[1][:16]}… runs, this verifier expects "
                                  f"{self.expected_model_sha256.hex()[:16]}…{self._also_text()}", "model")
        if self.expected_modules is not None:
            for stage in sorted(set(self.expected_modules) | set(state.modules)):
                want, got = self.expected_modules.get(stage), state.modules.get(stage)
                if got is None:
                    raise CredentialError(f"measurement module:{stage}: no module runs at stage {stage}, the pinned "
                                          f"one is {want[:16]}…", "module")
                if want is None:
                    raise CredentialError(f"measurement module:{stage} {got[0]} {got[1][:16]}…: runs, but no module "
                                          f"is pinned at stage {stage}", "module")
                if got[1] != want:
                    raise CredentialError(f"measurement module:{stage} {got[0]} {got[1][:16]}… is not the pinned "
                                          f"{want[:16]}…", "module")
        if self.expected_config_sha256 is not None:
            if state.config is None:
                raise CredentialError(f"measurement config: no config is measured into PCR {cred.measurement_pcr}, "
                                      f"the pinned one is {self.expected_config_sha256[:16]}…", "config")
            if state.config[1] != self.expected_config_sha256:
                raise CredentialError(f"measurement config {state.config[0]} {state.config[1][:16]}… is not the "
                                      f"pinned {self.expected_config_sha256[:16]}…", "config")
        return state

    def _also_text(self) -> str:
        n = len(self.also_accepted_models)
        return f" (or one of {n} also accepted)" if n > 1 else (
            f" (or {next(iter(self.also_accepted_models)).hex()[:16]}…, also accepted)" if n else "")

    def _check_certification(self, cred: SessionCredential) -> None:
        from .tpm.policy import verify_device_signature

        cert = cred.certification
        if cert is None:
            raise CredentialError("the session key is not certified by the device's policy-bound key: the device "
                                  "runs without attestation.certify_session, or a model or module other than the "
                                  "approved ones (the TPM refuses to certify then)", "uncertified")
        device = serialization.load_pem_public_key(cert.device_public_pem)
        if _der(device) != self._device_der:
            raise CredentialError("the session key is certified by a device key this verifier does not trust",
                                  "device-key")
        if self.approved_pcr_value is not None and cert.approved_pcr_value != self.approved_pcr_value:
            raise CredentialError(f"the session key is certified under approval of PCR value "
                                  f"{cert.approved_pcr_value.hex()[:16]}…, this verifier expects "
                                  f"{self.approved_pcr_value.hex()[:16]}…", "approval")
        digest = certification_digest(cred.session_public_pem, cert.approved_pcr_value)
        if not verify_device_signature(cert.device_public_pem, digest, cert.signature):
            raise CredentialError("the device key's certification does not verify for this session key (forged, or "
                                  "copied from another session)", "certification")


class SessionEnvelopeVerifier(EnvelopeVerifier):
    """The EnvelopeVerifier of one accepted session (SessionVerifier.accept): besides its own checks, it refuses every
    command once a later credential was accepted (`superseded`), and a sequence at or below the highest any session
    of the same SessionReplayState accepted (`replay`). Thread-safe per state (one lock)."""

    _state: SessionReplayState | None = None
    # what the credential's measurement log says runs (MeasuredState), and that log as (kind, name, sha256 hex);
    # None and () for a version 1 credential
    measured: MeasuredState | None = None
    measurement_log: tuple = ()
    _generation = 0
    _own_last = -1  # the highest sequence this session accepted itself

    def _join(self, state: SessionReplayState, generation: int) -> None:
        self._state, self._generation = state, generation
        self.last_sequence = max(self.last_sequence, state.sequence_high_water)

    def verify(self, data: bytes):
        state = self._state
        if state is None:
            return super().verify(data)
        with state.lock:
            if self._generation != state.generation:
                if state.ended is not None and state.ended[0] == self._generation:
                    raise EnvelopeError(f"session of key {self.key_id.hex()} was ended ({state.ended[1]}): no command "
                                        "is accepted until a new session credential is", "ended")
                raise EnvelopeError(f"session of key {self.key_id.hex()} is over: a later session credential was "
                                    "accepted, commands go through that session's verifier", "superseded")
            floor = state.sequence_high_water
            self.last_sequence = max(self.last_sequence, floor)
            try:
                env = super().verify(data)
            except EnvelopeError as exc:
                if exc.code == "replay" and floor > self._own_last:
                    raise EnvelopeError(f"{exc.reason}: sequence numbers must rise across sessions and an earlier "
                                        f"session accepted up to {floor} (a command of an earlier session replayed)",
                                        "replay") from None
                raise
            self._own_last = env.command.sequence
            state.sequence_high_water = max(floor, env.command.sequence)
            return env
