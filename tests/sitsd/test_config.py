from pathlib import Path

import pytest
import yaml

from sitsd.config import load_config
from sitsd.errors import ConfigError

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, example_config_data


def _write(tmp_path: Path, mutate) -> Path:
    data = example_config_data()
    mutate(data)
    path = tmp_path / "line.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_example_config_loads_into_typed_objects():
    cfg = load_config(EXAMPLE_CONFIG)
    assert cfg.signal_names[:2] == ["entry_thickness", "exit_thickness"]
    assert cfg.model.artifact == DEMO_MODEL  # resolved against the config's directory
    assert cfg.attestation.key_handle == 0x81000001  # tpm-direct's password signing key
    assert cfg.attestation.ak_handle == 0x81000002
    assert cfg.attestation.device_key_handle == 0x81000003  # the policy-bound device key (deploy, certify)
    assert cfg.signals[0].unit == "mm"
    assert cfg.safety.actuators[0].failsafe == 0.0


def test_unknown_field_names_file_line_and_field(tmp_path):
    path = tmp_path / "c.yaml"
    text = EXAMPLE_CONFIG.read_text().replace("  cycle_ms: 10", "  cycle_ms: 10\n  cycle_msec: 10")
    path.write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("  cycle_msec: 10"))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert f"{path}:{line}: timing.cycle_msec: unknown field" in str(exc.value)


def test_wrong_type_points_at_the_value(tmp_path):
    path = tmp_path / "c.yaml"
    text = EXAMPLE_CONFIG.read_text().replace("deadline_ms: 8 ", "deadline_ms: soon ")
    path.write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "deadline_ms: soon" in l)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert exc.value.problems[0][:2] == ("timing.deadline_ms", line)
    assert "valid number" in str(exc.value)


