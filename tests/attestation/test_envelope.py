"""Command envelopes as COSE_Sign1: the verifier's contract (round trip, tampering, replay, key,
model, freshness), the wire layout seen by an independent CBOR decoder, and hostile input."""
import hashlib
import math
import time

import cbor2
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attestation import cose
from attestation.envelope import (ALG_ECDSA_P256_SHA256, CONTENT_TYPE, DEFAULT_DEADLINE_GRACE_NS, DEFAULT_MAX_AGE_NS,
                                  DEFAULT_MAX_FUTURE_NS, DEFAULT_MAX_VALIDITY_NS, MAX_ENVELOPE_BYTES, Command,
                                  EnvelopeVerifier, assemble, decode, key_id_of, to_be_signed)
from attestation.errors import EnvelopeError
from attestation.signers import SoftwareSigner

MODEL = hashlib.sha256(b"model").digest()
SIGNER = SoftwareSigner()  # one key for the tests that only need some valid envelope


def _cmd(seq: int, values=(0.01,), model=MODEL, failsafe=False, now=None) -> Command:
    now = time.time_ns() if now is None else now
    return Command("ns=2;s=RollGapCommand", values, seq, seq * 10, now, now + 8_000_000, model, failsafe)


def _pem(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _es256_envelope(key: ec.EllipticCurvePrivateKey, cmd: Command) -> bytes:
    """What the TPM signer does, with a software P-256 key."""
    signed, parts = to_be_signed(cmd, ALG_ECDSA_P256_SHA256, key_id_of(key.public_key()))
    return assemble(parts, cose.es256_from_der(key.sign(signed, ec.ECDSA(hashes.SHA256()))))


def _malformed(data, match: str | None = None) -> EnvelopeError:
    with pytest.raises(EnvelopeError, match=match) as exc:
        decode(data)
    assert exc.value.code == "malformed", exc.value.reason
    return exc.value


# --- the contract --------------------------------------------------------------------------

def test_sign_and_verify_round_trip():
    signer = SoftwareSigner()
    verifier = EnvelopeVerifier(signer.public_key_pem(), MODEL)
    cmd = _cmd(1, (0.125, -3.5), failsafe=True)
    env = verifier.verify(signer.sign_command(cmd))
    assert env.command == cmd
    assert env.key_id == signer.key_id
    assert env.algorithm == signer.algorithm == cose.ALG_EDDSA


def test_every_flipped_bit_is_rejected():
    data = SIGNER.sign_command(_cmd(1))
    for i in range(len(data)):
        for bit in range(8):
            tampered = bytearray(data)
            tampered[i] ^= 1 << bit
            with pytest.raises(EnvelopeError):
                EnvelopeVerifier(SIGNER.public_key_pem(), MODEL).verify(bytes(tampered))


def test_replay_and_old_sequence_rejected():
    verifier = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL)
    first, second = SIGNER.sign_command(_cmd(5)), SIGNER.sign_command(_cmd(4))
    verifier.verify(first)
    with pytest.raises(EnvelopeError) as exc:
        verifier.verify(first)
    assert exc.value.code == "replay"
    with pytest.raises(EnvelopeError, match="not above the last accepted 5"):
        verifier.verify(second)


def test_wrong_model_and_wrong_key():
    other = SoftwareSigner()
    verifier = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL)
    with pytest.raises(EnvelopeError) as exc:
        verifier.verify(SIGNER.sign_command(_cmd(1, model=hashlib.sha256(b"other").digest())))
    assert exc.value.code == "model"
    with pytest.raises(EnvelopeError) as exc:
        verifier.verify(other.sign_command(_cmd(2)))
    assert exc.value.code == "key"
    with pytest.raises(EnvelopeError, match="signature algorithm ES256") as exc:
        verifier.verify(_es256_envelope(ec.generate_private_key(ec.SECP256R1()), _cmd(3)))
    assert exc.value.code == "key"


