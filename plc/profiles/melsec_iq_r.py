"""Mitsubishi MELSEC iQ-R through its OPC UA server module: device memory addresses, SM0/SM1 flags, SD0 codes.

`D100`, `X1F`, `ZR1000`, `D100.F` (bit F of D100) <-> `ns=2;s=<prefix>D100`; which devices exist, bit or word,
decimal or hexadecimal numbering, is data (melsec_iq_r.json, from the SLMP device code list).
"""
from __future__ import annotations

from .base import Address, Cursor, ProfileBase, format_node_id, load_data
from .events import DiagnosticRules, PlcEvent, StatusBits

DATA_FILE = "melsec_iq_r.json"
_HEX = "0123456789ABCDEF"
_EXAMPLE = "D100 (decimal word), X1F (hexadecimal bit), D100.F (bit F of D100)"


class MelsecProfile(ProfileBase):
    """MELSEC iQ-R device addresses; `prefix` is whatever the OPC UA module puts before the device text."""

    name = "melsec-iq-r"
    vendor = "Mitsubishi Electric"
    prefix = "MELSEC"
    example = _EXAMPLE

    def __init__(self, namespace_index: int | None = None, prefix: str | None = None) -> None:
        self.data = load_data(DATA_FILE)
        self.devices: dict[str, dict] = self.data["devices"]
        # Longest symbol first: 'LSTN' before 'LST..', 'SD' before 'S', 'DX' before 'D'.
        self.symbols = sorted(self.devices, key=len, reverse=True)
        bits = self.data["bit_of_word"]
        self.bit_sep: str = bits["separator"]
        self.bit_max = int(bits["max"])
        self.bit_types = tuple(bits["device_types"])
        self.max_number = int(self.data["max_device_number"])
        opcua = self.data["opcua"]
        self.namespace_index = opcua["default_namespace_index"] if namespace_index is None else namespace_index
        self.node_prefix = opcua["default_prefix"] if prefix is None else prefix
        self.status = StatusBits(self.vendor, self.prefix, self.data["status_word"])
        self.rules = DiagnosticRules(self.vendor, self.prefix, self.data["diagnostic_rules"],
                                     {"sd0_codes": self.data["sd0_codes"]})

    def device(self, symbol: str) -> dict:
        """The data-table entry for a device symbol (name, type, radix, source)."""
        return self.devices[symbol.upper()]

    # -- addresses -----------------------------------------------------------------------------

    def _symbol(self, cur: Cursor) -> str:
        rest = cur.text[cur.pos:].upper()
        letters = len(rest) - len(rest.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
        if letters == 0:
            raise cur.error("a device address starts with a device symbol such as D, M, X or ZR")
        # A hex-numbered device can swallow letters ('BF' is B + F), so take the longest symbol
        # after which a valid number follows; fall back to the longest symbol for the error.
        candidates = [s for s in self.symbols if rest.startswith(s)]
        for sym in candidates:
            tail = rest[len(sym):].split(self.bit_sep, 1)[0]
            digits = _HEX if self.devices[sym]["radix"] == 16 else _HEX[:10]
            if tail and all(c in digits for c in tail):
                return sym
        if not candidates:
            known = ", ".join(sorted(self.devices))
            raise cur.error(f"unknown device {rest[:letters]!r}; MELSEC iQ-R devices: {known}")
        return candidates[0]

    def _parse(self, cur: Cursor) -> tuple[str, int, int | None]:
        if cur.eof:
            raise cur.error("empty device address")
        sym = self._symbol(cur)
        cur.pos += len(sym)
        dev = self.devices[sym]
        radix = int(dev["radix"])
        allowed = _HEX if radix == 16 else _HEX[:10]
        start = cur.pos
        digits = cur.take_while(lambda c: c.upper() in allowed)
        if not digits:
            kind = "hexadecimal" if radix == 16 else "decimal"
            raise cur.error(f"{sym} ({dev['name']}) needs a {kind} device number")
        if not cur.eof and cur.peek() != self.bit_sep:
            kind = "hexadecimal" if radix == 16 else "decimal"
            raise cur.error(f"{sym} ({dev['name']}) is numbered in {kind}; {cur.peek()!r} is not a {kind} digit")
        number = int(digits, radix)
        if number > self.max_number:
            raise cur.error(f"device number exceeds {self.max_number}", start)
        bit = None
        if not cur.eof:
            sep_at = cur.pos
            cur.pos += 1
            if dev["type"] not in self.bit_types:
                raise cur.error(f"{sym} ({dev['name']}) is a {dev['type'].replace('_', ' ')} device; "
                                f"'{self.bit_sep}<bit>' applies to word devices only", sep_at)
            spec = cur.take_while(lambda c: True)
            if len(spec) != 1 or spec.upper() not in _HEX[:self.bit_max + 1]:
                raise cur.error(f"the bit of a word device is one hexadecimal digit 0-{_HEX[self.bit_max]}",
                                sep_at + 1)
            bit = int(spec, 16)
        return sym, number, bit

    def _address(self, sym: str, number: int, bit: int | None) -> Address:
        dev = self.devices[sym]
        text = sym + (format(number, "X") if int(dev["radix"]) == 16 else str(number))
        if bit is not None:
            text += f"{self.bit_sep}{bit:X}"
        kind = "bit" if dev["type"] == "bit" or bit is not None else "word"
        return Address(self.name, kind, text, format_node_id(self.namespace_index, None, self.node_prefix + text))

    def parse(self, address: str) -> Address:
        return self._address(*self._parse(Cursor(address, self._fail(address))))

    def parse_node_id(self, node_id: str) -> Address:
        return self._address(*self._parse(self._prefixed_node_id(node_id, self.namespace_index, self.node_prefix,
                                                                  "module")))

    # -- events --------------------------------------------------------------------------------

    def decode_status(self, word: int, timestamp_ns: int = 0) -> tuple[PlcEvent, ...]:
        """SM0..SM15 read as one word -> SM0/SM1 events."""
        return self.status.decode(word, timestamp_ns)

