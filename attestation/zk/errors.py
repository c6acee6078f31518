"""The one error type of `attestation.zk`: malformed files, proofs, keys, witnesses and circuits."""
from __future__ import annotations

from ..errors import AttestationError


class ZkError(AttestationError):
    """Something zk-related is malformed or invalid; the message says what, where and how to fix it.

    `where` names the file, JSON field or circuit signal concerned (empty when not applicable).
    """

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