def test_more_accepted_models_widen_the_pin_and_nothing_else():
    second, third = hashlib.sha256(b"model v2").digest(), hashlib.sha256(b"other").digest()
    verifier = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, also_accepted_models=[second])
    assert verifier.verify(SIGNER.sign_command(_cmd(1))).command.model_sha256 == MODEL
    assert verifier.verify(SIGNER.sign_command(_cmd(2, model=second))).command.model_sha256 == second
    with pytest.raises(EnvelopeError, match="or one of 1 more accepted") as exc:
        verifier.verify(SIGNER.sign_command(_cmd(3, model=third)))
    assert exc.value.code == "model"
    with pytest.raises(ValueError, match="needs expected_model_sha256"):
        EnvelopeVerifier(SIGNER.public_key_pem(), None, also_accepted_models=[second])
    with pytest.raises(ValueError, match="32 bytes"):
        EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, also_accepted_models=[second[:31]])


def test_signature_from_another_key_with_a_copied_kid_is_rejected():
    cmd = _cmd(1)
    signed, parts = to_be_signed(cmd, SIGNER.algorithm, SIGNER.key_id)
    forged = assemble(parts, ed25519.Ed25519PrivateKey.generate().sign(signed))
    with pytest.raises(EnvelopeError) as exc:
        EnvelopeVerifier(SIGNER.public_key_pem(), MODEL).verify(forged)
    assert exc.value.code == "signature"


def test_stale_commands_are_rejected():
    now = 10**18
    clock = [now]
    verifier = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, max_age_ns=5_000_000, clock=lambda: clock[0],
                                deadline_grace_ns=0)
    verifier.verify(SIGNER.sign_command(_cmd(1, now=now)))
    clock[0] = now + 8_000_001  # past the deadline of a command issued at `now`
    with pytest.raises(EnvelopeError, match="deadline passed") as exc:
        verifier.verify(SIGNER.sign_command(_cmd(2, now=now)))
    assert exc.value.code == "stale"
    clock[0] = now + 6_000_000  # before the deadline, but older than max_age_ns
    with pytest.raises(EnvelopeError, match="more than the 5 ms allowed") as exc:
        verifier.verify(SIGNER.sign_command(_cmd(3, now=now)))
    assert exc.value.code == "stale"
    assert verifier.last_sequence == 1  # a refused command does not move the replay window
    verifier.verify(SIGNER.sign_command(_cmd(4, now=now + 5_000_000)))


def test_future_commands_long_validity_and_the_deadline_grace():
    now = 10**18
    clock = [now]
    v = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, max_age_ns=50_000_000, clock=lambda: clock[0],
                         deadline_grace_ns=2_000_000, max_future_ns=1_000_000, max_validity_ns=20_000_000)
    with pytest.raises(EnvelopeError, match="in the future") as exc:  # the signer's clock runs 5 ms ahead
        v.verify(SIGNER.sign_command(_cmd(1, now=now + 5_000_000)))
    assert exc.value.code == "stale"
    long_lived = Command("ns=2;s=RollGapCommand", (0.01,), 2, 2, now, now + 60_000_000, MODEL, False)
    with pytest.raises(EnvelopeError, match="valid for 60.000 ms after it was issued"):
        v.verify(SIGNER.sign_command(long_lived))
    clock[0] = now + 9_000_000  # 1 ms past the 8 ms deadline: within the 2 ms grace
    v.verify(SIGNER.sign_command(_cmd(3, now=now)))
    clock[0] = now + 10_500_000  # 2.5 ms past it: refused
    with pytest.raises(EnvelopeError, match="deadline passed"):
        v.verify(SIGNER.sign_command(_cmd(4, now=now)))
    assert v.last_sequence == 3


