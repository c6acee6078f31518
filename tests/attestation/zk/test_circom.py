"""circom circuits: compiled with circom2 (npm) at test time; their .wasm witness generator under
wasmtime gives snarkjs's witness byte for byte; snarkjs's own pipeline proves, ours verifies, and
ours proves what snarkjs verifies."""
from __future__ import annotations

import json
import subprocess

import pytest

from attestation.zk import ZkError, dev_setup, prepare, prove, verify
from attestation.zk.circom import WitnessCalculator
from attestation.zk.field import R
from attestation.zk.formats import r1cs_file, snarkjs_json as sj, wtns, zkey

from .conftest import REPO, snarkjs

CIRCUIT = """pragma circom 2.0.0;
template Dot(n) {
    signal input x[n];
    signal input w[n];
    signal input b;
    signal output y;
    signal acc[n];
    acc[0] <== x[0] * w[0] + b;
    for (var i = 1; i < n; i++) { acc[i] <== acc[i-1] + x[i] * w[i]; }
    y <== acc[n-1] * acc[n-1];
}
component main {public [w, b]} = Dot(4);
"""
INPUT = {"x": [6528, 6400, 2560, 12800], "w": [3, -2, 7, 1], "b": -50000}


@pytest.fixture(scope="module")
def circom(tmp_path_factory):
    d = tmp_path_factory.mktemp("circom")
    (d / "dot.circom").write_text(CIRCUIT)
    circom2 = REPO / "node_modules" / ".bin" / "circom2"
    assert circom2.exists(), f"{circom2} is missing; run `make setup` (npm ci from package-lock.json)"
    res = subprocess.run([str(circom2), str(d / "dot.circom"), "--r1cs", "--wasm", "-o", str(d)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    (d / "input.json").write_text(json.dumps(INPUT))
    snarkjs("wtns", "calculate", d / "dot_js" / "dot.wasm", d / "input.json", d / "snarkjs.wtns", check=True)
    return d


def test_wasm_witness_under_wasmtime_equals_snarkjs(circom):
    w = WitnessCalculator(circom / "dot_js" / "dot.wasm").calculate(INPUT)
    assert wtns.dumps(w) == (circom / "snarkjs.wtns").read_bytes()
    r = r1cs_file.read(circom / "dot.r1cs")
    assert r.first_unsatisfied(w) is None
    acc = sum(x * w_ for x, w_ in zip(INPUT["x"], INPUT["w"])) + INPUT["b"]
    assert w[1] == acc * acc % R  # the output y


def test_witness_generator_errors_are_zkerror(circom):
    wc = WitnessCalculator(circom / "dot_js" / "dot.wasm")
    with pytest.raises(ZkError, match="no input signal 'z'"):
        wc.calculate({**INPUT, "z": 1})
    with pytest.raises(ZkError, match="takes 4 values"):
        wc.calculate({**INPUT, "x": [1, 2]})
    with pytest.raises(ZkError, match="not a loadable"):
        WitnessCalculator(b"\x00asm garbage")


def test_snarkjs_pipeline_proof_verified_by_ours(circom):
    d = circom
    snarkjs("powersoftau", "new", "bn128", "5", d / "p0.ptau", check=True)
    snarkjs("powersoftau", "contribute", d / "p0.ptau", d / "p1.ptau", "--name=t", "-e=entropy", check=True)
    snarkjs("powersoftau", "prepare", "phase2", d / "p1.ptau", d / "pf.ptau", check=True)
    snarkjs("groth16", "setup", d / "dot.r1cs", d / "pf.ptau", d / "c0.zkey", check=True)
    snarkjs("zkey", "contribute", d / "c0.zkey", d / "c1.zkey", "--name=p2", "-e=more", check=True)
    snarkjs("zkey", "export", "verificationkey", d / "c1.zkey", d / "vk.json", check=True)
    snarkjs("groth16", "prove", d / "c1.zkey", d / "snarkjs.wtns", d / "proof.json", d / "public.json", check=True)
    vk = sj.vk_from_json(sj.load(d / "vk.json"))
    public = sj.public_from_json(sj.load(d / "public.json"))
    proof = sj.proof_from_json(sj.load(d / "proof.json"))
    assert verify(vk, public, proof)
    assert public[1:5] == [v % R for v in INPUT["w"]]  # outputs first, then public inputs in order
    assert not verify(vk, [public[0], *public[1:4], (public[4] + 1) % R, public[5]], proof)
    # and our prover on snarkjs's key and our wasmtime witness: snarkjs accepts
    w = WitnessCalculator(d / "dot_js" / "dot.wasm").calculate(INPUT)
    ours = prove(prepare(zkey.read(d / "c1.zkey")), w)
    sj.dump(d / "ours.json", sj.proof_to_json(ours))
    res = snarkjs("groth16", "verify", d / "vk.json", d / "public.json", d / "ours.json")
    assert res.returncode == 0 and "OK!" in res.stdout


def test_dev_setup_on_a_circom_r1cs(circom, tmp_path):
    r = r1cs_file.read(circom / "dot.r1cs")
    pk = dev_setup(r)
    zkey.write(tmp_path / "c.zkey", pk)
    snarkjs("groth16", "prove", tmp_path / "c.zkey", circom / "snarkjs.wtns", tmp_path / "p.json", tmp_path / "pub.json",
            check=True)
    assert verify(pk.verifying_key(), sj.public_from_json(sj.load(tmp_path / "pub.json")),
                  sj.proof_from_json(sj.load(tmp_path / "p.json")))
