"""Command envelopes: one PLC command, signed as a COSE_Sign1 (RFC 9052, tag 18), and its verifier.

    COSE_Sign1 = 18([protected: bstr, unprotected: {}, payload: bstr, signature: bstr])
    protected  = {1 (alg): -7 ES256 | -8 EdDSA, 3 (content type): "application/sits-command+cbor",
                  4 (kid): 8-byte key id}
    payload    = {1: target (tstr, at most 255 bytes UTF-8), 2: values ([* float64], finite, at most 1024),
                  3: sequence (uint), 4: frame_sequence (uint), 5: issued_ns (int), 6: deadline_ns (int),
                  7: model_sha256 (bstr 32), 8: failsafe (bool)}
The signature covers the Sig_structure ["Signature1", protected, h'', payload]: ES256 is r||s
(2 x 32 bytes big endian), EdDSA is Ed25519. Key id: the first 8 bytes of the SHA-256 of the
signer's SubjectPublicKeyInfo DER. The unprotected bucket stays empty, and the payload is written one
way only (ascending keys, shortest integer heads, 64-bit floats): anything else is refused.
"""
from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import cbor2
from cryptography.hazmat.primitives import serialization

from . import cose
from .errors import EnvelopeError

ALG_ED25519 = cose.ALG_EDDSA
ALG_ECDSA_P256_SHA256 = cose.ALG_ES256
ALGORITHM_NAMES = {ALG_ED25519: "EdDSA (Ed25519)", ALG_ECDSA_P256_SHA256: "ES256 (ECDSA P-256)"}
CONTENT_TYPE = "application/sits-command+cbor"
KEY_ID_SIZE = 8
MAX_TARGET_BYTES = 255
MAX_VALUES = 1024
MAX_ENVELOPE_BYTES = 16384  # a real command is ~150 bytes; the cap bounds work on hostile input

# payload map keys
K_TARGET, K_VALUES, K_SEQUENCE, K_FRAME_SEQUENCE, K_ISSUED, K_DEADLINE, K_MODEL, K_FAILSAFE = range(1, 9)
FIELD_NAMES = {K_TARGET: "target", K_VALUES: "values", K_SEQUENCE: "sequence", K_FRAME_SEQUENCE: "frame_sequence",
               K_ISSUED: "issued_ns", K_DEADLINE: "deadline_ns", K_MODEL: "model_sha256", K_FAILSAFE: "failsafe"}
_U64 = (0, 2**64 - 1)
_I64 = (-2**63, 2**63 - 1)


@dataclass(frozen=True, slots=True)
class Command:
    """What the loop decided to send: the unsigned content of an envelope."""

    target: str
    values: tuple[float, ...]
    sequence: int
    frame_sequence: int
    issued_ns: int
    deadline_ns: int
    model_sha256: bytes
    failsafe: bool = False


@dataclass(frozen=True, slots=True)
class Envelope:
    command: Command
    algorithm: int
    key_id: bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class Unsigned:
    """The parts of a COSE_Sign1 fixed before signing: what `assemble` needs besides the signature."""

    protected: bytes
    payload: bytes


def key_id_of(public_key) -> bytes:
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).digest()[:KEY_ID_SIZE]


# --- signing side ----------------------------------------------------------------------------

def to_be_signed(cmd: Command, algorithm: int, key_id: bytes) -> tuple[bytes, Unsigned]:
    """The Sig_structure bytes a signer signs, and the parts to `assemble` with its signature."""
    protected = cose.encode_protected(
        {cose.HDR_ALG: algorithm, cose.HDR_CONTENT_TYPE: CONTENT_TYPE, cose.HDR_KID: bytes(key_id)})
    payload = encode_payload(cmd)
    return cose.sig_structure(protected, payload), Unsigned(protected, payload)


def assemble(parts: Unsigned, signature: bytes) -> bytes:
    return cose.encode_sign1(parts.protected, parts.payload, signature)