def test_a_default_verifier_refuses_a_held_back_command():
    """The security finding: a command held back for minutes (by an attacker or a stuck network) must not be
    accepted just because no newer one was. A verifier built with defaults checks freshness on the wall clock."""
    verifier = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL)
    assert verifier.freshness and verifier.clock is time.time_ns
    held_back = SIGNER.sign_command(_cmd(7, now=time.time_ns() - 300 * 10**9))  # issued 5 minutes ago
    expired = r"command 7 expired \d+\.\d{3} ms ago \(deadline passed, 200 ms grace\)"
    with pytest.raises(EnvelopeError, match=expired) as exc:
        verifier.verify(held_back)
    assert exc.value.code == "stale"
    assert verifier.last_sequence == -1  # refused: the replay window did not move
    assert verifier.verify(SIGNER.sign_command(_cmd(8))).command.sequence == 8


def test_default_freshness_bounds_on_an_injected_clock():
    now = 10**18
    clock = [now]
    v = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, clock=lambda: clock[0])
    assert (v.max_age_ns, v.deadline_grace_ns, v.max_future_ns, v.max_validity_ns) == (
        DEFAULT_MAX_AGE_NS, DEFAULT_DEADLINE_GRACE_NS, DEFAULT_MAX_FUTURE_NS, DEFAULT_MAX_VALIDITY_NS)

    def cmd(seq, issued, validity):
        return SIGNER.sign_command(Command("t", (0.5,), seq, seq, issued, issued + validity, MODEL))

    # within the deadline's 200 ms grace but issued more than 1 s ago: the age bound refuses it
    too_old = r"issued 1100\.000 ms ago, more than the 1000 ms allowed \(held back"
    with pytest.raises(EnvelopeError, match=too_old) as exc:
        v.verify(cmd(1, now - 1_100_000_000, 1_000_000_000))
    assert exc.value.code == "stale"
    v.verify(cmd(2, now - DEFAULT_MAX_AGE_NS, DEFAULT_MAX_AGE_NS))  # exactly 1 s old, deadline now: accepted
    v.verify(cmd(3, now - 8_000_000 - DEFAULT_DEADLINE_GRACE_NS, 8_000_000))  # exactly at the end of the grace
    with pytest.raises(EnvelopeError, match="deadline passed") as exc:
        v.verify(cmd(4, now - 8_000_001 - DEFAULT_DEADLINE_GRACE_NS, 8_000_000))
    assert exc.value.code == "stale"
    with pytest.raises(EnvelopeError, match="valid for 3600000.000 ms after it was issued, more than the 1000 ms"):
        v.verify(cmd(5, now, 3600 * 10**9))  # a signer cannot hand out a command that stays valid for an hour
    assert v.last_sequence == 3


def test_a_default_verifier_refuses_a_far_future_command():
    verifier = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL)
    future = SIGNER.sign_command(_cmd(1, now=time.time_ns() + 60 * 10**9))  # a signer clock 1 minute ahead
    with pytest.raises(EnvelopeError, match=r"issued 5\d{4}\.\d{3} ms in the future \(more than 1000 ms\)") as exc:
        verifier.verify(future)
    assert exc.value.code == "stale"
    assert verifier.last_sequence == -1


def test_offline_verification_opts_out_of_freshness_explicitly():
    """Old audit records, fuzz inputs and benchmark batches: freshness=False checks everything but time."""
    old = _cmd(1, now=1_000)
    offline = EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, freshness=False)
    assert offline.clock is None
    assert offline.verify(SIGNER.sign_command(old)).command == old
    assert offline.verify(SIGNER.sign_command(_cmd(2, now=time.time_ns() + 3600 * 10**9))).command.sequence == 2
    with pytest.raises(EnvelopeError) as exc:  # the other checks still hold
        offline.verify(SIGNER.sign_command(old))
    assert exc.value.code == "replay"
    with pytest.raises(EnvelopeError) as exc:
        offline.verify(SIGNER.sign_command(_cmd(3, model=hashlib.sha256(b"other").digest(), now=1_000)))
    assert exc.value.code == "model"
    with pytest.raises(EnvelopeError) as exc:  # without the opt-out the same old envelope is stale
        EnvelopeVerifier(SIGNER.public_key_pem(), MODEL).verify(SIGNER.sign_command(old))
    assert exc.value.code == "stale"
    # dropping the age bound alone is not an opt-out: the deadline is still checked on the wall clock
    with pytest.raises(EnvelopeError) as exc:
        EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, max_age_ns=None).verify(SIGNER.sign_command(old))
    assert exc.value.code == "stale"


