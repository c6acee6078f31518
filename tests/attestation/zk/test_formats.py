"""Binary and JSON formats: round trips, and garbage in -> ZkError, never another exception."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from attestation.zk import ZkError
from attestation.zk.formats import r1cs_file, snarkjs_json as sj, wtns, zkey

from .conftest import generated_circuit

_SMALL = generated_circuit(3, seed=5)
_R1CS = r1cs_file.dumps(_SMALL.r1cs)
_WTNS = wtns.dumps(_SMALL.witness([2, 3, 4]))
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _small_zkey() -> bytes:
    from attestation.zk import ToxicWaste, dev_setup

    return zkey.dumps(dev_setup(_SMALL.r1cs, ToxicWaste(2, 3, 5, 7, 11)))


_ZKEY = _small_zkey()


def test_round_trips(generated, tmp_path):
    assert r1cs_file.loads(r1cs_file.dumps(generated.r1cs)) == generated.r1cs
    assert wtns.loads(wtns.dumps(generated.witness)) == generated.witness
    assert zkey.loads(zkey.dumps(generated.pk)) == generated.pk
    assert zkey.dumps(zkey.loads(_ZKEY)) == _ZKEY
    assert sj.proof_from_json(json.loads(json.dumps(generated.proof_json))) == generated.proof
    assert sj.vk_from_json(generated.vk_json) == generated.pk.verifying_key()
    assert sj.public_from_json(generated.public_json) == generated.public
    r1cs_file.write(tmp_path / "c.r1cs", generated.r1cs)
    assert r1cs_file.read(tmp_path / "c.r1cs") == generated.r1cs


def _parse_all(data: bytes) -> None:
    for loads in (r1cs_file.loads, wtns.loads, zkey.loads):
        try:
            loads(data)
        except ZkError:
            pass


@_SETTINGS
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_zkerror(data):
    _parse_all(data)
    _parse_all(b"r1cs" + data)
    _parse_all(b"wtns" + data)
    _parse_all(b"zkey" + data)


@_SETTINGS
@given(st.sampled_from([_R1CS, _WTNS, _ZKEY]), st.data())
def test_mutated_files_raise_only_zkerror(blob, data):
    b = bytearray(blob)
    kind = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
    pos = data.draw(st.integers(0, len(b) - 1))
    if kind == "flip":
        b[pos] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        del b[pos:]
    else:
        b[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
    _parse_all(bytes(b))


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=20)


@_SETTINGS
@given(_json)
def test_random_json_raises_only_zkerror(obj):
    for f in (sj.proof_from_json, sj.public_from_json, sj.vk_from_json):
        try:
            f(obj)
        except ZkError:
            pass


@_SETTINGS
@given(st.data())
def test_mutated_snarkjs_json_raises_only_zkerror(generated, data):
    vk = json.loads(json.dumps(generated.vk_json))
    proof = json.loads(json.dumps(generated.proof_json))
    target = data.draw(st.sampled_from([vk, proof]))
    key = data.draw(st.sampled_from(sorted(target)))
    target[key] = data.draw(_json)
    for f, o in ((sj.vk_from_json, vk), (sj.proof_from_json, proof)):
        try:
            f(o)
        except ZkError:
            pass


def test_unreadable_json_file_is_zkerror(tmp_path):
    (tmp_path / "x.json").write_bytes(b"\xff\x00{")
    try:
        sj.load(tmp_path / "x.json")
    except ZkError as e:
        assert "x.json" in str(e)
    else:
        raise AssertionError("no error")
