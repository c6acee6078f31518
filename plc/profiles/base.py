"""The shared shape of a vendor profile: the typed Address, the PlcProfile interface, data loading.

Vendor knowledge lives in the JSON files next to this module; the profile modules are parsers
over that data. Everything here is vendor-neutral.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal, Protocol, runtime_checkable

from .errors import ProfileError
from .events import PlcEvent

AddressKind = Literal["bit", "word", "tag"]
# The rolling-mill simulator's variables are RollingMill.<name> in its own namespace (plc.simulator.server);
# a vendor profile's `simulator_tags` says where that controller holds each <name> instead.
SIMULATOR_PREFIX = "RollingMill."
ADDRESS_KINDS: tuple[str, ...] = ("bit", "word", "tag")


@dataclass(frozen=True)
class Address:
    """One parsed PLC address: `text` is the normalized spelling, `node_id` the OPC UA NodeId string."""

    profile: str
    kind: AddressKind
    text: str
    node_id: str


@runtime_checkable
class PlcProfile(Protocol):
    """What every vendor profile offers; see the profile modules for the vendor-specific syntax."""

    name: str
    vendor: str

    def parse(self, address: str) -> Address:
        """Vendor address text -> Address; raises ProfileError (with offset and example)."""

    def format(self, address: Address) -> str:
        """Address -> normalized vendor text; parse(format(a)) == a."""

    def parse_node_id(self, node_id: str) -> Address:
        """OPC UA NodeId string -> Address; raises ProfileError."""

    def node_id_for(self, signal_name: str) -> str:
        """NodeId string under which this vendor's server exposes `signal_name`: a simulator variable name
        (`exit_thickness`, `RollGapCommand`, with or without `RollingMill.`) through `simulator_tags`, any
        other text as a vendor address."""

    def simulator_tags(self) -> dict[str, str]:
        """Simulator variable name -> this vendor's address text (empty: the simulator's own names)."""

    def decode_status(self, word: int, timestamp_ns: int = 0) -> tuple[PlcEvent, ...]:
        """Controller status/mode word -> events; unknown values become UNKNOWN events."""

    def parse_diagnostic(self, text: str, timestamp_ns: int = 0) -> PlcEvent:
        """One diagnostic message -> one event; never raises, unknown text -> UNKNOWN event."""

    def example_status(self) -> tuple[int, ...]:
        """A few realistic raw status words (from the data), for a simulator to publish."""

    def example_diagnostics(self) -> tuple[str, ...]:
        """A few realistic raw diagnostic texts (from the data), for a simulator to publish."""


_URL = re.compile(r"^https?://\S+$")


@lru_cache(maxsize=None)
def _read(filename: str) -> str:
    return resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")


def load_data(filename: str) -> dict[str, Any]:
    """Parse one of the package's JSON data files; each call returns a fresh dict (callers may keep it).

    A data file without a non-empty `sources` list of URLs is rejected: the tables are only as
    good as their provenance, so a file that cannot say where its facts come from is a bug.
    """
    data = json.loads(_read(filename))
    sources = data.get("sources")
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and _URL.match(s) for s in sources):
        raise ValueError(f"{filename}: 'sources' must be a non-empty list of http(s) URLs")
    return data


class Cursor:
    """A position in an address being parsed; every failure is reported at the current offset."""

    def __init__(self, text: str, fail: Callable[[str, int], ProfileError], start: int = 0) -> None:
        self.text = text
        self.pos = start
        self._fail = fail

    @property
    def eof(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def error(self, reason: str, offset: int | None = None) -> ProfileError:
        return self._fail(reason, self.pos if offset is None else offset)

    def take_while(self, accept: Callable[[str], bool]) -> str:
        start = self.pos
        while self.pos < len(self.text) and accept(self.text[self.pos]):
            self.pos += 1
        return self.text[start:self.pos]

    def expect(self, char: str, what: str) -> None:
        if self.peek() != char:
            found = repr(self.peek()) if not self.eof else "end of text"
            raise self.error(f"expected {what}, found {found}")
        self.pos += 1

    def skip_spaces(self) -> None:
        self.take_while(lambda c: c == " ")


def split_node_id(node_id: str, fail: Callable[[str, int], ProfileError]) -> tuple[int | None, str | None, str, int]:
    """`ns=<i>;s=<id>` or `nsu=<uri>;s=<id>` -> (index, uri, identifier, offset of identifier).

    Only string identifiers are accepted: every profile here maps addresses to `s=` NodeIds.
    """
    match = re.match(r"ns=(\d+);", node_id) or re.match(r"nsu=([^;]+);", node_id)
    if match is None:
        raise fail("a NodeId starts with 'ns=<index>;' or 'nsu=<namespace uri>;'", 0)
    rest = match.end()
    if not node_id.startswith("s=", rest):
        raise fail("only string identifiers ('s=') are used by this profile", rest)
    if node_id.startswith("ns="):
        return int(match.group(1)), None, node_id[rest + 2:], rest + 2
    return None, match.group(1), node_id[rest + 2:], rest + 2


def format_node_id(namespace_index: int | None, namespace_uri: str | None, identifier: str) -> str:
    """The inverse of split_node_id; the URI form wins when both are given (it survives index changes)."""
    if namespace_uri:
        return f"nsu={namespace_uri};s={identifier}"
    return f"ns={namespace_index};s={identifier}"


class ProfileBase:
    """What the profiles share: failure messages, format, node_id_for, and the data-driven diagnostics.

    A subclass sets `name`, `vendor`, `prefix`, `example` (a valid address shown in errors) and
    implements `parse` and `parse_node_id`; data-driven profiles set `self.data` and `self.rules`.
    """

    name: str
    vendor: str
    prefix: str
    example: str

    def _fail(self, text: str) -> Callable[[str, int], ProfileError]:
        return lambda reason, offset: ProfileError(reason, profile=self.name, address=text, offset=offset,
                                                   example=self.example)

    def format(self, address: Address | str) -> str:
        if isinstance(address, str):
            return self.parse(address).text
        if address.profile != self.name:
            raise ProfileError(f"address belongs to profile {address.profile!r}", profile=self.name,
                               example=self.example)
        return address.text

    def node_id_for(self, signal_name: str) -> str:
        """A simulator variable name goes through the data file's `simulator_tags` (the tag layout a plant
        set up on this controller), anything else is parsed as this vendor's address. The mapping wins for
        its few names (a tag literally called `Status` is still reachable as a NodeId or via `parse`)."""
        name = signal_name[len(SIMULATOR_PREFIX):] if signal_name.startswith(SIMULATOR_PREFIX) else signal_name
        address = self.simulator_tags().get(name)
        return self.parse(address if address is not None else signal_name).node_id

    def simulator_tags(self) -> dict[str, str]:
        return {k: v for k, v in self.data.get("simulator_tags", {}).items() if not k.startswith("_")}

    def _prefixed_node_id(self, node_id: str, namespace_index: int, node_prefix: str, what: str) -> Cursor:
        """For `ns=<index>;s=<prefix><address>` NodeIds: check namespace and prefix, return a cursor at the
        address. `what` names the server side in errors ("gateway", "module")."""
        fail = self._fail(node_id)
        index, uri, identifier, offset = split_node_id(node_id, fail)
        if uri is not None:
            raise fail("this profile uses 'ns=<index>;' NodeIds", 0)
        if index != namespace_index:
            raise fail(f"namespace index {index} is not the {what} namespace index {namespace_index}", 3)
        if not identifier.startswith(node_prefix):
            raise fail(f"expected the {what} prefix {node_prefix!r}", offset)
        return Cursor(node_id, fail, offset + len(node_prefix))

    def parse_diagnostic(self, text: str, timestamp_ns: int = 0) -> PlcEvent:
        return self.rules.match(text, timestamp_ns)

    def example_status(self) -> tuple[int, ...]:
        return tuple(int(v, 16) for v in self.data["status_examples"])

    def example_diagnostics(self) -> tuple[str, ...]:
        return tuple(self.data["diagnostic_examples"])
