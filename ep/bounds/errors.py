"""Errors raised by `ep.bounds`: models it cannot analyse, and certificates that do not check out."""
from ..errors import EpError


class BoundsError(EpError):
    """The model, the input box or an analysis result is not usable (the message says which and why)."""


class CertificateError(BoundsError):
    """A bounds certificate does not hold for this model file (hash, box or bounds differ)."""
