"""The FMEA knowledge graph as data: components, their failure modes (causes, effects, S/O/D ratings) and
the detections that reveal each, plus the relations and causal signal edges the detectors test.

Loaded once and checked: pydantic for shapes, then cross checks (unique ids, effects that exist,
detection codes that some detector can emit). Errors name the file, the line, the field and the fix.
"""
from __future__ import annotations

import fnmatch
from functools import cached_property
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import _dotted, _line_of
from .errors import FmeaError
from .relations import Expression, parse_expression

_ID = r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$"
# every detection code starts with one of these: what the event stream and the detectors emit
CODE_PREFIXES = ("timestamp.", "constraint.", "safety.", "deadline", "clock.", "plc.", "plc_link.", "signer.",
                 "update.", "runtime.", "anomaly.relation.", "anomaly.stuck.", "anomaly.granger.", "model.")
Expect = Literal["required", "likely", "possible"]
EXPECT_WEIGHT = {"required": 1.0, "likely": 0.6, "possible": 0.3}


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Detection(_Item):
    """An event code (glob: `plc.*`, `timestamp.transit`) that reveals a failure mode or an effect.
    `severity` limits a match to events of those severities (PLC events)."""

    code: str = Field(min_length=1)
    expect: Expect = "required"
    severity: list[Literal["info", "warning", "error", "critical"]] | None = None
    direction: Literal["up", "down"] | None = None

    def matches(self, code: str, severity: str, value: float = 0.0) -> bool:
        if self.direction is not None and (value > 0) != (self.direction == "up"):
            return False
        return fnmatch.fnmatchcase(code, self.code) and (self.severity is None or severity in self.severity)


class FailureMode(_Item):
    id: str = Field(pattern=_ID)
    name: str
    causes: list[str] = Field(min_length=1)
    effects: list[str] = []
    detections: list[Detection] = Field(min_length=1)
    severity: int = Field(ge=1, le=10)
    occurrence: int = Field(ge=1, le=10)
    detection: int = Field(ge=1, le=10, description="FMEA detection rating: 1 = certainly detected, 10 = hidden")
    fix: str = ""

    @property
    def rpn(self) -> int:
        return self.severity * self.occurrence * self.detection


class Component(_Item):
    id: str = Field(pattern=_ID)
    name: str
    kind: Literal["sensor", "actuator", "mechanical", "controller", "network", "clock", "model", "signer", "software"]
    signals: list[str] = []
    failure_modes: list[FailureMode] = Field(min_length=1)


class Effect(_Item):
    id: str = Field(pattern=_ID)
    text: str
    severity: int = Field(ge=1, le=10)
    detections: list[Detection] = []


class Relation(_Item):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    expr: str
    text: str = ""
    tolerance: float = Field(default=0.0, ge=0, description="smallest deviation (in the relation's unit) that "
                             "counts, however quiet the reference was")

    @cached_property
    def expression(self) -> Expression:
        return parse_expression(self.expr)


class GrangerEdge(_Item):
    cause: str
    effect: str
    lags: int = Field(default=3, ge=1, le=20)

    @property
    def code(self) -> str:
        return f"anomaly.granger.{self.cause}->{self.effect}"


class Fmea(_Item):
    version: Literal[1]
    line: str
    signals: list[str] = Field(min_length=1, description="the signal window's columns, plus `command`")
    relations: list[Relation] = []
    granger: list[GrangerEdge] = []
    effects: list[Effect] = []
    components: list[Component] = Field(min_length=1)

    @property
    def failure_modes(self) -> list[tuple[Component, FailureMode]]:
        return [(c, m) for c in self.components for m in c.failure_modes]

    def effect(self, effect_id: str) -> Effect:
        return next(e for e in self.effects if e.id == effect_id)


