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
`EnvelopeVerifier` for that session's commands.

Certification (optional, `attestation.certify_session`): at start, right after the model and modules
are measured into the measurement PCR and before anything else is, `certify` has the
PolicyAuthorize-bound device key (0x81000001, attestation.tpm.policy) sign
SHA-256("sits-session-certify-v1" 0 || session key SPKI DER || approved PCR value). The TPM does
that only while the PCR holds the state the authority approved: for an unapproved model or module
the TPM refuses and there is no certified session key. A verifier given the device key
(`trusted_device_key_pem`) accepts only certified session keys.

Trade-off: the session private key lives in process memory until the signer is closed, while
the AK never leaves the TPM. PCR 16 is resettable at locality 0: the binding to the model holds
only while nothing but the daemon may use the TPM.

Credential CBOR (one canonical encoding; anything else is refused):
    {1: 1 (version), 2: session key SPKI DER, 3: AK SPKI DER, 4: TPMS_ATTEST bytes,
     5: quote signature r||s (64 bytes), 6: PCR index, 7: PCR value (32 bytes),
     8: [* measurement (32 bytes)], 9: verifier nonce (16..64 bytes)
     and, only for a certified session key, all three of:
     10: device key SPKI DER, 11: approved PCR value (32 bytes), 12: device key signature r||s (64 bytes)}
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cbor2
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from . import cose
from .cose import es256_from_der
from .envelope import ALG_ECDSA_P256_SHA256, Command, EnvelopeVerifier, assemble, key_id_of, to_be_signed
from .errors import AttestationError, EnvelopeError, TpmError
from .tpm.quote import AK_HANDLE, PCR_COUNT, Quote, QuoteError, extend_pcr, load_or_create_ak, quote, verify_quote
from .tpm.quote import ak_public_pem as _ak_public_pem
from .tpm.quote import read_pcrs
from .tpm.signer import DEFAULT_KEY_HANDLE, MODEL_PCR, _tss

BINDING_LABEL = b"sits-session-v1"
CERTIFY_LABEL = b"sits-session-certify-v1\0"
CREDENTIAL_VERSION = 1
MIN_NONCE, MAX_NONCE = 16, 64
MAX_MEASUREMENTS = 64
MAX_CREDENTIAL_BYTES = 4096
(K_VERSION, K_SESSION_KEY, K_AK, K_ATTEST, K_SIGNATURE, K_PCR, K_PCR_VALUE, K_MEASUREMENTS,
 K_NONCE, K_DEVICE_KEY, K_APPROVED_VALUE, K_DEVICE_SIGNATURE) = range(1, 13)
_PLAIN_KEYS = frozenset(range(K_VERSION, K_NONCE + 1))
_CERTIFIED_KEYS = frozenset(range(K_VERSION, K_DEVICE_SIGNATURE + 1))
_ZERO = b"\0" * 32


class CredentialError(AttestationError):
    """A session credential is malformed or does not prove what it must. `reason` says what in words;
    `code` is one of: malformed, ak, pcr, nonce, binding, signature, magic, type, pcr-selection,
    pcr-digest, pcr-value, model, key, uncertified, device-key, certification, approval."""

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


def _check_nonce(nonce) -> bytes:
    if not isinstance(nonce, (bytes, bytearray)) or not MIN_NONCE <= len(nonce) <= MAX_NONCE:
        raise ValueError(f"verifier nonce must be {MIN_NONCE}..{MAX_NONCE} random bytes")
    return bytes(nonce)


# --- the credential --------------------------------------------------------------------------

