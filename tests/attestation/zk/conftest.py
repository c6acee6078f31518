"""Fixtures for the zk tests: snarkjs from npm (the independent verifier), the demo circuit and a
generated circuit with development keys, all made at test time in temporary directories."""
from __future__ import annotations

import functools
import json
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from attestation.zk import Builder, Lin, dev_setup, prepare, prove
from attestation.zk.formats import snarkjs_json as sj
from attestation.zk.keys import Proof, ProvingKey

REPO = Path(__file__).resolve().parents[3]
SNARKJS = REPO / "node_modules" / ".bin" / "snarkjs"
CONFIG = REPO / "examples" / "rolling-mill.yaml"


def snarkjs(*args: str | Path, check: bool = False) -> subprocess.CompletedProcess:
    """Run the pinned snarkjs CLI. Its absence is a failure: `make setup` (npm ci) installs it."""
    assert SNARKJS.exists(), f"{SNARKJS} is missing; run `make setup` (npm ci from package-lock.json)"
    res = subprocess.run([str(SNARKJS), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=REPO)
    if check:
        assert res.returncode == 0, f"snarkjs {args[:2]} failed: {res.stdout}\n{res.stderr}"
    return res


def snarkjs_verifies(vk: dict, public: list, proof: dict, tmp: Path) -> bool:
    tmp.mkdir(parents=True, exist_ok=True)
    for name, obj in (("vk", vk), ("public", public), ("proof", proof)):
        (tmp / f"{name}.json").write_text(json.dumps(obj))
    res = snarkjs("groth16", "verify", tmp / "vk.json", tmp / "public.json", tmp / "proof.json")
    ok = res.returncode == 0 and "OK!" in res.stdout
    assert ok or "Invalid" in res.stdout + res.stderr or "not valid" in res.stdout + res.stderr, res.stdout + res.stderr
    return ok


@dataclass
class Proven:
    """A circuit with keys, a witness and one proof of it."""

    name: str
    pk: ProvingKey
    witness: list[int]
    public: list[int]
    proof: Proof
    dir: Path
    r1cs: object

    @functools.cached_property
    def vk_json(self) -> dict:
        return sj.vk_to_json(self.pk.verifying_key())

    @property
    def proof_json(self) -> dict:
        return sj.proof_to_json(self.proof)

    @property
    def public_json(self) -> list[str]:
        return sj.public_to_json(self.public)


def _proven(name: str, r1cs, witness: list[int], tmp: Path) -> Proven:
    pk = dev_setup(r1cs)
    proof = prove(prepare(pk, "gmpy2"), witness)
    return Proven(name, pk, witness, witness[1:1 + r1cs.n_public], proof, tmp, r1cs)


@pytest.fixture(scope="session")
def demo_circuit():
    from sitsd.config import load_config
    from sitsd.prover import circuit_for_config

    return circuit_for_config(load_config(CONFIG))


DEMO_INPUT = [4.0, 3.0, 2.4, 9000.0, 120.0, 2.5]
DEMO_CONTEXT = [2]  # mill_mode: AGC, the line's normal state (its conditional constraints apply)


@pytest.fixture(scope="session")
def demo(demo_circuit, tmp_path_factory) -> Proven:
    return _proven("demo", demo_circuit.circuit.r1cs, demo_circuit.witness(DEMO_INPUT, DEMO_CONTEXT), tmp_path_factory.mktemp("demo"))


def generated_circuit(n_mul: int, seed: int):
    """A random circuit: public x, y, private k; a chain of products with linear mixing and one range check."""
    rng = random.Random(seed)
    b = Builder(outputs=["out"], public=["x", "y"], private=["k"])
    x, y, k = b.inputs
    acc: Lin = x
    for i in range(n_mul):
        other = [x, y, k][i % 3] * rng.randrange(1, 1000) + rng.randrange(-50, 50)
        acc = b.mul(acc, other) + acc * rng.randrange(-3, 4)
    b.assert_range(y, 0, 1000, "y")
    b.set_output(0, acc + y * 5)
    return b.build()


@pytest.fixture(scope="session")
def generated(tmp_path_factory) -> Proven:
    c = generated_circuit(40, seed=3)
    return _proven("generated", c.r1cs, c.witness([7, 999, 12345]), tmp_path_factory.mktemp("gen"))
