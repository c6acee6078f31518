"""attestation.session_credential: model-only (real swtpm): sitsd's PLC link binds version 1 credentials (a quote over
PCR 16 alone, no measurement log) for a PLC gateway whose verifier predates version 2, while the measurements into
PCR 23 go on. A verifier without pins accepts them; one that needs measurements refuses them (`unmeasured`). The
knob is refused, naming the file, line and field, where no tpm-session credential is sent."""
from __future__ import annotations

import asyncio
import os

import pytest
import yaml

from attestation.session import CREDENTIAL_VERSION, CREDENTIAL_VERSION_MEASURED, CredentialError, SessionCredential, \
    SessionVerifier
from sitsd.cli import parse_overrides
from sitsd.config import load_config
from sitsd.errors import ConfigError

from ..conftest import EXAMPLE_CONFIG, example_config_data
from .test_session import MODEL
from .test_session_measured import CONFIG, PRE, POST, started


class _Log:
    def __init__(self) -> None:
        self.lines = []

    def __getattr__(self, level):
        return lambda event, **kw: self.lines.append((level, event, kw))


class _Node:
    def __init__(self, value=None) -> None:
        self.value = value

    async def read_value(self):
        return self.value

    async def write_value(self, data_value) -> None:
        self.value = data_value.Value.Value


class _Client:
    """The two PLC variables the session binding reads and writes."""

    def __init__(self) -> None:
        self.nonce, self.credential = _Node(os.urandom(32)), _Node()

    def get_node(self, node):
        return self.nonce if "Nonce" in str(node) else self.credential


def _bound_by_plc_link(monkeypatch, swtpm, tmp_path, session_credential: str):
    """What sitsd's PLC link writes to the PLC (PlcLink._bind_session, the signer and PCR 23 log as at start)."""
    import sitsd.plc_link as plc_link

    async def resolve(_client, text, _field):
        return text

    monkeypatch.setattr(plc_link, "resolve_node", resolve)
    cfg = load_config(EXAMPLE_CONFIG, parse_overrides([
        f"attestation.tcti={swtpm.tcti}", f"attestation.session_credential={session_credential}"]))
    assert cfg.attestation.session_credential == session_credential
    signer, log = started(swtpm, tmp_path)
    link = plc_link.PlcLink(cfg, signer=signer, source=None, on_plc_event=None,
                            device_key_file=tmp_path / "device.pub.pem", model_sha256=MODEL, log=_Log(),
                            measurements=lambda: log)
    client = _Client()
    try:
        asyncio.run(link._bind_session(client))
    finally:
        signer.close()
    return client.nonce.value, client.credential.value, signer.device_public_key_pem(), log


def test_model_only_binds_a_version_1_credential_a_verifier_accepts_only_without_pins(monkeypatch, swtpm, tmp_path):
    nonce, data, ak, log = _bound_by_plc_link(monkeypatch, swtpm, tmp_path, "model-only")
    cred = SessionCredential.from_cbor(data)
    assert cred.version == CREDENTIAL_VERSION and sorted(cred.quote.pcrs) == [16]
    assert cred.measurement_pcr is None and cred.measurement_log == ()
    assert cbor_version(data) == 1
    assert len(log.events) == 4 and log.value != b"\0" * 32  # PCR 23 measurement still happens
    session = SessionVerifier(ak, MODEL, freshness=False).accept(data, nonce)  # an older (v1) PLC's check
    assert session.measured is None
    for pins in ({"require_measurements": True}, {"expected_config_sha256": CONFIG},
                 {"expected_modules": {"pre": PRE, "post": POST}}):
        with pytest.raises(CredentialError) as exc:
            SessionVerifier(ak, MODEL, freshness=False, **pins).accept(data, nonce)
        assert exc.value.code == "unmeasured", exc.value


def test_measured_default_binds_version_2(monkeypatch, swtpm, tmp_path):
    nonce, data, ak, _ = _bound_by_plc_link(monkeypatch, swtpm, tmp_path, "measured")
    cred = SessionCredential.from_cbor(data)
    assert cred.version == CREDENTIAL_VERSION_MEASURED and sorted(cred.quote.pcrs) == [16, 23]
    SessionVerifier(ak, MODEL, freshness=False, require_measurements=True).accept(data, nonce)


def cbor_version(data: bytes) -> int:
    import cbor2

    return cbor2.loads(data)[1]


def _write(tmp_path, edit) -> str:
    data = example_config_data()
    edit(data)
    path = tmp_path / "rolling-mill.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_session_credential_is_validated_naming_file_line_and_field(tmp_path):
    assert load_config(EXAMPLE_CONFIG).attestation.session_credential == "measured"  # the default
    path = _write(tmp_path, lambda d: d["attestation"].update(session_credential="v1"))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    line = next(i for i, l in enumerate(path.read_text().splitlines(), 1) if l.strip().startswith("session_credential:"))
    assert f"{path}:{line}: attestation.session_credential: " in str(exc.value), str(exc.value)
    assert "measured" in str(exc.value) and "model-only" in str(exc.value)
    for other in ({"mode": "software"}, {"signing": "tpm-direct"}):
        path = _write(tmp_path, lambda d: d["attestation"].update(session_credential="model-only", **other))
        with pytest.raises(ConfigError) as exc:
            load_config(path)
        line = next(i for i, l in enumerate(path.read_text().splitlines(), 1) if l.strip().startswith("session_credential:"))
        assert f"{path}:{line}: attestation.session_credential: " in str(exc.value), str(exc.value)
        assert "needs mode tpm2 and signing tpm-session" in str(exc.value), str(exc.value)
        # the default says nothing about a credential that is not sent: never an error
        path = _write(tmp_path, lambda d: d["attestation"].update(session_credential="measured", **other))
        load_config(path)
