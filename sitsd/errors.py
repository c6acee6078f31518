"""Errors raised by the daemon core. Each says what was wrong, where, and what would fix it."""
from __future__ import annotations


class SitsError(Exception):
    """Base class for errors raised by `sitsd`."""


class ConfigError(SitsError):
    """A config file is missing, not YAML, or does not match the schema.

    `problems` holds one (field, line, reason) per problem; the message lists them all as
    `FILE:LINE: field: reason`.
    """

    def __init__(self, file: str, problems: list[tuple[str, int | None, str]]) -> None:
        self.file = file
        self.problems = problems
        super().__init__(format_problems("invalid config", file, problems))


def format_problems(title: str, file: str, problems: list[tuple[str, int | None, str]]) -> str:
    """`FILE:LINE: field: reason`, one line per problem (under `title` when there are several)."""
    lines = []
    for field, line, reason in problems:
        where = f"{file}:{line}" if line else file
        lines.append(f"{where}: {field}: {reason}" if field else f"{where}: {reason}")
    return f"{title}\n  " + "\n  ".join(lines) if len(lines) > 1 else lines[0]


class StartupError(SitsError):
    """The daemon could not start: PLC unreachable, TPM unavailable, model rejected."""


class ControlError(SitsError):
    """The control socket could not be reached or answered with an error."""
