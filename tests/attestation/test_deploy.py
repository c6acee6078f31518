"""sitsctl deploy on swtpm: the acceptance command, every [FAIL] path, the record's checks, verify-on-boot,
--tcti / SITS_TCTI, the EK certificate, and no dictionary-attack lockout across unclean restarts."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from attestation.deploy import DeployError, verify_record
from attestation.measurement import event_digest, extend, replay_file
from attestation.tpm import Swtpm
from attestation.tpm.policy import load_authority_public

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO, sitsd_args, wait_ready

OK = re.compile(r"^Verified: \[OK\] DeviceID=TPM2:0x81000001 \| ModelSHA256=([0-9a-f]{64}) \| PolicySig=valid$")


def sitsctl(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "sitsd.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def vendor(tmp_path):
    """An authority key pair and its approval of the example config's model and modules, made with sitsctl."""
    auth = tmp_path / "authority"
    assert sitsctl("policy", "keygen", "--output", auth).returncode == 0
    approval = tmp_path / "approval.json"
    r = sitsctl("policy", "approve", "--authority-key", auth / "authority.key.pem", "--config", EXAMPLE_CONFIG,
                "--output", approval)
    assert r.returncode == 0, r.stderr
    return {"approval": approval, "pub": auth / "authority.pub.pem", "key": auth / "authority.key.pem"}


def deploy_args(tmp_path, vendor, tcti=None, *extra):
    args = ["deploy", "--config", EXAMPLE_CONFIG, "--attestation-mode", "tpm2", "--verify-on-boot", "true",
            "--approval", vendor["approval"], "--authority-pub", vendor["pub"],
            "--set", f"audit.directory={tmp_path / 'audit'}", "--set", f"control.socket={tmp_path / 'c.sock'}"]
    if tcti:
        args += ["--tcti", tcti]
    return [*args, *extra]


def deploy_in_process(capsys, tmp_path, vendor, tcti, *extra):
    from sitsd.cli import main

    rc = main([str(a) for a in deploy_args(tmp_path, vendor, tcti, *extra)])
    out, err = capsys.readouterr()
    return rc, out, err


def tampered_model() -> bytes:
    """The demo model with one more ModelProto.doc_string (field 6): still loads, another SHA-256."""
    return DEMO_MODEL.read_bytes() + b"\x32\x08tampered"


def staged(tmp_path) -> dict:
    return json.loads((tmp_path / "audit" / "deployment.json").read_text())


def test_acceptance_ok_with_the_real_sha256_then_fail_with_a_modified_artifact(tmp_path, vendor):
    sw = Swtpm(tcp=True).start()  # the acceptance command's TCTI form: swtpm:host=127.0.0.1,port=P
    try:
        r = sitsctl(*deploy_args(tmp_path, vendor, sw.tcti))
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert len(lines) == 1, r.stdout
        match = OK.match(lines[0])
        assert match, lines[0]
        assert match.group(1) == hashlib.sha256(DEMO_MODEL.read_bytes()).hexdigest()
        assert "EK certificate: none" in r.stderr  # swtpm without swtpm_setup --create-ek-cert has none
        record = staged(tmp_path)
        verify_record(record, nonce=bytes.fromhex(record["nonce"]), authority=load_authority_public(vendor["pub"]))
        # a fresh TPM: the device identity key DeviceID names, the policy-bound device key and the AK provisioned
        assert record["keys_created"] == ["device identity key", "device key", "attestation key"]
        assert record["identity_key_handle"] == 0x81000001 and "BEGIN PUBLIC KEY" in record["identity_public_pem"]
        assert replay_file(tmp_path / "audit" / "deployment-measurements.jsonl").hex() == record["pcr_value"]
        assert [e["kind"] for e in record["events"]] == ["model", "module:pre", "module:post", "config", "approval"]
        from tpm2_pytss import ESAPI

        from attestation.tpm.quote import read_pcrs

        esapi = ESAPI(sw.tcti)
        try:
            assert read_pcrs(esapi, [23])[23].hex() == record["pcr_value"]  # the log explains the TPM's PCR
        finally:
            esapi.close()

        before = (tmp_path / "audit" / "deployment.json").read_bytes()
        modified = tmp_path / "rolling_mill.onnx"
        modified.write_bytes(tampered_model())
        r = sitsctl(*deploy_args(tmp_path, vendor, sw.tcti, "--set", f"model.artifact={modified}"))
        assert r.returncode != 0
        assert r.stdout.splitlines() == [r.stdout.strip()] and r.stdout.startswith("Verified: [FAIL] ")
        assert hashlib.sha256(modified.read_bytes()).hexdigest() in r.stdout and "not the approved" in r.stdout
        assert (tmp_path / "audit" / "deployment.json").read_bytes() == before  # the staged deployment stays
    finally:
        sw.stop()


