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
