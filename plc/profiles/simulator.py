"""The project's own PLC simulator: `RollingMill.<name>` in the simulator namespace, addresses passed through.

The simulator is not a vendor controller, so there is no vendor data: any non-empty signal name
is valid and maps to `nsu=urn:sits2026:plc-simulator;s=RollingMill.<name>`.
"""
from __future__ import annotations

from .base import SIMULATOR_PREFIX, Address, ProfileBase, format_node_id, split_node_id
from .events import PlcEvent, unknown_event

# Same value as plc.simulator.server.NAMESPACE_URI; not imported, because that module pulls in the
# whole asyncua server stack and a profile must stay importable without it (a test pins the two).
NAMESPACE_URI = "urn:sits2026:plc-simulator"
NODE_PREFIX = SIMULATOR_PREFIX
_EXAMPLE = "roll_gap"


class SimulatorProfile(ProfileBase):
    """Passthrough profile for the rolling-mill simulator; it reports no status or diagnostics of its own."""

    name = "simulator"
    vendor = "sits2026"
    prefix = "SIM"
    example = _EXAMPLE

    def _address(self, signal: str, text: str, base: int) -> Address:
        for i, c in enumerate(signal):
            # ';' would end the NodeId part in some clients' parsers; whitespace and control
            # characters are never part of a simulator variable name.
            if c == ";" or not c.isprintable() or c.isspace():
                raise self._fail(text)(f"character {c!r} is not allowed in a simulator signal name", base + i)
        if not signal:
            raise self._fail(text)("empty signal name", base)
        return Address(self.name, "tag", signal, format_node_id(None, NAMESPACE_URI, NODE_PREFIX + signal))

    def parse(self, address: str) -> Address:
        signal = address[len(NODE_PREFIX):] if address.startswith(NODE_PREFIX) else address
        return self._address(signal, address, len(address) - len(signal))

    def parse_node_id(self, node_id: str) -> Address:
        fail = self._fail(node_id)
        _, uri, identifier, offset = split_node_id(node_id, fail)
        if uri != NAMESPACE_URI:
            raise fail(f"simulator NodeIds use 'nsu={NAMESPACE_URI};'", 0)
        if not identifier.startswith(NODE_PREFIX):
            raise fail(f"simulator variables live under {NODE_PREFIX!r}", offset)
        return self._address(identifier[len(NODE_PREFIX):], node_id, offset + len(NODE_PREFIX))

    def simulator_tags(self) -> dict[str, str]:
        return {}  # the simulator's own names: node_id_for passes them through `parse`

    def decode_status(self, word: int, timestamp_ns: int = 0) -> tuple[PlcEvent, ...]:
        return (unknown_event(self.prefix, self.vendor, word if isinstance(word, (int, str)) else repr(word),
                              "the simulator defines no status word", timestamp_ns),)

    def parse_diagnostic(self, text: str, timestamp_ns: int = 0) -> PlcEvent:
        raw = text if isinstance(text, str) else repr(text)
        return unknown_event(self.prefix, self.vendor, raw, raw, timestamp_ns)

    def example_status(self) -> tuple[int, ...]:
        return ()

    def example_diagnostics(self) -> tuple[str, ...]:
        return ()