def test_the_acceptance_command_as_written_uses_the_committed_approval(tmp_path):
    """examples/ carries the vendor's approval of the demo model and modules and the vendor's public key
    (its private key was destroyed after signing): the literal command verifies. This test fails when
    the model or a module changes without a new approval (sitsctl policy approve)."""
    sw = Swtpm(tcp=True).start()
    try:
        host_port = sw.tcti.split(":", 1)[1]
        r = sitsctl("deploy", "--config", EXAMPLE_CONFIG, "--attestation-mode", "tpm2", "--verify-on-boot", "true",
                    "--tcti", f"swtpm:{host_port}", "--set", f"audit.directory={tmp_path / 'audit'}",
                    "--set", f"control.socket={tmp_path / 'c.sock'}")
        assert r.returncode == 0, r.stdout + r.stderr
        match = OK.match(r.stdout.strip())
        assert match and match.group(1) == hashlib.sha256(DEMO_MODEL.read_bytes()).hexdigest(), r.stdout
    finally:
        sw.stop()


@pytest.mark.parametrize("case, expected", [
    ("other-authority", "PolicySig=invalid: approval is signed by authority"),
    ("no-approval", "no approval: pass --approval FILE"),
    ("pinned", "differs from model.sha256"),
    ("bad-config", "is invalid: timing.cycle_ms"),
    ("no-tpm", "TPM: cannot open TCTI"),
    ("foreign-key", "device key: the key at 0x81000003 is not bound to authority"),
    ("foreign-identity", "device identity key: the key at 0x81000001 (attestation.key_handle, the password key "
                         "DeviceID names) is restricted (an attestation key"),
    ("handles-collide", "key_handle and device_key_handle are both 0x81000001"),
    ("certify-other-approval", "attestation.certify_session is on: sitsd certifies its session key with the "
                               "config's approval"),
])
def test_fail_paths_print_one_fail_line_and_exit_non_zero(swtpm, tmp_path, vendor, capsys, case, expected):
    from attestation.tpm.policy import approve, load_authority_private

    extra, tcti = [], swtpm.tcti
    if case == "other-authority":
        other = tmp_path / "other"
        assert sitsctl("policy", "keygen", "--output", other).returncode == 0
        forged = approve(load_authority_private(other / "authority.key.pem"), 23,
                         json.loads(vendor["approval"].read_text())["events"])
        vendor = {**vendor, "approval": tmp_path / "forged.json"}
        vendor["approval"].write_text(forged.to_json())
    elif case == "no-approval":
        from sitsd.cli import main

        rc = main(["deploy", "--config", str(EXAMPLE_CONFIG), "--attestation-mode", "tpm2", "--tcti", tcti,
                   "--set", f"audit.directory={tmp_path / 'audit'}", "--set", "attestation.approval=",
                   "--set", "attestation.authority_key="])
        out = capsys.readouterr().out
        assert rc == 1 and out.startswith("Verified: [FAIL] ") and expected in out
        return
    elif case == "pinned":
        extra = ["--set", "model.sha256=" + "ab" * 32]
    elif case == "bad-config":
        extra = ["--set", "timing.cycle_ms=-1"]
    elif case == "no-tpm":
        tcti = f"swtpm:path={tmp_path}/absent.sock"
    elif case == "foreign-key":  # a password key (tpm-direct's kind) already at the device key's handle
        from attestation.tpm import TpmSigner

        TpmSigner(swtpm.tcti, 0x81000003).close()
    elif case == "foreign-identity":  # an AK where DeviceID's password key belongs
        from tpm2_pytss import ESAPI

        from attestation.tpm.quote import load_or_create_ak

        esapi = ESAPI(swtpm.tcti)
        try:
            load_or_create_ak(esapi, 0x81000001)
        finally:
            esapi.close()
    elif case == "handles-collide":  # the policy-bound device key asked for at tpm-direct's handle
        extra = ["--set", "attestation.device_key_handle=0x81000001"]
    elif case == "certify-other-approval":  # the config's (committed) approval is not the one deployed
        extra = ["--set", "attestation.certify_session=true"]
    rc, out, _ = deploy_in_process(capsys, tmp_path, vendor, tcti, *extra)
    assert rc == 1
    assert len(out.splitlines()) == 1 and out.startswith("Verified: [FAIL] "), out
    assert expected in out, out
    assert not (tmp_path / "audit" / "deployment.json").exists()


