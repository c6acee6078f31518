"""attestation.certify_session on swtpm: the PolicyAuthorize-bound device key certifies the session key only
while the measurement PCR holds the approved model and modules; a verifier given that key accepts nothing else."""
import dataclasses
import hashlib
import os

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.measurement import TpmPcr, event_digest
from attestation.session import (Certification, CredentialError, SessionCredential, SessionVerifier,
                                 TpmSessionSigner, certification_digest)
from attestation.tpm.policy import PolicyError, approve, public_pem, verify_device_signature

from .test_deploy import vendor  # noqa: F401 (fixture)
from .test_session import MODEL, command, every_truncation_and_changed_byte_is_refused, rejected

APPROVED = [("model", "rolling_mill.onnx", MODEL.hex()),
            ("module:pre", "pre_filter", hashlib.sha256(b"pre").hexdigest())]
TAMPERED = [("model", "rolling_mill.onnx", hashlib.sha256(b"approved model, one weight patched").hexdigest()),
            APPROVED[1]]


@pytest.fixture
def authority():
    return ec.generate_private_key(ec.SECP256R1())


def started(swtpm, events) -> TpmSessionSigner:
    """A session signer with `events` measured into PCR 23 from its reset, as sitsd does at start."""
    signer = TpmSessionSigner(swtpm.tcti)
    signer.measure_model(MODEL)
    remeasure(signer, events)
    return signer


def remeasure(signer: TpmSessionSigner, events) -> None:
    pcr = TpmPcr(signer._open_esapi, 23, signer._lock)
    pcr.reset()
    for e in events:
        pcr.extend(event_digest(*e))


def refusal(signer: TpmSessionSigner, device_pem: bytes, cred: SessionCredential, nonce: bytes) -> CredentialError:
    """Why a verifier that requires certification by `device_pem` refuses `cred`."""
    return rejected(SessionVerifier(signer.device_public_key_pem(), MODEL, trusted_device_key_pem=device_pem),
                    cred.to_cbor(), nonce)


def test_certified_session_key_is_accepted_by_a_verifier_that_requires_it(swtpm, authority):
    approval = approve(authority, 23, APPROVED)
    signer = started(swtpm, APPROVED)
    try:
        cert = signer.certify(approval, authority.public_key())
        assert signer.device_key_created
        assert cert.approved_pcr_value.hex() == approval.pcr_value
        assert verify_device_signature(cert.device_public_pem,
                                       certification_digest(signer.public_key_pem(), cert.approved_pcr_value),
                                       cert.signature)
        nonce = os.urandom(32)
        cred = signer.bind(nonce)
        assert cred.certification == cert
        data = cred.to_cbor()
        assert SessionCredential.from_cbor(data) == cred  # keys 10..12 round-trip canonically
        verifier = SessionVerifier(signer.device_public_key_pem(), MODEL, trusted_device_key_pem=cert.device_public_pem,
                                   approved_pcr_value=bytes.fromhex(approval.pcr_value)).accept(data, nonce)
        assert verifier.verify(signer.sign_command(command(1))).command.sequence == 1
        # a verifier that does not ask for it accepts the certified credential too
        SessionVerifier(signer.device_public_key_pem(), MODEL).accept(data, nonce)
        # certification_active False (a hot swap away from the certified set): bind leaves it out
        signer.certification_active = lambda: False
        nonce2 = os.urandom(32)
        plain = signer.bind(nonce2)
        assert plain.certification is None
        err = refusal(signer, cert.device_public_pem, plain, nonce2)
        assert err.code == "uncertified" and "not certified" in err.reason
    finally:
        signer.close()


def test_the_tpm_refuses_to_certify_for_a_tampered_model(swtpm, authority):
    approval = approve(authority, 23, APPROVED)
    signer = started(swtpm, TAMPERED)
    try:
        with pytest.raises(PolicyError) as info:
            signer.certify(approval, authority.public_key())
        assert info.value.code == "refused"
        assert "not in the state the approval covers" in info.value.reason
        assert signer.certification is None
        nonce = os.urandom(32)
        cred = signer.bind(nonce)
        assert cred.certification is None
        from attestation.tpm.policy import key_public_pem, load_or_create_policy_key

        with signer._lock:
            key, created = load_or_create_policy_key(signer._open_esapi(), signer.device_key_handle,
                                                     authority.public_key())
            device_pem = key_public_pem(signer._open_esapi(), key)
        assert not created  # certify made it before the TPM refused the policy
        assert refusal(signer, device_pem, cred, nonce).code == "uncertified"
        # the modules in another order: another PCR value, refused as well
        remeasure(signer, list(reversed(APPROVED)))
        with pytest.raises(PolicyError, match="refused the device key"):
            signer.certify(approval, authority.public_key())
    finally:
        signer.close()


