"""TPM 2.0 access through tpm2-pytss ESAPI, and swtpm for demos and tests."""
from .quote import AK_HANDLE, Quote, QuoteError, load_or_create_ak, quote, verify_quote
from .signer import DEFAULT_DEVICE_KEY_HANDLE, DEFAULT_KEY_HANDLE, TpmSigner, WrongKeyError
from .swtpm import Swtpm, swtpm_available
from .ek import read_ek_certificates
from .policy import Approval, PolicyError, approve, load_or_create_policy_key, policy_sign

__all__ = ["DEFAULT_DEVICE_KEY_HANDLE", "DEFAULT_KEY_HANDLE", "TpmSigner", "WrongKeyError", "Swtpm",
           "swtpm_available",
           "AK_HANDLE", "Quote", "QuoteError", "load_or_create_ak", "quote", "verify_quote", "read_ek_certificates",
           "Approval", "PolicyError", "approve", "load_or_create_policy_key", "policy_sign"]