def test_contradictory_freshness_options_are_refused():
    with pytest.raises(ValueError, match="freshness=False checks no time"):
        EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, freshness=False, clock=time.time_ns)
    with pytest.raises(ValueError, match="deadline_grace_ns must not be negative"):
        EnvelopeVerifier(SIGNER.public_key_pem(), MODEL, deadline_grace_ns=-1)


def test_session_verifier_passes_the_default_freshness_through():
    from attestation.session import SessionVerifier

    ak = _pem(ec.generate_private_key(ec.SECP256R1()).public_key())
    options = SessionVerifier(ak, MODEL)._envelope_options
    assert options["freshness"] is True and options["max_age_ns"] == DEFAULT_MAX_AGE_NS
    assert options["deadline_grace_ns"] == DEFAULT_DEADLINE_GRACE_NS
    assert SessionVerifier(ak, MODEL, freshness=False)._envelope_options["freshness"] is False


def test_es256_signatures_are_64_byte_r_s():
    key = ec.generate_private_key(ec.SECP256R1())
    cmd = _cmd(1)
    data = _es256_envelope(key, cmd)
    env = EnvelopeVerifier(_pem(key.public_key()), MODEL).verify(data)
    assert env.algorithm == cose.ALG_ES256 and env.command == cmd
    assert len(env.signature) == 64
    r, s = int.from_bytes(env.signature[:32], "big"), int.from_bytes(env.signature[32:], "big")
    key.public_key().verify(encode_dss_signature(r, s), decode(data)[1], ec.ECDSA(hashes.SHA256()))
    signed, parts = to_be_signed(cmd, ALG_ECDSA_P256_SHA256, key_id_of(key.public_key()))
    _malformed(assemble(parts, key.sign(signed, ec.ECDSA(hashes.SHA256()))), "signature is 7[0-2] bytes, expected 64")


def test_envelope_is_cose_sign1_to_an_independent_decoder():
    cmd = _cmd(7, (0.25, -1.0))
    data = SIGNER.sign_command(cmd)
    item = cbor2.loads(data)
    assert isinstance(item, cbor2.CBORTag) and item.tag == 18
    assert len(item.value) == 4
    protected, unprotected, payload, signature = item.value
    assert cbor2.loads(protected) == {1: -8, 3: CONTENT_TYPE, 4: SIGNER.key_id}
    assert dict(unprotected) == {}
    assert cbor2.loads(payload) == {1: cmd.target, 2: [0.25, -1.0], 3: 7, 4: 70, 5: cmd.issued_ns,
                                    6: cmd.deadline_ns, 7: MODEL, 8: False}
    sig_structure = cbor2.dumps(["Signature1", protected, b"", payload])
    assert decode(data)[1] == sig_structure
    serialization.load_pem_public_key(SIGNER.public_key_pem()).verify(signature, sig_structure)
    assert cose.verify_sign1(data, serialization.load_pem_public_key(SIGNER.public_key_pem())).payload == payload


@given(st.text(max_size=60), st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=8),
       st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(-2**63, 2**63 - 1), st.booleans())