def test_forged_spliced_or_foreign_certifications_are_refused(swtpm, authority):
    approval = approve(authority, 23, APPROVED)
    signer = started(swtpm, APPROVED)
    try:
        cert = signer.certify(approval, authority.public_key())
        nonce = os.urandom(32)
        cred = signer.bind(nonce)
        ak = signer.device_public_key_pem()

        def verifier(**kw):
            return SessionVerifier(ak, MODEL, **{"trusted_device_key_pem": cert.device_public_pem, **kw})

        # another device key (software, not the TPM's) signs the session key: not the trusted device key
        other = ec.generate_private_key(ec.SECP256R1())
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric.utils import Prehashed, decode_dss_signature

        digest = certification_digest(cred.session_public_pem, cert.approved_pcr_value)
        r, s = decode_dss_signature(other.sign(digest, ec.ECDSA(Prehashed(hashes.SHA256()))))
        forged = Certification(public_pem(other.public_key()), cert.approved_pcr_value,
                               r.to_bytes(32, "big") + s.to_bytes(32, "big"))
        err = rejected(verifier(), dataclasses.replace(cred, certification=forged).to_cbor(), nonce)
        assert err.code == "device-key"
        # the trusted device key's signature, but over another approved value (edited after signing)
        edited = Certification(cert.device_public_pem, hashlib.sha256(b"x").digest(), cert.signature)
        assert rejected(verifier(), dataclasses.replace(cred, certification=edited).to_cbor(),
                        nonce).code == "certification"
        # a certification copied from another session (another session key) onto this credential
        signer.close()  # swtpm serves one connection at a time
        signer2 = started(swtpm, APPROVED)
        cert2 = signer2.certify(approval, authority.public_key())
        assert cert2.device_public_pem == cert.device_public_pem  # one device key, a new session key
        nonce2 = os.urandom(32)
        cred2 = signer2.bind(nonce2)
        spliced = dataclasses.replace(cred2, certification=cert)
        assert refusal(signer2, cert.device_public_pem, spliced, nonce2).code == "certification"
        # a verifier pinned to another approval
        err = rejected(SessionVerifier(signer2.device_public_key_pem(), MODEL,
                                       trusted_device_key_pem=cert.device_public_pem,
                                       approved_pcr_value=hashlib.sha256(b"other approval").digest()),
                       cred2.to_cbor(), nonce2)
        assert err.code == "approval"
        signer2.close()
    finally:
        signer.close()


def test_credential_with_only_part_of_the_certification_is_malformed(swtpm, authority):
    import cbor2

    approval = approve(authority, 23, APPROVED)
    signer = started(swtpm, APPROVED)
    try:
        signer.certify(approval, authority.public_key())
        nonce = os.urandom(32)
        fields = cbor2.loads(signer.bind(nonce).to_cbor())
        for missing in (10, 11, 12):
            partial = cbor2.dumps({k: v for k, v in fields.items() if k != missing})
            with pytest.raises(CredentialError) as info:
                SessionCredential.from_cbor(partial)
            assert info.value.code == "malformed"
        short = cbor2.dumps({**fields, 12: fields[12][:63]})
        with pytest.raises(CredentialError, match="device key signature"):
            SessionCredential.from_cbor(short)
    finally:
        signer.close()


def test_every_changed_byte_of_a_certified_credential_is_refused_cleanly(swtpm, authority):
    approval = approve(authority, 23, APPROVED)
    signer = started(swtpm, APPROVED)
    cert = signer.certify(approval, authority.public_key())
    nonce = os.urandom(32)
    data = signer.bind(nonce).to_cbor()
    signer.close()
    verifier = SessionVerifier(SessionCredential.from_cbor(data).ak_public_pem, MODEL,
                               trusted_device_key_pem=cert.device_public_pem)
    verifier.accept(data, nonce)
    every_truncation_and_changed_byte_is_refused(verifier, data, nonce)


