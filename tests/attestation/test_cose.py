"""The COSE_Sign1 layer against published vectors: RFC 9052 Appendix C.2.1 and the cose-wg
Examples sign1-tests (https://github.com/cose-wg/Examples/tree/master/sign1-tests), all made
with the same public P-256 key "11". ECDSA is randomized, so we verify their signatures."""
import base64

import cbor2
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from attestation import cose
from attestation.errors import EnvelopeError


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# Key "11" (kty EC2, crv P-256) of the RFC 9052 examples, as published in cose-wg/Examples.
KEY_11 = ec.EllipticCurvePublicNumbers(
    int.from_bytes(_b64url("usWxHK2PmfnHKwXPS54m0kTcGJ90UiglWiGahtagnv8"), "big"),
    int.from_bytes(_b64url("IBOL-C3BttVivg-lSreASjpkttcsz-1rb7btKLv8EX4"), "big"),
    ec.SECP256R1()).public_key()

CONTENT = b"This is the content."

# RFC 9052 (and RFC 8152) Appendix C.2.1, "Single ECDSA Signature":
# 18([<<{1: -7}>>, {4: '11'}, 'This is the content.', h'8eb3...cb36'])
RFC9052_C_2_1 = bytes.fromhex(
    "D28443A10126A10442313154546869732069732074686520636F6E74656E742E5840"
    "8EB33E4CA31D1C465AB05AAC34CC6B23D58FEF5C083106C4D25A91AEF0B0117E"
    "2AF9A291AA32E14AB834DC56ED2A223444547E01F11D3B0916E5A4C345CACB36")
# Its ToBeSign ("intermediates" of cose-wg sign1-tests with the same headers): the Sig_structure.
C_2_1_TO_BE_SIGNED = bytes.fromhex(
    "846A5369676E61747572653143A101264054546869732069732074686520636F6E74656E742E")

# cose-wg sign1-tests/sign-pass-02.json: external AAD h'11aa22bb33cc44dd55006699'.
SIGN_PASS_02 = bytes.fromhex(
    "D28443A10126A10442313154546869732069732074686520636F6E74656E742E5840"
    "EAE868ECC176883766C5DC5BA5B8DCA25DAB3C2E56A551CE5705B793914348E1"
    "55388B10C4F1B59A6733EAB416870A945111A4B2FBDBEF33A77234B1DEFF2F9B")
SIGN_PASS_02_AAD = bytes.fromhex("11aa22bb33cc44dd55006699")

# cose-wg sign1-tests/sign-pass-03.json: the same message without its tag 18.
_SIG_03 = ("EAE868ECC176883766C5DC5BA5B8DCA25DAB3C2E56A551CE5705B793914348E1"
           "9F43D6C6BA654472DA301B645B293C9BA939295B97C4BDB847782BFF384C5794")
SIGN_PASS_03_UNTAGGED = bytes.fromhex(
    "8443A10126A10442313154546869732069732074686520636F6E74656E742E5840" + _SIG_03)

# cose-wg sign1-tests/sign-fail-*.json: each must be refused, for the reason in its title.
SIGN_FAIL = {
    "01 wrong CBOR tag (998)": ("D903E68443A10126A10442313154546869732069732074686520636F6E74656E742E5840"
                                + _SIG_03, "malformed"),
    "02 payload changed": ("D28443A10126A10442313154546869732069732074686520636F6E74656E742F5840"
                           + _SIG_03, "signature"),
    "03 alg -999": ("D28445A1013903E6A10442313154546869732069732074686520636F6E74656E742E5840"
                    + _SIG_03, "key"),
    "04 alg 'unknown'": ("D2844AA10167756E6B6E6F776EA10442313154546869732069732074686520636F6E74656E742E5840"
                         + _SIG_03, "key"),
    "06 protected header added": ("D28445A201260300A10442313154546869732069732074686520636F6E74656E742E5840"
                                  + _SIG_03, "signature"),
    "07 protected header removed": (
        "D28443A10126A10442313154546869732069732074686520636F6E74656E742E5840"
        "EAE868ECC176883766C5DC5BA5B8DCA25DAB3C2E56A551CE5705B793914348E1"
        "72727F48461FABBBA2E343492DDECAC3983686250BC68E9F1A7A07D41225B59F", "signature"),
}


