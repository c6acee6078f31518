"""The FMEA file's schema: the example loads, and every kind of mistake is reported with file, line, field and fix."""
from pathlib import Path

import pytest

from sitsd.rca.errors import FmeaError
from sitsd.rca.fmea import load_fmea

from ...conftest import REPO

EXAMPLE = REPO / "examples" / "fmea" / "rolling-mill.yaml"


def test_example_loads_and_is_a_connected_graph():
    f = load_fmea(EXAMPLE)
    modes = [m.id for _, m in f.failure_modes]
    assert len(modes) == len(set(modes)) >= 15
    kinds = {c.kind for c in f.components}
    assert {"sensor", "actuator", "mechanical", "controller", "network", "clock", "model", "signer"} <= kinds
    assert {r.name for r in f.relations} >= {"gaugemeter", "mass_flow", "actuator_tracking", "thickness_error"}
    for _, m in f.failure_modes:
        assert 1 <= m.rpn <= 1000 and m.causes and m.detections


def _broken(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    text = EXAMPLE.read_text()
    assert old in text, old
    p = tmp_path / "fmea.yaml"
    p.write_text(text.replace(old, new, count))
    return p


def _first_changed_line(path: Path) -> int:
    pairs = zip(EXAMPLE.read_text().splitlines(), path.read_text().splitlines())
    return next(i for i, (a, b) in enumerate(pairs, 1) if a != b)


@pytest.mark.parametrize("old, new, field, reason, needle", [
    ("        severity: 8\n        occurrence: 3\n        detection: 2\n",
     "        severity: 11\n        occurrence: 3\n        detection: 2\n",
     "components[8].failure_modes[0].severity", "less than or equal to 10", "severity: 11"),
    ("    kind: sensor\n", "    kind: sensr\n", "components[0].kind", "'sensor'", "kind: sensr"),
    ("        effects: [failsafe_commands, late_commands]\n", "        effects: [failsafe_command, late_commands]\n",
     "components[9].failure_modes[0].effects[0]", "effect 'failsafe_command' is not defined", "[failsafe_command,"),
    ("          - {code: timestamp.future}\n", "          - {code: timestmp.future}\n",
     "components[10].failure_modes[0].detections[0].code", "matches no event source", "timestmp.future"),
    ("          - {code: anomaly.relation.mass_flow}\n", "          - {code: anomaly.relation.massflow}\n",
     "components[0].failure_modes[0].detections[0].code", "relation 'massflow' is not defined", "relation.massflow"),
    ("    expr: strip_speed * exit_thickness / entry_thickness\n",
     "    expr: strip_speed * exit_thickness / entry_thicknes\n",
     "relations[1].expr", "entry_thicknes not in signals", "entry_thicknes\n"),
    ("    expr: strip_speed * exit_thickness / entry_thickness\n", "    expr: __import__('os').getcwd()\n",
     "relations[1].expr", "is not allowed in a relation", "__import__"),
    ("        fix: recalibrate the entry gauge against a reference sample\n",
     "        fix: recalibrate the entry gauge against a reference sample\n        owner: maintenance\n",
     "components[0].failure_modes[0].owner", "unknown field", "owner: maintenance"),
    ("      - id: entry_gauge.stuck\n", "      - id: entry_gauge.drift\n",
     "components[0].failure_modes[1].id", "used twice", "- id: entry_gauge.drift\n"),
])
def test_schema_errors_name_file_line_field_and_reason(tmp_path, old, new, field, reason, needle):
    p = _broken(tmp_path, old, new)
    with pytest.raises(FmeaError) as exc:
        load_fmea(p)
    msg = str(exc.value)
    problem = next((pr for pr in exc.value.problems if pr[0] == field), None)
    assert problem is not None, msg
    assert reason in problem[2], msg
    line = _first_changed_line(p)  # the line the edit touched is the line the error must name
    assert needle.strip() in p.read_text().splitlines()[line - 1]
    assert problem[1] == line, msg
    assert f"{p}:{line}: {field}: " in msg


def test_missing_required_field_and_missing_file_and_bad_yaml(tmp_path):
    p = _broken(tmp_path, "        causes: [source decay or dirt in the X-ray path, temperature drift of the detector]\n", "")
    with pytest.raises(FmeaError, match=r"components\[0\]\.failure_modes\[0\]\.causes: required field is missing"):
        load_fmea(p)
    with pytest.raises(FmeaError, match="file not found; pass --fmea"):
        load_fmea(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ncomponents: [\n")
    with pytest.raises(FmeaError, match=r"bad.yaml:\d+: not valid YAML"):
        load_fmea(bad)
