"""The tpm-session mode against swtpm: one TPM2_Quote binds a software session key to the AK and
the measured model; commands are then signed without the TPM."""
import dataclasses
import hashlib
import os
import time

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from attestation import cose
from attestation.envelope import ALG_ECDSA_P256_SHA256, Command
from attestation.errors import AttestationError, EnvelopeError, TpmError
from attestation.session import (CredentialError, SessionCredential, SessionVerifier, TpmSessionSigner,
                                 replay_measurements, session_binding)
from attestation.tpm import AK_HANDLE, Quote, QuoteError, Swtpm, TpmSigner, load_or_create_ak, quote, verify_quote

MODEL = hashlib.sha256(b"rolling mill model").digest()
OTHER_MODEL = hashlib.sha256(b"some other model").digest()


def command(seq: int, model: bytes = MODEL) -> Command:
    now = time.time_ns()
    return Command("ns=2;s=Mill.Setpoints", (0.5, -1.25), seq, seq, now, now + 10**9, model)


def session(swtpm, model: bytes = MODEL, **kwargs) -> tuple[TpmSessionSigner, bytes, SessionCredential]:
    signer = TpmSessionSigner(swtpm.tcti, **kwargs)
    signer.measure_model(model)
    nonce = os.urandom(32)
    return signer, nonce, signer.bind(nonce)


def rejected(verifier: SessionVerifier, data: bytes, nonce: bytes) -> CredentialError:
    with pytest.raises(CredentialError) as info:
        verifier.accept(data, nonce)
    return info.value


def every_truncation_and_changed_byte_is_refused(verifier: SessionVerifier, data: bytes, nonce: bytes) -> None:
    """Each prefix of a credential and (hypothesis) each single changed byte: a CredentialError, nothing else."""
    for size in range(len(data)):
        rejected(verifier, data[:size], nonce)

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.integers(0, len(data) - 1), st.integers(1, 255))
    def every_changed_byte_is_refused(index, xor):
        garbled = bytearray(data)
        garbled[index] ^= xor
        rejected(verifier, bytes(garbled), nonce)

    every_changed_byte_is_refused()


