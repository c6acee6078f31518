"""Structured logging: JSON lines through structlog, one event per line.

Only the I/O thread and startup code log; the loop thread reports through counters and the
alert queue. With `syslog_prefix`, each line starts with `<N>` so journald (SyslogLevelPrefix=)
assigns the priority while MESSAGE stays pure JSON.
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import struct
import sys
from typing import TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "warn": 4, "error": 3, "exception": 3, "critical": 2}


def _syslog_prefix(_logger, method: str, event: dict) -> dict:
    event["_prefix"] = f"<{_PRIORITY.get(method, 6)}>"
    return event


class _PrefixedJSON:
    def __init__(self) -> None:
        self._json = structlog.processors.JSONRenderer(sort_keys=False)

    def __call__(self, logger, method: str, event: dict) -> str:
        prefix = event.pop("_prefix", "")
        return prefix + self._json(logger, method, event)


class _CurrentStderr:
    """Whatever sys.stderr is at the time of each write: configuring logging must not pin one stream
    object (a test harness or an embedding program may swap and close it later)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


JOURNAL_SOCKET = "/run/systemd/journal/socket"
_FIELD = re.compile(r"[^A-Z0-9_]")


def journal_fields(method: str, event: dict) -> dict[str, str]:
    """One journal entry: MESSAGE (the event and its fields as one JSON object, as on stderr),
    PRIORITY, SYSLOG_IDENTIFIER, and every field of the event as SITS_<NAME> (upper case), so
    `journalctl -u sitsd SITS_KIND=deadline` or `SITS_EVENT="startup failed"` select entries."""
    fields = {"MESSAGE": json.dumps(event, default=str), "PRIORITY": str(_PRIORITY.get(method, 6)),
              "SYSLOG_IDENTIFIER": "sitsd"}
    for key, value in event.items():
        name = "SITS_" + _FIELD.sub("_", str(key).upper())
        fields[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return fields


def encode_journal(fields: dict[str, str]) -> bytes:
    """journald's native protocol: KEY=value lines; a value with a newline as KEY, 64-bit LE length, value."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class _JournalRenderer:
    def __call__(self, logger, method: str, event: dict) -> bytes:
        event.pop("_prefix", None)
        return encode_journal(journal_fields(method, event))


class _JournalLogger:
    """Sends each entry as one datagram to journald's native socket, never blocking; if journald does
    not take it (gone, queue full), the entry goes to stderr as a JSON line instead."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def msg(self, data: bytes) -> None:
        try:
            self.sock.sendto(data, socket.MSG_DONTWAIT, self.path)
        except OSError:
            message = next((line[8:] for line in data.split(b"\n") if line.startswith(b"MESSAGE=")), data)
            sys.stderr.write(message.decode("utf-8", "replace") + "\n")
            sys.stderr.flush()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def journal_available(path: str = JOURNAL_SOCKET) -> bool:
    """Whether stderr is connected to the journal (systemd sets JOURNAL_STREAM=<dev>:<inode> for it)
    and journald's native socket exists: then sitsd can send structured entries."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino) and os.path.exists(path)


def configure(level: str = "info", stream: TextIO | None = None, syslog_prefix: bool = False,
              journal: bool = False) -> None:
    # asyncua logs protocol chatter (revised session timeouts, ...) through stdlib logging; keep errors only
    logging.getLogger("asyncua").setLevel(logging.ERROR)
    processors = [structlog.processors.add_log_level,
                  structlog.processors.TimeStamper(fmt="iso", utc=True),
                  structlog.processors.format_exc_info]
    if journal:  # structured entries to journald's native socket (fields, not just a text line)
        processors.append(_JournalRenderer())
        factory = lambda *_: _JournalLogger()  # noqa: E731
    else:
        if syslog_prefix:
            processors.append(_syslog_prefix)
        processors.append(_PrefixedJSON())
        factory = structlog.PrintLoggerFactory(stream or _CurrentStderr())
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str = "sitsd"):
    return structlog.get_logger(name)