def test_any_command_round_trips(target, values, seq, frame_seq, issued, failsafe):
    assume(len(target.encode()) <= 255)
    cmd = Command(target, tuple(values), seq, frame_seq, issued, issued // 2, MODEL, failsafe)
    env, _ = decode(SIGNER.sign_command(cmd))
    assert env.command == cmd


@pytest.mark.parametrize("cmd, reason", [
    (Command("t" * 256, (0.0,), 1, 1, 0, 0, MODEL), "longer than 255 bytes"),
    (Command("t", (math.nan,), 1, 1, 0, 0, MODEL), "finite"),
    (Command("t", (0.0,), -1, 1, 0, 0, MODEL), "outside"),
    (Command("t", (0.0,), 1, 1, 2**63, 0, MODEL), "outside"),
    (Command("t", (0.0,), 1, 1, 0, 0, MODEL[:31]), "32 bytes"),
])
def test_commands_the_format_cannot_carry_are_refused_at_signing(cmd, reason):
    with pytest.raises(ValueError, match=reason):
        SIGNER.sign_command(cmd)


# --- strict decoding of hostile input ------------------------------------------------------

BASE = SIGNER.sign_command(_cmd(1, values=(0.5,)))
_PROTECTED, _, _PAYLOAD, _SIG = cbor2.loads(BASE).value
_HEADERS = cbor2.loads(_PROTECTED)
_FIELDS = cbor2.loads(_PAYLOAD)


def _sign1(protected=_PROTECTED, unprotected=None, payload=_PAYLOAD, signature=_SIG, tag=18, extra=()) -> bytes:
    parts = [protected, {} if unprotected is None else unprotected, payload, signature, *extra]
    return cbor2.dumps(cbor2.CBORTag(tag, parts) if tag is not None else parts)


def _changed(base: dict, changes: dict) -> dict:
    """`base` with entries replaced, or removed where the new value is None."""
    out = dict(base)
    for key, value in changes.items():
        if value is None:
            del out[key]
        else:
            out[key] = value
    return out


def _headers(**changes) -> bytes:
    """An envelope whose protected bucket has labels replaced or removed (h_N=value or None)."""
    return _sign1(protected=_protected(**changes))


def _protected(**changes) -> bytes:
    return cbor2.dumps(_changed(_HEADERS, {int(k[2:]): v for k, v in changes.items()}))


def _fields(**changes) -> bytes:
    """An envelope whose payload has fields replaced or removed (f_N=value or None)."""
    return _sign1(payload=cbor2.dumps(_changed(_FIELDS, {int(k[2:]): v for k, v in changes.items()})))


def _raw_map(base: dict, raw: dict[int, bytes] | None = None, order=sorted, extra=()) -> bytes:
    """A CBOR map written by hand, to say what cbor2 would not write: `raw` gives value bytes as
    is, `extra` appends (key bytes, value bytes) entries, `order` orders the keys."""
    raw = raw or {}
    entries = [(cbor2.dumps(k), raw.get(k, cbor2.dumps(base[k]))) for k in order(base)] + list(extra)
    return bytes([0xA0 + len(entries)]) + b"".join(k + v for k, v in entries)


def _raw_payload(**kwargs) -> bytes:
    return _sign1(payload=_raw_map(_FIELDS, **kwargs))


_HALF = bytes.fromhex("81f93800")  # [0.5] as a half-precision float
_SINGLE = bytes.fromhex("81fa3f000000")  # [0.5] as a single-precision float

HOSTILE = {
    # COSE structure
    "wrong tag": (_sign1(tag=17), "expected CBOR tag 18"),
    "untagged": (_sign1(tag=None), "expected CBOR tag 18"),
    "self-describe tag around it": (b"\xd9\xd9\xf7" + BASE, "expected CBOR tag 18"),
    "tag 18 in a long head": (b"\xd8\x12" + BASE[1:], "expected CBOR tag 18"),
    "3 elements": (cbor2.dumps(cbor2.CBORTag(18, [_PROTECTED, {}, _PAYLOAD])), "array of 4"),
    "5 elements": (_sign1(extra=[b""]), "array of 4"),
    "not an array": (cbor2.dumps(cbor2.CBORTag(18, {1: 2})), "array of 4"),
    "protected is a map": (_sign1(protected=_HEADERS), "protected header must be a byte string"),
    "unprotected is bytes": (_sign1(unprotected=b""), "unprotected header must be a map"),
    "detached payload": (_sign1(payload=None), "detached payload"),
    "payload is text": (_sign1(payload="x"), "payload must be a byte string"),
    "signature is text": (_sign1(signature="x"), "signature must be a byte string"),
    "trailing bytes": (BASE + b"\x00", "bytes after its CBOR item"),
    "truncated": (BASE[:-1], "not valid CBOR"),
    "indefinite array": (b"\xd2\x9f" + cbor2.dumps([_PROTECTED, {}, _PAYLOAD, _SIG])[1:] + b"\xff", "indefinite"),
    "tag inside": (_sign1(unprotected={99: cbor2.CBORTag(1, 0)}), "tag 1 is not allowed"),
    "unprotected header": (_sign1(unprotected={99: 0}), "unprotected header must be empty"),
    "empty": (b"", "expected CBOR tag 18"),
    # headers
    "unknown critical header": (_headers(h_2=[99], h_99=0), "99 is marked critical and is not understood"),
    "crit names an absent header": (_headers(h_2=[7]), "crit names header 7"),
    "crit is empty": (_headers(h_2=[]), "non-empty array"),
    "crit unprotected": (_sign1(unprotected={2: [1]}), "crit header must be protected"),
    "label in both buckets": (_sign1(unprotected={4: SIGNER.key_id}), "in both buckets"),
    "kid only unprotected": (_sign1(_protected(h_4=None), {4: SIGNER.key_id}), "8-byte kid in its protected"),
    "kid of 7 bytes": (_headers(h_4=SIGNER.key_id[:7]), "8-byte kid"),
    "kid is text": (_headers(h_4="kid"), "kid header must be a byte string"),
    "alg is text": (_headers(h_1="EdDSA"), "integer alg"),
    "alg missing": (_headers(h_1=None), "integer alg"),
    "no content type": (_headers(h_3=None), "content type must be"),
    "other content type": (_headers(h_3="application/cbor"), "content type must be"),
    "protected is h'a0'": (_sign1(protected=b"\xa0"), "integer alg"),
    "protected is a list": (_sign1(protected=cbor2.dumps([1])), "must encode a map"),
    "protected has trailing bytes": (_sign1(protected=_PROTECTED + b"\x00"), "protected header has bytes after"),
    "duplicate protected label": (_sign1(protected=_raw_map(_HEADERS, extra=[(b"\x01", b"\x27")])),
                                  "Duplicate map key"),
    "bool protected label": (_sign1(protected=_raw_map(_HEADERS, extra=[(b"\xf4", b"\x00")])), "label of type bool"),
    "signature of 63 bytes": (_sign1(signature=_SIG[:63]), "signature is 63 bytes, expected 64"),
    "empty signature": (_sign1(signature=b""), "signature is 0 bytes"),
    # payload
    "payload not a map": (_sign1(payload=cbor2.dumps([1, 2])), "payload must be a map"),
    "payload empty": (_sign1(payload=b""), "payload is not valid CBOR"),
    "payload has trailing bytes": (_sign1(payload=_PAYLOAD + b"\x00"), "payload has bytes after"),
    "field missing": (_fields(f_8=None), "exactly the keys"),
    "extra field": (_fields(f_9=0), "exactly the keys"),
    "text key": (_sign1(payload=cbor2.dumps({**_changed(_FIELDS, {1: None}), "1": "t"})), "exactly the keys"),
    "true as key 1": (_raw_payload(order=lambda fields: sorted(fields)[1:], extra=[(b"\xf5", b"\x61t")]),
                      "exactly the keys"),
    "duplicate key": (_raw_payload(order=lambda f: sorted(f)[:-1], extra=[(b"\x07", b"\xf4")]), "Duplicate map key"),
    "target is bytes": (_fields(f_1=b"t"), r"field 1 \(target\) must be text"),
    "target too long": (_fields(f_1="t" * 256), r"field 1 \(target\) must be text of at most 255"),
    "values not an array": (_fields(f_2=1.0), r"field 2 \(values\) must be an array"),
    "integer value": (_fields(f_2=[1]), "field 2"),
    "NaN value": (_fields(f_2=[math.nan]), "finite floats"),
    "infinite value": (_fields(f_2=[math.inf]), "finite floats"),
    "nested values": (_fields(f_2=[[1.0]]), "payload is not valid CBOR"),
    "indefinite values": (_raw_payload(raw={2: b"\x9f\xf9\x38\x00\xff"}), "indefinite"),
    "negative sequence": (_fields(f_3=-1), r"field 3 \(sequence\) must be an integer"),
    "bool sequence": (_fields(f_3=True), r"field 3 \(sequence\) must be an integer"),
    "bignum sequence": (_fields(f_3=2**64), "tag 2 is not allowed"),
    "float frame sequence": (_fields(f_4=1.0), "field 4"),
    "issued beyond int64": (_fields(f_5=2**63), "field 5"),
    "deadline is text": (_fields(f_6="soon"), "field 6"),
    "model of 31 bytes": (_fields(f_7=MODEL[:31]), r"field 7 \(model_sha256\) must be a 32-byte string"),
    "failsafe is 0": (_fields(f_8=0), r"field 8 \(failsafe\) must be a boolean"),
    "failsafe is undefined": (_fields(f_8=cbor2.undefined), r"field 8 \(failsafe\) must be a boolean"),
    "half-precision value": (_raw_payload(raw={2: _HALF}), "canonical"),
    "single-precision value": (_raw_payload(raw={2: _SINGLE}), "canonical"),
    "long integer head": (_raw_payload(raw={3: b"\x18\x01"}), "canonical"),
    "keys out of order": (_raw_payload(order=lambda fields: sorted(fields, reverse=True)), "canonical"),
}


def test_hand_written_maps_match_cbor2_when_unchanged():
    """Guards the HOSTILE cases above: the hand writer reproduces the real bytes."""
    assert _raw_map(_FIELDS) == _PAYLOAD and _raw_map(_HEADERS) == _PROTECTED
    assert cbor2.dumps([0.5]) not in (_HALF, _SINGLE) and cbor2.loads(_HALF) == cbor2.loads(_SINGLE) == [0.5]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_envelope_is_malformed_with_a_reason(name):
    data, match = HOSTILE[name]
    _malformed(data, match)
    with pytest.raises(EnvelopeError) as exc:
        EnvelopeVerifier(SIGNER.public_key_pem(), MODEL).verify(data)
    assert exc.value.code == "malformed"


@pytest.mark.parametrize("data", ["text", None, 42, bytearray(BASE)[:10]])
def test_non_bytes_input_is_malformed(data):
    _malformed(data)


def test_oversized_input_is_refused_before_parsing():
    _malformed(BASE + b"\x00" * MAX_ENVELOPE_BYTES, "more than the 16384 allowed")


def test_bytearray_and_memoryview_are_accepted():
    assert decode(bytearray(BASE))[0] == decode(memoryview(BASE))[0] == decode(BASE)[0]


# --- fuzz: nothing but EnvelopeError may leave decode or verify -----------------------------

@given(st.binary(max_size=300))
def test_garbage_is_rejected_as_malformed(data):
    _malformed(data)
    _malformed(b"\xd2" + data)  # past the tag check, into the CBOR decoder


@given(st.integers(0, len(BASE) - 1))
def test_truncation_is_malformed(cut):
    _malformed(BASE[:cut])


@settings(max_examples=400)
@given(st.data())
def test_mutated_envelopes_only_raise_envelope_error(data):
    mutated = bytearray(BASE)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(mutated)))
        op = data.draw(st.sampled_from(("set", "insert", "delete")))
        if op == "set" and at < len(mutated):
            mutated[at] = data.draw(st.integers(0, 255))
        elif op == "insert":
            mutated[at:at] = data.draw(st.binary(min_size=1, max_size=9))
        else:
            del mutated[at:at + data.draw(st.integers(1, 9))]
    assume(bytes(mutated) != BASE)
    with pytest.raises(EnvelopeError):
        EnvelopeVerifier(SIGNER.public_key_pem(), MODEL).verify(bytes(mutated))


