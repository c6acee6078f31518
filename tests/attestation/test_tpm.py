import hashlib
import time

import cbor2
import pytest
from cryptography.hazmat.primitives import serialization

from attestation import cose
from attestation.envelope import ALG_ECDSA_P256_SHA256, Command, EnvelopeVerifier
from attestation.errors import TpmError
from attestation.tpm import TpmSigner

MODEL = hashlib.sha256(b"rolling mill model").digest()


def test_tpm_key_signs_verifiable_envelopes_and_persists(swtpm):
    signer = TpmSigner(swtpm.tcti)
    assert signer.created
    now = time.time_ns()
    # freshness on a clock fixed at `now`: reopening the TPM key below takes as long as it takes
    verifier = EnvelopeVerifier(signer.public_key_pem(), MODEL, clock=lambda: now)
    for seq in range(1, 4):
        verifier.verify(signer.sign_command(Command("t", (0.5,), seq, seq, now, now + 10**7, MODEL)))
    key_id = signer.key_id
    signer.close()
    again = TpmSigner(swtpm.tcti)  # the persisted key at 0x81000001 is found, not recreated
    try:
        assert not again.created
        assert again.key_id == key_id
        verifier.verify(again.sign_command(Command("t", (0.5,), 4, 4, now, now + 10**7, MODEL)))
    finally:
        again.close()


def test_tpm_envelopes_are_es256_cose_sign1_with_r_s_signatures(swtpm):
    signer = TpmSigner(swtpm.tcti)
    try:
        now = time.time_ns()
        data = signer.sign_command(Command("t", (0.5,), 1, 1, now, now + 10**7, MODEL))
    finally:
        signer.close()
    item = cbor2.loads(data)
    assert item.tag == 18 and cbor2.loads(item.value[0])[1] == ALG_ECDSA_P256_SHA256 == cose.ALG_ES256
    msg = cose.verify_sign1(data, serialization.load_pem_public_key(signer.public_key_pem()))
    assert len(msg.signature) == 64  # r||s, each 32 bytes big endian, not DER
    assert msg.header(cose.HDR_KID) == signer.key_id


def test_model_measurement_extends_pcr16(swtpm):
    signer = TpmSigner(swtpm.tcti)
    try:
        value = signer.measure_model(MODEL)
        assert value == hashlib.sha256(b"\0" * 32 + MODEL).digest()  # PCR16 starts at zero after reset
        assert signer.measure_model(MODEL) == hashlib.sha256(value + MODEL).digest()
    finally:
        signer.close()


def test_unreachable_tpm_is_a_clear_error(tmp_path):
    with pytest.raises(TpmError, match="cannot open TPM through TCTI"):
        TpmSigner(f"swtpm:path={tmp_path}/nothing.sock")
    with pytest.raises(TpmError, match="no TCTI given"):
        TpmSigner("")


def _persistent_public(tcti, handle):
    from tpm2_pytss import ESAPI

    esapi = ESAPI(tcti)
    try:
        pub, _, _ = esapi.read_public(esapi.tr_from_tpmpublic(handle))
        return pub.to_pem(), bytes(pub.publicArea.authPolicy)
    finally:
        esapi.close()


