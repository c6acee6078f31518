"""Structured PLC events and the two data-driven decoders behind them: text rules and status-word bits.

Both decoders take their tables from a profile's JSON file; neither ever raises on input it does
not know, it returns a `<PREFIX>.UNKNOWN` warning that keeps the raw input instead.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["info", "warning", "error", "critical"]
SEVERITIES: tuple[str, ...] = ("info", "warning", "error", "critical")
ENTRY_KEYS: tuple[str, ...] = ("code", "severity", "component", "text", "source")


@dataclass(frozen=True)
class PlcEvent:
    """One thing the controller reported, in vendor-neutral form; `raw` is exactly what came in."""

    code: str
    severity: Severity
    component: str
    text: str
    timestamp_ns: int
    vendor: str
    raw: str | int

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")


def unknown_event(prefix: str, vendor: str, raw: str | int, text: str, timestamp_ns: int) -> PlcEvent:
    # 'warning', not 'error': we do not know that anything is wrong, only that we cannot tell.
    return PlcEvent(f"{prefix}.UNKNOWN", "warning", "unknown", text, timestamp_ns, vendor, raw)


def event_from_entry(entry: Mapping[str, Any], vendor: str, raw: str | int, timestamp_ns: int,
                     text: str | None = None) -> PlcEvent:
    return PlcEvent(entry["code"], entry["severity"], entry["component"], text if text is not None else entry["text"],
                    timestamp_ns, vendor, raw)


def check_entry(entry: Mapping[str, Any], where: str) -> None:
    """A table entry must name code, severity, component, text and the source URL it came from."""
    missing = [k for k in ENTRY_KEYS if k not in entry]
    if missing:
        raise ValueError(f"{where}: entry lacks {missing}")
    if entry["severity"] not in SEVERITIES:
        raise ValueError(f"{where}: severity {entry['severity']!r} not in {SEVERITIES}")


def _fill(template: str, values: Mapping[str, str]) -> str:
    try:
        return template.format_map(values)
    except (KeyError, IndexError, ValueError):
        return template


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    entry: Mapping[str, Any] | None
    lookups: tuple[str, ...]
    key: str
    text: str
    unknown_text: str


class DiagnosticRules:
    """Ordered regex rules over diagnostic text; the first rule that matches decides the event.

    A rule either carries its outcome (`code`, `severity`, ... directly) or names lookup tables
    and a `key` template built from the pattern's named groups (e.g. Logix "{type}/{code}").
    """

    def __init__(self, vendor: str, prefix: str, rules: Sequence[Mapping[str, Any]],
                 tables: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> None:
        self.vendor = vendor
        self.prefix = prefix
        self.tables = {name: dict(table) for name, table in (tables or {}).items()}
        for name, table in self.tables.items():
            for key, entry in table.items():
                check_entry(entry, f"{prefix} table {name}[{key}]")
        self.rules: list[_Rule] = []
        for i, rule in enumerate(rules):
            lookups = tuple(rule.get("lookup", ()))
            entry = None if lookups else rule
            if entry is not None:
                check_entry(entry, f"{prefix} rule {i}")
            unknown = [name for name in lookups if name not in self.tables]
            if unknown:
                raise ValueError(f"{prefix} rule {i}: no table {unknown}")
            self.rules.append(_Rule(re.compile(rule["pattern"], re.IGNORECASE), entry, lookups, rule.get("key", ""),
                                    rule.get("text", "{entry}"), rule.get("unknown_text", "{raw}")))

    def match(self, raw: object, timestamp_ns: int = 0) -> PlcEvent:
        text = raw if isinstance(raw, str) else repr(raw)
        for rule in self.rules:
            found = rule.pattern.search(text)
            if found is None:
                continue
            groups = {k: v.upper() for k, v in found.groupdict().items() if v is not None}
            groups["raw"] = text
            if rule.entry is not None:
                return event_from_entry(rule.entry, self.vendor, text, timestamp_ns, _fill(rule.entry["text"], groups))
            key = _fill(rule.key, groups)
            for name in rule.lookups:
                entry = self.tables[name].get(key)
                if entry is not None:
                    filled = _fill(rule.text, {**groups, "entry": entry["text"]})
                    return event_from_entry(entry, self.vendor, text, timestamp_ns, filled)
            return unknown_event(self.prefix, self.vendor, text, _fill(rule.unknown_text, groups), timestamp_ns)
        return unknown_event(self.prefix, self.vendor, text, text, timestamp_ns)


def _int(value: Any) -> int:
    return int(value, 0) if isinstance(value, str) else int(value)


class StatusBits:
    """A status word described as data: enumerated `fields` (mask -> value table) and single-bit `flags`.

    Each field yields one event for its current value; each flag yields its `set` entry when all
    mask bits are on and its optional `clear` entry otherwise.
    """

    def __init__(self, vendor: str, prefix: str, table: Mapping[str, Any]) -> None:
        self.vendor = vendor
        self.prefix = prefix
        self.width = int(table.get("width_bits", 16))
        self.fields = []
        for f in table.get("fields", ()):
            values = {_int(k): v for k, v in f["values"].items()}
            for k, entry in values.items():
                check_entry(entry, f"{prefix} field {f['name']}[{k:#x}]")
            self.fields.append((f["name"], _int(f["mask"]), values))
        self.flags = []
        for flag in table.get("flags", ()):
            for state in ("set", "clear"):
                if flag.get(state) is not None:
                    check_entry(flag[state], f"{prefix} flag {flag['mask']}.{state}")
            self.flags.append((_int(flag["mask"]), flag["set"], flag.get("clear")))

    def decode(self, word: object, timestamp_ns: int = 0) -> tuple[PlcEvent, ...]:
        if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word < (1 << self.width):
            return (unknown_event(self.prefix, self.vendor, word if isinstance(word, (int, str)) else repr(word),
                                  f"status value {word!r} is not a {self.width}-bit word", timestamp_ns),)
        events: list[PlcEvent] = []
        for name, mask, values in self.fields:
            entry = values.get(word & mask)
            if entry is None:
                events.append(unknown_event(self.prefix, self.vendor, word,
                                            f"unlisted {name} value {word & mask:#06x} in status word {word:#06x}",
                                            timestamp_ns))
            else:
                events.append(event_from_entry(entry, self.vendor, word, timestamp_ns))
        for mask, on, off in self.flags:
            entry = on if word & mask == mask else off
            if entry is not None:
                events.append(event_from_entry(entry, self.vendor, word, timestamp_ns))
        return tuple(events)