@pytest.mark.parametrize("mutate,field,reason", [
    (lambda d: d["model"]["inputs"].append("roll_speed"), "model.inputs[6]", "not a declared signal"),
    (lambda d: d["signals"][0].update(min=9.0), "signals[0]", "must be below max"),
    (lambda d: d["safety"]["actuators"][0].update(failsafe=1.0), "safety.actuators[0]", "outside"),
    (lambda d: d["attestation"].update(mode="tpm2", tcti=None), "attestation", "needs tcti"),
    (lambda d: d["plc"].update(command_node="X1G", profile="melsec-iq-r"), "plc.command_node",
     "'G' is not a hexadecimal digit at offset 2"),
    (lambda d: d["constraints"][0]["coefficients"].update(bogus=1.0), "constraints[0].coefficients.bogus",
     "not a declared signal"),
    (lambda d: d["plc"].update(profile="s5"), "plc.profile", "s7-1500"),
    (lambda d: d.pop("safety"), "safety", "required field is missing"),
    (lambda d: d["model"].update(sha256=1234), "model.sha256", "quoted string"),
    (lambda d: d["plc"].update(command_mode="method"), "plc", "needs command_object"),
])
def test_semantic_errors(tmp_path, mutate, field, reason):
    with pytest.raises(ConfigError) as exc:
        load_config(_write(tmp_path, mutate))
    fields = [p[0] for p in exc.value.problems]
    assert field in fields, str(exc.value)
    assert reason in str(exc.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nsignals: [\n  - a\n")
    with pytest.raises(ConfigError, match=rf"{bad}:\d+: not valid YAML"):
        load_config(bad)


def test_overrides_apply_before_validation():
    cfg = load_config(EXAMPLE_CONFIG, {"attestation.mode": "software", "timing.deadline_ms": 5})
    assert cfg.attestation.mode == "software" and cfg.timing.deadline_ms == 5


def test_transport_kinds_are_a_tagged_union():
    cfg = load_config(EXAMPLE_CONFIG, {"transport": {"kind": "opcua-subscription",
                                                     "node": "nsu=urn:x;s=Frame", "publishing_interval_ms": 2}})
    assert cfg.transport.kind == "opcua-subscription" and cfg.transport.publishing_interval_ms == 2
    with pytest.raises(ConfigError) as exc:
        load_config(EXAMPLE_CONFIG, {"transport.kind": "mqtt"})
    assert "transport" in exc.value.problems[0][0] and "'uadp-udp', 'uadp-eth', 'opcua-subscription'" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load_config(EXAMPLE_CONFIG, {"transport.publisher_id": "x"})
    assert exc.value.problems[0][0] == "transport.publisher_id"  # no discriminator value in the path


def test_vendor_addresses_resolve_through_the_profile():
    cfg = load_config(EXAMPLE_CONFIG, {"plc.profile": "s7-1500", "plc.command_node": "DB_AGC.RollGapCommand",
                                       "plc.status_node": "ns=3;i=1001"})
    assert cfg.plc.node_id(cfg.plc.command_node) == 'ns=3;s="DB_AGC"."RollGapCommand"'
    assert cfg.plc.node_id(cfg.plc.status_node) == "ns=3;i=1001"  # NodeIds pass through


# -- hostile config files: every mutation is a ConfigError that names a place, never a crash ----------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TEXT = EXAMPLE_CONFIG.read_text()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, len(_TEXT) - 1), st.integers(1, 40), st.binary(max_size=12))
def test_mutated_config_files_fail_cleanly(tmp_path, start, length, junk):
    text = _TEXT[:start] + junk.decode("latin-1") + _TEXT[start + length:]
    path = tmp_path / "mutated.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        assert str(path) in str(exc) and exc.problems
    else:
        assert cfg.signals  # a mutation that still parses must still be a complete, valid config


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_when_conditions_are_rejected_or_parsed(text):
    from sitsd.config import parse_when

    try:
        conditions = parse_when(text)
    except ValueError as exc:
        assert "condition" in str(exc)
    else:
        assert all(c.op in ("==", "!=", "<", "<=", ">", ">=") for c in conditions)


def test_a_config_that_is_not_utf8_is_a_config_error_with_its_line(tmp_path):
    """Found by the atheris config target: a Latin-1 byte escaped as UnicodeDecodeError."""
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(EXAMPLE_CONFIG.read_bytes().replace(b"line:", b"# caf\xe9\nline:", 1))
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    line = EXAMPLE_CONFIG.read_bytes().split(b"line:", 1)[0].count(b"\n") + 1
    assert f"{bad}:{line}: not UTF-8 text (byte 0xe9" in str(err.value)


def test_enrollment_authority_is_a_p256_public_key_outside_the_audit_directory(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    def pem(key) -> bytes:
        return key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)

    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "enroller.pub.pem").write_bytes(pem(ec.generate_private_key(ec.SECP256R1())))
    (keys / "p384.pub.pem").write_bytes(pem(ec.generate_private_key(ec.SECP384R1())))
    (keys / "rsa.pub.pem").write_bytes(pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    (keys / "junk.pem").write_text("not a key\n")
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "enroller.pub.pem").write_bytes((keys / "enroller.pub.pem").read_bytes())

    assert load_config(EXAMPLE_CONFIG).attestation.enrollment_authority is None  # optional, off by default
    # relative to the config's directory, like every path in it
    cfg = load_config(_write(tmp_path, lambda d: d["attestation"].update(enrollment_authority="keys/enroller.pub.pem")))
    assert cfg.attestation.enrollment_authority == keys / "enroller.pub.pem"

    for value, reason in (
            ("keys/missing.pem", "does not exist (the enrolling verifier's public key"),
            ("keys/junk.pem", "is not a PEM public key"),
            ("keys/rsa.pub.pem", "is not an ECDSA P-256 public key"),
            ("keys/p384.pub.pem", "is not an ECDSA P-256 public key"),
            (str(audit / "enroller.pub.pem"), "is inside audit.directory")):
        path = _write(tmp_path, lambda d: (d["attestation"].update(enrollment_authority=value),
                                           d["audit"].update(directory=str(audit))))
        with pytest.raises(ConfigError) as exc:
            load_config(path)
        assert [p[0] for p in exc.value.problems] == ["attestation.enrollment_authority"], str(exc.value)
        assert reason in str(exc.value), str(exc.value)
        line = next(i for i, l in enumerate(path.read_text().splitlines(), 1) if "enrollment_authority" in l)
        assert f"{path}:{line}: attestation.enrollment_authority: " in str(exc.value)

    def software(d):
        d["attestation"].update(mode="software", enrollment_authority="keys/enroller.pub.pem")
        d["audit"]["anchor"] = "off"
    with pytest.raises(ConfigError, match="enrollment_authority checks the record that pins the TPM's attestation "
                                          "key .AK.: it needs mode tpm2"):
        load_config(_write(tmp_path, software))
