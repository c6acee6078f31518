"""sitsd with proofs on: proofs are made off the fast path, verify with snarkjs, and each proven
command's audit record names its proof."""
from __future__ import annotations

import json
import signal
import subprocess
import time

from attestation.zk import verify
from attestation.zk.formats import snarkjs_json as sj
from sitsd.audit import audit_files, read_records, verify_directory
from sitsd.prover import KeyDir

from ...conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_ready
from .conftest import snarkjs


def test_daemon_proves_commands_and_audit_references_them(plcsim, demo, demo_circuit, tmp_path):
    audit, proofs = tmp_path / "audit", tmp_path / "proofs"
    # keys made by the session fixture for the same circuit; the daemon's workers load them
    KeyDir(proofs / "keys").write(demo_circuit, demo.pk, "test fixture")
    endpoint, udp_url, _sim = plcsim(audit / "signer.pub.pem")
    log = tmp_path / "sitsd.log"
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none",
                                         audit__directory=audit, control__socket=tmp_path / "c.sock",
                                         proof__policy="one_in_n", proof__n=25, proof__workers=1, proof__queue=2,
                                         proof__directory=proofs),
                              stderr=open(log, "wb"), cwd=REPO)
    try:
        wait_ready(daemon, log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until a few proofs are done (load-dependent: no timing asserted)
            index = (proofs / "index.jsonl").read_text().splitlines() if (proofs / "index.jsonl").exists() else []
            if sum('"status": "ok"' in line for line in index) >= 3:
                break
            assert daemon.poll() is None, log.read_text()[-2000:]
            time.sleep(0.5)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert daemon.returncode == 0, log.read_text()[-2000:]
    assert "prover stopped" in log.read_text()

    entries = [json.loads(line) for line in (proofs / "index.jsonl").read_text().splitlines()]
    ok = {e["id"]: e for e in entries if e.get("status") == "ok"}
    assert len(ok) >= 3, entries
    assert not [e for e in entries if e.get("event") == "prover_failed"]

    verify_directory(audit)  # the hash chain holds with the proof fields in it
    records = [r for f in audit_files(audit) for r in read_records(f)]
    proven = [r for r in records if "proof" in r]
    assert proven, "no audit record references a proof"
    assert all(not r["failsafe"] for r in proven)
    by_id = {r["proof"]["id"]: r for r in proven}
    # every reference in the audit log is accounted for in the index (ok, failed or dropped at stop) ...
    assert set(by_id) <= {e["id"] for e in entries if "id" in e}
    # ... and every proven command that reached the wire names its proof (a proof can also exist for a
    # command that expired before the write: it has no audit record at all)
    audited = {r["seq"] for r in records}
    assert all(proof_id in by_id for proof_id in ok if int(proof_id.removeprefix("cmd-")) in audited)
    assert set(ok) & set(by_id)

    vk_file = proofs / "vk.json"
    vk = sj.vk_from_json(sj.load(vk_file))
    for proof_id in sorted(set(ok) & set(by_id))[:3]:
        rec = by_id[proof_id]
        assert rec["proof"]["id"] == f"cmd-{rec['seq']}"
        proof_file, public_file = proofs / f"{proof_id}.proof.json", proofs / f"{proof_id}.public.json"
        res = snarkjs("groth16", "verify", vk_file, public_file, proof_file)
        assert res.returncode == 0 and "OK!" in res.stdout, res.stdout + res.stderr
        public = sj.public_from_json(sj.load(public_file))
        assert verify(vk, public, sj.proof_from_json(sj.load(proof_file)))
        assert (public[1] << 128 | public[2]) == int(demo_circuit.chain.sha256, 16)
        inputs = demo_circuit.decode_inputs(public)
        assert 3.5 <= inputs[0] <= 4.5 and 3000 <= inputs[3] <= 14000  # what the model saw: in range