def _rechain(record):
    """Recompute digests and PCR values of edited events so the log itself is consistent again."""
    value = bytes.fromhex(record["initial"])
    for e in record["events"]:
        digest = event_digest(e["kind"], e["name"], e["sha256"])
        value = extend(value, digest)
        e["digest"], e["pcr_after"] = digest.hex(), value.hex()
    record["pcr_value"] = value.hex()


def test_record_checks_nonce_pcr_event_log_ak_and_device_signature(swtpm, tmp_path, vendor, capsys):
    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti)
    assert rc == 0, out + err
    record = staged(tmp_path)
    nonce = bytes.fromhex(record["nonce"])
    authority = load_authority_public(vendor["pub"])
    verify_record(record, nonce=nonce, authority=authority)

    def fails(rec, code, match=None, **kw):
        with pytest.raises(DeployError) as info:
            verify_record(rec, **{"nonce": nonce, "authority": authority, **kw})
        assert info.value.code == code, info.value.reason
        if match:
            assert match in info.value.reason

    fresh = os.urandom(32)
    fails(record, "nonce", nonce=fresh)  # a verifier that asked with another nonce
    fails({**record, "nonce": fresh.hex()}, "nonce", "extraData", nonce=fresh)  # ... even if the record claims it

    edited = json.loads(json.dumps(record))
    edited["events"][3]["sha256"] = hashlib.sha256(b"another config").hexdigest()  # event-log tampering
    fails(edited, "event-log", "does not replay")

    wrong_pcr = json.loads(json.dumps(record))
    wrong_pcr["events"] = wrong_pcr["events"][:-1]  # drop the approval event: a consistent log, not the quoted PCR
    _rechain(wrong_pcr)
    fails(wrong_pcr, "pcr", "pcrDigest")

    other_model = json.loads(json.dumps(record))
    other_model["events"][0]["sha256"] = hashlib.sha256(b"model v2").hexdigest()
    _rechain(other_model)
    fails(other_model, "model", "differ from the approval")

    from cryptography.hazmat.primitives.asymmetric import ec

    from attestation.tpm.policy import public_pem

    fails(record, "quote", "does not verify", ak_public_pem=public_pem(ec.generate_private_key(ec.SECP256R1())
                                                                         .public_key()))
    forged = {**record, "device_signature": "00" * 63 + "01"}
    fails(forged, "device")


def test_software_and_none_modes(tmp_path, vendor, capsys):
    from sitsd.cli import main

    base = ["deploy", "--config", str(EXAMPLE_CONFIG), "--approval", str(vendor["approval"]), "--authority-pub",
            str(vendor["pub"]), "--set", f"audit.directory={tmp_path / 'audit'}",
            "--set", f"control.socket={tmp_path / 'c.sock'}"]
    sha = hashlib.sha256(DEMO_MODEL.read_bytes()).hexdigest()
    assert main([*base, "--attestation-mode", "software"]) == 0
    out, err = capsys.readouterr()
    assert out == f"Verified: [OK] DeviceID=software | ModelSHA256={sha} | PolicySig=valid\n"
    assert "WARNING: --attestation-mode software" in err and "Development only" in err
    assert staged(tmp_path)["mode"] == "software"
    before = (tmp_path / "audit" / "deployment.json").read_bytes()
    assert main([*base, "--attestation-mode", "none"]) == 0
    assert capsys.readouterr().out == f"Verified: [OK] DeviceID=none | ModelSHA256={sha} | PolicySig=valid\n"
    assert (tmp_path / "audit" / "deployment.json").read_bytes() == before  # checks only: nothing staged
    assert main([*base, "--attestation-mode", "none", "--verify-on-boot", "true"]) == 1
    assert "needs a measured deployment" in capsys.readouterr().out


