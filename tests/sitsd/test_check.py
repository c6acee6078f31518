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
    """The certificate, and the JSON, carry the hash of the constraint set the box came from."""
    from sitsd.config import load_config

    cert_path = tmp_path / "cert.json"
    rc, result, text = _check("--certificate", str(cert_path))
    assert rc == 0, text
    cert = Certificate.from_json(cert_path.read_text())
    verify_certificate(DEMO_MODEL, cert)  # raises if the model or the bounds changed
    expected = _hash(load_config(EXAMPLE_CONFIG))
    assert cert.constraints_sha256 == expected
    assert result["constraints_sha256"] == expected and f"constraints SHA-256 {expected}" in text
    assert result["certificate"] == {"model_sha256": cert.model_sha256, "constraints_sha256": expected,
                                     "method": cert.method, "written_to": str(cert_path)}
    verify_certificate(DEMO_MODEL, cert, constraints_sha256=expected)


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
    assert cert.constraints_sha256 == _hash(cfg) == result["constraints_sha256"]
    proven, report = swap_bounds_check(cfg, artifact)
    assert proven and "certificate in its manifest re-checked" in report, report

    # the running config has other constraints (one bound moved): refused, both hashes named, and the fix
    data = example_config_data()
    data["constraints"][0]["max"] = -0.31
    other = _load(tmp_path, data, "other.yaml")
    proven, report = swap_bounds_check(other, artifact)
    assert not proven and "made for other constraints" in report, report
    assert cert.constraints_sha256 in report and _hash(other) in report and "sitsctl check" in report

    # a certificate from before constraint hashing: still readable, refused at the swap with what to do
    manifest = json.loads((artifact / "manifest.json").read_text())
    old = {k: v for k, v in manifest["bounds_certificate"].items() if k != "constraints_sha256"}
    assert Certificate.from_json(json.dumps(old)).constraints_sha256 == ""
    (artifact / "manifest.json").write_text(json.dumps({**manifest, "bounds_certificate": old}))
    proven, report = swap_bounds_check(cfg, artifact)
    assert not proven and "predates constraint hashing" in report and "sitsctl check" in report, report

    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["bounds_certificate"]["constraints_sha256"] = cert.constraints_sha256
    manifest["bounds_certificate"]["output_upper"] = [1e-4]  # a claim the model does not meet
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    proven, report = swap_bounds_check(cfg, artifact)
    assert not proven and "does not hold" in report, report


# ---------------------------------------------------------------- the constraint hash of certificates

def _load(tmp_path, data, name="c.yaml"):
    from sitsd.config import load_config

    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(path)


def _hash(cfg):
    from sitsd.check import constraints_sha256

    return constraints_sha256(cfg.signals, cfg.constraints)


def _with_two_term_when(data, terms):
    data["constraints"].append({"name": "slow_thin_agc", "coefficients": {"strip_speed": 1.0, "exit_thickness": 0.5},
                                "max": 4.0, "when": terms})
    return data


def test_constraint_hash_does_not_depend_on_the_order_in_the_yaml(tmp_path):
    """Same signals and constraints, written in another order (lists, mapping keys, coefficients, the
    `and`-ed terms of a `when`, its spacing): the same hash."""
    plain = _load(tmp_path, _with_two_term_when(example_config_data(), "mill_mode == 2 and strip_speed > 1.6"),
                  "a.yaml")
    data = _with_two_term_when(example_config_data(), "strip_speed>1.6   and mill_mode==2")
    data["signals"] = [dict(reversed(list(s.items()))) for s in reversed(data["signals"])]
    data["constraints"] = [{**dict(reversed(list(c.items()))),
                            "coefficients": dict(reversed(list(c["coefficients"].items())))}
                           for c in reversed(data["constraints"])]
    for s in data["signals"]:
        if s.get("values"):
            s["values"] = list(reversed(s["values"]))
    shuffled = _load(tmp_path, data, "b.yaml")
    assert [s.name for s in shuffled.signals] != [s.name for s in plain.signals]  # really reordered
    assert _hash(shuffled) == _hash(plain)
    # names, rate limits and the invalid-value policy do not change the admissible region
    data["constraints"][0]["name"] = "renamed"
    data["signals"][0]["max_rate"] = 123.0
    assert _hash(_load(tmp_path, data, "c.yaml")) == _hash(plain)


@pytest.mark.parametrize("change", [
    lambda d: d["constraints"][0].__setitem__("max", -0.31),                         # a constraint's bound
    lambda d: d["constraints"][2].__setitem__("min", 4000.5),
    lambda d: d["constraints"][0]["coefficients"].__setitem__("entry_thickness", -1.01),
    lambda d: d["constraints"][3].__setitem__("when", "mill_mode == 2"),             # its condition
    lambda d: d["constraints"].pop(),                                                 # one constraint fewer
    lambda d: d["signals"][0].__setitem__("max", 4.6),                               # a signal's range
    lambda d: d["signals"][0].__setitem__("unit", "in"),                             # its unit
    lambda d: d["signals"][6].__setitem__("values", [0, 1]),                         # enum values
])
def test_constraint_hash_changes_with_the_admissible_region(tmp_path, change):
    base = _hash(_load(tmp_path, example_config_data(), "a.yaml"))
    data = example_config_data()
    change(data)
    assert _hash(_load(tmp_path, data, "b.yaml")) != base
