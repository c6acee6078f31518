"""Siemens S7-1500 through its built-in OPC UA server: symbolic tag addresses, mode byte, diagnostics buffer.

`DB_Line.Values[3]` / `"DB Line"."Stand 3".Gap` <-> `ns=3;s="DB_Line"."Values"[3]`: the server quotes
every name in a string NodeId, so a name may hold spaces and dots but never a double quote.
"""
from __future__ import annotations

import re

from .base import Address, Cursor, ProfileBase, format_node_id, load_data, split_node_id
from .events import DiagnosticRules, PlcEvent, event_from_entry, unknown_event

DATA_FILE = "s7_1500.json"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EXAMPLE = '"DB Line"."Stand 3".Gap'

Part = tuple[str, tuple[int, ...]]


def _is_ident_start(c: str) -> bool:
    return c.isascii() and (c.isalpha() or c == "_")


def _is_ident_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


class S7Profile(ProfileBase):
    """S7-1500 OPC UA profile; `namespace_index` is where the Siemens namespace sits (3 unless changed)."""

    name = "s7-1500"
    vendor = "Siemens"
    prefix = "S7"
    example = _EXAMPLE

    def __init__(self, namespace_index: int | None = None, use_namespace_uri: bool = False) -> None:
        self.data = load_data(DATA_FILE)
        opcua = self.data["opcua"]
        self.namespace_uri: str = opcua["namespace_uri"]
        self.namespace_index = opcua["default_namespace_index"] if namespace_index is None else namespace_index
        # The manual warns the index can move when namespaces are added; the nsu= form survives that.
        self.use_namespace_uri = use_namespace_uri
        self.modes = {int(k, 16): v for k, v in self.data["operating_modes"].items() if not k.startswith("_")}
        self.rules = DiagnosticRules(self.vendor, self.prefix, self.data["diagnostic_rules"])

    # -- addresses -----------------------------------------------------------------------------

    def _parse_parts(self, cur: Cursor) -> list[Part]:
        if cur.eof:
            raise cur.error("empty address")
        parts: list[Part] = []
        while True:
            parts.append((self._name(cur), self._indices(cur)))
            if cur.eof:
                return parts
            cur.expect(".", "'.' between names or the end of the address")
            if cur.eof:
                raise cur.error("a name must follow '.'")

    def _name(self, cur: Cursor) -> str:
        start = cur.pos
        if cur.peek() == '"':
            cur.pos += 1
            name = cur.take_while(lambda c: c != '"')
            if cur.eof:
                raise cur.error("unterminated quoted name (missing closing '\"')", start)
            if not name:
                raise cur.error("empty quoted name", start)
            cur.pos += 1
            return name
        if not _is_ident_start(cur.peek()):
            raise cur.error("a name starts with a letter or '_', or is written in double quotes")
        return cur.take_while(_is_ident_char)

    def _indices(self, cur: Cursor) -> tuple[int, ...]:
        if cur.peek() != "[":
            return ()
        cur.pos += 1
        out: list[int] = []
        while True:
            cur.skip_spaces()
            start = cur.pos
            sign = "-" if cur.peek() == "-" else ""
            cur.pos += len(sign)
            digits = cur.take_while(lambda c: c.isascii() and c.isdigit())
            if not digits:
                raise cur.error("an array index is an integer, e.g. [3] or [1,2]", start)
            out.append(int(sign + digits))
            cur.skip_spaces()
            if cur.peek() == "]":
                cur.pos += 1
                return tuple(out)
            cur.expect(",", "',' or ']' in an array index")

    @staticmethod
    def _text(parts: list[Part]) -> str:
        def one(name: str, idx: tuple[int, ...]) -> str:
            shown = name if _IDENT.match(name) else f'"{name}"'
            return shown + (f"[{','.join(map(str, idx))}]" if idx else "")
        return ".".join(one(n, i) for n, i in parts)

    @staticmethod
    def _identifier(parts: list[Part]) -> str:
        return ".".join(f'"{n}"' + (f"[{','.join(map(str, i))}]" if i else "") for n, i in parts)

    def _address(self, parts: list[Part]) -> Address:
        node = format_node_id(self.namespace_index, self.namespace_uri if self.use_namespace_uri else None,
                              self._identifier(parts))
        return Address(self.name, "tag", self._text(parts), node)

    def parse(self, address: str) -> Address:
        return self._address(self._parse_parts(Cursor(address, self._fail(address))))

    def parse_node_id(self, node_id: str) -> Address:
        fail = self._fail(node_id)
        index, uri, identifier, offset = split_node_id(node_id, fail)
        if uri is not None and uri != self.namespace_uri:
            raise fail(f"namespace {uri!r} is not the S7 namespace {self.namespace_uri!r}", 4)
        if index is not None and index != self.namespace_index:
            raise fail(f"namespace index {index} is not the S7 namespace index {self.namespace_index}", 3)
        return self._address(self._parse_parts(Cursor(node_id, fail, offset)))

    # -- events --------------------------------------------------------------------------------

    def decode_status(self, word: int, timestamp_ns: int = 0) -> tuple[PlcEvent, ...]:
        """The SZL xy24 mode byte -> one mode-transition event (requested mode decides severity)."""
        if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word <= 0xFF:
            return (unknown_event(self.prefix, self.vendor, word if isinstance(word, (int, str)) else repr(word),
                                  f"mode value {word!r} is not a mode byte", timestamp_ns),)
        requested, previous = self.modes.get(word & 0x0F), self.modes.get(word >> 4)
        if requested is None or previous is None:
            return (unknown_event(self.prefix, self.vendor, word, f"unlisted mode ID in mode byte {word:#04x}",
                                  timestamp_ns),)
        entry = {"code": f"S7.MODE.{requested['key']}", "severity": requested["severity"], "component": "cpu",
                 "text": f"Mode transition from {previous['name']} to {requested['name']}"}
        return (event_from_entry(entry, self.vendor, word, timestamp_ns),)

