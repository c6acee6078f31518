"""The enrollment record pins the AK (real swtpm): the PLC side (attestation.tpm.enroll.load_enrollment,
EnrolledSessionVerifier, the simulator's SessionAcceptor and `sitsctl plcsim --enrollment`) trusts the enrolled
AK and refuses a session credential quoted by any other (a fresh AK in the same TPM, another TPM's AK); a
tampered, forged or malformed record is refused saying what to fix; `sitsctl deploy` into a running sitsd fails
when the daemon's AK is not the enrolled one (the load is undone), and says so when it trusted an AK on first use."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attestation.envelope import Command
from attestation.session import CredentialError, SessionVerifier, TpmSessionSigner
from attestation.tpm import Swtpm
from attestation.tpm import enroll as E
from attestation.tpm.policy import generate_authority, load_authority_public
from sitsd.plcsim import SessionAcceptor

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO, sitsd_args, wait_ready
from .test_deploy import deploy_in_process, sitsctl as cli, staged, tampered_model, vendor  # noqa: F401 (fixture)
from .test_enroll import round_trip, sitsctl as enroll_cli

MODEL = hashlib.sha256(b"rolling mill model").digest()
OTHER_AK = 0x81000005  # a second restricted AK in the same TPM (fresh_ak): another key, never enrolled


def fresh_ak(tcti: str, handle: int = OTHER_AK) -> bytes:
    """Create a restricted P-256 AK at `handle` with the AK template but a random unique field: another key than
    load_or_create_ak's (a primary from the same template and seed is the same key every time). Its TPMT_PUBLIC."""
    from attestation.tpm.signer import _tss

    t = _tss()
    esapi = t.ESAPI(tcti)
    try:
        a = t.TPMA_OBJECT
        attrs = (a.FIXEDTPM | a.FIXEDPARENT | a.SENSITIVEDATAORIGIN | a.USERWITHAUTH | a.SIGN_ENCRYPT | a.NODA
                 | a.RESTRICTED)
        area = t.TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null", objectAttributes=attrs)
        area.unique.ecc.x = t.TPM2B_ECC_PARAMETER(os.urandom(32))
        h, *_ = esapi.create_primary(None, t.TPM2B_PUBLIC(publicArea=area), t.ESYS_TR.OWNER)
        try:
            persistent = esapi.evict_control(t.ESYS_TR.OWNER, h, handle)
        finally:
            esapi.flush_context(h)
        return E.read_public(esapi, persistent)
    finally:
        esapi.close()


def command(seq: int) -> Command:
    now = time.time_ns()
    return Command("ns=2;s=RollingMill.RollGapCommand", (0.01,), seq, seq, now, now + 500_000_000, MODEL)


def credential(tcti: str, ak_handle: int | None = None) -> tuple[bytes, bytes, bytes, bytes]:
    """(credential CBOR, nonce, a command it signed, the AK PEM) from a tpm-session signer on `tcti`."""
    signer = TpmSessionSigner(tcti, **({"ak_handle": ak_handle} if ak_handle else {}))
    try:
        signer.measure_model(MODEL)
        nonce = os.urandom(32)
        return signer.bind(nonce).to_cbor(), nonce, signer.sign_command(command(100)), signer.device_public_key_pem()
    finally:
        signer.close()


def reseal(path: Path, record: dict, key=None) -> Path:
    """Write `record` with a freshly computed record_sha256 (what someone who knows the format can do)."""
    path.write_text(json.dumps(E.seal_record(record, key), indent=2))
    return path


@pytest.fixture(autouse=True)
def _no_leftover_cli_overrides():
    """`sitsctl deploy` run in process (deploy_in_process) leaves its --tcti in sitsd.config.CLI_OVERRIDES, which
    every later load_config of the session would apply: clear it after each test here."""
    from sitsd import config

    yield
    config.CLI_OVERRIDES.clear()


def record_error(path, **kwargs) -> E.EnrollError:
    with pytest.raises(E.EnrollError) as info:
        E.load_enrollment(path, **kwargs)
    assert info.value.code == "record" and f"enrollment record {path}:" in info.value.reason
    return info.value