def test_global_tcti_and_sits_tcti_reach_every_config_load(swtpm, tmp_path, vendor, capsys, monkeypatch):
    from sitsd import config
    from sitsd.cli import _take_global_tcti
    from sitsd.config import load_config

    try:
        assert _take_global_tcti(["status", "--tcti", "swtpm:path=/a", "--config", "x"]) == ["status", "--config", "x"]
        assert load_config(EXAMPLE_CONFIG).attestation.tcti == "swtpm:path=/a"
        assert load_config(EXAMPLE_CONFIG, {"attestation.tcti": "mine"}).attestation.tcti == "mine"  # --set wins
        monkeypatch.setenv("SITS_TCTI", "swtpm:path=/env")
        assert _take_global_tcti(["check-config"]) == ["check-config"]
        assert load_config(EXAMPLE_CONFIG).attestation.tcti == "swtpm:path=/env"
        assert _take_global_tcti(["--tcti=swtpm:path=/flag", "x"]) == ["x"]  # the flag beats the environment
        assert load_config(EXAMPLE_CONFIG).attestation.tcti == "swtpm:path=/flag"
        monkeypatch.delenv("SITS_TCTI")
        _take_global_tcti([])
        assert load_config(EXAMPLE_CONFIG).attestation.tcti == "device:/dev/tpmrm0"  # nothing left behind
        # the real thing: deploy reaches swtpm through SITS_TCTI alone
        monkeypatch.setenv("SITS_TCTI", swtpm.tcti)
        rc, out, err = deploy_in_process(capsys, tmp_path, vendor, None)
        assert rc == 0 and OK.match(out.strip()), out + err
    finally:
        config.CLI_OVERRIDES.clear()


def test_ek_certificate_is_reported_when_the_tpm_has_one(tmp_path, vendor, capsys):
    if shutil.which("swtpm_setup") is None or shutil.which("swtpm_localca") is None:
        pytest.fail("swtpm_setup/swtpm_localca missing: apt-get install swtpm-tools")
    ca, state = tmp_path / "ca", tmp_path / "tpm"
    ca.mkdir()
    state.mkdir()
    (tmp_path / "localca.conf").write_text(f"statedir = {ca}\nsigningkey = {ca}/signkey.pem\n"
                                           f"issuercert = {ca}/issuercert.pem\ncertserial = {ca}/certserial\n")
    (tmp_path / "setup.conf").write_text(f"create_certs_tool = {shutil.which('swtpm_localca')}\n"
                                         f"create_certs_tool_config = {tmp_path / 'localca.conf'}\n"
                                         "create_certs_tool_options = /etc/swtpm-localca.options\n"
                                         "active_pcr_banks = sha256\n")
    with open(tmp_path / "setup.log", "wb") as log:  # a file, never an unread pipe
        r = subprocess.run(["swtpm_setup", "--tpm2", "--tpmstate", str(state), "--create-ek-cert", "--config",
                            str(tmp_path / "setup.conf"), "--overwrite"], stdout=log, stderr=log, timeout=60)
    assert r.returncode == 0, (tmp_path / "setup.log").read_text()
    sw = Swtpm(state).start()
    try:
        rc, out, err = deploy_in_process(capsys, tmp_path, vendor, sw.tcti)
    finally:
        sw.stop()
    assert rc == 0, out + err
    assert "EK certificate: RSA 2048 at 0x01c00002 (issuer CN=swtpm-localca" in err
    from cryptography import x509

    ek = {c["index"]: c for c in staged(tmp_path)["ek_certificates"]}
    der = bytes.fromhex(ek["0x01c00002"]["der"])
    cert = x509.load_der_x509_certificate(der[:4 + int.from_bytes(der[2:4], "big")])
    assert cert.issuer.rfc4514_string() == "CN=swtpm-localca"


