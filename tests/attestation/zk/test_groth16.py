"""Groth16 end to end, with snarkjs as the independent checker in both directions."""
from __future__ import annotations

import copy
import hashlib
import json

import pytest

from attestation.zk import backend, prepare, prove, verify
from attestation.zk.field import R
from attestation.zk.formats import r1cs_file, snarkjs_json as sj, wtns, zkey

from .conftest import snarkjs, snarkjs_verifies


@pytest.fixture(params=["demo", "generated"])
def proven(request):
    return request.getfixturevalue(request.param)


def test_snarkjs_accepts_our_proof(proven, tmp_path):
    assert verify(proven.pk.verifying_key(), proven.public, proven.proof)
    assert snarkjs_verifies(proven.vk_json, proven.public_json, proven.proof_json, tmp_path)


def test_our_vk_json_is_what_snarkjs_exports(proven, tmp_path):
    zkey.write(tmp_path / "c.zkey", proven.pk)
    snarkjs("zkey", "export", "verificationkey", tmp_path / "c.zkey", tmp_path / "vk.json", check=True)
    assert json.loads((tmp_path / "vk.json").read_text()) == proven.vk_json


def test_snarkjs_proves_with_our_zkey_and_witness_and_we_verify(proven, tmp_path):
    zkey.write(tmp_path / "c.zkey", proven.pk)
    r1cs_file.write(tmp_path / "c.r1cs", proven.r1cs)
    wtns.write(tmp_path / "w.wtns", proven.witness)
    res = snarkjs("wtns", "check", tmp_path / "c.r1cs", tmp_path / "w.wtns", check=True)
    assert "WITNESS IS CORRECT" in res.stdout
    snarkjs("groth16", "prove", tmp_path / "c.zkey", tmp_path / "w.wtns", tmp_path / "p.json", tmp_path / "pub.json",
            check=True)
    proof = sj.proof_from_json(json.loads((tmp_path / "p.json").read_text()))
    public = sj.public_from_json(json.loads((tmp_path / "pub.json").read_text()))
    assert public == proven.public
    assert verify(proven.pk.verifying_key(), public, proof)
    assert not verify(proven.pk.verifying_key(), [(public[0] + 1) % R, *public[1:]], proof)


def test_backends_give_identical_proofs(generated):
    r, s = 123456789, 987654321
    proofs = {name: prove(prepare(generated.pk, name), generated.witness, r=r, s=s) for name in backend.available()}
    assert len(proofs) >= 2
    assert len({(p.a, p.b, p.c) for p in proofs.values()}) == 1
    assert verify(generated.pk.verifying_key(), generated.public, proofs["int"])
    # and different blinding gives a different, equally valid proof
    other = prove(prepare(generated.pk, "gmpy2"), generated.witness, r=r + 1, s=s)
    assert other.a != proofs["int"].a and verify(generated.pk.verifying_key(), generated.public, other)


def test_tampered_public_signals_rejected_by_both(demo, tmp_path):
    # demo layout (attestation/zk/compiler.py, docs/zk.md): 0 output, 1-2 model SHA-256 hi/lo, 3-8 inputs, 9 mill_mode
    for i in (0, 3, len(demo.public) - 1):  # the output, the first input, the context signal (mill_mode)
        bad = list(demo.public)
        bad[i] = (bad[i] + 1) % R
        assert not verify(demo.pk.verifying_key(), bad, demo.proof)
        assert not snarkjs_verifies(demo.vk_json, sj.public_to_json(bad), demo.proof_json, tmp_path / str(i))


def test_tampered_model_hash_rejected_by_both(demo, demo_circuit, tmp_path):
    """The model SHA-256 (public signals 1 and 2) is bound by the proof: a proof made for one model
    does not verify as a proof for another model hash, whichever half changes."""
    first = demo_circuit.chain.n_outputs  # the hash follows the outputs
    hi, lo = demo_circuit.hash_signals()
    assert demo.public[first:first + 2] == [hi, lo]
    other = int(hashlib.sha256(b"another model").hexdigest(), 16)
    cases = {"hi+1": {first: (hi + 1) % R}, "lo+1": {first + 1: (lo + 1) % R},
             "hi,lo swapped": {first: lo, first + 1: hi},
             "another model's hash": {first: other >> 128, first + 1: other & ((1 << 128) - 1)}}
    for what, change in cases.items():
        bad = list(demo.public)
        for i, v in change.items():
            bad[i] = v
        assert bad != demo.public
        assert not verify(demo.pk.verifying_key(), bad, demo.proof), what
        assert not verify(demo.pk.verifying_key(), bad, demo.proof, "gmpy2"), what  # the py_ecc reference too
        assert not snarkjs_verifies(demo.vk_json, sj.public_to_json(bad), demo.proof_json,
                                    tmp_path / what.replace(" ", "_").replace(",", "").replace("'", "")), what


def test_tampered_proof_rejected_by_both(generated, tmp_path):
    from attestation.zk import curve
    from attestation.zk.keys import Proof

    be = backend.get("gmpy2")
    vk = generated.pk.verifying_key()
    p = generated.proof
    swapped = Proof(curve.add(curve.G1, p.a, p.a, be), p.b, p.c)  # valid point, wrong proof
    assert not verify(vk, generated.public, swapped)
    assert not snarkjs_verifies(generated.vk_json, generated.public_json, sj.proof_to_json(swapped), tmp_path / "a")
    c_neg = Proof(p.a, p.b, curve.neg(curve.G1, p.c))
    assert not verify(vk, generated.public, c_neg)
    assert not snarkjs_verifies(generated.vk_json, generated.public_json, sj.proof_to_json(c_neg), tmp_path / "c")


def test_tampered_vk_rejected_by_both(generated, demo, tmp_path):
    vk = copy.deepcopy(generated.vk_json)
    vk["IC"][1] = vk["IC"][2]
    assert not verify(sj.vk_from_json(vk), generated.public, generated.proof)
    assert not snarkjs_verifies(vk, generated.public_json, generated.proof_json, tmp_path / "ic")
    vk = copy.deepcopy(generated.vk_json)
    vk["vk_delta_2"] = vk["vk_gamma_2"]
    assert not verify(sj.vk_from_json(vk), generated.public, generated.proof)
    assert not snarkjs_verifies(vk, generated.public_json, generated.proof_json, tmp_path / "delta")
    # another circuit's key
    assert not snarkjs_verifies(demo.vk_json, demo.public_json, generated.proof_json, tmp_path / "other")