@pytest.fixture
def enrolled(swtpm, tmp_path):
    """swtpm's AK at 0x81000002 enrolled with `sitsctl enroll` (EK trusted on first use: swtpm has no EK
    certificate), the record signed by a verifier key."""
    d = tmp_path / "enroll"
    d.mkdir()
    priv, pub = generate_authority(tmp_path / "enroller")
    record = round_trip(swtpm.tcti, d, verify_args=("--signing-key", priv))
    return {"path": d / "record.json", "record": record, "pub": pub, "priv": priv, "dir": d}


# --- the PLC-side library ---------------------------------------------------------------------------------------

def test_enrolled_ak_is_accepted_and_any_other_ak_refused_naming_the_record(swtpm, enrolled):
    path = enrolled["path"]
    enrollment = E.load_enrollment(path, authority=load_authority_public(enrolled["pub"]))
    assert enrollment.signature_checked and enrollment.ek_trust == "none"
    assert enrollment.ak_name == enrolled["record"]["ak_name"]

    data, nonce, cmd, ak_pem = credential(swtpm.tcti)
    assert enrollment.matches(ak_pem)
    session = E.EnrolledSessionVerifier(enrollment, MODEL).accept(data, nonce)
    assert session.verify(cmd).command.sequence == 100

    # a fresh AK in the same TPM: a valid credential (its own key accepts it) but not the enrolled AK
    fresh_ak(swtpm.tcti)
    data, nonce, cmd, other_pem = credential(swtpm.tcti, OTHER_AK)
    assert not enrollment.matches(other_pem)
    SessionVerifier(other_pem, MODEL).accept(data, nonce).verify(cmd)  # genuine, just not enrolled
    with pytest.raises(CredentialError) as info:
        E.EnrolledSessionVerifier(enrollment, MODEL).accept(data, nonce)
    assert info.value.code == "ak"
    assert f"not by the AK enrolled in {path}" in info.value.reason
    assert E.ak_fingerprint(other_pem) in info.value.reason and enrollment.ak_fingerprint in info.value.reason

    # another TPM's AK
    with Swtpm() as other:
        data, nonce, _, _ = credential(other.tcti)
    with pytest.raises(CredentialError) as info:
        E.EnrolledSessionVerifier(enrollment, MODEL).accept(data, nonce)
    assert info.value.code == "ak" and str(path) in info.value.reason

    # the simulator's acceptor: with an enrollment the device key file is not read, not even when it names
    # the other AK (what a compromised host would write there)
    key_file = enrolled["dir"] / "device.pub.pem"
    key_file.write_bytes(other_pem)
    acceptor = SessionAcceptor(key_file, MODEL, enrollment=enrollment)
    data, nonce, cmd, _ = credential(swtpm.tcti)
    assert acceptor(data, nonce)(cmd)[0] == 100
    data, nonce, _, _ = credential(swtpm.tcti, OTHER_AK)
    with pytest.raises(CredentialError, match="not by the AK enrolled in") as info:
        acceptor(data, nonce)
    assert info.value.code == "ak"
    # without an enrollment the same acceptor trusts the key file as found: the gap the enrollment closes
    SessionAcceptor(key_file, MODEL)(data, nonce)