def test_verify_on_boot_refuses_a_model_other_than_the_deployed_one(swtpm, tmp_path, vendor, capsys):
    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti)
    assert rc == 0, out + err
    modified = tmp_path / "rolling_mill.onnx"
    modified.write_bytes(tampered_model())
    common = dict(attestation__tcti=swtpm.tcti, plc__security="none", plc__endpoint="opc.tcp://127.0.0.1:9/none",
                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock")
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, model__artifact=modified, **common),
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1
    assert "verify-on-boot: what sitsd loaded differs from the verified deployment" in r.stderr, r.stderr[-2000:]
    assert "cannot connect to the PLC" not in r.stderr  # refused before anything went towards the PLC
    # a forged record: the same events in "software" mode (no quote to check), or without its approval
    record_file = tmp_path / "audit" / "deployment.json"
    genuine = json.loads(record_file.read_text())
    for forged, expected in (({**genuine, "mode": "software"}, "made in 'software' mode, this daemon measures "
                              "into a TPM"),
                             ({k: v for k, v in genuine.items() if k != "approval"}, "carries no approval")):
        record_file.write_text(json.dumps(forged))
        r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, **common), capture_output=True, text=True, timeout=120,
                           cwd=REPO)
        assert r.returncode == 1 and expected in r.stderr, r.stderr[-2000:]
    record_file.write_text(json.dumps(genuine))
    # without any staged record, attestation.verify_on_boot: true refuses as well
    (tmp_path / "audit" / "deployment.json").unlink()
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, attestation__verify_on_boot="true", **common),
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1 and "no staged deployment record" in r.stderr, r.stderr[-2000:]


def test_verify_on_boot_start_then_deploy_loads_into_the_running_daemon(plcsim, swtpm, tmp_path, vendor, capsys):
    """Deploy, start sitsd with verify-on-boot, then deploy into it live: the same files (nothing to do), a
    new approved model (hot swap, quoted by the daemon), and an old approval for the new model (refused)."""
    from ep.session import sha256_file

    from sitsd.control import request

    model = tmp_path / "release" / "rolling_mill.onnx"  # the same name: the name is part of the measurement
    model.parent.mkdir()
    model.write_bytes(DEMO_MODEL.read_bytes())
    at_model = ("--set", f"model.artifact={model}")
    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *at_model)
    assert rc == 0, out + err
    ak = tmp_path / "ak.pem"
    ak.write_text(staged(tmp_path)["ak_public_pem"])  # the deployment's AK is the one the PLC trusts
    endpoint, udp_url, _ = plcsim(ak, model_sha256=sha256_file(DEMO_MODEL).hex(), session=True)
    log = tmp_path / "sitsd.log"
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=swtpm.tcti, plc__security="none", model__artifact=model,
                                       # this test's vendor, not the one examples/approval was signed by
                                       attestation__approval=vendor["approval"],
                                       attestation__authority_key=vendor["pub"],
                                       audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                            stderr=open(log, "wb"), cwd=REPO)
    try:
        wait_ready(proc, log)
        text = log.read_text()
        assert "deployment verified on boot" in text
        assert text.index("deployment verified on boot") < text.index("PLC accepted the startup fail-safe command")

        rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *at_model)  # same files, live
        assert rc == 0 and OK.match(out.strip()), out + err
        assert "loaded into the running sitsd (applied: nothing, already running)" in err
        record = staged(tmp_path)
        assert record["live"] and record["events"][-1]["kind"] == "approval"

        model.write_bytes(tampered_model())  # a new model release at the same path ...
        approval2 = tmp_path / "approval2.json"
        r = sitsctl("policy", "approve", "--authority-key", vendor["key"], "--config", EXAMPLE_CONFIG,
                    "--output", approval2, *at_model)
        assert r.returncode == 0, r.stderr
        new_sha = hashlib.sha256(tampered_model()).hexdigest()
        before = (tmp_path / "audit" / "deployment.json").read_bytes()
        rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *at_model)  # ... old approval
        assert rc == 1 and "not the approved" in out, out + err
        assert (tmp_path / "audit" / "deployment.json").read_bytes() == before
        assert request(tmp_path / "c.sock", "status")["model_sha256"] == hashlib.sha256(
            DEMO_MODEL.read_bytes()).hexdigest()  # refused before the daemon was asked: the old model runs
        rc, out, err = deploy_in_process(capsys, tmp_path, {**vendor, "approval": approval2}, swtpm.tcti, *at_model)
        assert rc == 0 and out.strip() == (f"Verified: [OK] DeviceID=TPM2:0x81000001 | ModelSHA256={new_sha} | "
                                           "PolicySig=valid"), out + err
        assert "applied: model" in err
        assert request(tmp_path / "c.sock", "status")["model_sha256"] == new_sha
        record = staged(tmp_path)
        verify_record(record, nonce=bytes.fromhex(record["nonce"]), authority=load_authority_public(vendor["pub"]),
                      ak_public_pem=ak.read_bytes())
        assert record["boot_events"][0] == ["model", "rolling_mill.onnx", new_sha]
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        # the next start verifies against the live record (a PLC that expects the new model this time)
        endpoint, udp_url, _ = plcsim(ak, model_sha256=new_sha, session=True)
        log2 = tmp_path / "sitsd2.log"
        proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                           attestation__tcti=swtpm.tcti, plc__security="none", model__artifact=model,
                                           attestation__approval=vendor["approval"],
                                           attestation__authority_key=vendor["pub"],
                                           audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                                stderr=open(log2, "wb"), cwd=REPO)
        wait_ready(proc, log2)
        assert "deployment verified on boot" in log2.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def persistent_keys(tcti) -> dict:
    """{handle: (objectAttributes, authPolicy, public PEM)} of the persistent objects in the TPM."""
    from tpm2_pytss import ESAPI, TPM2_CAP, TPM2_HT

    esapi = ESAPI(tcti)
    try:
        _, data = esapi.get_capability(TPM2_CAP.HANDLES, TPM2_HT.PERSISTENT << 24, 16)
        out = {}
        for handle in [int(h) for h in data.data.handles]:
            pub, _, _ = esapi.read_public(esapi.tr_from_tpmpublic(handle))
            out[handle] = (int(pub.publicArea.objectAttributes), bytes(pub.publicArea.authPolicy), pub.to_pem())
        return out
    finally:
        esapi.close()


