"""Errors raised by the PLC side: codecs, transports, OPC UA sessions."""


class PlcError(Exception):
    """Base class for every error raised by `plc`."""


class UadpDecodeError(PlcError):
    """A UADP NetworkMessage could not be decoded; `offset` is the byte where it went wrong."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"UADP decode error at byte {offset}: {reason}")
        self.reason = reason
        self.offset = offset


class TransportError(PlcError):
    """A transport address is malformed or a socket could not be opened."""


class CommandWriteError(PlcError):
    """The PLC did not acknowledge a command write (bad status, lost session)."""