def test_tampered_forged_and_malformed_records_are_refused_saying_what_and_how(swtpm, enrolled, tmp_path):
    record, pub = enrolled["record"], load_authority_public(enrolled["pub"])
    d = tmp_path / "bad"
    d.mkdir()
    good = E.load_enrollment(enrolled["path"])
    # signed, but nobody asked to check it: the key id it names is only claimed
    assert good.signed_by is None and not good.signature_checked and good.trust == "enrolled-unverified"
    assert good.claimed_signed_by == record["signature"]["key_id"]
    assert "signed_by" not in good.describe() and good.describe()["claimed_signed_by"] == good.claimed_signed_by
    checked = E.load_enrollment(enrolled["path"], authority=pub)
    assert checked.signed_by == record["signature"]["key_id"] and checked.trust == "enrolled"
    assert checked.describe()["signed_by"] == checked.signed_by and "claimed_signed_by" not in checked.describe()

    # an edit without recomputing the digest: any field
    for field, value in (("ek_trust", "certificate-chain"), ("ak_public_pem", record["ak_public_pem"].replace(
            record["ak_public_pem"].splitlines()[1][:8], "AAAAAAAA")), ("enrolled_at", "2020-01-01T00:00:00+00:00")):
        path = d / f"edited-{field}.json"
        path.write_text(json.dumps({**record, field: value}))
        err = record_error(path)
        assert "record_sha256 does not match its contents" in err.reason and "restore the original" in err.reason

    # another AK swapped in and the digest recomputed: only the signature catches it
    from attestation.tpm.signer import DEFAULT_KEY_HANDLE, TpmSigner, _tss

    t = _tss()
    other_public = fresh_ak(swtpm.tcti)
    other = E.parse_public(other_public)
    swapped = {**record, "ak_public": base64.b64encode(other_public).decode(), "ak_name": other.name().hex(),
               "ak_public_pem": other.public_key_pem().decode(),
               "activation": {**record["activation"], "ak_name": other.name().hex()}}
    forged = reseal(d / "forged.json", swapped)
    assert E.load_enrollment(forged).ak_name == other.name().hex()  # unsigned and self-consistent: only the file's
    err = record_error(forged, authority=pub)                       # own protection stands against this
    assert "not signed, and a signature by the enrollment key" in err.reason and "--signing-key" in err.reason
    forged_keep_sig = d / "forged-sig.json"
    forged_keep_sig.write_text(json.dumps({**E.seal_record(swapped), "signature": record["signature"]}))
    assert "the signature does not verify" in record_error(forged_keep_sig, authority=pub).reason
    _, stranger = generate_authority(tmp_path / "stranger")
    err = record_error(enrolled["path"], authority=load_authority_public(stranger))
    assert "not by the trusted enrollment key" in err.reason

    # resealed records that do not hold together, or hold a key that is no AK
    signer = TpmSigner(swtpm.tcti)  # the unrestricted password key at 0x81000001
    signer.close()
    esapi = t.ESAPI(swtpm.tcti)
    try:
        device_key = E.read_public(esapi, esapi.tr_from_tpmpublic(DEFAULT_KEY_HANDLE))
    finally:
        esapi.close()
    dk = E.parse_public(device_key)
    not_ak = reseal(d / "not-ak.json", {**record, "ak_public": base64.b64encode(device_key).decode(),
                                       "ak_name": dk.name().hex(), "ak_public_pem": dk.public_key_pem().decode(),
                                       "activation": {**record["activation"], "ak_name": dk.name().hex()}})
    assert "AK refused: " in record_error(not_ak).reason and "not restricted" in record_error(not_ak).reason
    name_mismatch = reseal(d / "name.json", {**record, "ak_public": base64.b64encode(other_public).decode(),
                                             "ak_public_pem": other.public_key_pem().decode()})
    assert "is not the Name of the AK public area" in record_error(name_mismatch).reason
    pem_mismatch = reseal(d / "pem.json", {**record, "ak_public_pem": other.public_key_pem().decode()})
    assert "ak_public_pem is not the key of the AK public area" in record_error(pem_mismatch).reason
    no_activation = reseal(d / "no-act.json", {k: v for k, v in record.items() if k != "activation"})
    assert "field 'activation' is missing" in record_error(no_activation).reason
    not_activated = reseal(d / "not-act.json", {**record, "activation": {**record["activation"], "method": "tofu"}})
    assert "does not say the AK was bound to the EK by credential activation" in record_error(not_activated).reason
    other_ek = reseal(d / "ek.json", {**record, "activation": {**record["activation"], "ek_public_sha256": "00" * 32}})
    assert "encrypted to another EK" in record_error(other_ek).reason

    # not a record at all
    (d / "truncated.json").write_text(json.dumps(record)[:200])
    err = record_error(d / "truncated.json")
    assert "not JSON at line 1 column" in err.reason and "sitsctl enroll --verify" in err.reason
    (d / "v1.json").write_text(json.dumps({**record, "format": "sits-enroll-record/1"}))
    assert "written by an older sitsctl" in record_error(d / "v1.json").reason
    assert "format 'sits-enroll-request/1' is not" in record_error(enrolled["dir"] / "request.json").reason
    assert "cannot read it" in record_error(d / "missing.json").reason
    # the EK trust a reader demands: meaningless without the authority key (ek_trust is an editable field)
    with pytest.raises(ValueError, match="min_ek_trust pinned needs authority: ek_trust is a field"):
        E.load_enrollment(enrolled["path"], min_ek_trust="pinned")
    err = record_error(enrolled["path"], min_ek_trust="pinned", authority=pub)
    assert "ek_trust 'none'" in err.reason and "--ek-ca" in err.reason
    assert E.load_enrollment(enrolled["path"], min_ek_trust="none").ek_trust == "none"

    # the same checks from the command line: sitsctl enroll --check-record and sitsctl plcsim --enrollment
    r = enroll_cli(None, "--check-record", enrolled["path"], "--enrollment-authority", enrolled["pub"])
    assert r.returncode == 0 and "signature verified" in r.stderr, r.stderr
    assert json.loads(r.stdout)["ak_name"] == record["ak_name"]
    r = enroll_cli(None, "--check-record", forged, "--enrollment-authority", enrolled["pub"])
    assert r.returncode == 1 and "REFUSED: enrollment record" in r.stderr and "not signed" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "sitsd.plcsim", "--enrollment", d / "edited-ek_trust.json",
                        "--model-sha256", MODEL.hex(), "--port", "0", "--duration", "1"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode != 0 and "ready" not in r.stdout
    assert f"sitsctl plcsim: --enrollment: enrollment record {d / 'edited-ek_trust.json'}: record_sha256" in r.stderr
    r = subprocess.run([sys.executable, "-m", "sitsd.plcsim", "--enrollment", enrolled["path"], "--trust-key",
                        enrolled["pub"]], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode != 0 and "--enrollment pins the TPM attestation key" in r.stderr


def test_plc_simulator_with_enrollment_over_opc_ua(swtpm, enrolled):
    """The PLC simulator (OPC UA server) given the enrollment: the enrolled AK's credential opens a session, a
    credential of another AK is refused and the refusal names the record."""
    from plc.simulator.server import RollingMillSimulator, SimulatorSettings

    from .plc_session import session_nodes, write

    enrollment = E.load_enrollment(enrolled["path"])

    async def scenario() -> dict:
        sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9", port=0), None,
                                   session_acceptor=SessionAcceptor(None, MODEL, enrollment=enrollment))
        await sim.start()
        seen = {}
        try:
            async with session_nodes(sim.endpoint) as (nonce_node, cred_node, cmd_node):

                async def bind(ak_handle=None):
                    nonce = bytes(await nonce_node.read_value())
                    signer = await asyncio.to_thread(TpmSessionSigner, swtpm.tcti,
                                                     **({"ak_handle": ak_handle} if ak_handle else {}))
                    try:
                        await asyncio.to_thread(signer.measure_model, MODEL)
                        cred = await asyncio.to_thread(lambda: signer.bind(nonce).to_cbor())
                        return cred, signer.sign_command(command(200 if ak_handle else 100))
                    finally:
                        signer.close()

                await asyncio.to_thread(fresh_ak, swtpm.tcti)
                cred, cmd = await bind(OTHER_AK)
                seen["other_ak"] = await write(cred_node, cred)
                seen["other_reject"] = sim.last_reject
                seen["other_cmd"] = await write(cmd_node, cmd)
                cred, cmd = await bind()
                seen["enrolled"] = await write(cred_node, cred)
                seen["enrolled_cmd"] = await write(cmd_node, cmd)
            seen["stats"] = sim.stats()
            return seen
        finally:
            await sim.close()

    seen = asyncio.run(scenario())
    assert not seen["other_ak"] and not seen["other_cmd"]
    assert f"not by the AK enrolled in {enrolled['path']}" in seen["other_reject"]
    assert seen["enrolled"] and seen["enrolled_cmd"]
    assert seen["stats"]["sessions_accepted"] == 1 and seen["stats"]["sessions_rejected"] == 1