def encode_payload(cmd: Command) -> bytes:
    """The command as its CBOR map; ValueError for a command the format cannot carry."""
    values = [float(v) for v in cmd.values]
    target = cmd.target
    _require(isinstance(target, str), f"command target must be text, got {type(target).__name__}")
    _require(len(target.encode()) <= MAX_TARGET_BYTES,
             f"command target {target!r} is longer than {MAX_TARGET_BYTES} bytes")
    _require(len(values) <= MAX_VALUES, f"a command carries at most {MAX_VALUES} values, got {len(values)}")
    _require(all(math.isfinite(v) for v in values), "command values must be finite")
    _require(len(cmd.model_sha256) == 32, "model_sha256 must be 32 bytes")
    ints = {K_SEQUENCE: (int(cmd.sequence), _U64), K_FRAME_SEQUENCE: (int(cmd.frame_sequence), _U64),
            K_ISSUED: (int(cmd.issued_ns), _I64), K_DEADLINE: (int(cmd.deadline_ns), _I64)}
    for key, (value, (lo, hi)) in ints.items():
        _require(lo <= value <= hi, f"command {FIELD_NAMES[key]} = {value} is outside [{lo}, {hi}]")
    return cbor2.dumps({K_TARGET: target, K_VALUES: values, **{k: v for k, (v, _) in ints.items()},
                        K_MODEL: bytes(cmd.model_sha256), K_FAILSAFE: bool(cmd.failsafe)})


def _require(ok: bool, reason: str) -> None:
    if not ok:
        raise ValueError(reason)


# --- verifying side --------------------------------------------------------------------------

def decode(data: bytes) -> tuple[Envelope, bytes]:
    """Parse an envelope; returns it with the bytes its signature covers (the Sig_structure).
    Raises EnvelopeError('malformed') for anything that is not a well-formed command envelope."""
    if isinstance(data, (bytes, bytearray, memoryview)) and len(data) > MAX_ENVELOPE_BYTES:
        raise EnvelopeError(f"envelope is {len(data)} bytes, more than the {MAX_ENVELOPE_BYTES} allowed", "malformed")
    msg = cose.decode_sign1(data)
    algorithm, key_id = _envelope_headers(msg)
    cmd = decode_payload(msg.payload)
    return Envelope(cmd, algorithm, key_id, msg.signature), msg.to_be_signed()


def _envelope_headers(msg: cose.Sign1) -> tuple[int, bytes]:
    """alg, content type and kid must be protected, so the signature binds them to the command;
    the unprotected bucket must be empty, so that no byte of an accepted envelope goes unsigned."""
    headers = msg.protected_headers
    algorithm = headers.get(cose.HDR_ALG)
    if type(algorithm) is not int:
        raise EnvelopeError("envelope needs an integer alg in its protected header", "malformed")
    if headers.get(cose.HDR_CONTENT_TYPE) != CONTENT_TYPE:
        raise EnvelopeError(f"envelope content type must be {CONTENT_TYPE!r} in its protected header", "malformed")
    key_id = headers.get(cose.HDR_KID)
    if not isinstance(key_id, bytes) or len(key_id) != KEY_ID_SIZE:
        raise EnvelopeError(f"envelope needs a {KEY_ID_SIZE}-byte kid in its protected header", "malformed")
    if msg.unprotected_headers:
        raise EnvelopeError("envelope's unprotected header must be empty: nothing unsigned is accepted", "malformed")
    expected = cose.SIGNATURE_SIZES.get(algorithm)
    if expected is not None and len(msg.signature) != expected:
        raise EnvelopeError(f"{ALGORITHM_NAMES[algorithm]} signature is {len(msg.signature)} bytes, "
                            f"expected {expected}", "malformed")
    return algorithm, key_id


def decode_payload(payload: bytes) -> Command:
    fields = cose.loads_strict(payload, "envelope payload", max_depth=2)
    if not isinstance(fields, Mapping):
        raise EnvelopeError("envelope payload must be a map", "malformed")
    if set(fields) != set(range(K_TARGET, K_FAILSAFE + 1)) or not all(type(k) is int for k in fields):
        raise EnvelopeError(f"envelope payload must have exactly the keys 1..{K_FAILSAFE}", "malformed")
    cmd = Command(_text(fields[K_TARGET]), _floats(fields[K_VALUES]),
                  _int(fields, K_SEQUENCE, _U64), _int(fields, K_FRAME_SEQUENCE, _U64),
                  _int(fields, K_ISSUED, _I64), _int(fields, K_DEADLINE, _I64),
                  _model(fields[K_MODEL]), _bool(fields[K_FAILSAFE]))
    if encode_payload(cmd) != payload:
        raise EnvelopeError("envelope payload is not in its one canonical encoding", "malformed")
    return cmd


