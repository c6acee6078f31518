"""`sitsctl check` on the demo config: constraints proven satisfiable, model bounds proven inside the limits."""
import json
import subprocess
import sys

import pytest
import yaml

from ep.bounds import Certificate, verify_certificate

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO, example_config_data


def _check(*args, config=EXAMPLE_CONFIG):
    r = subprocess.run([sys.executable, "-m", "sitsd.cli", "check", "--config", str(config), "--json", *args],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    return r.returncode, json.loads(r.stdout.splitlines()[-1]), r.stdout


def test_demo_config_is_proven():
    rc, result, text = _check()
    assert rc == 0, text
    assert result["satisfiable"] and result["bounds_proven"]
    assert result["contradictions"] == [] and result["redundant"] == [] and result["unreachable"] == []
    lo, hi = result["output_bounds"]["roll_gap_correction"]
    assert -0.15 <= lo < hi <= 0.15
    assert result["actuator_limits"]["roll_gap_correction"] == [-0.15, 0.15]
    # the clip head makes both methods report its range at the output; the JSON compares them before it
    assert result["crown_width"] < result["ibp_width"] and result["width_at"] == "before the output head (Clip)"
    assert result["output_width"] == pytest.approx(0.28, abs=1e-6)
    assert "proven bounds" in text and "inside the actuator limits" in text


def test_contradictory_constraints_exit_non_zero_and_are_named(tmp_path):
    data = example_config_data()
    data["constraints"] += [
        {"name": "thin_exit", "coefficients": {"exit_thickness": 1.0}, "max": 2.8},
        {"name": "thick_exit", "coefficients": {"exit_thickness": 1.0}, "min": 3.0},
    ]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    rc, result, text = _check(config=path)
    assert rc == 1 and not result["satisfiable"] and not result["bounds_proven"]
    assert ["thick_exit", "thin_exit"] in [sorted(core) for core in result["contradictions"]]
    assert "thin_exit" in text and "thick_exit" in text


def test_a_contradiction_only_under_a_condition_names_the_unreachable_state_and_exits_non_zero(tmp_path):
    """A force band for AGC (mill_mode == 2) that excludes every force: the set is satisfiable (modes 0 and 1
    run), but the line could never run in AGC, so check says so and fails."""
    data = example_config_data()
    data["constraints"].append({"name": "agc_force_floor", "coefficients": {"rolling_force": 1.0}, "min": 13500.0,
                                "when": "mill_mode == 2"})
    path = tmp_path / "agc.yaml"
    path.write_text(yaml.safe_dump(data))
    rc, result, text = _check(config=path)
    assert rc == 1 and result["satisfiable"] and result["contradictions"] == []
    assert result["unreachable"] == [{"when": "mill_mode == 2",
                                      "core": ["force_in_band_under_agc", "agc_force_floor"]}]
    assert "UNREACHABLE: while mill_mode == 2" in text


def test_limits_the_model_can_break_are_not_proven(tmp_path):
    rc, result, text = _check("--set", "safety.actuators=[{output: roll_gap_correction, min: -0.05, max: 0.05, "
                                       "failsafe: 0.0}]", "--max-splits", "16")
    assert rc == 1 and result["satisfiable"] and not result["bounds_proven"]
    assert "counterexample" in result or "worst sub-region" in text
    assert "fix:" in text


def test_certificate_is_written_and_verifies(tmp_path):
    cert_path = tmp_path / "cert.json"
    rc, _, _ = _check("--certificate", str(cert_path))
    assert rc == 0
    cert = Certificate.from_json(cert_path.read_text())
    verify_certificate(DEMO_MODEL, cert)  # raises if the model or the bounds changed


def test_check_stores_the_certificate_in_a_compiled_artifact_and_a_swap_rechecks_it(tmp_path):
    """The certificate goes into the artifact's manifest (its hash unchanged); the pre-swap check
    replays it instead of proving anew, and refuses a manifest whose certificate was edited."""
    import numpy as np

    from ep.artifact import read_certificate, resolve_model
    from sitsd.check import swap_bounds_check
    from sitsd.config import load_config

    rng = np.random.default_rng(5)
    lo, hi = np.array([3.9, 2.95, 1.3, 7000, 100, 2.5]), np.array([4.1, 3.05, 1.5, 9500, 140, 2.8])
    np.save(tmp_path / "calibration.npy", (lo + (hi - lo) * rng.random((256, 6))).astype(np.float32))
    artifact = tmp_path / "artifact"
    r = subprocess.run([sys.executable, "-m", "sitsd.cli", "compile", str(DEMO_MODEL), "--target", "cpu",
                        "--quantization", "fp8-adaptive", "--calibration", str(tmp_path / "calibration.npy"),
                        "--output", str(artifact)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    sha_before = resolve_model(artifact)[1]
    assert read_certificate(artifact) is None
    rc, result, text = _check("--set", f"model.artifact={artifact}", "--set", "model.sha256=")
    assert rc == 0, text
    assert f"certificate stored in {artifact / 'manifest.json'}" in text
    cert = Certificate.from_json(json.dumps(read_certificate(artifact)))
    assert resolve_model(artifact)[1] == sha_before  # an annotation, not part of the artifact's identity
    verify_certificate(resolve_model(artifact)[0], cert)

    cfg = load_config(EXAMPLE_CONFIG)
    proven, report = swap_bounds_check(cfg, artifact)
    assert proven and "certificate in its manifest re-checked" in report, report

    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["bounds_certificate"]["output_upper"] = [1e-4]  # a claim the model does not meet
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    proven, report = swap_bounds_check(cfg, artifact)
    assert not proven and "does not hold" in report, report