def test_a_verifier_pinned_to_an_approval_accepts_only_certifications_under_it(swtpm, authority):
    approval = approve(authority, 23, APPROVED)
    other_modules = approve(authority, 23, [APPROVED[0], ("module:pre", "pre_filter", hashlib.sha256(b"v2").hexdigest())])
    signer = started(swtpm, APPROVED)
    try:
        cert = signer.certify(approval, authority.public_key())
        nonce = os.urandom(32)
        data = signer.bind(nonce).to_cbor()
        ak, device = signer.device_public_key_pem(), cert.device_public_pem
        pinned = SessionVerifier(ak, MODEL, trusted_device_key_pem=device, approval=approval,
                                 authority=authority.public_key())
        assert pinned.approved_pcr_value.hex() == approval.pcr_value
        pinned.accept(data, nonce)
        # the same authority approved other modules for this model once: a verifier pinned to that refuses
        stale = SessionVerifier(ak, MODEL, trusted_device_key_pem=device, approval=other_modules,
                                authority=authority.public_key())
        assert rejected(stale, data, nonce).code == "approval"
        other = ec.generate_private_key(ec.SECP256R1())
        with pytest.raises(PolicyError):  # an approval the trusted authority did not sign
            SessionVerifier(ak, MODEL, trusted_device_key_pem=device, approval=approve(other, 23, APPROVED),
                            authority=authority.public_key())
    finally:
        signer.close()


def test_a_certified_credential_also_carries_the_measurement_log_and_the_config_measured_after_it(swtpm, authority):
    """certify_session certifies model and modules; the config, measured after the certification, is proven by the
    version 2 credential's PCR 23 log (keys 13..15 next to the certification's 10..12)."""
    import cbor2

    from attestation.measurement import MeasurementLog

    config = hashlib.sha256(b"config bytes").hexdigest()
    approval = approve(authority, 23, APPROVED)
    signer = TpmSessionSigner(swtpm.tcti)
    try:
        signer.measure_model(MODEL)
        tpm = TpmPcr(signer._open_esapi, 23, signer._lock)
        tpm.reset()
        log = MeasurementLog(None, 23, tpm)
        for e in APPROVED:
            log.record(*e)
        cert = signer.certify(approval, authority.public_key())
        log.record("config", "rolling-mill.yaml", config)
        nonce = os.urandom(32)
        cred = signer.bind(nonce, log)
        data = cred.to_cbor()
        assert sorted(cbor2.loads(data)) == list(range(1, 16)) and cbor2.loads(data)[1] == 2
        assert SessionCredential.from_cbor(data) == cred
        session = SessionVerifier(signer.device_public_key_pem(), MODEL,
                                  trusted_device_key_pem=cert.device_public_pem, approval=approval, authority=authority.public_key(),
                                  expected_modules={"pre": APPROVED[1][2]}, expected_config_sha256=config
                                  ).accept(data, nonce)
        assert session.measured.config == ("rolling-mill.yaml", config)
        assert session.measured.modules == {"pre": ("pre_filter", APPROVED[1][2])}
        nonce = os.urandom(32)
        data = signer.bind(nonce, log).to_cbor()
        err = rejected(SessionVerifier(signer.device_public_key_pem(), MODEL,
                                       trusted_device_key_pem=cert.device_public_pem,
                                       expected_config_sha256=hashlib.sha256(b"other").hexdigest()), data, nonce)
        assert err.code == "config"
    finally:
        signer.close()


def test_verifier_arguments_are_checked():
    ak = public_pem(ec.generate_private_key(ec.SECP256R1()).public_key())
    with pytest.raises(ValueError, match="needs trusted_device_key_pem"):
        SessionVerifier(ak, MODEL, approved_pcr_value=bytes(32))
    from cryptography.hazmat.primitives.asymmetric import ed25519

    ed = public_pem(ed25519.Ed25519PrivateKey.generate().public_key())
    with pytest.raises(ValueError, match="P-256"):
        SessionVerifier(ak, MODEL, trusted_device_key_pem=ed)
    authority = ec.generate_private_key(ec.SECP256R1())
    approval = approve(authority, 23, TAMPERED)  # approves another model than MODEL
    with pytest.raises(ValueError, match="is for model"):
        SessionVerifier(ak, MODEL, trusted_device_key_pem=ak, approval=approval, authority=authority.public_key())
    with pytest.raises(ValueError, match="needs its authority"):
        SessionVerifier(ak, MODEL, trusted_device_key_pem=ak, approval=approval)


