"""Signers turn a Command into envelope bytes (a COSE_Sign1). One Protocol, one class per key store."""
from __future__ import annotations

from typing import Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from . import fastsign
from .envelope import ALG_ED25519, Command, assemble, key_id_of, to_be_signed


class Signer(Protocol):
    kind: str  # "tpm" | "software"
    algorithm: int
    key_id: bytes

    def public_key_pem(self) -> bytes: ...

    def sign_command(self, cmd: Command) -> bytes: ...  # the COSE_Sign1 bytes

    def close(self) -> None: ...


class SoftwareSigner:
    """Ed25519 key held in process memory. For development and machines without a TPM only."""

    kind = "software"
    algorithm = ALG_ED25519

    def __init__(self, private_key: ed25519.Ed25519PrivateKey | None = None) -> None:
        self._key = private_key or ed25519.Ed25519PrivateKey.generate()
        self.key_id = key_id_of(self._key.public_key())
        # the loop's signature keeps the GIL where libcrypto is there (attestation.fastsign)
        self._held, why = fastsign.load(self._key)
        self._sign = self._held.sign if self._held is not None else self._key.sign
        self.sign_path = "libcrypto, GIL held" if self._held is not None else f"cryptography, GIL released ({why})"

    def public_key_pem(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def sign_command(self, cmd: Command) -> bytes:
        signed, parts = to_be_signed(cmd, self.algorithm, self.key_id)
        return assemble(parts, self._sign(signed))

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