def test_tpm_direct_deploys_and_its_daemon_starts_on_the_same_tpm(plcsim, swtpm, tmp_path, vendor, capsys):
    """A box that has run tpm-direct (its password key at key_handle 0x81000001) deploys without evicting
    anything: the deployment's policy-bound device key goes to device_key_handle 0x81000003. Then sitsd starts
    with signing tpm-direct and verify-on-boot on that TPM, signs with the password key the PLC trusts, and takes
    a live deployment; both keys stay what they were."""
    from tpm2_pytss import TPMA_OBJECT

    from attestation.tpm import TpmSigner
    from attestation.tpm.policy import key_auth_policy
    from sitsd.control import request

    signer = TpmSigner(swtpm.tcti)  # tpm-direct ran here before: its key is at 0x81000001
    password_pem = signer.public_key_pem()
    signer.close()
    direct = ("--set", "attestation.signing=tpm-direct")
    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *direct)
    assert rc == 0 and OK.match(out.strip()), out + err
    record = staged(tmp_path)
    assert record["device_id"] == "TPM2:0x81000001" and record["device_key_handle"] == 0x81000003
    assert record["identity_key_handle"] == 0x81000001
    # the password key (the device identity, tpm-direct's key) existed: found and named, not created again
    assert record["keys_created"] == ["device key", "attestation key"]
    assert record["identity_public_pem"].encode() == password_pem
    verify_record(record, nonce=bytes.fromhex(record["nonce"]), authority=load_authority_public(vendor["pub"]))
    keys = persistent_keys(swtpm.tcti)
    assert sorted(keys) == [0x81000001, 0x81000002, 0x81000003]
    attrs, policy, pem = keys[0x81000001]
    assert attrs & TPMA_OBJECT.USERWITHAUTH and policy == b"" and pem == password_pem
    attrs, policy, pem = keys[0x81000003]
    assert not attrs & TPMA_OBJECT.USERWITHAUTH and policy == key_auth_policy(load_authority_public(vendor["pub"]))
    assert pem.decode() == record["device_public_pem"] != password_pem.decode()

    (tmp_path / "device.pem").write_bytes(password_pem)
    endpoint, udp_url, sim = plcsim(tmp_path / "device.pem")  # the PLC trusts the tpm-direct key
    log = tmp_path / "sitsd.log"
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=swtpm.tcti, attestation__signing="tpm-direct",
                                       plc__security="none", attestation__approval=vendor["approval"],
                                       attestation__authority_key=vendor["pub"],
                                       audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                            stderr=open(log, "wb"), cwd=REPO)
    try:
        wait_ready(proc, log)
        text = log.read_text()
        assert "deployment verified on boot" in text
        assert text.index("deployment verified on boot") < text.index("PLC accepted the startup fail-safe command")
        assert request(tmp_path / "c.sock", "status")["signer"] == "tpm"

        rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti, *direct)  # live, into tpm-direct
        assert rc == 0 and OK.match(out.strip()), out + err
        assert "loaded into the running sitsd (applied: nothing, already running)" in err
        record = staged(tmp_path)
        assert record["live"] and record["device_id"] == "TPM2:0x81000001"
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        sim.stdin.write("stats\n")
        sim.stdin.flush()
        stats = json.loads(sim.stdout.readline())["stats"]
        assert stats["accepted"] > 0 and stats["rejected"] == 0, stats  # signed by the password key at 0x81000001
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert persistent_keys(swtpm.tcti) == keys  # neither key was replaced or evicted