# --- sitsd with attestation.certify_session, against the PLC simulator that requires it ----------------------

def test_sitsd_starts_only_with_the_approved_model_and_the_plc_accepts_only_certified_keys(plcsim, swtpm, tmp_path,
                                                                                           vendor):
    import signal
    import subprocess
    import time

    from sitsd.control import request
    from sitsd.errors import ControlError

    from pathlib import Path

    from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO, example_config_data, sim_stats, sitsd_args, wait_ready
    from .test_deploy import tampered_model

    audit = tmp_path / "audit"
    model_sha = hashlib.sha256(DEMO_MODEL.read_bytes()).hexdigest()
    endpoint, udp_url, sim = plcsim(audit / "device.pub.pem", model_sha256=model_sha, session=True,
                                    extra_args=("--trust-policy-key", str(audit / "device-policy.pub.pem"),
                                                "--approval", str(vendor["approval"]),
                                                "--authority-pub", str(vendor["pub"])))
    common = dict(attestation__tcti=swtpm.tcti, plc__security="none", attestation__certify_session="true",
                  attestation__approval=vendor["approval"], attestation__authority_key=vendor["pub"],
                  audit__directory=audit, control__socket=tmp_path / "c.sock")
    log = tmp_path / "sitsd.log"
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url, **common),
                            stderr=open(log, "wb"), cwd=REPO)
    try:
        wait_ready(proc, log)
        deadline = time.monotonic() + 30
        while request(tmp_path / "c.sock", "status")["counters"]["commands"] < 50 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert request(tmp_path / "c.sock", "status")["session_certified"] is True
        text = log.read_text()
        assert "session key certified by the TPM" in text
        assert text.index("session key certified by the TPM") < text.index("session key bound to the TPM quote")
        assert '"certified": true' in text or "certified=True" in text, text[-3000:]
        # hot swaps to anything but the certified set are refused: the certified session key would sign for them
        swapped = tmp_path / "swap" / "rolling_mill.onnx"
        swapped.parent.mkdir()
        swapped.write_bytes(tampered_model())
        with pytest.raises(ControlError, match="certify_session is on"):
            request(tmp_path / "c.sock", "update", timeout_s=60, model=str(swapped))
        post = next(m for m in example_config_data()["modules"] if m["stage"] == "post")
        module = tmp_path / "swap" / Path(post["path"]).name
        source = (REPO / "examples" / post["path"])
        text = source.read_text().rstrip()
        assert text.endswith(")")
        module.write_text(text[:-1] + "\n  (func $unused_v2 (result i32) i32.const 2))\n")  # other code, same ABI
        golden = source.with_name(source.stem + ".golden.json")
        (module.parent / golden.name).write_bytes(golden.read_bytes())
        with pytest.raises(ControlError, match="certify_session is on"):
            request(tmp_path / "c.sock", "update", timeout_s=60, module=str(module), name=post["name"])
        status = request(tmp_path / "c.sock", "status")
        assert status["session_certified"] is True and status["model_sha256"] == model_sha
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    stats = sim_stats(sim)
    assert stats["accepted"] >= 50 and stats["rejected"] == 0, stats

    # a model the authority did not approve: the TPM refuses to certify, sitsd stops before the PLC
    modified = tmp_path / "rolling_mill.onnx"
    modified.write_bytes(tampered_model())
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, model__artifact=modified, plc__endpoint=endpoint,
                                  transport__url=udp_url, **common),
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "the TPM refused to certify the session key" in r.stderr, r.stderr[-2000:]
    assert "TPM_RC_VALUE" in r.stderr or "TPM_RC_POLICY_FAIL" in r.stderr
    assert "session key bound" not in r.stderr and "PLC accepted" not in r.stderr

    # the PLC that requires a certified key refuses a sitsd that does not certify it
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                  **{**common, "attestation__certify_session": "false"}),
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "the PLC refused the session credential" in r.stderr, r.stderr[-2000:]
    assert "not certified" in sim_stats(sim).get("last_reject", ""), "no reject reason"
