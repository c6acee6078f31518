"""PolicyAuthorize + PolicyPCR on swtpm: the device key signs only in a PCR state the authority approved."""
import hashlib
import os
import stat
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.measurement import event_digest
from attestation.tpm.policy import (Approval, PolicyError, approve, authority_id, key_auth_policy, key_public_pem,
                                    load_or_create_policy_key, pcr_policy_digest, policy_sign, public_pem,
                                    verify_device_signature)
from attestation.tpm.quote import extend_pcr, read_pcrs

from ..conftest import REPO

HANDLE = 0x81000003  # attestation.device_key_handle's default: never tpm-direct's key_handle
V1 = [("model", "mill.onnx", hashlib.sha256(b"model v1").hexdigest()),
      ("module:pre", "pre_filter", hashlib.sha256(b"pre").hexdigest())]
V2 = [("model", "mill.onnx", hashlib.sha256(b"model v2").hexdigest()), V1[1]]


@pytest.fixture
def tpm(swtpm):
    from tpm2_pytss import ESAPI

    esapi = ESAPI(swtpm.tcti)
    yield esapi
    esapi.close()


@pytest.fixture
def authority():
    return ec.generate_private_key(ec.SECP256R1())


def measure(esapi, events, pcr=23):
    from tpm2_pytss import ESYS_TR

    esapi.pcr_reset(getattr(ESYS_TR, f"PCR{pcr}"))
    for e in events:
        extend_pcr(esapi, pcr, event_digest(*e))
    return read_pcrs(esapi, [pcr])[pcr]


def test_offline_policy_digest_equals_the_tpms_trial_session(tpm):
    from tpm2_pytss import ESYS_TR, TPM2_ALG, TPM2_SE, TPM2B_DIGEST, TPMT_SYM_DEF, TPML_PCR_SELECTION

    value = measure(tpm, V1)
    trial = tpm.start_auth_session(ESYS_TR.NONE, ESYS_TR.NONE, TPM2_SE.TRIAL, TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL),
                                   TPM2_ALG.SHA256)
    try:
        tpm.policy_pcr(trial, TPM2B_DIGEST(b""), TPML_PCR_SELECTION.parse("sha256:23"))
        assert bytes(tpm.policy_get_digest(trial)) == pcr_policy_digest(23, value)
    finally:
        tpm.flush_context(trial)


def test_bound_key_signs_with_approval_and_right_pcr_never_by_password(tpm, authority):
    from tpm2_pytss import TPM2_ALG, TPM2_RH, TPM2_ST, TPM2B_DIGEST, TPMT_SIG_SCHEME, TPMT_TK_HASHCHECK, TSS2_Exception

    key, created = load_or_create_policy_key(tpm, HANDLE, authority.public_key())
    assert created
    pub, _, _ = tpm.read_public(key)
    assert bytes(pub.publicArea.authPolicy) == key_auth_policy(authority.public_key())
    approval = approve(authority, 23, V1)
    approval.verify(authority.public_key())
    assert measure(tpm, V1).hex() == approval.pcr_value
    digest = hashlib.sha256(b"deploy challenge").digest()
    sig = policy_sign(tpm, key, approval, authority.public_key(), digest)
    assert verify_device_signature(key_public_pem(tpm, key), digest, sig)
    assert not verify_device_signature(key_public_pem(tpm, key), hashlib.sha256(b"other").digest(), sig)
    scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.ECDSA)
    scheme.details.any.hashAlg = TPM2_ALG.SHA256
    with pytest.raises(TSS2_Exception, match="AUTH_UNAVAILABLE|auth"):  # no USERWITHAUTH: a password opens nothing
        tpm.sign(key, TPM2B_DIGEST(digest), scheme, TPMT_TK_HASHCHECK(tag=TPM2_ST.HASHCHECK, hierarchy=TPM2_RH.NULL))