def test_rfc9052_c_2_1_verifies():
    msg = cose.verify_sign1(RFC9052_C_2_1, KEY_11)
    assert msg.protected_headers == {cose.HDR_ALG: cose.ALG_ES256}
    assert msg.unprotected_headers == {cose.HDR_KID: b"11"}
    assert msg.payload == CONTENT
    assert len(msg.signature) == 64  # r||s, not DER
    assert msg.to_be_signed() == C_2_1_TO_BE_SIGNED
    assert cose.sig_structure(msg.protected, CONTENT) == C_2_1_TO_BE_SIGNED


def test_rfc9052_c_2_1_with_a_flipped_signature_bit_fails():
    tampered = bytearray(RFC9052_C_2_1)
    tampered[-1] ^= 0x01
    with pytest.raises(EnvelopeError) as exc:
        cose.verify_sign1(bytes(tampered), KEY_11)
    assert exc.value.code == "signature"


def test_external_aad_is_signed():
    assert cose.verify_sign1(SIGN_PASS_02, KEY_11, SIGN_PASS_02_AAD).payload == CONTENT
    with pytest.raises(EnvelopeError) as exc:
        cose.verify_sign1(SIGN_PASS_02, KEY_11)
    assert exc.value.code == "signature"


def test_untagged_sign1_is_refused_but_verifies_once_tagged():
    """RFC 9052 allows untagged messages where the context says what they are; we insist on the tag."""
    with pytest.raises(EnvelopeError, match="expected CBOR tag 18") as exc:
        cose.verify_sign1(SIGN_PASS_03_UNTAGGED, KEY_11)
    assert exc.value.code == "malformed"
    assert cose.verify_sign1(b"\xd2" + SIGN_PASS_03_UNTAGGED, KEY_11).payload == CONTENT


@pytest.mark.parametrize("name", SIGN_FAIL)
def test_cose_wg_failure_vectors_are_refused(name):
    data, code = SIGN_FAIL[name]
    with pytest.raises(EnvelopeError) as exc:
        cose.verify_sign1(bytes.fromhex(data), KEY_11)
    assert exc.value.code == code, exc.value.reason


def test_wrong_key_type_for_the_algorithm_is_a_key_error():
    with pytest.raises(EnvelopeError) as exc:
        cose.verify_sign1(RFC9052_C_2_1, ed25519.Ed25519PrivateKey.generate().public_key())
    assert exc.value.code == "key"


def test_ed25519_round_trip_through_the_low_level_api():
    key = ed25519.Ed25519PrivateKey.generate()
    protected = cose.encode_protected({cose.HDR_ALG: cose.ALG_EDDSA})
    data = cose.encode_sign1(protected, CONTENT, key.sign(cose.sig_structure(protected, CONTENT, b"aad")),
                             {cose.HDR_KID: b"k"})
    assert cose.verify_sign1(data, key.public_key(), b"aad").header(cose.HDR_KID) == b"k"


def test_empty_protected_bucket_is_a_zero_length_string():
    assert cose.encode_protected({}) == b""
    assert cbor2.loads(cose.sig_structure(b"", b"x")) == ["Signature1", b"", b"", b"x"]


def test_es256_signature_conversion():
    key = ec.generate_private_key(ec.SECP256R1())
    raw = cose.es256_from_der(key.sign(b"m", ec.ECDSA(hashes.SHA256())))
    assert len(raw) == 64
    cose.verify_signature(cose.ALG_ES256, key.public_key(), b"m", raw)
    assert cose.es256_signature(1, 2) == (1).to_bytes(32, "big") + (2).to_bytes(32, "big")