# --- sitsctl deploy ----------------------------------------------------------------------------------------------

def test_deploy_pins_the_enrolled_ak_also_into_a_running_daemon(plcsim, swtpm, enrolled, tmp_path, vendor, capsys):
    from ep.session import sha256_file

    from sitsd.control import request

    good = enrolled["path"]
    with Swtpm() as other:  # another TPM, properly enrolled: its record is genuine, but not this device's
        d = tmp_path / "other"
        d.mkdir()
        round_trip(other.tcti, d)
    wrong = d / "record.json"
    audit = tmp_path / "audit"
    model = tmp_path / "release" / "rolling_mill.onnx"
    model.parent.mkdir()
    model.write_bytes(DEMO_MODEL.read_bytes())
    at_model = ("--set", f"model.artifact={model}")

    # a deploy from reset: the TPM's AK against the enrollment
    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *at_model, "--enrollment", wrong)
    assert rc == 1 and out.startswith(f"Verified: [FAIL] ak: the TPM's AK (attestation.ak_handle 0x81000002"), out
    assert f"is not the AK enrolled in {wrong}" in out and not (audit / "deployment.json").exists()
    # the right record, its signature unchecked: it pins the AK, but says it is only as good as its writer
    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *at_model, "--enrollment", good)
    assert rc == 0 and out.startswith("Verified: [OK]"), out + err
    assert "AK: enrolled-unverified (sha256:" in err and "TRUSTED ON FIRST USE" not in err
    assert "WARNING: ENROLLMENT RECORD NOT SIGNATURE-CHECKED" in err and "a compromised host could have written" in err
    assert "--signing-key" in err and "--enrollment-authority" in err and "attestation.enrollment_authority" in err
    assert staged(tmp_path)["ak_trust"] == "enrolled-unverified"
    assert "signed_by" not in staged(tmp_path)["enrollment"]
    # with the enroller's key on the command line: enrolled, no warning
    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *at_model, "--enrollment", good,
                                     "--enrollment-authority", enrolled["pub"])
    assert rc == 0 and out.startswith("Verified: [OK]"), out + err
    assert "AK: enrolled (sha256:" in err and "record signature verified" in err and "WARNING" not in err
    assert staged(tmp_path)["ak_trust"] == "enrolled"
    assert staged(tmp_path)["enrollment"]["ak_name"] == enrolled["record"]["ak_name"]
    assert staged(tmp_path)["enrollment"]["signed_by"] == enrolled["record"]["signature"]["key_id"]
    # the enroller's key given, the record unsigned (its digest recomputed: what a compromised host can do)
    unsigned = reseal(tmp_path / "unsigned.json", {k: v for k, v in json.loads(good.read_text()).items()
                                                   if k != "signature"})
    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *at_model, "--enrollment", unsigned,
                                     "--enrollment-authority", enrolled["pub"])
    assert rc == 1 and "not signed, and a signature by the enrollment key" in out, out

    # the PLC trusts the enrolled AK only (the key file it is also given names another TPM's AK: not used)
    other_ak = tmp_path / "other-ak.pem"
    other_ak.write_text(json.loads(wrong.read_text())["ak_public_pem"])
    endpoint, udp_url, sim = plcsim(other_ak, model_sha256=sha256_file(DEMO_MODEL).hex(), session=True,
                                    extra_args=("--enrollment", str(good)))
    log = tmp_path / "sitsd.log"
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=swtpm.tcti, plc__security="none", model__artifact=model,
                                       attestation__approval=vendor["approval"],
                                       attestation__authority_key=vendor["pub"],
                                       audit__directory=audit, control__socket=tmp_path / "c.sock"),
                            stderr=open(log, "wb"), cwd=REPO)
    try:
        wait_ready(proc, log)  # its session credential was accepted by the enrollment-pinned PLC
        assert "PLC accepted the startup fail-safe command" in log.read_text()

        # a new approved model, deployed live with another device's enrollment: loaded, then undone
        model.write_bytes(tampered_model())
        approval2 = tmp_path / "approval2.json"
        r = cli("policy", "approve", "--authority-key", vendor["key"], "--config", EXAMPLE_CONFIG,
                "--output", approval2, *at_model)
        assert r.returncode == 0, r.stderr
        new_sha, old_sha = hashlib.sha256(tampered_model()).hexdigest(), sha256_file(DEMO_MODEL).hex()
        v2 = {**vendor, "approval": approval2}
        before = (audit / "deployment.json").read_bytes()
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model, "--enrollment", wrong)
        assert rc == 1 and out.startswith("Verified: [FAIL] ak: the running sitsd's AK (attestation.ak_handle "), out
        assert f"is not the AK enrolled in {wrong}" in out and "the running configuration was restored" in out, out
        assert (audit / "deployment.json").read_bytes() == before
        assert request(tmp_path / "c.sock", "status")["model_sha256"] == old_sha

        # a tampered or old record installed on the device: refused before the daemon is asked, never first
        # use, and the error says how to get past it
        installed = audit / "enrollment.json"
        record = json.loads(good.read_text())
        installed.write_text(json.dumps({**record, "ek_trust": "pinned"}))
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model)
        assert rc == 1 and out.startswith(f"Verified: [FAIL] enrollment record {installed}: "
                                          "record_sha256 does not match"), out
        assert f"remove or replace {installed}, or pass --enrollment" in out, out
        installed.write_text(json.dumps({**record, "format": "sits-enroll-record/1"}))
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model)
        assert rc == 1 and "written by an older sitsctl" in out, out
        assert f"remove or replace {installed}, or pass --enrollment" in out, out
        assert request(tmp_path / "c.sock", "status")["model_sha256"] == old_sha

        # the enroller's key in the config (attestation.enrollment_authority) and an unsigned record installed
        # in sitsd's own directory: refused, the daemon is not asked
        at_authority = ("--set", f"attestation.enrollment_authority={enrolled['pub']}")
        reseal(installed, {k: v for k, v in record.items() if k != "signature"})
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model, *at_authority)
        assert rc == 1 and "not signed, and a signature by the enrollment key" in out, out
        assert request(tmp_path / "c.sock", "status")["model_sha256"] == old_sha
        # ... and no record at all: no fallback to trust on first use
        installed.unlink()
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model, *at_authority)
        assert rc == 1 and "attestation.enrollment_authority is set" in out and "no enrollment record" in out, out
        # ... a key other than the enroller's: the signed record is refused
        _, stranger = generate_authority(tmp_path / "stranger")
        shutil.copy(good, installed)
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model,
                                         "--set", f"attestation.enrollment_authority={stranger}")
        assert rc == 1 and "not by the trusted enrollment key" in out, out
        assert request(tmp_path / "c.sock", "status")["model_sha256"] == old_sha

        # the device's own signed record at <audit.directory>/enrollment.json, checked with the configured key
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model, *at_authority)
        assert rc == 0 and out.strip().endswith(f"ModelSHA256={new_sha} | PolicySig=valid"), out + err
        assert "applied: model" in err and "AK: enrolled (sha256:" in err and str(installed) in err
        assert "record signature verified" in err and "WARNING" not in err, err
        assert staged(tmp_path)["ak_trust"] == "enrolled"
        assert request(tmp_path / "c.sock", "status")["model_sha256"] == new_sha
        # the same record without the key: used, but enrolled-unverified, with the warning
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model)
        assert rc == 0, out + err
        assert "AK: enrolled-unverified (sha256:" in err and "a compromised host could have written" in err
        assert staged(tmp_path)["ak_trust"] == "enrolled-unverified"

        # no enrollment and no earlier deployment: today's behaviour, with the warning that says what it was
        (audit / "enrollment.json").unlink()
        (audit / "deployment.json").unlink()
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model)
        assert rc == 0 and out.startswith("Verified: [OK]"), out + err
        assert "WARNING: AK TRUSTED ON FIRST USE: no enrollment record" in err
        assert staged(tmp_path)["ak_trust"] == "first-use"
        rc, out, err = deploy_in_process(capsys, tmp_path, v2, swtpm.tcti, *at_model)
        assert rc == 0 and "checked against the AK of the previous deployment" in err, out + err
        assert staged(tmp_path)["ak_trust"] == "previous-deployment"
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert sim.poll() is None  # the PLC ran throughout


