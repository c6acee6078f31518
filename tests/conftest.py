"""Shared fixtures: real peers only (swtpm, the PLC simulator process, ONNX Runtime)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIG = REPO / "examples" / "rolling-mill.yaml"
DEMO_MODEL = REPO / "examples" / "models" / "rolling_mill.onnx"


@pytest.fixture
def swtpm(tmp_path_factory):
    """A fresh swtpm per test. `make test` installs swtpm, so its absence is a failure, not a skip."""
    from attestation.tpm import Swtpm

    assert shutil.which("swtpm"), "swtpm is not installed; run `make test` (it installs swtpm) or apt-get install swtpm"
    sw = Swtpm().start()
    try:
        yield sw
    finally:
        sw.stop()