_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
            | st.binary(max_size=40))
CBOR_VALUES = st.recursive(
    _scalars,
    lambda kids: (st.lists(kids, max_size=4)
                  | st.dictionaries(st.integers(-3, 10) | st.text(max_size=3), kids, max_size=4)
                  | st.builds(cbor2.CBORTag, st.integers(0, 2**64 - 1), kids)),
    max_leaves=12)


def _decodes_or_is_malformed(data: bytes) -> None:
    """What hostile input may do: decode (a change that keeps it well formed) or raise
    EnvelopeError('malformed'); any other exception fails the test. Verifying must then still refuse it."""
    try:
        decode(data)
    except EnvelopeError as exc:
        assert exc.code == "malformed", exc.reason
    if data != BASE:
        with pytest.raises(EnvelopeError):
            EnvelopeVerifier(SIGNER.public_key_pem(), MODEL).verify(data)


@settings(max_examples=400)
@given(st.integers(0, 3), CBOR_VALUES)
def test_any_cbor_in_any_cose_slot_only_raises_envelope_error(slot, value):
    parts = [_PROTECTED, {}, _PAYLOAD, _SIG]
    parts[slot] = value
    _decodes_or_is_malformed(cbor2.dumps(cbor2.CBORTag(18, parts)))


@settings(max_examples=400)
@given(st.sampled_from(("protected", "unprotected", "payload")), st.integers(-2, 10) | st.text(max_size=2),
       CBOR_VALUES)