def _cross_checks(f: Fmea) -> list[tuple[tuple, str]]:
    problems: list[tuple[tuple, str]] = []
    known = set(f.signals) | {"command"}
    seen: dict[str, tuple] = {}

    def unique(kind: str, ident: str, loc: tuple) -> None:
        if ident in seen:
            problems.append((loc, f"{kind} id {ident!r} is used twice (first at {_dotted(seen[ident])})"))
        else:
            seen[ident] = loc

    for i, r in enumerate(f.relations):
        try:
            unknown = sorted(r.expression.names - known)
        except ValueError as exc:
            problems.append((("relations", i, "expr"), str(exc)))
            continue
        if unknown:
            problems.append((("relations", i, "expr"), f"{', '.join(unknown)} not in signals "
                                                       f"({', '.join(sorted(known))})"))
    for i, g in enumerate(f.granger):
        for end in ("cause", "effect"):
            if getattr(g, end) not in known:
                problems.append((("granger", i, end), f"{getattr(g, end)!r} not in signals"))
    relations = {r.name for r in f.relations}
    edges = {f"{g.cause}->{g.effect}" for g in f.granger}
    effects = {e.id for e in f.effects}

    def check_detection(d: Detection, loc: tuple) -> None:
        if not d.code.startswith(CODE_PREFIXES):
            problems.append((loc + ("code",), f"{d.code!r} matches no event source; codes start with one of "
                                              f"{', '.join(CODE_PREFIXES)}"))
        for prefix, names, what in (("anomaly.relation.", relations, "relation"), ("anomaly.stuck.", known, "signal"),
                                    ("anomaly.granger.", edges, "granger edge")):
            if d.code.startswith(prefix) and "*" not in d.code and d.code[len(prefix):] not in names:
                problems.append((loc + ("code",), f"{what} {d.code[len(prefix):]!r} is not defined; "
                                                  f"defined: {', '.join(sorted(names)) or 'none'}"))

    for i, e in enumerate(f.effects):
        unique("effect", e.id, ("effects", i, "id"))
        for j, d in enumerate(e.detections):
            check_detection(d, ("effects", i, "detections", j))
    for i, c in enumerate(f.components):
        unique("component", c.id, ("components", i, "id"))
        for s, name in enumerate(c.signals):
            if name not in known:
                problems.append((("components", i, "signals", s), f"{name!r} not in signals"))
        for j, m in enumerate(c.failure_modes):
            loc = ("components", i, "failure_modes", j)
            unique("failure mode", m.id, loc + ("id",))
            for k, eff in enumerate(m.effects):
                if eff not in effects:
                    problems.append((loc + ("effects", k), f"effect {eff!r} is not defined under effects: "
                                                            f"({', '.join(sorted(effects)) or 'none'})"))
            for k, d in enumerate(m.detections):
                check_detection(d, loc + ("detections", k))
    return problems


def load_fmea(path: str | Path) -> Fmea:
    path = Path(path)
    file = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FmeaError(file, [("", None, "file not found; pass --fmea with the path to an FMEA YAML file "
                                          "(see examples/fmea/rolling-mill.yaml)")]) from None
    except OSError as exc:
        raise FmeaError(file, [("", None, f"cannot read: {exc.strerror}")]) from None
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise FmeaError(file, [("", mark.line + 1 if mark else None,
                                f"not valid YAML: {getattr(exc, 'problem', None) or exc}")]) from None
    if not isinstance(data, dict):
        raise FmeaError(file, [("", 1, "expected a mapping (version, line, signals, relations, effects, components)")])
    try:
        fmea = Fmea.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check the spelling; see examples/fmea/rolling-mill.yaml)"
            elif err["type"] == "missing":
                msg = "required field is missing"
            problems.append((_dotted(loc), _line_of(root, loc), msg))
        raise FmeaError(file, problems) from None
    problems = _cross_checks(fmea)
    if problems:
        raise FmeaError(file, [(_dotted(loc), _line_of(root, loc), reason) for loc, reason in problems])
    return fmea