def test_tampered_model_is_refused_by_the_tpm(tpm, authority):
    key, _ = load_or_create_policy_key(tpm, HANDLE, authority.public_key())
    approval = approve(authority, 23, V1)
    tampered = [("model", "mill.onnx", hashlib.sha256(b"model v1 with a patched weight").hexdigest()), V1[1]]
    measure(tpm, tampered)
    with pytest.raises(PolicyError) as info:
        policy_sign(tpm, key, approval, authority.public_key(), bytes(32))
    assert info.value.code == "refused"
    assert "TPM_RC_VALUE" in info.value.reason or "TPM_RC_POLICY_FAIL" in info.value.reason
    assert "not in the state the approval covers" in info.value.reason
    # same events in another order: another PCR value, refused as well
    measure(tpm, list(reversed(V1)))
    with pytest.raises(PolicyError, match="refused the device key"):
        policy_sign(tpm, key, approval, authority.public_key(), bytes(32))


def test_model_v2_approval_works_with_the_same_key_and_v1_is_not_replayable(tpm, authority):
    key, _ = load_or_create_policy_key(tpm, HANDLE, authority.public_key())
    pem = key_public_pem(tpm, key)
    v1, v2 = approve(authority, 23, V1), approve(authority, 23, V2)
    measure(tpm, V1)
    policy_sign(tpm, key, v1, authority.public_key(), bytes(32))
    measure(tpm, V2)  # model update: no new key, a new approval
    again, created = load_or_create_policy_key(tpm, HANDLE, authority.public_key())
    assert not created and key_public_pem(tpm, again) == pem
    digest = hashlib.sha256(b"v2").digest()
    assert verify_device_signature(pem, digest, policy_sign(tpm, again, v2, authority.public_key(), digest))
    with pytest.raises(PolicyError) as info:  # the old approval replayed on the new state
        policy_sign(tpm, again, v1, authority.public_key(), digest)
    assert info.value.code == "refused"


def test_approval_signed_by_another_key_or_edited_is_rejected(tpm, authority):
    other = ec.generate_private_key(ec.SECP256R1())
    forged = approve(other, 23, V1)
    with pytest.raises(PolicyError) as info:
        forged.verify(authority.public_key())
    assert info.value.code == "authority"
    # claiming the trusted authority's id does not help: the signature does not verify
    claimed = Approval(**{**forged.__dict__, "authority_id": authority_id(authority.public_key())})
    with pytest.raises(PolicyError, match="does not verify") as info:
        claimed.verify(authority.public_key())
    assert info.value.code == "signature"
    # an approval whose model was swapped after signing
    good = approve(authority, 23, V1)
    edited = Approval(**{**good.__dict__, "events": tuple(V2), "model_sha256": V2[0][2]})
    with pytest.raises(PolicyError, match="does not follow"):
        edited.verify(authority.public_key())
    # and the TPM itself refuses the forged signature (VerifySignature)
    key, _ = load_or_create_policy_key(tpm, HANDLE, authority.public_key())
    measure(tpm, V1)
    with pytest.raises(PolicyError) as info:
        policy_sign(tpm, key, claimed, authority.public_key(), bytes(32))
    assert info.value.code == "signature"
    assert Approval.from_json(good.to_json()) == good


def test_key_of_another_authority_at_the_handle_is_refused_not_replaced(tpm, authority):
    load_or_create_policy_key(tpm, HANDLE, authority.public_key())
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(PolicyError, match="not bound to authority") as info:
        load_or_create_policy_key(tpm, HANDLE, other.public_key())
    assert info.value.code == "key" and "tpm2_evictcontrol" in info.value.reason


def test_keygen_writes_a_private_key_only_the_owner_reads_and_warns(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sitsd.cli", "policy", "keygen", "--output", str(tmp_path / "auth")],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    priv = tmp_path / "auth" / "authority.key.pem"
    assert stat.S_IMODE(os.stat(priv).st_mode) == 0o600
    assert "PRIVATE key" in r.stderr and "OFFLINE" in r.stderr
    from attestation.tpm.policy import load_authority_private, load_authority_public

    assert public_pem(load_authority_private(priv).public_key()) == public_pem(
        load_authority_public(tmp_path / "auth" / "authority.pub.pem"))
    again = subprocess.run([sys.executable, "-m", "sitsd.cli", "policy", "keygen", "--output", str(tmp_path / "auth")],
                           capture_output=True, text=True, cwd=REPO, timeout=60)
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr
