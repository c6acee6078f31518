"""Structured logging: JSON lines through structlog, one event per line.

Only the I/O thread and startup code log; the loop thread reports through counters and the
alert queue. With `syslog_prefix`, each line starts with `<N>` so journald (SyslogLevelPrefix=)
assigns the priority while MESSAGE stays pure JSON.
"""
from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


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


def configure(level: str = "info", stream: TextIO | None = None, syslog_prefix: bool = False) -> None:
    # asyncua logs protocol chatter (revised session timeouts, ...) through stdlib logging; keep errors only
    logging.getLogger("asyncua").setLevel(logging.ERROR)
    processors = [structlog.processors.add_log_level,
                  structlog.processors.TimeStamper(fmt="iso", utc=True),
                  structlog.processors.format_exc_info]
    if syslog_prefix:
        processors.append(_syslog_prefix)
    processors.append(_PrefixedJSON())
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream or _CurrentStderr()),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str = "sitsd"):
    return structlog.get_logger(name)