# --- records that must not get as far as a credential ---------------------------------------------------------

def rsa_ak_public(tcti: str) -> bytes:
    """A restricted RSA 2048 signing key made by the TPM (a valid AK by its attributes, but not P-256)."""
    from attestation.tpm.signer import _tss

    t = _tss()
    esapi = t.ESAPI(tcti)
    try:
        a = t.TPMA_OBJECT
        attrs = (a.FIXEDTPM | a.FIXEDPARENT | a.SENSITIVEDATAORIGIN | a.USERWITHAUTH | a.SIGN_ENCRYPT | a.NODA
                 | a.RESTRICTED)
        area = t.TPMT_PUBLIC.parse("rsa2048:rsassa-sha256:null", objectAttributes=attrs)
        h, pub, *_ = esapi.create_primary(None, t.TPM2B_PUBLIC(publicArea=area), t.ESYS_TR.OWNER)
        esapi.flush_context(h)
        return bytes(pub.publicArea.marshal())
    finally:
        esapi.close()


def test_records_with_odd_json_digest_key_types_or_keys_are_refused_cleanly(swtpm, enrolled, tmp_path):
    record = enrolled["record"]
    d = tmp_path / "odd"
    d.mkdir()

    # a key twice in one object: json.loads would keep the last, another reader the first
    text = json.dumps(record)
    dup = d / "dup.json"
    dup.write_text(text[:-1] + f', "ek_trust": "certificate-chain"}}')
    err = record_error(dup)
    assert "key 'ek_trust' appears twice in one JSON object" in err.reason
    dup_nested = d / "dup-nested.json"
    dup_nested.write_text(text.replace('"activation": {', '"activation": {"method": "tofu", ', 1))
    assert "key 'method' appears twice" in record_error(dup_nested).reason

    # a digest that is not hex (non-ASCII): an EnrollError, never a TypeError from hmac.compare_digest
    for bad in ("é" * 64, "zz" * 32, "00" * 31):
        path = d / "digest.json"
        path.write_text(json.dumps({**record, "record_sha256": bad}))
        assert "record_sha256 is not 64 hex digits" in record_error(path).reason

    # an AK public key PEM of a type cryptography does not know: refused as a mismatch, not a crash
    lines = record["ak_public_pem"].splitlines()
    der = base64.b64decode("".join(lines[1:-1]))
    unknown = der.replace(bytes.fromhex("2a8648ce3d0201"), bytes.fromhex("2a8648ce3d0209"))  # id-ecPublicKey -> ?
    assert unknown != der
    pem = "-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(unknown).decode() + "\n-----END PUBLIC KEY-----\n"
    assert E.ak_fingerprint(pem) == "(not a public key)"
    odd_pem = reseal(d / "pem.json", {**record, "ak_public_pem": pem})
    assert "ak_public_pem is not the key of the AK public area" in record_error(odd_pem).reason
    assert not E.load_enrollment(enrolled["path"]).matches(pem)

    # an RSA AK made by the TPM: restricted, fixedTPM, but no quote of it could ever be checked (P-256 only),
    # so the record is refused when it is loaded (plcsim at start), not at every credential
    rsa_public = rsa_ak_public(swtpm.tcti)
    rsa = E.parse_public(rsa_public)
    E.check_ak(rsa)  # a fine AK by its attributes
    rsa_record = reseal(d / "rsa.json", {**record, "ak_public": base64.b64encode(rsa_public).decode(),
                                         "ak_name": rsa.name().hex(), "ak_public_pem": rsa.public_key_pem().decode(),
                                         "activation": {**record["activation"], "ak_name": rsa.name().hex()}})
    err = record_error(rsa_record)
    assert "AK refused: it is an RSA 2048 key" in err.reason and "P-256" in err.reason
    r = subprocess.run([sys.executable, "-m", "sitsd.plcsim", "--enrollment", rsa_record, "--model-sha256",
                        MODEL.hex(), "--port", "0", "--duration", "1"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode != 0 and "ready" not in r.stdout and "it is an RSA 2048 key" in r.stderr, r.stderr


def test_check_record_and_plcsim_options_on_the_command_line(swtpm, enrolled, tmp_path):
    path, pub = enrolled["path"], enrolled["pub"]
    _, stranger = generate_authority(tmp_path / "stranger")

    # --check-record: a missing file cannot be checked (exit 2, as its help says), not "refused" (1)
    r = enroll_cli(None, "--check-record", tmp_path / "missing.json")
    assert r.returncode == 2 and "cannot read" in r.stderr and "REFUSED" not in r.stderr, r.stderr
    # --require-ek-trust above none without the authority key means nothing: refused before reading the record
    r = enroll_cli(None, "--check-record", path, "--require-ek-trust", "pinned")
    assert r.returncode == 2 and "--require-ek-trust pinned needs --enrollment-authority" in r.stderr, r.stderr
    r = enroll_cli(None, "--check-record", path, "--require-ek-trust", "pinned", "--enrollment-authority", pub)
    assert r.returncode == 1 and "ek_trust 'none'" in r.stderr, r.stderr
    r = enroll_cli(None, "--check-record", path, "--require-ek-trust", "none")
    assert r.returncode == 0, r.stderr
    # without the key the signature is only claimed, and the summary says so
    assert "NOT checked" in r.stderr and "claimed_signed_by" in json.loads(r.stdout)
    assert "signed_by" not in json.loads(r.stdout)
    r = enroll_cli(None, "--check-record", path, "--enrollment-authority", pub)
    assert r.returncode == 0 and "signature verified" in r.stderr
    assert json.loads(r.stdout)["signed_by"] == enrolled["record"]["signature"]["key_id"]

    # options of another step are refused (exit 2), never silently ignored
    for args, option, wanted in (
            (("--challenge", enrolled["dir"] / "request.json", "--signing-key", enrolled["priv"]), "--signing-key",
             "--verify"),
            (("--verify", tmp_path / "response.json", "--trust-unverified-ek"), "--trust-unverified-ek",
             "--challenge"),
            (("--verify", tmp_path / "response.json", "--ek-ca", pub), "--ek-ca", "--challenge"),
            (("--challenge", enrolled["dir"] / "request.json", "--enrollment-authority", pub),
             "--enrollment-authority", "--check-record"),
            (("--activate", tmp_path / "challenge.json", "--require-ek-trust", "pinned"), "--require-ek-trust",
             "--check-record"),
            (("--check-record", path, "--signing-key", enrolled["priv"]), "--signing-key", "--verify"),
            (("-o", tmp_path / "request.json", "--enrollment-authority", pub), "--enrollment-authority",
             "--check-record")):
        r = enroll_cli(swtpm.tcti, *args)
        assert r.returncode == 2 and f"{option} goes with {wanted}" in r.stderr, (args, r.stderr)
    assert not (tmp_path / "request.json").exists()

    # sitsctl plcsim: the same options
    def plcsim(*args):
        return subprocess.run([sys.executable, "-m", "sitsd.plcsim", "--enrollment", path, "--model-sha256",
                               MODEL.hex(), "--port", "0", "--udp-url", "opc.udp://127.0.0.1:9", "--duration", "0.5",
                               *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=120)

    r = plcsim("--require-ek-trust", "pinned")
    assert r.returncode != 0 and "ready" not in r.stdout
    assert "sitsctl plcsim: --require-ek-trust pinned needs --enrollment-authority" in r.stderr, r.stderr
    r = plcsim("--require-ek-trust", "certificate-unchecked", "--enrollment-authority", pub)
    assert r.returncode != 0 and "ready" not in r.stdout and "ek_trust 'none'" in r.stderr, r.stderr
    r = plcsim("--enrollment-authority", stranger)
    assert r.returncode != 0 and "not by the trusted enrollment key" in r.stderr, r.stderr
    r = plcsim("--enrollment-authority", pub, "--require-ek-trust", "none")
    assert r.returncode == 0, r.stderr
    ready = json.loads(r.stdout.splitlines()[0])
    assert ready["ready"] and ready["enrollment"]["signature_checked"]
    assert ready["enrollment"]["signed_by"] == enrolled["record"]["signature"]["key_id"]
    assert "record signature verified" in r.stderr and "WARNING" not in r.stderr, r.stderr
    r = plcsim()
    assert r.returncode == 0, r.stderr
    ready = json.loads(r.stdout.splitlines()[0])
    assert not ready["enrollment"]["signature_checked"] and "signed_by" not in ready["enrollment"]
    assert "WARNING: the record's signature was NOT checked" in r.stderr and "--enrollment-authority" in r.stderr
