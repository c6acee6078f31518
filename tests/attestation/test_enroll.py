"""AK enrollment by credential activation (attestation/tpm/enroll.py, sitsctl enroll) against a real swtpm:
the Python MakeCredential and the TPM's own both activate; the wrong AK, another EK and tampered blobs fail
with clear errors; the sitsctl round trip as subprocesses; the EK certificate chain of an swtpm provisioned
by swtpm_setup --create-ek-cert with a local CA."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.tpm import Swtpm, load_or_create_ak, quote, verify_quote
from attestation.tpm import enroll as E
from attestation.tpm.quote import ak_public_pem
from attestation.tpm.signer import DEFAULT_KEY_HANDLE, TpmSigner, _tss

REPO = Path(__file__).resolve().parents[2]
SECRET = bytes(range(32))


@pytest.fixture
def esapi(swtpm):
    t = _tss()
    e = t.ESAPI(swtpm.tcti)
    try:
        yield e
        # every transient object (EKs, loaded publics) and session was flushed by the code under test
        _, data = e.get_capability(t.TPM2_CAP.HANDLES, t.TPM2_HT.TRANSIENT << 24)
        handles = data.data.handles
        assert [int(handles[i]) for i in range(len(handles))] == []
        _, data = e.get_capability(t.TPM2_CAP.HANDLES, t.TPM2_HT.LOADED_SESSION << 24)  # HMAC and policy
        sessions = data.data.handles
        assert [int(sessions[i]) for i in range(len(sessions))] == []
    finally:
        e.close()


def tpm_make_credential(esapi, ek_public: bytes, ak_name: bytes, secret: bytes) -> tuple[bytes, bytes]:
    """TPM2_MakeCredential by the TPM itself, with the EK loaded as a public-only object."""
    t = _tss()
    area, _ = t.TPMT_PUBLIC.unmarshal(ek_public)
    h = esapi.load_external(t.TPM2B_PUBLIC(publicArea=area), None, t.ESYS_TR.NULL)
    try:
        blob, enc = esapi.make_credential(h, t.TPM2B_DIGEST(secret), t.TPM2B_NAME(ak_name))
        return bytes(blob), bytes(enc)
    finally:
        esapi.flush_context(h)


# --- names and parsing ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["ecc", "rsa"])
def test_names_computed_from_public_areas_equal_the_tpms(esapi, kind):
    t = _tss()
    ak, _ = load_or_create_ak(esapi)
    _, tpm_name, _ = esapi.read_public(ak)
    ak_public = E.read_public(esapi, ak)
    assert E.object_name(ak_public) == bytes(tpm_name)
    assert E.parse_public(ak_public).public_key_pem() == ak_public_pem(esapi, ak)
    with E.open_ek(esapi, kind) as (ek, ek_public):
        _, ek_name, _ = esapi.read_public(ek)
        area = E.parse_public(ek_public)
        assert E.object_name(ek_public) == bytes(ek_name) == area.name()
        assert area.kind == kind and E._same_template(area, E.parse_public(E.ek_template(kind)))
        pytss_area, _ = t.TPMT_PUBLIC.unmarshal(ek_public)
        assert bytes(pytss_area.get_name()) == area.name()
    with E.open_ek(esapi, kind) as (_, again):
        assert again == ek_public  # a primary from the endorsement seed: the same EK every time


def test_parse_public_refuses_what_is_not_a_tpmt_public():
    raw = E.ek_template("ecc")
    assert E.parse_public(raw).curve == 0x0003
    with pytest.raises(E.EnrollError, match="truncated at byte"):
        E.parse_public(raw[:-3])
    with pytest.raises(E.EnrollError, match="3 bytes after the TPMT_PUBLIC"):
        E.parse_public(raw + b"abc")
    with pytest.raises(E.EnrollError, match="neither RSA"):
        E.parse_public(b"\x00\x08" + raw[2:])  # a keyed-hash object
    with pytest.raises(E.EnrollError, match="nameAlg 0x0099"):
        E.object_name(raw[:2] + b"\x00\x99" + raw[4:])


def test_kdfs_agree_with_tpm2_pytss_also_for_multi_block_output():
    """An independent implementation (tpm2-pytss on `cryptography`'s KBKDFHMAC and ConcatKDFHash)."""
    from tpm2_pytss.internal.crypto import _kdfa, kdfe

    key, u, v = b"k" * 32, b"context-u", b"context-v"
    for bits in (128, 256, 520):
        assert E.kdfa(E.ALG_SHA256, key, b"STORAGE", u, v, bits) == _kdfa(E.ALG_SHA256, key, b"STORAGE", u, v, bits)
        # ConcatKDF's otherinfo holds the label with its NUL
        assert E.kdfe(E.ALG_SHA256, key, b"IDENTITY", u, v, bits) == kdfe(E.ALG_SHA256, key, b"IDENTITY\0", u, v,
                                                                           bits)
    assert len(E.kdfa(E.ALG_SHA256, key, b"STORAGE", u, v, 300)) == 38
    # the label is NUL-terminated exactly once, whether or not the caller wrote the NUL
    assert E.kdfa(E.ALG_SHA256, key, b"INTEGRITY\0", b"", b"", 256) == E.kdfa(E.ALG_SHA256, key, b"INTEGRITY",
                                                                              b"", b"", 256)


# --- credential activation against the TPM -------------------------------------------------------

@pytest.mark.parametrize("kind", ["ecc", "rsa"])
def test_python_and_tpm_make_credential_both_activate(esapi, kind):
    ak, _ = load_or_create_ak(esapi)
    ak_name = E.object_name(E.read_public(esapi, ak))
    with E.open_ek(esapi, kind) as (ek, ek_public):
        blob, enc = E.make_credential(ek_public, ak_name, SECRET)
        assert E.activate_credential(esapi, ak, ek, blob, enc) == SECRET
        tpm_blob, tpm_enc = tpm_make_credential(esapi, ek_public, ak_name, SECRET[:20])
        assert E.activate_credential(esapi, ak, ek, tpm_blob, tpm_enc) == SECRET[:20]
        # same structure sizes as the TPM's: TPM2B_DIGEST(HMAC) || encIdentity; RSA 256 bytes / ECC point
        assert len(blob) == len(tpm_make_credential(esapi, ek_public, ak_name, SECRET)[0]) == 2 + 32 + 2 + 32
        assert len(enc) == len(tpm_enc) == (256 if kind == "rsa" else 2 + 32 + 2 + 32)
        # a fresh seed each time: the same secret never yields the same challenge
        assert E.make_credential(ek_public, ak_name, SECRET) != (blob, enc)


def test_wrong_ak_fails_to_activate_with_a_clear_error(esapi, swtpm):
    signer = TpmSigner(swtpm.tcti)  # the unrestricted device key at 0x81000001: another Name than the AK's
    signer.close()
    ak, _ = load_or_create_ak(esapi)
    device_key = esapi.tr_from_tpmpublic(DEFAULT_KEY_HANDLE)
    ak_name = E.object_name(E.read_public(esapi, ak))
    key_name = E.object_name(E.read_public(esapi, device_key))
    assert ak_name != key_name
    with E.open_ek(esapi, "ecc") as (ek, ek_public):
        blob, enc = E.make_credential(ek_public, ak_name, SECRET)
        with pytest.raises(E.EnrollError, match="integrity HMAC does not verify: it was made for another AK name") as e:
            E.activate_credential(esapi, device_key, ek, blob, enc)
        assert e.value.code == "integrity"
        # the TPM's own credential, too, activates only for the object it names
        blob, enc = tpm_make_credential(esapi, ek_public, key_name, SECRET)
        with pytest.raises(E.EnrollError, match="integrity"):
            E.activate_credential(esapi, ak, ek, blob, enc)
        assert E.activate_credential(esapi, device_key, ek, blob, enc) == SECRET
    # and the verifier never makes a credential for such a key: it is no AK
    with pytest.raises(E.EnrollError, match="AK refused: .*not restricted") as e:
        E.check_ak(E.parse_public(E.read_public(esapi, device_key)))
    assert e.value.code == "ak"


def test_tampered_blob_or_secret_fails_with_a_clear_error(esapi):
    ak, _ = load_or_create_ak(esapi)
    ak_name = E.object_name(E.read_public(esapi, ak))
    with E.open_ek(esapi, "ecc") as (ek, ek_public):
        blob, enc = E.make_credential(ek_public, ak_name, SECRET)
        for where in (2, 20, len(blob) - 1):  # outer HMAC, encIdentity
            bad = bytearray(blob)
            bad[where] ^= 0x01
            with pytest.raises(E.EnrollError, match="integrity HMAC does not verify.*altered") as e:
                E.activate_credential(esapi, ak, ek, bytes(bad), enc)
            assert e.value.code == "integrity"
        # another ephemeral point: a different seed (or no point on the curve at all)
        other = ec.generate_private_key(ec.SECP256R1()).public_key().public_numbers()
        point = b"\x00\x20" + other.x.to_bytes(32, "big") + b"\x00\x20" + other.y.to_bytes(32, "big")
        with pytest.raises(E.EnrollError, match="integrity HMAC does not verify"):
            E.activate_credential(esapi, ak, ek, blob, point)
        off_curve = bytearray(enc)
        off_curve[-1] ^= 0x01
        with pytest.raises(E.EnrollError, match="another TPM's EK") as e:
            E.activate_credential(esapi, ak, ek, blob, bytes(off_curve))
        assert e.value.code == "integrity"
        assert E.activate_credential(esapi, ak, ek, blob, enc) == SECRET  # the untouched one still works


def test_credential_for_another_ek_fails(esapi):
    ak, _ = load_or_create_ak(esapi)
    ak_name = E.object_name(E.read_public(esapi, ak))
    # another TPM's EK: the default template with another P-256 key in its unique field
    n = ec.generate_private_key(ec.SECP256R1()).public_key().public_numbers()
    template = E.ek_template("ecc")
    other_ek = template[:-68] + b"\x00\x20" + n.x.to_bytes(32, "big") + b"\x00\x20" + n.y.to_bytes(32, "big")
    blob, enc = E.make_credential(other_ek, ak_name, SECRET)
    with E.open_ek(esapi, "ecc") as (ek, _):
        with pytest.raises(E.EnrollError, match="another TPM's EK"):
            E.activate_credential(esapi, ak, ek, blob, enc)
    with E.open_ek(esapi, "rsa") as (rsa_ek, rsa_public):
        blob, enc = E.make_credential(rsa_public, ak_name, SECRET)
    with E.open_ek(esapi, "ecc") as (ek, _):  # an RSA-encrypted seed offered to the ECC EK
        with pytest.raises(E.EnrollError, match="another EK type|another TPM's EK"):
            E.activate_credential(esapi, ak, ek, blob, enc)


def test_verifier_refuses_unfit_aks_and_eks_saying_why(esapi):
    ak, _ = load_or_create_ak(esapi)
    raw = E.read_public(esapi, ak)
    E.check_ak(E.parse_public(raw))
    attrs = int.from_bytes(raw[4:8], "big")
    for clear, words in ((E.RESTRICTED, "not restricted"), (E.FIXED_TPM, "not fixedTPM"),
                         (E.FIXED_PARENT, "not fixedParent")):
        changed = raw[:4] + (attrs & ~clear).to_bytes(4, "big") + raw[8:]
        with pytest.raises(E.EnrollError, match=f"AK refused: .*{words}"):
            E.check_ak(E.parse_public(changed))
    with pytest.raises(E.EnrollError, match="decrypt is set"):
        E.check_ak(E.parse_public(raw[:4] + (attrs | E.DECRYPT).to_bytes(4, "big") + raw[8:]))
    with pytest.raises(E.EnrollError, match="an EK is a restricted decryption key") as e:
        E.make_credential(raw, E.object_name(raw), SECRET)  # the AK is no EK: it signs
    assert e.value.code == "ek"
    with pytest.raises(ValueError, match="1..32"):
        E.make_credential(E.ek_template("ecc")[:-68] + raw[-68:], E.object_name(raw), b"x" * 33)


# --- sitsctl enroll as subprocesses --------------------------------------------------------------

def sitsctl(tcti: str | None, *args, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SITS_TCTI"}
    if tcti:
        env["SITS_TCTI"] = tcti
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "sitsd.cli", "enroll", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def round_trip(tcti: str, d: Path, *request_args, challenge_args=("--trust-unverified-ek",), verify_args=()) -> dict:
    r = sitsctl(tcti, "-o", d / "request.json", *request_args)
    assert r.returncode == 0, r.stderr
    r = sitsctl(None, "--challenge", d / "request.json", "-o", d / "challenge.json", "--pending",
                d / "pending.json", *challenge_args)
    assert r.returncode == 0, r.stderr
    assert (d / "pending.json").stat().st_mode & 0o077 == 0  # the kept secret is the verifier's alone
    assert json.loads((d / "pending.json").read_text())["secret"] not in (d / "challenge.json").read_text()
    r = sitsctl(tcti, "--activate", d / "challenge.json", "-o", d / "response.json")
    assert r.returncode == 0, r.stderr
    r = sitsctl(None, "--verify", d / "response.json", "--pending", d / "pending.json", "-o", d / "record.json",
                *verify_args)
    assert r.returncode == 0, r.stderr
    assert "OK: AK" in r.stderr
    return json.loads((d / "record.json").read_text())


def test_sitsctl_enroll_round_trip_and_the_record_verifies_quotes(swtpm, tmp_path):
    started = time.perf_counter()
    record = round_trip(swtpm.tcti, tmp_path)
    print(f"sitsctl enroll round trip (4 processes): {time.perf_counter() - started:.2f} s")
    assert record["format"] == "sits-enroll-record/2" and record["ek_trust"] == "none"
    assert record["activation"]["method"] == "TPM2_ActivateCredential"
    assert record["activation"]["ak_name"] == record["ak_name"] and "signature" not in record
    assert E.load_enrollment(tmp_path / "record.json").ak_name == record["ak_name"]  # what the PLC side checks
    assert record["ek_certificate_sha256"] is None and record["ak_handle"] == "0x81000002"
    assert not (tmp_path / "pending.json").exists()  # one challenge, one answer
    t = _tss()
    e = t.ESAPI(swtpm.tcti)
    try:
        ak, created = load_or_create_ak(e)
        assert not created  # the AK sitsctl enroll made is the one quotes use
        assert record["ak_public_pem"].encode() == ak_public_pem(e, ak)
        assert record["ak_name"] == E.object_name(E.read_public(e, ak)).hex()
        with E.open_ek(e, "ecc") as (_, ek_public):
            assert record["ek_public_pem"].encode() == E.parse_public(ek_public).public_key_pem()
        q = quote(e, ak, [16], b"verifier nonce")
    finally:
        e.close()
    verify_quote(q, record["ak_public_pem"].encode(), b"verifier nonce")  # the PLC side trusts the record's AK
    # replaying the response: nothing is pending any more
    r = sitsctl(None, "--verify", tmp_path / "response.json", "--pending", tmp_path / "pending.json")
    assert r.returncode == 2 and "cannot read" in r.stderr and "pending.json" in r.stderr


def test_sitsctl_enroll_rsa_ek_round_trip(swtpm, tmp_path):
    record = round_trip(swtpm.tcti, tmp_path, "--ek", "rsa")
    assert record["ek_kind"] == "rsa" and "BEGIN PUBLIC KEY" in record["ek_public_pem"]


def test_sitsctl_enroll_refusals_say_why(swtpm, tmp_path):
    d = tmp_path
    assert sitsctl(swtpm.tcti, "-o", d / "request.json").returncode == 0
    request = json.loads((d / "request.json").read_text())
    # an unrestricted key offered as AK (the device signing key at 0x81000001)
    signer = TpmSigner(swtpm.tcti)
    signer.close()
    t = _tss()
    e = t.ESAPI(swtpm.tcti)
    try:
        device_key = E.read_public(e, e.tr_from_tpmpublic(DEFAULT_KEY_HANDLE))
    finally:
        e.close()
    (d / "bad-ak.json").write_text(json.dumps({**request, "ak_public": base64.b64encode(device_key).decode()}))
    r = sitsctl(None, "--challenge", d / "bad-ak.json", "--pending", d / "p.json")
    assert r.returncode == 1 and "REFUSED" in r.stderr and "not restricted" in r.stderr, r.stderr
    assert not (d / "p.json").exists()
    # a certificate that is not the EK's
    (d / "bad-cert.json").write_text(json.dumps({**request, "ek_certificate": base64.b64encode(b"\x30\x03\x02\x01\x01")
                                                 .decode()}))
    r = sitsctl(None, "--challenge", d / "bad-cert.json", "--pending", d / "p.json")
    assert r.returncode == 1 and "EK certificate is not an X.509 certificate" in r.stderr, r.stderr
    # --ek-ca without an EK certificate in the request
    ca = d / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    r = sitsctl(None, "--challenge", d / "request.json", "--pending", d / "p.json", "--ek-ca", ca)
    assert r.returncode == 1 and "no EK certificate" in r.stderr, r.stderr
    # a pinned EK that is another one
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    from cryptography.hazmat.primitives import serialization
    (d / "other.pem").write_bytes(other.public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    r = sitsctl(None, "--challenge", d / "request.json", "--pending", d / "p.json", "--expect-ek", d / "other.pem")
    assert r.returncode == 1 and "not the one in --expect-ek" in r.stderr, r.stderr
    # a good challenge, then a tampered one at the device: the TPM refuses it
    r = sitsctl(None, "--challenge", d / "request.json", "-o", d / "challenge.json", "--pending", d / "p.json",
                "--trust-unverified-ek")
    assert r.returncode == 0, r.stderr
    challenge = json.loads((d / "challenge.json").read_text())
    blob = bytearray(base64.b64decode(challenge["credential_blob"]))
    blob[-1] ^= 0x80
    (d / "tampered.json").write_text(json.dumps({**challenge, "credential_blob": base64.b64encode(blob).decode()}))
    r = sitsctl(swtpm.tcti, "--activate", d / "tampered.json")
    assert r.returncode == 1 and "integrity HMAC does not verify" in r.stderr, r.stderr
    # a challenge for another AK (this TPM's AK is at 0x81000002): refused before the TPM is asked
    (d / "other-ak.json").write_text(json.dumps({**challenge, "ak_name": "000b" + "00" * 32}))
    r = sitsctl(swtpm.tcti, "--activate", d / "other-ak.json")
    assert r.returncode == 1 and "was made for AK name 000b00" in r.stderr, r.stderr
    # a response with another secret, and one to another challenge
    r = sitsctl(swtpm.tcti, "--activate", d / "challenge.json", "-o", d / "response.json")
    assert r.returncode == 0, r.stderr
    response = json.loads((d / "response.json").read_text())
    (d / "wrong-secret.json").write_text(json.dumps({**response, "secret": "00" * 32}))
    r = sitsctl(None, "--verify", d / "wrong-secret.json", "--pending", d / "p.json", "-o", d / "record.json")
    assert r.returncode == 1 and "another secret" in r.stderr and not (d / "record.json").exists(), r.stderr
    (d / "other-challenge.json").write_text(json.dumps({**response, "challenge_id": "ff" * 16}))
    r = sitsctl(None, "--verify", d / "other-challenge.json", "--pending", d / "p.json")
    assert r.returncode == 1 and "answers challenge ffff" in r.stderr, r.stderr
    # wrong file for the step, and no TPM named
    r = sitsctl(None, "--activate", d / "request.json")
    assert r.returncode == 2 and "is not a sits-enroll-challenge/1 document" in r.stderr, r.stderr
    r = sitsctl(None, "--activate", d / "challenge.json")
    assert r.returncode == 2 and "which TPM? give --tcti" in r.stderr, r.stderr
    r = sitsctl(f"swtpm:path={d}/none.sock", "-o", d / "x.json")
    assert r.returncode == 2 and "cannot open the TPM through TCTI" in r.stderr, r.stderr
    # after all the refusals, the right response still verifies
    r = sitsctl(None, "--verify", d / "response.json", "--pending", d / "p.json", "-o", d / "record.json")
    assert r.returncode == 0, r.stderr


def test_sitsctl_enroll_refuses_an_unverified_ek_by_default(swtpm, tmp_path):
    """swtpm has no EK certificate: without --ek-ca / --expect-ek the challenge is refused (exit 1) and says how
    to proceed; --trust-unverified-ek enrolls it, recorded as ek_trust none; --expect-ek pins it."""
    from cryptography.hazmat.primitives import serialization

    d = tmp_path
    assert sitsctl(swtpm.tcti, "-o", d / "request.json").returncode == 0
    r = sitsctl(None, "--challenge", d / "request.json", "-o", d / "challenge.json", "--pending", d / "p.json")
    assert r.returncode == 1 and "REFUSED: nothing vouches for this device's EK" in r.stderr, r.stderr
    assert "no EK certificate" in r.stderr and "--trust-unverified-ek" in r.stderr and "--expect-ek" in r.stderr
    ek = E.parse_public(base64.b64decode(json.loads((d / "request.json").read_text())["ek_public"]))
    assert __import__("hashlib").sha256(ek.public_key_der()).hexdigest() in r.stderr  # to compare out of band
    assert not (d / "p.json").exists() and not (d / "challenge.json").exists()
    r = sitsctl(None, "--challenge", d / "request.json", "-o", d / "challenge.json", "--pending", d / "p.json",
                "--trust-unverified-ek")
    assert r.returncode == 0 and "EK trust: none" in r.stderr, r.stderr
    (d / "ek.pem").write_bytes(ek.public_key_pem())
    r = sitsctl(None, "--challenge", d / "request.json", "-o", d / "challenge.json", "--pending", d / "p.json",
                "--expect-ek", d / "ek.pem")
    assert r.returncode == 0 and "EK trust: pinned" in r.stderr, r.stderr


# --- an swtpm with an EK certificate (swtpm_setup --create-ek-cert, local CA) -------------------

@pytest.fixture
def provisioned_swtpm(tmp_path):
    """An swtpm whose state swtpm_setup made: an RSA 2048 EK at 0x81010001 with its certificate in NV 0x01c00002,
    issued by a local CA (swtpm_localca) created in tmp_path/ca."""
    assert shutil.which("swtpm_setup"), "swtpm_setup is not installed: apt-get install swtpm-tools"
    ca, state = tmp_path / "ca", tmp_path / "tpm"
    ca.mkdir()
    state.mkdir()
    (tmp_path / "localca.conf").write_text(f"statedir = {ca}\nsigningkey = {ca}/signkey.pem\n"
                                           f"issuercert = {ca}/issuercert.pem\ncertserial = {ca}/certserial\n")
    (tmp_path / "localca.options").write_text("--platform-manufacturer sits\n--platform-version 1\n"
                                              "--platform-model test\n")
    (tmp_path / "setup.conf").write_text(f"create_certs_tool = {shutil.which('swtpm_localca')}\n"
                                         f"create_certs_tool_config = {tmp_path}/localca.conf\n"
                                         f"create_certs_tool_options = {tmp_path}/localca.options\n"
                                         "active_pcr_banks = sha256\n")
    r = subprocess.run(["swtpm_setup", "--tpm2", "--tpmstate", str(state), "--create-ek-cert", "--config",
                        str(tmp_path / "setup.conf"), "--overwrite"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    sw = Swtpm(state).start()
    try:
        yield sw, ca
    finally:
        sw.stop()


def test_ek_certificate_chain_checked_by_the_verifier(provisioned_swtpm, tmp_path):
    sw, ca = provisioned_swtpm
    d = tmp_path / "run"
    d.mkdir()
    record = round_trip(sw.tcti, d, "--ek", "rsa", challenge_args=("--ek-ca", ca / "issuercert.pem"))
    assert record["ek_trust"] == "certificate-chain"
    request = json.loads((d / "request.json").read_text())
    cert = base64.b64decode(request["ek_certificate"])
    assert record["ek_certificate_sha256"] == __import__("hashlib").sha256(cert).hexdigest()
    assert E.ek_matches_certificate(E.parse_public(base64.b64decode(request["ek_public"])), cert)
    # the persistent EK swtpm_setup made is the one our template creates: it is what the certificate certifies
    t = _tss()
    e = t.ESAPI(sw.tcti)
    try:
        area, _ = t.TPMT_PUBLIC.unmarshal(E.ek_template("rsa"))
        h, pub, *_ = e.create_primary(None, t.TPM2B_PUBLIC(publicArea=area), t.ESYS_TR.ENDORSEMENT)
        e.flush_context(h)
        assert bytes(pub.publicArea.marshal()) == base64.b64decode(request["ek_public"])
    finally:
        e.close()
    # a certificate nobody checked: refused by default, enrolled as certificate-unchecked only when asked to
    r = sitsctl(None, "--challenge", d / "request.json", "--pending", d / "p.json")
    assert r.returncode == 1 and "carries an EK certificate, but no --ek-ca was given" in r.stderr, r.stderr
    r = sitsctl(None, "--challenge", d / "request.json", "--pending", d / "p.json", "--trust-unverified-ek")
    assert r.returncode == 0 and "EK trust: certificate-unchecked" in r.stderr, r.stderr
    # a CA that did not issue it (the root signs the local CA, not EK certificates)
    r = sitsctl(None, "--challenge", d / "request.json", "--pending", d / "p.json",
                "--ek-ca", ca / "swtpm-localca-rootca-cert.pem")
    assert r.returncode == 1 and "was not issued by any certificate in --ek-ca" in r.stderr, r.stderr
    # the certificate with another EK public area (an RSA EK of another TPM): refused
    with Swtpm() as other:
        r = sitsctl(other.tcti, "-o", d / "other.json", "--ek", "rsa")
        assert r.returncode == 0, r.stderr
    foreign = json.loads((d / "other.json").read_text())
    (d / "swapped.json").write_text(json.dumps({**foreign, "ek_certificate": request["ek_certificate"]}))
    r = sitsctl(None, "--challenge", d / "swapped.json", "--pending", d / "p.json", "--ek-ca", ca / "issuercert.pem")
    assert r.returncode == 1 and "certifies another key than the request's EK" in r.stderr, r.stderr