CLIENT = """
import sys, hashlib
from tpm2_pytss import ESAPI
from attestation.tpm.policy import Approval, load_authority_public, load_or_create_policy_key, policy_sign
e = ESAPI(sys.argv[1])
authority = load_authority_public(sys.argv[2])
approval = Approval.load(sys.argv[3])
key, _ = load_or_create_policy_key(e, 0x81000003, authority)
from tpm2_pytss import ESYS_TR
from attestation.measurement import event_digest
from attestation.tpm.quote import extend_pcr
e.pcr_reset(ESYS_TR.PCR23)  # back to the approved state: the deployment measured config and approval after it
for event in approval.events:
    extend_pcr(e, 23, event_digest(*event))
policy_sign(e, key, approval, authority, bytes(32))
print("signing", flush=True)
while True:
    try:
        policy_sign(e, key, approval, authority, bytes(32))
    except Exception:
        pass
"""


def test_no_dictionary_attack_lockout_across_five_unclean_restarts(tmp_path, vendor, capsys):
    """Each round: deploy (provisions or reuses the keys), a process signing with the device key in a loop
    is SIGKILLed, then swtpm itself is SIGKILLed (no TPM2_Shutdown), and restarted on the same state."""
    from tpm2_pytss import ESAPI, TPM2_CAP, TPM2_PT

    state = tmp_path / "tpm"
    sw = Swtpm(state)
    try:
        for round_ in range(5):
            sw.start()
            rc, out, err = deploy_in_process(capsys, tmp_path, vendor, sw.tcti)
            assert rc == 0, f"round {round_}: {out}{err}"
            with open(tmp_path / "client.log", "wb") as client_err:
                client = subprocess.Popen([sys.executable, "-c", CLIENT, sw.tcti, str(vendor["pub"]),
                                           str(vendor["approval"])], stdout=subprocess.PIPE, stderr=client_err,
                                          cwd=REPO, text=True)
                assert client.stdout.readline().strip() == "signing", (tmp_path / "client.log").read_text()
                client.kill()
                client.wait()
                client.stdout.close()
            sw.kill()
        sw.start()
        rc, out, err = deploy_in_process(capsys, tmp_path, vendor, sw.tcti)
        assert rc == 0 and OK.match(out.strip()), out + err
        assert staged(tmp_path)["keys_created"] == []  # the same keys survived every unclean restart
        esapi = ESAPI(sw.tcti)
        try:
            _, data = esapi.get_capability(TPM2_CAP.TPM_PROPERTIES, TPM2_PT.LOCKOUT_COUNTER, 1)
            assert data.data.tpmProperties[0].value == 0
        finally:
            esapi.close()
    finally:
        sw.stop()
        shutil.rmtree(state, ignore_errors=True)


