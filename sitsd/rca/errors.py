"""Errors of fault attribution: a bad FMEA file, an unreadable events dump, a renderer that is missing."""
from __future__ import annotations

from ..errors import SitsError


class DiagnoseError(SitsError):
    """Diagnosis could not run; the message says what is missing and how to get it."""


class FmeaError(SitsError):
    """An FMEA file does not match the schema. `problems` holds (field, line, reason); the message lists
    them as `FILE:LINE: field: reason`."""

    def __init__(self, file: str, problems: list[tuple[str, int | None, str]]) -> None:
        self.file = file
        self.problems = problems
        lines = []
        for fld, line, reason in problems:
            where = f"{file}:{line}" if line else file
            lines.append(f"{where}: {fld}: {reason}" if fld else f"{where}: {reason}")
        super().__init__("invalid FMEA file\n  " + "\n  ".join(lines) if len(lines) > 1 else lines[0])