def test_a_policy_bound_key_at_key_handle_is_refused_at_open_never_used_or_replaced(swtpm):
    """The PolicyAuthorize-bound device key (sitsctl deploy's, from before device_key_handle) at tpm-direct's
    handle: TpmSigner refuses it at open, naming the handle, what is there and the fixes; each fix then works."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from tpm2_pytss import ESAPI, ESYS_TR

    from attestation.tpm import WrongKeyError
    from attestation.tpm.policy import key_auth_policy, load_or_create_policy_key

    authority = ec.generate_private_key(ec.SECP256R1()).public_key()
    esapi = ESAPI(swtpm.tcti)
    try:
        load_or_create_policy_key(esapi, 0x81000001, authority)
    finally:
        esapi.close()
    before = _persistent_public(swtpm.tcti, 0x81000001)
    with pytest.raises(WrongKeyError) as info:
        TpmSigner(swtpm.tcti)
    text = str(info.value)
    assert isinstance(info.value, TpmError)  # the daemon's startup refuses it like any TPM error
    assert text.startswith("attestation.key_handle 0x81000001: tpm-direct signs every command by password")
    assert "bound to a policy (authPolicy set)" in text and "not usable by password (no USERWITHAUTH)" in text
    assert f"authPolicy {key_auth_policy(authority).hex()[:16]}" in text and "ECC NIST_P256" in text
    assert "set attestation.key_handle to a free persistent handle" in text
    assert "tpm2_evictcontrol -C o -c 0x81000001" in text
    assert "set attestation.device_key_handle: 0x81000001 and key_handle to a free handle" in text
    assert _persistent_public(swtpm.tcti, 0x81000001) == before  # refused, neither used nor replaced

    other = TpmSigner(swtpm.tcti, 0x81000004)  # fix 1: another key_handle; the policy key stays where it is
    try:
        assert other.created
        now = time.time_ns()
        verifier = EnvelopeVerifier(other.public_key_pem(), MODEL, clock=lambda: now)
        verifier.verify(other.sign_command(Command("t", (0.5,), 1, 1, now, now + 10**7, MODEL)))
    finally:
        other.close()
    assert _persistent_public(swtpm.tcti, 0x81000001) == before

    esapi = ESAPI(swtpm.tcti)  # fix 2: evict it (tpm2_evictcontrol -C o -c 0x81000001)
    try:
        esapi.evict_control(ESYS_TR.OWNER, esapi.tr_from_tpmpublic(0x81000001), 0x81000001)
    finally:
        esapi.close()
    fresh = TpmSigner(swtpm.tcti)
    try:
        assert fresh.created and fresh.public_key_pem() != before[0]
    finally:
        fresh.close()


def test_other_keys_at_key_handle_are_refused_with_what_is_wrong(swtpm):
    from tpm2_pytss import ESAPI, ESYS_TR, TPM2B_PUBLIC, TPMA_OBJECT, TPMT_PUBLIC

    from attestation.tpm import WrongKeyError
    from attestation.tpm.quote import load_or_create_ak

    a = TPMA_OBJECT
    base = a.FIXEDTPM | a.FIXEDPARENT | a.SENSITIVEDATAORIGIN | a.SIGN_ENCRYPT
    esapi = ESAPI(swtpm.tcti)
    try:
        load_or_create_ak(esapi, 0x81000005)
        for handle, spec, attrs in ((0x81000006, "ecc256:ecdsa-sha256:null", base | a.USERWITHAUTH),
                                    (0x81000007, "ecc384:ecdsa-sha384:null", base | a.USERWITHAUTH | a.NODA),
                                    (0x81000008, "ecc256:ecdsa-sha256:null", base | a.NODA)):
            tmpl = TPM2B_PUBLIC(publicArea=TPMT_PUBLIC.parse(spec, objectAttributes=attrs))
            h, *_ = esapi.create_primary(None, tmpl, ESYS_TR.OWNER)
            try:
                esapi.evict_control(ESYS_TR.OWNER, h, handle)
            finally:
                esapi.flush_context(h)
    finally:
        esapi.close()
    for handle, problem in ((0x81000005, "restricted (an attestation key"),
                            (0x81000006, "dictionary-attack protected (no NODA"),
                            (0x81000007, "not on curve P-256 (NIST_P384)"),
                            (0x81000008, "not usable by password (no USERWITHAUTH)")):
        with pytest.raises(WrongKeyError) as info:
            TpmSigner(swtpm.tcti, handle)
        text = str(info.value)
        assert text.startswith(f"attestation.key_handle 0x{handle:08x}: ") and problem in text, text
        assert f"tpm2_evictcontrol -C o -c 0x{handle:08x}" in text
        assert "device_key_handle" not in text  # no policy key there: no hint to keep it

    from sitsd.config import load_config
    from sitsd.daemon import make_signer
    from sitsd.errors import StartupError

    from ..conftest import EXAMPLE_CONFIG

    cfg = load_config(EXAMPLE_CONFIG, {"attestation.tcti": swtpm.tcti, "attestation.signing": "tpm-direct",
                                       "attestation.key_handle": 0x81000005})
    with pytest.raises(StartupError) as info:
        make_signer(cfg)
    assert "attestation.key_handle 0x81000005" in str(info.value) and "restricted" in str(info.value)
    assert "group tss" not in str(info.value)  # the TPM answered: not the generic "cannot reach it" fix