def _malformed(field: int, wanted: str) -> EnvelopeError:
    return EnvelopeError(f"envelope payload field {field} ({FIELD_NAMES[field]}) must be {wanted}", "malformed")


def _text(value) -> str:
    if type(value) is not str or len(value.encode()) > MAX_TARGET_BYTES:
        raise _malformed(K_TARGET, f"text of at most {MAX_TARGET_BYTES} bytes")
    return value


def _floats(value) -> tuple[float, ...]:
    if (not isinstance(value, (list, tuple)) or len(value) > MAX_VALUES
            or not all(type(v) is float and math.isfinite(v) for v in value)):
        raise _malformed(K_VALUES, f"an array of at most {MAX_VALUES} finite floats")
    return tuple(value)


def _int(fields: Mapping, key: int, bounds: tuple[int, int]) -> int:
    value = fields[key]
    if type(value) is not int or not bounds[0] <= value <= bounds[1]:
        raise _malformed(key, f"an integer in [{bounds[0]}, {bounds[1]}]")
    return value


def _model(value) -> bytes:
    if type(value) is not bytes or len(value) != 32:
        raise _malformed(K_MODEL, "a 32-byte string")
    return value


def _bool(value) -> bool:
    if type(value) is not bool:
        raise _malformed(K_FAILSAFE, "a boolean")
    return value


# PLC-side freshness, on by default. A sitsd command is valid from `issued_ns` to `deadline_ns` (at most 10
# control cycles later: config check), and the deadline is when it must leave sitsd, so the PLC side allows
# transport and scheduling on top. The defaults are those of `sitsctl plcsim` (--max-age-ms 1000,
# --deadline-grace-ms 200): a command held back past its deadline plus 200 ms, issued more than 1 s ago,
# issued more than 1 s in this clock's future, or valid for more than 1 s is refused as "stale". That is
# 100 to 1000 cycles of a 100 Hz to 1 kHz loop: far beyond any delay the loop itself produces, so no false
# refusal on a loaded host, yet a command an attacker or a stuck network held back cannot act minutes later.
# The clocks of signer and verifier must agree to well under that (one host, or PTP/NTP).
DEFAULT_MAX_AGE_NS = 1_000_000_000
DEFAULT_DEADLINE_GRACE_NS = 200_000_000
DEFAULT_MAX_FUTURE_NS = DEFAULT_MAX_AGE_NS
DEFAULT_MAX_VALIDITY_NS = DEFAULT_MAX_AGE_NS