@dataclass(frozen=True)
class SessionCredential:
    """What the daemon sends the PLC once per session. `quote.pcrs` must be {pcr: pcr_value} and
    `quote.ak_public_pem` the credential's AK: an inconsistent credential cannot be built."""

    session_public_pem: bytes
    ak_public_pem: bytes
    quote: Quote
    pcr_value: bytes
    measurements: tuple[bytes, ...]  # every digest extended into `pcr` since its reset, in order
    verifier_nonce: bytes
    pcr: int = MODEL_PCR
    certification: Certification | None = None  # set when the device key certified the session key

    def __post_init__(self) -> None:
        object.__setattr__(self, "measurements", tuple(self.measurements))
        if dict(self.quote.pcrs) != {self.pcr: self.pcr_value}:
            raise CredentialError(f"the quote's PCR values are not PCR {self.pcr} = the credential's pcr_value",
                                  "malformed")
        if self.quote.ak_public_pem != self.ak_public_pem:
            raise CredentialError("the quote's AK is not the credential's AK", "malformed")

    def to_cbor(self) -> bytes:
        fields = {
            K_VERSION: CREDENTIAL_VERSION,
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
        return cbor2.dumps(fields)

    @classmethod
    def from_cbor(cls, data: bytes) -> "SessionCredential":
        """Strict: one canonical CBOR map with exactly the keys 1..9 (or 1..12: certified) of the right types
        and sizes, keys that load as P-256 or Ed25519 public keys; anything else is CredentialError('malformed')."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CredentialError(f"credential must be bytes, got {type(data).__name__}", "malformed")
        data = bytes(data)
        if len(data) > MAX_CREDENTIAL_BYTES:
            raise CredentialError(f"credential is {len(data)} bytes, more than {MAX_CREDENTIAL_BYTES}", "malformed")
        try:
            fields = cose.loads_strict(data, "session credential", max_depth=3)
        except EnvelopeError as exc:
            raise CredentialError(exc.reason, "malformed") from None
        if not isinstance(fields, dict) or set(fields) not in (_PLAIN_KEYS, _CERTIFIED_KEYS) \
                or not all(type(k) is int for k in fields):
            raise CredentialError(f"credential must be a map with exactly the keys 1..{K_NONCE} (1..{K_DEVICE_SIGNATURE}"
                                  " when certified)", "malformed")
        if type(fields[K_VERSION]) is not int or fields[K_VERSION] != CREDENTIAL_VERSION:
            raise CredentialError(f"credential version must be {CREDENTIAL_VERSION}", "malformed")
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
        cred = cls(session_pem, ak_pem, Quote(attest, signature, {pcr: pcr_value}, ak_pem), pcr_value,
                   tuple(measurements), nonce, pcr, certification)
        if cred.to_cbor() != data:
            raise CredentialError("credential is not in its one canonical encoding", "malformed")
        return cred


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


# --- the daemon side -------------------------------------------------------------------------

class TpmSessionSigner:
    """Signs commands with an in-memory ECDSA P-256 session key bound to the TPM by one quote.

    `key_handle` is the PolicyAuthorize-bound device key: used only by `certify` (never for
    commands). `measure_model`, `certify` and `bind` use the TPM under a lock; `sign_command` never
    does and needs no lock. `certification_active`, when set, says whether the certification still
    describes what runs (a hot swap away from the certified model ends it): `bind` leaves it out
    of the credential while it returns False.
    """

    kind = "tpm-session"
    algorithm = ALG_ECDSA_P256_SHA256

    def __init__(self, tcti: str, key_handle: int = DEFAULT_KEY_HANDLE, ak_handle: int = AK_HANDLE,
                 pcr: int = MODEL_PCR, *, reset_pcr: bool = True) -> None:
        if not tcti:
            raise TpmError("no TCTI given; use device:/dev/tpmrm0 for the kernel resource manager "
                           "or swtpm:path=<socket> for swtpm (the library default is never used)")
        if ak_handle == key_handle:
            raise ValueError(f"AK handle 0x{ak_handle:08x} must differ from the device key handle")
        if type(pcr) is not int or not 0 <= pcr < PCR_COUNT:
            raise ValueError(f"PCR must be in 0..{PCR_COUNT - 1}, got {pcr!r}")
        t = _tss()
        self.tcti, self.key_handle, self.ak_handle, self.pcr = tcti, key_handle, ak_handle, pcr
        self._lock = threading.Lock()
        try:
            self._esapi = t.ESAPI(tcti)
        except Exception as exc:  # TSS2_Exception or TCTI load failure
            raise TpmError(f"cannot open TPM through TCTI {tcti!r}: {exc}") from exc
        try:
            self._ak, self.ak_created = load_or_create_ak(self._esapi, ak_handle)
            self._ak_public_pem = _ak_public_pem(self._esapi, self._ak)
            if reset_pcr:
                self._esapi.pcr_reset(getattr(t.ESYS_TR, f"PCR{pcr}"))
            start = read_pcrs(self._esapi, [pcr])[pcr]
        except TpmError:
            self._esapi.close()
            raise
        except Exception as exc:
            self._esapi.close()
            raise TpmError(f"TPM at {tcti!r}: cannot set up the attestation key at 0x{ak_handle:08x} or "
                           f"reset PCR {pcr} (only 16 and 23 are resettable at locality 0): {exc}") from exc
        if start != _ZERO:
            self._esapi.close()
            raise TpmError(f"PCR {pcr} is {start.hex()[:16]}…, not zero: its earlier measurements are unknown; "
                           "reset it (reset_pcr=True) or use a PCR nothing else extends")
        self._measurements: list[bytes] = []
        self._last_reopen = 0.0
        self.reconnects = 0
        self.certification: Certification | None = None
        self.certification_active: Callable[[], bool] | None = None
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._session_public_pem = _pem(self._key.public_key())
        self.key_id = key_id_of(self._key.public_key())
        self._ecdsa = ec.ECDSA(hashes.SHA256())

    def public_key_pem(self) -> bytes:
        """The session key: what each command's signature verifies with (after `SessionVerifier.accept`)."""
        return self._session_public_pem

    def device_public_key_pem(self) -> bytes:
        """The AK: the device identity a PLC is provisioned to trust."""
        return self._ak_public_pem

    @property
    def measurements(self) -> tuple[bytes, ...]:
        return tuple(self._measurements)

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

    def certify(self, approval, authority) -> Certification:
        """Have the policy-bound device key at `key_handle` (created when absent, bound to `authority`) sign
        this session key under `approval`. The TPM checks the approval's PCR state against the PCR's current
        value: PolicyError(code "refused") when the measured model or modules are not the approved ones.
        Call it right after the approved measurements (model, modules) and before any other."""
        from .tpm.policy import PolicyError, key_public_pem, load_or_create_policy_key, policy_sign

        approved = bytes.fromhex(approval.pcr_value)
        digest = certification_digest(self._session_public_pem, approved)
        with self._lock:
            esapi = self._open_esapi()
            step = f"provisioning the policy-bound device key at 0x{self.key_handle:08x}"
            try:
                key, self.device_key_created = load_or_create_policy_key(esapi, self.key_handle, authority)
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

    def bind(self, verifier_nonce: bytes) -> SessionCredential:
        """Quote the PCR with extraData = the binding of the session key to `verifier_nonce` (16..64
        bytes the PLC chose). The credential carries what the TPM quoted; the verifier judges it."""
        nonce = _check_nonce(verifier_nonce)
        extra = session_binding(self._session_public_pem, nonce)
        cert = self.certification  # judged before the quote: a swap meanwhile cannot carry it over
        if cert is not None and self.certification_active is not None and not self.certification_active():
            cert = None
        with self._lock:
            esapi = self._open_esapi()
            try:
                q = quote(esapi, self._ak, [self.pcr], extra)
            except _tss().TSS2_Exception as exc:
                raise TpmError(f"TPM2_Quote with AK 0x{self.ak_handle:08x} through {self.tcti!r} failed: {exc}") \
                    from exc
            measurements = tuple(self._measurements)
        return SessionCredential(self._session_public_pem, self._ak_public_pem, q, q.pcrs[self.pcr], measurements,
                                 nonce, self.pcr, cert)

    def probe(self) -> None:
        """TPM2_ReadPublic of the AK: TpmError when the TPM does not answer. After a failure the connection is
        reopened (rate-limited), so measurements, quotes and anchors work again once the TPM is back; commands
        never need the TPM (the session key signs them)."""
        with self._lock:
            esapi = self._open_esapi()
            try:
                esapi.read_public(self._ak)
            except Exception as exc:  # TSS2_Exception, a dead socket
                self._reopen_locked()
                raise TpmError(f"TPM at {self.tcti!r} does not answer: {exc}") from exc

    def _reopen_locked(self, min_interval_s: float = 1.0) -> bool:
        from .tpm.signer import reopen

        fresh = reopen(self, self.ak_handle, min_interval_s)
        if fresh is None:
            return False
        self._esapi, self._ak = fresh
        return True

    def sign_command(self, cmd: Command) -> bytes:
        key = self._key
        if key is None:
            raise TpmError("TpmSessionSigner is closed")
        signed, parts = to_be_signed(cmd, self.algorithm, self.key_id)
        return assemble(parts, es256_from_der(key.sign(signed, self._ecdsa)))  # COSE wants r||s, not DER

    def _open_esapi(self):
        if self._esapi is None:
            raise TpmError("TpmSessionSigner is closed")
        return self._esapi

    def close(self) -> None:
        with self._lock:
            self._key = None
            if self._esapi is not None:
                self._esapi.close()
                self._esapi = None


# --- the PLC side ----------------------------------------------------------------------------

class SessionVerifier:
    """Trusts one device (its AK public key) running one model. `accept` checks a session credential
    against the nonce this verifier sent and returns the EnvelopeVerifier for that session's commands.

    With `trusted_device_key_pem` (the device's PolicyAuthorize-bound key, 0x81000001) only a session key
    that key certified is accepted, i.e. one the TPM certified while the measured model and modules were
    some approved ones. Pin which: `approval` with its `authority` (the approval is verified here and must
    approve `expected_model_sha256`; its modules are then the only ones accepted), or `approved_pcr_value`.
    Without a pin, any approval the authority ever signed for this device key is accepted."""

    def __init__(self, trusted_ak_public_pem: bytes, expected_model_sha256: bytes, pcr: int = MODEL_PCR, *,
                 max_age_ns: int | None = None, clock: Callable[[], int] | None = None,
                 deadline_grace_ns: int = 0, max_future_ns: int | None = None,
                 max_validity_ns: int | None = None, trusted_device_key_pem: bytes | None = None,
                 approved_pcr_value: bytes | None = None, approval=None, authority=None) -> None:
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
        self._envelope_options = {"max_age_ns": max_age_ns, "clock": clock, "deadline_grace_ns": deadline_grace_ns,
                                  "max_future_ns": max_future_ns, "max_validity_ns": max_validity_ns}

    def accept(self, credential_bytes: bytes, nonce: bytes) -> EnvelopeVerifier:
        """Raises CredentialError naming the failed check; ValueError for a bad `nonce` argument."""
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
        if self.expected_model_sha256 not in cred.measurements:
            raise CredentialError(f"model {self.expected_model_sha256.hex()[:16]}… was not measured into "
                                  f"PCR {cred.pcr} in this session", "model")
        if self._device_der is not None:
            self._check_certification(cred)
        return EnvelopeVerifier(cred.session_public_pem, self.expected_model_sha256, **self._envelope_options)

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