def test_any_cbor_in_any_header_or_field_only_raises_envelope_error(where, key, value):
    if where == "protected":
        data = _sign1(protected=cbor2.dumps({**_HEADERS, key: value}))
    elif where == "unprotected":
        data = _sign1(unprotected={key: value})
    else:
        data = _sign1(payload=cbor2.dumps({**_FIELDS, key: value}))
    _decodes_or_is_malformed(data)


def test_the_plc_simulator_checks_freshness_by_default(tmp_path):
    """`sitsctl plcsim` (the demo's PLC) refuses a replayed old command even with a fresh sequence number."""
    from sitsd.plcsim import LazyVerifier, build_parser

    from sitsd.plcsim import freshness_options

    args = build_parser().parse_args(["--trust-key", str(tmp_path / "k.pem")])
    assert args.max_age_ms == 1000.0 and args.deadline_grace_ms == 200.0
    # the library's defaults are the simulator's: a PLC gateway built on EnvelopeVerifier() gets the same checks
    assert freshness_options(args) == {
        "max_age_ns": DEFAULT_MAX_AGE_NS, "deadline_grace_ns": DEFAULT_DEADLINE_GRACE_NS,
        "max_future_ns": DEFAULT_MAX_FUTURE_NS, "max_validity_ns": DEFAULT_MAX_VALIDITY_NS}
    (tmp_path / "k.pem").write_bytes(SIGNER.public_key_pem())
    verify = LazyVerifier(tmp_path / "k.pem", MODEL, freshness_options(args))
    assert verify(SIGNER.sign_command(_cmd(1)))[0] == 1
    with pytest.raises(EnvelopeError, match="deadline passed|more than the 1000 ms allowed"):
        verify(SIGNER.sign_command(_cmd(2, now=time.time_ns() - 2_000_000_000)))
    # no options at all is the verifier's defaults: still fresh
    with pytest.raises(EnvelopeError, match="deadline passed"):
        LazyVerifier(tmp_path / "k.pem", MODEL)(SIGNER.sign_command(_cmd(3, now=time.time_ns() - 2_000_000_000)))
    # --max-age-ms 0 is the explicit opt-out
    off = build_parser().parse_args(["--trust-key", str(tmp_path / "k.pem"), "--max-age-ms", "0"])
    assert freshness_options(off) == {"freshness": False}
    assert LazyVerifier(tmp_path / "k.pem", MODEL, freshness_options(off))(
        SIGNER.sign_command(_cmd(4, now=1_000)))[0] == 4
