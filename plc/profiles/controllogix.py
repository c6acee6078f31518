"""Rockwell ControlLogix behind an OPC UA gateway: Logix tag paths, CIP status word, major/minor fault records.

`Program:MainProgram.Thickness`, `Tag.5`, `Arr[1,2]` <-> `ns=2;s=[PLC]Program:MainProgram.Thickness` (FactoryTalk
Linx `[Shortcut]Tag` items; the shortcut, or a prefix such as KEPServerEX's `Channel1.Device1.`, is configurable).
"""
from __future__ import annotations

from .base import Address, Cursor, ProfileBase, format_node_id, load_data
from .events import DiagnosticRules, PlcEvent, StatusBits

DATA_FILE = "controllogix.json"
_EXAMPLE = "Program:MainProgram.Line1_Gap[2].Value"

Member = tuple[str, tuple[int, ...]]


def _name_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


def _digit(c: str) -> bool:
    return c.isascii() and c.isdigit()


class LogixProfile(ProfileBase):
    """ControlLogix tags through an OPC UA gateway (FactoryTalk Linx Gateway, KEPServerEX, ...)."""

    name = "controllogix"
    vendor = "Rockwell Automation"
    prefix = "LOGIX"
    example = _EXAMPLE

    def __init__(self, namespace_index: int | None = None, shortcut: str | None = None,
                 prefix: str | None = None) -> None:
        self.data = load_data(DATA_FILE)
        rules = self.data["tag_rules"]
        self.max_name = int(rules["max_name_length"])
        self.max_dims = int(rules["max_array_dimensions"])
        self.max_bit = int(rules["max_bit"])
        self.program_prefix: str = rules["program_prefix"]
        opcua = self.data["opcua"]
        self.namespace_index = opcua["default_namespace_index"] if namespace_index is None else namespace_index
        self.node_prefix = prefix if prefix is not None else f"[{shortcut or opcua['default_shortcut']}]"
        self.status = StatusBits(self.vendor, self.prefix, self.data["status_word"])
        self.rules = DiagnosticRules(self.vendor, self.prefix, self.data["diagnostic_rules"],
                                     {"major_faults": self.data["major_faults"],
                                      "minor_faults": self.data["minor_faults"]})

    # -- addresses -----------------------------------------------------------------------------

    def _name(self, cur: Cursor, what: str) -> str:
        start = cur.pos
        c = cur.peek()
        if not (c.isascii() and (c.isalpha() or c == "_")):
            found = repr(c) if c else "end of text"
            raise cur.error(f"a {what} starts with a letter or '_', found {found}")
        name = cur.take_while(_name_char)
        # Logix name rules (1756-PM004): at most 40 characters, no consecutive or trailing '_'.
        if len(name) > self.max_name:
            raise cur.error(f"a {what} has at most {self.max_name} characters", start + self.max_name)
        doubled = name.find("__")
        if doubled >= 0:
            raise cur.error(f"a {what} has no consecutive underscores", start + doubled + 1)
        if name.endswith("_"):
            raise cur.error(f"a {what} does not end with an underscore", start + len(name) - 1)
        return name

    def _subscripts(self, cur: Cursor) -> tuple[int, ...]:
        if cur.peek() != "[":
            return ()
        open_at = cur.pos
        cur.pos += 1
        out: list[int] = []
        while True:
            cur.skip_spaces()
            digits = cur.take_while(_digit)
            if not digits:
                raise cur.error("an array subscript is a non-negative integer, e.g. [2] or [1,2]")
            out.append(int(digits))
            cur.skip_spaces()
            if cur.peek() == "]":
                cur.pos += 1
                break
            cur.expect(",", "',' or ']' in an array subscript")
        if len(out) > self.max_dims:
            raise cur.error(f"Logix arrays have at most {self.max_dims} dimensions", open_at)
        return tuple(out)

    def _parse(self, cur: Cursor) -> tuple[str | None, list[Member], int | None]:
        if cur.eof:
            raise cur.error("empty tag path")
        program = None
        head = cur.text[cur.pos:cur.pos + len(self.program_prefix)]
        if head.lower() == self.program_prefix.lower():
            cur.pos += len(self.program_prefix)
            program = self._name(cur, "program name")
            cur.expect(".", "'.' after the program name")
        members: list[Member] = []
        bit = None
        while True:
            if members and _digit(cur.peek()):
                start = cur.pos
                bit = int(cur.take_while(_digit))
                if bit > self.max_bit:
                    raise cur.error(f"a bit number is 0..{self.max_bit}", start)
                if not cur.eof:
                    raise cur.error("a bit number can only end the tag path")
                return program, members, bit
            members.append((self._name(cur, "tag or member name"), self._subscripts(cur)))
            if cur.eof:
                return program, members, bit
            if cur.peek() == ":":
                raise cur.error(f"':' only appears in the '{self.program_prefix}<name>.' prefix")
            cur.expect(".", "'.' between members or the end of the tag path")

    def _address(self, program: str | None, members: list[Member], bit: int | None) -> Address:
        path = ".".join(n + (f"[{','.join(map(str, s))}]" if s else "") for n, s in members)
        text = (f"{self.program_prefix}{program}." if program else "") + path + (f".{bit}" if bit is not None else "")
        node = format_node_id(self.namespace_index, None, self.node_prefix + text)
        return Address(self.name, "bit" if bit is not None else "tag", text, node)

    def parse(self, address: str) -> Address:
        return self._address(*self._parse(Cursor(address, self._fail(address))))

    def parse_node_id(self, node_id: str) -> Address:
        return self._address(*self._parse(self._prefixed_node_id(node_id, self.namespace_index, self.node_prefix,
                                                                  "gateway")))

    # -- events --------------------------------------------------------------------------------

    def decode_status(self, word: int, timestamp_ns: int = 0) -> tuple[PlcEvent, ...]:
        """CIP Identity Status word -> extended device status event plus one event per fault bit."""
        return self.status.decode(word, timestamp_ns)