STREAMING_CONFIG = REPO / "examples" / "rolling-mill-streaming.yaml"


def test_streaming_config_is_approved_deployed_and_verified_on_boot(swtpm, tmp_path, capsys):
    """model.kind streaming (built from its seed, no artifact file): `sitsctl policy approve` and `sitsctl deploy`
    measure the built graph's SHA-256 under the runner's name; sitsd's verify-on-boot accepts that deployment and
    refuses the same config with another seed (other weights)."""
    from sitsd.cli import main
    from sitsd.config import load_config
    from sitsd.model import model_sha256

    auth = tmp_path / "authority"
    approval = tmp_path / "stream.approval.json"
    assert main(["policy", "keygen", "--output", str(auth)]) == 0
    assert main(["policy", "approve", "--authority-key", str(auth / "authority.key.pem"), "--config",
                 str(STREAMING_CONFIG), "--output", str(approval)]) == 0
    capsys.readouterr()
    sha = model_sha256(load_config(STREAMING_CONFIG))
    assert json.loads(approval.read_text())["model_sha256"] == sha
    rc = main(["deploy", "--config", str(STREAMING_CONFIG), "--attestation-mode", "tpm2", "--verify-on-boot", "true",
               "--tcti", swtpm.tcti, "--approval", str(approval), "--authority-pub", str(auth / "authority.pub.pem"),
               "--set", f"audit.directory={tmp_path / 'audit'}", "--set", f"control.socket={tmp_path / 'c.sock'}"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert OK.match(out.splitlines()[0]).group(1) == sha
    assert ("model", "streaming-transformer-seed0", sha) in [(e["kind"], e["name"], e["sha256"])
                                                             for e in staged(tmp_path)["events"]]
    # verify-on-boot checks the record's approval with the authority's key: the daemon is given it
    common = dict(attestation__tcti=swtpm.tcti, plc__security="none", plc__endpoint="opc.tcp://127.0.0.1:9/none",
                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock",
                  attestation__approval=approval, attestation__authority_key=auth / "authority.pub.pem")
    r = subprocess.run(sitsd_args(STREAMING_CONFIG, **common), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "deployment verified on boot" in r.stderr, r.stderr[-2000:]
    assert "cannot connect to the PLC" in r.stderr  # verified, then on towards the (absent) PLC
    r = subprocess.run(sitsd_args(STREAMING_CONFIG, model__streaming__seed=1, **common), capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1
    assert "verify-on-boot: what sitsd loaded differs from the verified deployment" in r.stderr, r.stderr[-2000:]


def test_verify_on_boot_survives_kill_9_and_restart(plcsim, swtpm, tmp_path, vendor, capsys):
    """systemd restarts sitsd after a crash: each start resets the measurement PCR and measures from zero, so
    the restarted daemon verifies against the same deployment (before, the first start's extensions stayed in
    PCR 23 and every restart was refused until a reboot or a new deploy)."""
    from ep.session import sha256_file

    rc, out, err = deploy_in_process(capsys, tmp_path, vendor, swtpm.tcti)
    assert rc == 0, out + err
    ak = tmp_path / "ak.pem"
    ak.write_text(staged(tmp_path)["ak_public_pem"])
    endpoint, udp_url, _ = plcsim(ak, model_sha256=sha256_file(DEMO_MODEL).hex(), session=True)
    args = sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url, attestation__tcti=swtpm.tcti,
                      plc__security="none", attestation__approval=vendor["approval"],
                      attestation__authority_key=vendor["pub"], audit__directory=tmp_path / "audit",
                      control__socket=tmp_path / "c.sock")
    for start in range(3):
        log = tmp_path / f"sitsd-{start}.log"
        proc = subprocess.Popen(args, stderr=open(log, "wb"), cwd=REPO)
        try:
            wait_ready(proc, log)
            assert "deployment verified on boot" in log.read_text(), log.read_text()[-2000:]
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