class EnvelopeVerifier:
    """Checks envelopes from one signer: key, signature, model hash, strictly rising sequence numbers
    and freshness against `clock` (default: the wall clock, `time.time_ns`).

    Freshness is on by default (see DEFAULT_MAX_AGE_NS): a command past its deadline plus
    `deadline_grace_ns`, older than `max_age_ns`, more than `max_future_ns` ahead of the clock or valid for
    longer than `max_validity_ns` is refused with code "stale". Each bound but the deadline can be dropped
    by passing None for it. `freshness=False` turns every time check off, for offline verification of old
    records (audit, fuzzing, benchmarks): never use it on a live command path.

    Used by the PLC simulator and usable on a PLC gateway. Not thread-safe (holds replay state).
    """

    def __init__(self, public_key_pem: bytes, expected_model_sha256: bytes | None = None, *,
                 also_accepted_models: Iterable[bytes] = (), freshness: bool = True, max_age_ns: int | None = DEFAULT_MAX_AGE_NS,
                 clock: Callable[[], int] | None = None, deadline_grace_ns: int = DEFAULT_DEADLINE_GRACE_NS,
                 max_future_ns: int | None = DEFAULT_MAX_FUTURE_NS,
                 max_validity_ns: int | None = DEFAULT_MAX_VALIDITY_NS) -> None:
        if not freshness and clock is not None:
            raise ValueError("freshness=False checks no time: a clock makes no sense with it")
        for name, value in (("max_age_ns", max_age_ns), ("deadline_grace_ns", deadline_grace_ns),
                            ("max_future_ns", max_future_ns), ("max_validity_ns", max_validity_ns)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        self.public_key = serialization.load_pem_public_key(public_key_pem)
        self.algorithm = cose.algorithm_for_key(self.public_key)
        self.key_id = key_id_of(self.public_key)
        self.expected_model_sha256 = expected_model_sha256
        # more models whose commands are accepted besides the expected one (a PLC told about a model update
        # before the edge swaps to it); none without an expected model, which would accept any
        also = tuple(bytes(m) for m in also_accepted_models)
        if also and expected_model_sha256 is None:
            raise ValueError("also_accepted_models needs expected_model_sha256 (without one every model is accepted)")
        if any(len(m) != 32 for m in also):
            raise ValueError("also_accepted_models must be SHA-256 digests (32 bytes each)")
        self.also_accepted_models = frozenset(also)
        self.freshness = bool(freshness)
        # None: no time checks at all (offline verification); only a verifier whose clock tracks the signer's
        # can judge freshness
        self.clock = (clock or time.time_ns) if self.freshness else None
        self.max_age_ns = max_age_ns
        # transport and scheduling between the signer's deadline check and this one; clocks that differ by
        # more than `max_future_ns` (a command issued in the verifier's future) are refused
        self.deadline_grace_ns = deadline_grace_ns
        self.max_future_ns = max_future_ns
        self.max_validity_ns = max_validity_ns  # deadline - issued: a signer cannot hand out long-lived commands
        self.last_sequence = -1

    def verify(self, data: bytes) -> Envelope:
        env, signed = decode(data)
        self._check_key(env)
        try:
            cose.verify_signature(env.algorithm, self.public_key, signed, env.signature)
        except EnvelopeError as exc:
            raise EnvelopeError(f"bad signature on command {env.command.sequence}", exc.code) from None
        cmd = env.command
        if (self.expected_model_sha256 is not None and cmd.model_sha256 != self.expected_model_sha256
                and bytes(cmd.model_sha256) not in self.also_accepted_models):
            others = len(self.also_accepted_models)
            raise EnvelopeError(
                f"command {cmd.sequence} comes from model {cmd.model_sha256.hex()[:16]}…, "
                f"expected {self.expected_model_sha256.hex()[:16]}…"
                + (f" or one of {others} more accepted" if others else ""), "model")
        if cmd.sequence <= self.last_sequence:
            raise EnvelopeError(
                f"sequence {cmd.sequence} is not above the last accepted {self.last_sequence} (replay)", "replay")
        self._check_fresh(cmd)
        self.last_sequence = cmd.sequence
        return env

    def _check_key(self, env: Envelope) -> None:
        if env.algorithm != self.algorithm:
            name = ALGORITHM_NAMES.get(env.algorithm, f"unknown ({env.algorithm})")
            raise EnvelopeError(f"signature algorithm {name}, trusted key is {ALGORITHM_NAMES[self.algorithm]}", "key")
        if env.key_id != self.key_id:
            raise EnvelopeError(f"signed by key {env.key_id.hex()}, trusted key is {self.key_id.hex()}", "key")

    def _check_fresh(self, cmd: Command) -> None:
        if self.clock is None:
            return
        now = self.clock()
        if self.max_future_ns is not None and cmd.issued_ns - now > self.max_future_ns:
            raise EnvelopeError(f"command {cmd.sequence} was issued {(cmd.issued_ns - now) / 1e6:.3f} ms in the future "
                                f"(more than {self.max_future_ns / 1e6:g} ms): the signer's clock is ahead of this "
                                "one (check PTP/NTP on both)", "stale")
        if self.max_validity_ns is not None and cmd.deadline_ns - cmd.issued_ns > self.max_validity_ns:
            raise EnvelopeError(f"command {cmd.sequence} is valid for {(cmd.deadline_ns - cmd.issued_ns) / 1e6:.3f} ms "
                                f"after it was issued, more than the {self.max_validity_ns / 1e6:g} ms allowed",
                                "stale")
        if now > cmd.deadline_ns + self.deadline_grace_ns:
            raise EnvelopeError(
                f"command {cmd.sequence} expired {(now - cmd.deadline_ns) / 1e6:.3f} ms ago (deadline passed, "
                f"{self.deadline_grace_ns / 1e6:g} ms grace)", "stale")
        if self.max_age_ns is not None and now - cmd.issued_ns > self.max_age_ns:
            raise EnvelopeError(f"command {cmd.sequence} was issued {(now - cmd.issued_ns) / 1e6:.3f} ms ago, "
                                f"more than the {self.max_age_ns / 1e6:g} ms allowed (held back or replayed "
                                "late)", "stale")
