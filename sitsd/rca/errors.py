"""Errors of fault attribution: a bad FMEA file, an unreadable events dump, a renderer that is missing."""
from __future__ import annotations

from ..errors import SitsError, format_problems


class DiagnoseError(SitsError):
    """Diagnosis could not run; the message says what is missing and how to get it."""


class FmeaError(SitsError):
    """An FMEA file does not match the schema. `problems` holds (field, line, reason); the message lists
    them as `FILE:LINE: field: reason`."""

    def __init__(self, file: str, problems: list[tuple[str, int | None, str]]) -> None:
        self.file = file
        self.problems = problems
        super().__init__(format_problems("invalid FMEA file", file, problems))
