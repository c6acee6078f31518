import hashlib
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attestation.envelope import Command, EnvelopeVerifier, decode
from attestation.errors import EnvelopeError
from attestation.signers import SoftwareSigner

MODEL = hashlib.sha256(b"model").digest()


def _cmd(seq: int, values=(0.01,), model=MODEL, failsafe=False) -> Command:
    now = time.time_ns()
    return Command("ns=2;s=RollGapCommand", values, seq, seq * 10, now, now + 8_000_000, model, failsafe)


def test_sign_and_verify_round_trip():
    signer = SoftwareSigner()
    verifier = EnvelopeVerifier(signer.public_key_pem(), MODEL)
    cmd = _cmd(1, (0.125, -3.5), failsafe=True)
    env = verifier.verify(signer.sign_command(cmd))
    assert env.command == cmd
    assert env.key_id == signer.key_id


def test_every_flipped_byte_is_rejected():
    signer = SoftwareSigner()
    data = signer.sign_command(_cmd(1))
    for i in range(len(data)):
        tampered = bytearray(data)
        tampered[i] ^= 0x01
        with pytest.raises(EnvelopeError):
            EnvelopeVerifier(signer.public_key_pem(), MODEL).verify(bytes(tampered))


def test_replay_and_old_sequence_rejected():
    signer = SoftwareSigner()
    verifier = EnvelopeVerifier(signer.public_key_pem(), MODEL)
    first, second = signer.sign_command(_cmd(5)), signer.sign_command(_cmd(4))
    verifier.verify(first)
    with pytest.raises(EnvelopeError) as exc:
        verifier.verify(first)
    assert exc.value.code == "replay"
    with pytest.raises(EnvelopeError, match="not above the last accepted 5"):
        verifier.verify(second)


def test_wrong_model_and_wrong_key():
    signer, other = SoftwareSigner(), SoftwareSigner()
    verifier = EnvelopeVerifier(signer.public_key_pem(), MODEL)
    with pytest.raises(EnvelopeError) as exc:
        verifier.verify(signer.sign_command(_cmd(1, model=hashlib.sha256(b"other").digest())))
    assert exc.value.code == "model"
    with pytest.raises(EnvelopeError) as exc:
        verifier.verify(other.sign_command(_cmd(2)))
    assert exc.value.code == "key"


@given(st.binary(max_size=200))
def test_garbage_is_rejected_as_malformed(data):
    with pytest.raises(EnvelopeError) as exc:
        decode(data)
    assert exc.value.code == "malformed"


@given(st.integers(0, 150))
def test_truncation_is_malformed(cut):
    data = SoftwareSigner().sign_command(_cmd(1))
    with pytest.raises(EnvelopeError) as exc:
        decode(data[:min(cut, len(data) - 1)])
    assert exc.value.code == "malformed"


@given(st.text(max_size=60), st.lists(st.floats(allow_nan=False), max_size=8), st.integers(0, 2**63 - 1),
       st.integers(0, 2**63 - 1), st.integers(-2**63, 2**63 - 1), st.booleans())
def test_any_command_round_trips(target, values, seq, frame_seq, issued, failsafe):
    from hypothesis import assume

    assume(len(target.encode()) <= 255)
    cmd = Command(target, tuple(values), seq, frame_seq, issued, issued // 2, MODEL, failsafe)
    env, _ = decode(SoftwareSigner().sign_command(cmd))
    assert env.command == cmd