def pem(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class CountingEsapi:
    """Stands in for the signer's ESAPI context and counts every TPM call made through it."""

    def __init__(self, esapi) -> None:
        self._esapi, self.calls = esapi, []

    def __getattr__(self, name):
        attr = getattr(self._esapi, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)
        return counted


# --- the happy path --------------------------------------------------------------------------

def test_verifier_accepts_the_bound_session_and_its_commands(swtpm):
    signer, nonce, cred = session(swtpm)
    try:
        assert signer.kind == "tpm-session" and signer.algorithm == ALG_ECDSA_P256_SHA256
        assert signer.ak_created
        assert cred.pcr == 16 and cred.measurements == (MODEL,)
        assert cred.pcr_value == replay_measurements([MODEL]) == hashlib.sha256(b"\0" * 32 + MODEL).digest()
        assert cred.session_public_pem == signer.public_key_pem() != signer.device_public_key_pem()
        assert cred.ak_public_pem == signer.device_public_key_pem()
        data = cred.to_cbor()
        assert SessionCredential.from_cbor(data) == cred
        verify_quote(cred.quote, signer.device_public_key_pem(), session_binding(cred.session_public_pem, nonce),
                     {16: cred.pcr_value})

        verifier = SessionVerifier(signer.device_public_key_pem(), MODEL).accept(data, nonce)
        assert verifier.key_id == signer.key_id
        for seq in range(1, 6):
            env = verifier.verify(signer.sign_command(command(seq)))
            assert env.key_id == signer.key_id and env.command.sequence == seq
        with pytest.raises(EnvelopeError) as info:  # the session verifier is a full EnvelopeVerifier
            verifier.verify(signer.sign_command(command(3)))
        assert info.value.code == "replay"
        with pytest.raises(EnvelopeError) as info:
            verifier.verify(signer.sign_command(command(9, OTHER_MODEL)))
        assert info.value.code == "model"
    finally:
        signer.close()


def test_sign_command_never_touches_the_tpm(swtpm):
    signer, nonce, cred = session(swtpm)
    verifier = SessionVerifier(signer.device_public_key_pem(), MODEL).accept(cred.to_cbor(), nonce)
    counting = CountingEsapi(signer._esapi)
    signer._esapi = counting
    try:
        signer.measure_model(MODEL)  # the counter sees the TPM calls the signer does make
        assert "pcr_extend" in counting.calls
        counting.calls.clear()
        for seq in range(1, 201):
            verifier.verify(signer.sign_command(command(seq)))
        assert counting.calls == []
        swtpm.stop()  # and with no TPM at all, commands are still signed
        verifier.verify(signer.sign_command(command(201)))
    finally:
        signer._esapi = counting._esapi
        signer.close()
    with pytest.raises(TpmError, match="closed"):
        signer.sign_command(command(202))


def test_ak_persists_across_signers_while_the_session_key_changes(swtpm):
    first, _, _ = session(swtpm)
    old_envelope = first.sign_command(command(2))
    first.close()
    second, nonce2, cred2 = session(swtpm)  # the PCR is reset at start: it holds this session's measurements
    try:
        assert first.ak_created and not second.ak_created
        assert second.device_public_key_pem() == first.device_public_key_pem()
        assert second.public_key_pem() != first.public_key_pem() and second.key_id != first.key_id
        assert cred2.measurements == (MODEL,)
        verifier = SessionVerifier(first.device_public_key_pem(), MODEL)
        session2 = verifier.accept(cred2.to_cbor(), nonce2)
        session2.verify(second.sign_command(command(1)))
        with pytest.raises(EnvelopeError) as info:  # the old session's key is not this session's
            session2.verify(old_envelope)
        assert info.value.code == "key"
    finally:
        second.close()


# --- the verifier's refusals, each with its reason ---------------------------------------------

def test_old_credential_replayed_for_a_new_nonce(swtpm):
    signer, old_nonce, cred = session(swtpm)
    signer.close()
    verifier = SessionVerifier(cred.ak_public_pem, MODEL)
    new_nonce = os.urandom(32)
    assert rejected(verifier, cred.to_cbor(), new_nonce).code == "nonce"
    # rewriting the nonce in the credential does not help: the quote's extraData binds the old one
    forged = dataclasses.replace(cred, verifier_nonce=new_nonce)
    assert rejected(verifier, forged.to_cbor(), new_nonce).code == "binding"
    verifier.accept(cred.to_cbor(), old_nonce)  # the credential itself is fine, for its own nonce


def test_substituted_session_key(swtpm):
    signer, nonce, cred = session(swtpm)
    signer.close()
    attacker = ec.generate_private_key(ec.SECP256R1())
    forged = dataclasses.replace(cred, session_public_pem=pem(attacker))
    assert rejected(SessionVerifier(cred.ak_public_pem, MODEL), forged.to_cbor(), nonce).code == "binding"


def test_tampered_attest_or_signature(swtpm):
    signer, nonce, cred = session(swtpm)
    signer.close()
    verifier = SessionVerifier(cred.ak_public_pem, MODEL)
    attest = bytearray(cred.quote.attest)
    attest[-40] ^= 0x01  # inside pcrDigest
    tampered = dataclasses.replace(cred, quote=dataclasses.replace(cred.quote, attest=bytes(attest)))
    error = rejected(verifier, tampered.to_cbor(), nonce)
    assert error.code == "signature" and "signature" in error.reason
    signature = bytearray(cred.quote.signature)
    signature[5] ^= 0x80
    tampered = dataclasses.replace(cred, quote=dataclasses.replace(cred.quote, signature=bytes(signature)))
    assert rejected(verifier, tampered.to_cbor(), nonce).code == "signature"


def test_quote_from_another_ak(swtpm):
    signer, nonce, cred = session(swtpm)
    signer.close()
    # another device: a second TPM (a second primary AK in the same TPM would be the same key, since a
    # primary key is derived from the owner seed and the template)
    with Swtpm() as other_tpm:
        other, other_nonce, other_cred = session(other_tpm)
        other.close()
    assert other_cred.ak_public_pem != cred.ak_public_pem
    verifier = SessionVerifier(cred.ak_public_pem, MODEL)
    # honest about its AK: not the trusted device
    assert rejected(verifier, dataclasses.replace(other_cred, verifier_nonce=nonce).to_cbor(), nonce).code == "ak"
    # claims the trusted AK: the signature gives it away
    lying = SessionCredential(other_cred.session_public_pem, cred.ak_public_pem,
                              dataclasses.replace(other_cred.quote, ak_public_pem=cred.ak_public_pem),
                              other_cred.pcr_value, other_cred.measurements, other_nonce)
    assert rejected(verifier, lying.to_cbor(), other_nonce).code == "signature"


def test_other_model_measured(swtpm):
    signer, nonce, cred = session(swtpm, model=OTHER_MODEL)
    signer.close()
    error = rejected(SessionVerifier(cred.ak_public_pem, MODEL), cred.to_cbor(), nonce)
    assert error.code == "model" and MODEL.hex()[:16] in error.reason
    # and claiming the expected model without having measured it breaks the PCR replay
    lying = dataclasses.replace(cred, measurements=(MODEL,))
    assert rejected(SessionVerifier(cred.ak_public_pem, MODEL), lying.to_cbor(), nonce).code == "pcr-value"


def test_also_accepted_models_widen_the_model_check_and_nothing_else(swtpm):
    third = hashlib.sha256(b"a third model").digest()
    signer, nonce, cred = session(swtpm, model=OTHER_MODEL)
    try:
        data = cred.to_cbor()
        assert rejected(SessionVerifier(cred.ak_public_pem, MODEL), data, nonce).code == "model"
        error = rejected(SessionVerifier(cred.ak_public_pem, MODEL, also_accepted_models=[third]), data, nonce)
        assert error.code == "model" and "also accepted" in error.reason
        verifier = SessionVerifier(cred.ak_public_pem, MODEL, also_accepted_models=[OTHER_MODEL]).accept(data, nonce)
        assert verifier.expected_model_sha256 == OTHER_MODEL  # the model the credential measured is the session's
        assert verifier.verify(signer.sign_command(command(1, OTHER_MODEL))).command.sequence == 1
        # the other accepted model too: a swap's commands come before the credential that measures it
        assert verifier.verify(signer.sign_command(command(2, MODEL))).command.sequence == 2
        with pytest.raises(EnvelopeError) as info:
            verifier.verify(signer.sign_command(command(3, third)))
        assert info.value.code == "model"
        with pytest.raises(ValueError, match="32 bytes"):
            SessionVerifier(cred.ak_public_pem, MODEL, also_accepted_models=[OTHER_MODEL[:31]])
        with pytest.raises(ValueError, match="pin one measured state"):
            SessionVerifier(cred.ak_public_pem, MODEL, also_accepted_models=[OTHER_MODEL],
                            trusted_device_key_pem=signer.device_public_key_pem(), approved_pcr_value=b"\1" * 32)
    finally:
        signer.close()


def test_with_also_accepted_models_a_version_1_credential_runs_its_newest_model(swtpm):
    third = hashlib.sha256(b"a third model").digest()
    signer = TpmSessionSigner(swtpm.tcti)
    try:
        signer.measure_model(OTHER_MODEL)
        signer.measure_model(third)  # then swapped to a model nobody accepted
        nonce = os.urandom(32)
        cred = signer.bind(nonce)
        assert cred.measurement_pcr is None and cred.measurements == (OTHER_MODEL, third)
        error = rejected(SessionVerifier(cred.ak_public_pem, MODEL, also_accepted_models=[OTHER_MODEL]),
                         cred.to_cbor(), nonce)
        assert error.code == "model" and "measured last" in error.reason and third.hex()[:16] in error.reason
    finally:
        signer.close()


def test_pcr_extended_by_something_else_after_the_measurement(swtpm):
    from tpm2_pytss import ESAPI

    from attestation.tpm.quote import extend_pcr

    signer = TpmSessionSigner(swtpm.tcti)
    try:
        signer.measure_model(MODEL)
        intruder = ESAPI(swtpm.tcti)  # another client of the same TPM
        try:
            extend_pcr(intruder, 16, hashlib.sha256(b"another model loaded later").digest())
        finally:
            intruder.close()
        nonce = os.urandom(32)
        cred = signer.bind(nonce)
    finally:
        signer.close()
    assert cred.measurements == (MODEL,) and cred.pcr_value != replay_measurements([MODEL])
    error = rejected(SessionVerifier(cred.ak_public_pem, MODEL), cred.to_cbor(), nonce)
    assert error.code == "pcr-value" and "PCR 16" in error.reason


def test_garbled_or_truncated_credentials_raise_only_credential_error(swtpm):
    signer, nonce, cred = session(swtpm)
    signer.close()
    data = cred.to_cbor()
    verifier = SessionVerifier(cred.ak_public_pem, MODEL)
    verifier.accept(data, nonce)
    every_truncation_and_changed_byte_is_refused(verifier, data, nonce)
    for junk in (b"", b"\xa0", b"\xd2\x84", data + b"\0", b"\xff" * 5000, "text", None):
        rejected(verifier, junk, nonce)

    @settings(max_examples=200, deadline=None, database=None)
    @given(st.binary(max_size=600), st.integers(0, len(data)))
    def spliced_bytes_are_refused(junk, at):
        garbled = data[:at] + junk + data[at + len(junk):]
        if garbled != data:
            rejected(verifier, garbled, nonce)

    spliced_bytes_are_refused()


# --- the quote on its own ----------------------------------------------------------------------

def test_verify_quote_names_each_failure(swtpm):
    from tpm2_pytss import ESAPI, TPM2B_DATA, TPM2_ALG, TPMT_SIG_SCHEME

    esapi = ESAPI(swtpm.tcti)
    try:
        ak, created = load_or_create_ak(esapi)
        assert created and load_or_create_ak(esapi)[1] is False
        nonce = os.urandom(32)
        q = quote(esapi, AK_HANDLE, [16, 23], nonce)
        # a genuine AK-signed attestation that is not a quote: TPM2_Certify of the AK by itself
        certify_attest, certify_sig = esapi.certify(ak, ak, TPM2B_DATA(nonce), TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL))
        certify_attest = bytes(certify_attest)
        r, s = bytes(certify_sig.signature.ecdsa.signatureR), bytes(certify_sig.signature.ecdsa.signatureS)
        certify = dataclasses.replace(q, attest=certify_attest, signature=cose.es256_signature(
            int.from_bytes(r, "big"), int.from_bytes(s, "big")))
    finally:
        esapi.close()
    assert sorted(q.pcrs) == [16, 23] and len(q.signature) == 64
    verify_quote(q, q.ak_public_pem, nonce, {16: b"\0" * 32})

    def code(quote_, ak_pem=q.ak_public_pem, extra=nonce, expected=None) -> str:
        with pytest.raises(QuoteError) as info:
            verify_quote(quote_, ak_pem, extra, expected)
        assert isinstance(info.value, AttestationError)
        return info.value.code

    assert code(q, extra=os.urandom(32)) == "nonce"
    assert code(q, expected={16: b"\1" * 32}) == "pcr-value"
    assert code(dataclasses.replace(q, pcrs={16: b"\0" * 32, 23: b"\1" * 32})) == "pcr-digest"
    assert code(dataclasses.replace(q, pcrs={16: b"\0" * 32})) == "pcr-selection"
    assert code(q, ak_pem=pem(ec.generate_private_key(ec.SECP256R1()))) == "signature"
    assert code(certify) == "type"
    # a restricted AK never signs these; a software key stands in to reach the checks after the signature
    fake = ec.generate_private_key(ec.SECP256R1())

    def signed_by_fake(attest: bytes) -> Quote:
        return dataclasses.replace(q, attest=attest, signature=cose.es256_from_der(
            fake.sign(attest, ec.ECDSA(hashes.SHA256()))))

    verify_quote(signed_by_fake(q.attest), pem(fake), nonce)  # the stand-in passes where nothing is changed

    assert code(signed_by_fake(b"\0\0\0\0" + q.attest[4:]), pem(fake)) == "magic"
    assert code(signed_by_fake(q.attest + b"\0"), pem(fake)) == "malformed"

    @settings(max_examples=200, deadline=None, database=None)
    @given(st.binary(min_size=1, max_size=300))
    def hostile_attest_is_a_quote_error(attest):
        code(signed_by_fake(attest), pem(fake))

    hostile_attest_is_a_quote_error()


def test_an_unrestricted_key_is_never_used_as_ak(swtpm):
    TpmSigner(swtpm.tcti).close()  # tpm-direct's password signing key, at 0x81000001, can sign any digest
    with pytest.raises(TpmError, match="not a restricted"):
        TpmSessionSigner(swtpm.tcti, device_key_handle=0x81000009, ak_handle=0x81000001)
    with pytest.raises(ValueError):
        TpmSessionSigner(swtpm.tcti, ak_handle=0x81000003)  # the same handle as the policy-bound device key


def test_bad_arguments(swtpm, tmp_path):
    with pytest.raises(TpmError, match="cannot open TPM"):
        TpmSessionSigner(f"swtpm:path={tmp_path}/nothing.sock")
    signer = TpmSessionSigner(swtpm.tcti)
    try:
        with pytest.raises(ValueError):
            signer.bind(b"short")
        with pytest.raises(ValueError):
            signer.measure_model(b"\0" * 31)
    finally:
        signer.close()
    with pytest.raises(TpmError, match="closed"):
        signer.bind(os.urandom(32))
