"""Attestation: command envelopes (COSE_Sign1) and their verification, software and TPM signers."""
from .envelope import Command, Envelope, EnvelopeVerifier, decode
from .errors import AttestationError, EnvelopeError, TpmError
from .signers import Signer, SoftwareSigner
from .session import CredentialError, SessionCredential, SessionVerifier, TpmSessionSigner

__all__ = ["Command", "Envelope", "EnvelopeVerifier", "decode", "AttestationError", "EnvelopeError",
           "TpmError", "Signer", "SoftwareSigner",
           "CredentialError", "SessionCredential", "SessionVerifier", "TpmSessionSigner"]
