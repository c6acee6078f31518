"""Shared for the fault-attribution tests: one scenario runner (real gates, real ORT model) per session."""
import pytest

from sitsd.rca.fmea import load_fmea

from ...conftest import EXAMPLE_CONFIG, REPO

FMEA = REPO / "examples" / "fmea" / "rolling-mill.yaml"


@pytest.fixture(scope="session")
def runner():
    from sitsd.rca.scenario import ScenarioRunner

    return ScenarioRunner(EXAMPLE_CONFIG)


@pytest.fixture(scope="session")
def fmea():
    return load_fmea(FMEA)
