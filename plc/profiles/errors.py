"""The one error every vendor profile raises: what is wrong, where in the input, and a valid example."""
from __future__ import annotations

from ..errors import PlcError


class ProfileError(PlcError):
    """An address, NodeId or profile name a profile cannot accept.

    `offset` is the 0-based character offset into `address` where parsing stopped (None when
    the problem is not positional, e.g. an unknown profile name); `example` is a valid input of
    the same kind, so the message alone is enough to fix a config file.
    """

    def __init__(self, reason: str, *, profile: str | None = None, address: str | None = None,
                 offset: int | None = None, example: str | None = None) -> None:
        self.reason = reason
        self.profile = profile
        self.address = address
        self.offset = offset
        self.example = example
        parts = [f"{profile}: {reason}" if profile else reason]
        if address is not None and offset is not None:
            parts.append(f" at offset {offset} in {address!r}")
        if example:
            parts.append(f"; example of a valid one: {example}")
        super().__init__("".join(parts))
