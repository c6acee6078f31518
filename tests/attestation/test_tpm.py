import hashlib
import time

import pytest

from attestation.envelope import Command, EnvelopeVerifier
from attestation.errors import TpmError
from attestation.tpm import TpmSigner

MODEL = hashlib.sha256(b"rolling mill model").digest()


def test_tpm_key_signs_verifiable_envelopes_and_persists(swtpm):
    signer = TpmSigner(swtpm.tcti)
    assert signer.created
    verifier = EnvelopeVerifier(signer.public_key_pem(), MODEL)
    now = time.time_ns()
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
