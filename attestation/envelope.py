"""Command envelopes: a signed, self-describing record of one PLC command.

Binary layout, little endian (version 1):
    magic "SITS" | version u8 | flags u8 (bit 0: fail-safe) | sequence u64 | frame sequence u64
    | issued ns i64 | deadline ns i64 | model SHA-256 32 B | target length u8 | target UTF-8
    | value count u16 | values f64[] | algorithm u8 | key id 8 B | signature length u16 | signature
The signature covers every byte before the signature length. Key id: first 8 bytes of the
SHA-256 of the signer's SubjectPublicKeyInfo DER.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from .errors import EnvelopeError

MAGIC = b"SITS"
VERSION = 1
FLAG_FAILSAFE = 0x01
ALG_ED25519 = 1
ALG_ECDSA_P256_SHA256 = 2
ALGORITHM_NAMES = {ALG_ED25519: "ed25519", ALG_ECDSA_P256_SHA256: "ecdsa-p256-sha256"}

_HEAD = struct.Struct("<4sBBQQqq32sB")
_COUNT = struct.Struct("<H")
_TRAILER = struct.Struct("<B8sH")


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


def key_id_of(public_key) -> bytes:
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).digest()[:8]


def encode_unsigned(cmd: Command, algorithm: int, key_id: bytes) -> bytes:
    """The bytes a signer signs."""
    target = cmd.target.encode()
    if len(target) > 255:
        raise ValueError(f"command target {cmd.target!r} is longer than 255 bytes")
    if len(cmd.model_sha256) != 32:
        raise ValueError("model_sha256 must be 32 bytes")
    n = len(cmd.values)
    return b"".join((
        _HEAD.pack(MAGIC, VERSION, FLAG_FAILSAFE if cmd.failsafe else 0, cmd.sequence, cmd.frame_sequence,
                   cmd.issued_ns, cmd.deadline_ns, cmd.model_sha256, len(target)),
        target, _COUNT.pack(n), struct.pack(f"<{n}d", *cmd.values),
        bytes((algorithm,)), key_id,
    ))


def attach_signature(unsigned: bytes, signature: bytes) -> bytes:
    return unsigned + struct.pack("<H", len(signature)) + signature


def decode(data: bytes) -> tuple[Envelope, bytes]:
    """Parse an envelope; returns it with the signed bytes. Raises EnvelopeError('malformed')."""
    try:
        magic, version, flags, seq, frame_seq, issued, deadline, model, tlen = _HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise EnvelopeError(f"not a command envelope (magic {magic!r}, expected {MAGIC!r})", "malformed")
        if version != VERSION:
            raise EnvelopeError(f"envelope version {version} is not supported (expected {VERSION})", "malformed")
        off = _HEAD.size
        target = bytes(data[off:off + tlen]).decode()
        off += tlen
        (n,) = _COUNT.unpack_from(data, off)
        off += _COUNT.size
        values = struct.unpack_from(f"<{n}d", data, off)
        off += 8 * n
        algorithm, key_id, sig_len = _TRAILER.unpack_from(data, off)
        signed_end = off + 9
        off += _TRAILER.size
        signature = bytes(data[off:off + sig_len])
        if len(signature) != sig_len or off + sig_len != len(data):
            raise EnvelopeError(
                f"envelope is {len(data)} bytes, its header announces {off + sig_len}", "malformed")
    except (struct.error, UnicodeDecodeError) as exc:
        raise EnvelopeError(f"truncated or corrupt envelope ({len(data)} bytes): {exc}", "malformed") from exc
    cmd = Command(target, values, seq, frame_seq, issued, deadline, model, bool(flags & FLAG_FAILSAFE))
    return Envelope(cmd, algorithm, key_id, signature), bytes(data[:signed_end])


class EnvelopeVerifier:
    """Checks envelopes from one signer: signature, key id, model hash and strictly rising sequence numbers.

    Used by the PLC simulator and usable on a PLC gateway. Not thread-safe (holds replay state).
    """

    def __init__(self, public_key_pem: bytes, expected_model_sha256: bytes | None = None) -> None:
        self.public_key = serialization.load_pem_public_key(public_key_pem)
        if isinstance(self.public_key, ed25519.Ed25519PublicKey):
            self.algorithm = ALG_ED25519
        elif isinstance(self.public_key, ec.EllipticCurvePublicKey) and self.public_key.curve.name == "secp256r1":
            self.algorithm = ALG_ECDSA_P256_SHA256
        else:
            raise ValueError("trusted key must be Ed25519 or ECDSA P-256")
        self.key_id = key_id_of(self.public_key)
        self.expected_model_sha256 = expected_model_sha256
        self.last_sequence = -1

    def verify(self, data: bytes) -> Envelope:
        env, signed = decode(data)
        if env.algorithm != self.algorithm:
            name = ALGORITHM_NAMES.get(env.algorithm, f"unknown ({env.algorithm})")
            raise EnvelopeError(f"signature algorithm {name}, trusted key is {ALGORITHM_NAMES[self.algorithm]}", "key")
        if env.key_id != self.key_id:
            raise EnvelopeError(f"signed by key {env.key_id.hex()}, trusted key is {self.key_id.hex()}", "key")
        try:
            if self.algorithm == ALG_ED25519:
                self.public_key.verify(env.signature, signed)
            else:
                self.public_key.verify(env.signature, signed, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise EnvelopeError(f"bad signature on command {env.command.sequence}", "signature") from None
        if self.expected_model_sha256 is not None and env.command.model_sha256 != self.expected_model_sha256:
            raise EnvelopeError(
                f"command {env.command.sequence} comes from model {env.command.model_sha256.hex()[:16]}…, "
                f"expected {self.expected_model_sha256.hex()[:16]}…", "model")
        if env.command.sequence <= self.last_sequence:
            raise EnvelopeError(
                f"sequence {env.command.sequence} is not above the last accepted {self.last_sequence} (replay)",
                "replay")
        self.last_sequence = env.command.sequence
        return env
