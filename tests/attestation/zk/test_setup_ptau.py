"""Key generation from a snarkjs phase-1 .ptau: byte-identical to `snarkjs groth16 setup`, and the
production flow (our import, snarkjs phase-2 contribution, our prover) verifies with snarkjs."""
from __future__ import annotations

import json

import pytest

from attestation.zk import ZkError, prepare, prove, verify
from attestation.zk.formats import ptau, r1cs_file, snarkjs_json as sj, zkey
from attestation.zk.setup import from_ptau

from .conftest import generated_circuit, snarkjs


@pytest.fixture(scope="module")
def ptau_files(tmp_path_factory):
    """A 2^6 ceremony with one contribution, raw and prepared (small powers keep `prepare phase2` fast)."""
    d = tmp_path_factory.mktemp("ptau")
    snarkjs("powersoftau", "new", "bn128", "6", d / "p0.ptau", check=True)
    snarkjs("powersoftau", "contribute", d / "p0.ptau", d / "p1.ptau", "--name=test", "-e=entropy for the test",
            check=True)
    snarkjs("powersoftau", "prepare", "phase2", d / "p1.ptau", d / "final.ptau", check=True)
    return d


@pytest.fixture(scope="module")
def small():
    return generated_circuit(3, seed=1)  # domain 32: a raw 2^6 file holds the 64 powers the H points need


def test_prepared_ptau_import_is_byte_identical_to_snarkjs_setup(ptau_files, small, tmp_path):
    r1cs_file.write(tmp_path / "c.r1cs", small.r1cs)
    r = r1cs_file.read(tmp_path / "c.r1cs")  # snarkjs sees the same constraint order
    snarkjs("groth16", "setup", tmp_path / "c.r1cs", ptau_files / "final.ptau", tmp_path / "s.zkey", check=True)
    ours = from_ptau(r, ptau.read(ptau_files / "final.ptau"))
    assert zkey.dumps(ours) == (tmp_path / "s.zkey").read_bytes()
    raw = from_ptau(r, ptau.read(ptau_files / "p1.ptau"))  # Lagrange bases by our group FFT
    assert raw == ours


def test_ptau_key_after_snarkjs_phase2_contribution_proves(ptau_files, small, tmp_path):
    r1cs_file.write(tmp_path / "c.r1cs", small.r1cs)
    zkey.write(tmp_path / "c0.zkey", from_ptau(small.r1cs, ptau.read(ptau_files / "final.ptau")))
    snarkjs("zkey", "contribute", tmp_path / "c0.zkey", tmp_path / "c1.zkey", "--name=phase2", "-e=more entropy",
            check=True)
    res = snarkjs("zkey", "verify", tmp_path / "c.r1cs", ptau_files / "final.ptau", tmp_path / "c1.zkey")
    assert res.returncode == 0 and "ZKey Ok!" in res.stdout, res.stdout + res.stderr
    pk = zkey.read(tmp_path / "c1.zkey")
    w = small.witness([5, 17, 9])
    proof = prove(prepare(pk), w)
    public = w[1:1 + pk.n_public]
    assert verify(pk.verifying_key(), public, proof)
    snarkjs("zkey", "export", "verificationkey", tmp_path / "c1.zkey", tmp_path / "vk.json", check=True)
    sj.dump(tmp_path / "proof.json", sj.proof_to_json(proof))
    sj.dump(tmp_path / "public.json", sj.public_to_json(public))
    assert json.loads((tmp_path / "vk.json").read_text()) == sj.vk_to_json(pk.verifying_key())
    res = snarkjs("groth16", "verify", tmp_path / "vk.json", tmp_path / "public.json", tmp_path / "proof.json")
    assert res.returncode == 0 and "OK!" in res.stdout


def test_ptau_too_small_is_a_clear_error(ptau_files):
    big = generated_circuit(70, seed=2)  # domain 128 > 2^6
    with pytest.raises(ZkError, match="power 6"):
        from_ptau(big.r1cs, ptau.read(ptau_files / "final.ptau"))
    with pytest.raises(ZkError, match="not a ptau file|ptau"):
        ptau.loads(b"zkey" + bytes(20))
