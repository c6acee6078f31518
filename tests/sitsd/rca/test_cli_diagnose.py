"""`sitsctl diagnose` offline from an events dump: text, json, dot and a PNG rendered by Graphviz."""
import json
import os
import subprocess
import sys

import pytest

from plc.simulator.faults import FaultSpec
from sitsd.cli_diagnose import parse_duration
from sitsd.rca.events import dump

from ...conftest import REPO

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def roll_wear_dump(runner, tmp_path_factory):
    res = runner.run(FaultSpec("roll_wear", 20.0, seed=3), seed=3, seconds=28.0)
    res.window.meta = {"model": str(runner.cfg.model.artifact), "inputs": list(runner.cfg.model.inputs)}
    path = tmp_path_factory.mktemp("dump") / "roll_wear.json"
    dump(path, [e for e in res.events if e.t_ns >= res.now_ns - 20 * 10**9], res.window)
    return path


def _sitsctl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "sitsd.cli", "diagnose", *args], capture_output=True, text=False,
                          timeout=120, cwd=REPO, env=env)


def test_png_of_an_injected_fault(roll_wear_dump, tmp_path):
    out = tmp_path / "diagnosis.png"
    r = _sitsctl("--events", str(roll_wear_dump), "--since", "20s", "--format", "png", "--output", str(out))
    assert r.returncode == 0, r.stderr.decode()
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert len(data) > 10_000 and width > 600 and height > 200


def test_text_json_and_dot(roll_wear_dump):
    text = _sitsctl("--events", str(roll_wear_dump), "--since", "20s")
    assert text.returncode == 0, text.stderr.decode()
    lines = text.stdout.decode().splitlines()
    first = next(line for line in lines if line.lstrip().startswith("1. "))
    assert "rolls.wear" in first and "%" in first and "RPN" in first
    assert any("anomaly.relation.gaugemeter" in line for line in lines)
    js = json.loads(_sitsctl("--events", str(roll_wear_dump), "--since", "20s", "--format", "json").stdout)
    assert js["ranking"][0]["cause"] == "rolls.wear" and js["ranking"][0]["component"] == "rolls"
    assert js["symptoms"][0]["code"] == "anomaly.relation.gaugemeter"
    dot = _sitsctl("--events", str(roll_wear_dump), "--since", "20s", "--format", "dot").stdout.decode()
    assert dot.startswith("digraph diagnosis {") and '"mode:rolls.wear"' in dot and "#d7301f" in dot


def test_png_without_graphviz_says_what_to_do(roll_wear_dump, tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no `dot` on this PATH
    r = _sitsctl("--events", str(roll_wear_dump), "--format", "png", "--output", str(tmp_path / "x.png"), env=env)
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "apt-get install graphviz" in err and "--format dot" in err
    r = _sitsctl("--events", str(roll_wear_dump), "--format", "png")
    assert r.returncode == 2 and "--output FILE.png" in r.stderr.decode()


def test_durations():
    assert parse_duration("10m") == 600 and parse_duration("90s") == 90 and parse_duration("500ms") == 0.5
    assert parse_duration("2") == 2
    r = _sitsctl("--since", "ten minutes", "--events", "x.json")
    assert r.returncode == 2 and "is not a duration" in r.stderr.decode()


def test_missing_events_file_is_a_clear_error(tmp_path):
    r = _sitsctl("--events", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "no such events file" in r.stderr.decode()
