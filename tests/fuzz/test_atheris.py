"""Runs every atheris target of tests/fuzz/harness.py for a bounded number of inputs.

Each target starts from a seed corpus of valid inputs made here (UADP messages with every
PublisherId type, the example config, signed envelopes), so libFuzzer mutates real structure
instead of searching for it. A crash, a hang past -timeout or a misbehaving reader fails the test
with the fuzzer's report and the offending input. The runs are short (CI time); run the harness
by hand with -max_total_time for a longer campaign.

The runs are reproducible: the seed corpus is built from fixed keys, times and setup secrets (no
randomness), libFuzzer gets -seed=1 and Python a fixed PYTHONHASHSEED, so every CI run mutates the
same inputs in the same order and a failure found in CI is found again by rerunning the test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from asyncua import ua

from attestation.envelope import Command
from attestation.signers import SoftwareSigner
from plc.uadp import DataSetMessage, NetworkMessage, PublisherIdType, encode

from ..conftest import REPO

HARNESS = REPO / "tests" / "fuzz" / "harness.py"
# inputs per target: enough for thousands of mutations of the seeds within CI time
RUNS = {"uadp": 20000, "constraints": 6000, "envelope": 6000, "config": 400, "zk_json": 300, "zk_bin": 3000}


def _uadp_seeds() -> list[bytes]:
    ids = [(7, PublisherIdType.BYTE), (4840, PublisherIdType.UINT16), (2**31, PublisherIdType.UINT32),
           (2**60, PublisherIdType.UINT64), ("line-7", PublisherIdType.STRING)]
    v = ua.Variant
    fields = (v(1.5, ua.VariantType.Double), v(-2.0, ua.VariantType.Double), v(3, ua.VariantType.Int32))
    seeds = [encode(NetworkMessage((DataSetMessage(fields),), pid, ptype)) for pid, ptype in ids]
    seeds.append(encode(NetworkMessage((DataSetMessage((v(0.25, ua.VariantType.Double),)),
                                        DataSetMessage((v("text", ua.VariantType.String),
                                                        v(True, ua.VariantType.Boolean)))), 9,
                                       PublisherIdType.UINT16, uuid.UUID(int=5), 1, 2, 3, 4, (10, 11))))
    return seeds


FIXED_NOW_NS = 1_796_083_200_000_000_000  # 2026-12-01T00:00:00Z: seeds must not depend on the clock


def _envelope_seeds() -> list[bytes]:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    signer = SoftwareSigner(ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32))))  # Ed25519 is deterministic
    now = FIXED_NOW_NS
    return [signer.sign_command(Command("ns=2;s=RollGapCommand", (0.01, -0.5), seq, seq, now, now + 8_000_000,
                                        bytes(32), seq % 2 == 0)) for seq in (1, 2)]


def _zk_material():
    """A 4-constraint circuit, its dev keys and one proof: the seeds of both zk targets."""
    from attestation.zk import Builder, dev_setup, prove
    from attestation.zk.formats import r1cs_file, snarkjs_json, wtns, zkey
    from attestation.zk.setup import ToxicWaste

    b = Builder(outputs=["out"], public=["x"], private=["k"])
    x, k = b.inputs
    a = x
    for _ in range(3):
        a = b.mul(a, a + k)
    b.set_output(0, a)
    circuit = b.build()
    witness = circuit.witness([3, 5])
    pk = dev_setup(circuit.r1cs, ToxicWaste(11, 13, 17, 19, 23))  # fixed secrets: the same seeds every run
    proof = prove(pk, witness, r=29, s=31)
    public = witness[1:1 + pk.n_public]  # outputs first, then public inputs, as snarkjs orders them
    docs = [snarkjs_json.proof_to_json(proof), snarkjs_json.public_to_json(public),
            snarkjs_json.vk_to_json(pk.verifying_key())]
    return ([json.dumps(docs).encode(), json.dumps(docs[2]).encode()],
            [r1cs_file.dumps(circuit.r1cs), wtns.dumps(witness), zkey.dumps(pk)])


SEEDS = {
    "uadp": _uadp_seeds,
    "config": lambda: [(REPO / "examples" / "rolling-mill.yaml").read_bytes()],
    "constraints": lambda: [bytes(range(256)), b"\x01" * 64],
    "envelope": _envelope_seeds,
    "zk_json": lambda: _zk_material()[0],
    "zk_bin": lambda: _zk_material()[1],
}


@pytest.mark.parametrize("target", sorted(RUNS))
def test_fuzz_target_survives(target, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(SEEDS[target]()):
        (corpus / f"seed-{i}").write_bytes(seed)
    cmd = [sys.executable, str(HARNESS), target, f"-runs={RUNS[target]}", "-timeout=20", "-rss_limit_mb=3072",
           "-seed=1", f"-artifact_prefix={tmp_path}/", str(corpus)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # set and dict orders (and so coverage order) fixed
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    report = (r.stdout + r.stderr)[-4000:]
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
    assert r.returncode == 0 and not crashes, f"{target}: fuzzer found {crashes or 'a failure'}\n{report}"
    assert f"Done {RUNS[target]} runs" in report, report
