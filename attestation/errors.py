"""Errors raised by `attestation`: envelopes, signers, the TPM."""


class AttestationError(Exception):
    """Base class for every error raised by `attestation`."""


class EnvelopeError(AttestationError):
    """A command envelope is malformed, badly signed, replayed or for the wrong model."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code  # short machine-readable kind: malformed, signature, key, model, replay


class TpmError(AttestationError):
    """The TPM could not be reached or refused an operation; the message names the TCTI and the call."""
