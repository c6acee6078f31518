"""attestation.fastsign: the loop's signature through libcrypto, keeping the GIL."""
from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from hypothesis import given, settings
from hypothesis import strategies as st

from attestation import fastsign
from attestation.envelope import Command, EnvelopeVerifier
from attestation.signers import SoftwareSigner
from tests.gil import gil_handoffs

# RFC 8032, section 7.1, tests 1-3: (secret key, public key, message, signature)
RFC8032 = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
]


def held(key):
    h, why = fastsign.load(key)
    assert h is not None, f"libcrypto path unavailable: {why}"  # CI installs libssl3: this must not fall back
    return h


@pytest.mark.parametrize("secret,public,message,signature", RFC8032)
def test_rfc8032_vectors(secret, public, message, signature):
    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(secret))
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert pub.hex() == public
    h = held(key)
    assert h.sign(bytes.fromhex(message)).hex() == signature
    h.close()


@settings(max_examples=60, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), message=st.binary(max_size=600))
def test_ed25519_signatures_equal_cryptographys(secret, message):
    key = ed25519.Ed25519PrivateKey.from_private_bytes(secret)
    h = held(key)
    assert h.sign(message) == key.sign(message)  # Ed25519 is deterministic: the very same bytes


@settings(max_examples=40, deadline=None)
@given(message=st.binary(max_size=600))
def test_p256_signatures_verify_under_the_cryptography_public_key(message):
    key = ec.generate_private_key(ec.SECP256R1())
    h = held(key)
    sig = h.sign(message)
    key.public_key().verify(sig, message, ec.ECDSA(hashes.SHA256()))  # raises InvalidSignature otherwise
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(Exception):
        other.public_key().verify(sig, message, ec.ECDSA(hashes.SHA256()))


def test_other_curves_and_closed_keys_are_refused():
    h, why = fastsign.load(ec.generate_private_key(ec.SECP384R1()))
    assert h is None and "secp384r1" in why
    h = held(ed25519.Ed25519PrivateKey.generate())
    h.close()
    h.close()  # idempotent
    with pytest.raises(fastsign.SignError, match="closed"):
        h.sign(b"x")


def test_the_environment_switch_falls_back_to_cryptography(monkeypatch):
    monkeypatch.setenv(fastsign.ENV_DISABLE, "1")
    signer = SoftwareSigner()
    assert signer.sign_path.startswith("cryptography, GIL released")
    monkeypatch.delenv(fastsign.ENV_DISABLE)
    assert SoftwareSigner().sign_path == "libcrypto, GIL held"


def _command() -> Command:
    now = time.time_ns()
    return Command("ns=2;s=Mill.Cmd", (1.25, -3.5), 7, 9, now, now + 10**9, b"\x11" * 32, False)


def test_the_software_signer_signs_on_the_held_path_and_its_envelopes_verify():
    signer = SoftwareSigner()
    assert signer.sign_path == "libcrypto, GIL held"
    cmd = _command()
    verifier = EnvelopeVerifier(signer.public_key_pem(), expected_model_sha256=b"\x11" * 32)
    env = verifier.verify(signer.sign_command(cmd))
    assert env.command == cmd


def test_signing_keeps_the_gil_and_cryptography_does_not():
    # the control: cryptography's sign releases the GIL, so the probe thread runs during many of the calls
    key = ed25519.Ed25519PrivateKey.generate()
    h = held(key)
    message = b"m" * (256 << 10)  # ~1 ms of hashing: a release is seen every time, a held call never
    released = gil_handoffs(lambda: key.sign(message))
    kept = gil_handoffs(lambda: h.sign(message))
    assert released >= 12, released
    assert kept <= 2, kept
