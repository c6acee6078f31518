"""The prover's counters in `sitsctl status`, `sitsctl top` and the Prometheus metrics of a real sitsd with
proofs on (real prover process, keys made at startup): the numbers add up while it runs and exactly once
it stopped."""
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_ready

N = 5  # prove one command in 5: at 100 Hz far more than one prover process makes, so the queue overflows


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_proof_counters_in_status_metrics_and_top(plcsim, tmp_path):
    from sitsd.control import request

    audit, control = tmp_path / "audit", tmp_path / "c.sock"
    endpoint, udp_url, _ = plcsim(audit / "signer.pub.pem")
    log = tmp_path / "sitsd.log"
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none", audit__directory=audit,
                                         control__socket=control, metrics__enabled=True, proof__policy="one_in_n",
                                         proof__n=N, proof__workers=1, proof__queue=1,
                                         proof__directory=tmp_path / "proofs"),
                              stderr=open(log, "wb"), cwd=REPO)
    try:
        wait_ready(daemon, log)
        deadline = time.monotonic() + 120
        while True:  # until the prover (keys made at its start) has made a few proofs and the queue overflowed
            proofs = request(control, "status")["proofs"]
            if proofs["proved"] >= 2 and proofs["dropped"] > 0:
                break
            assert daemon.poll() is None and time.monotonic() < deadline, (proofs, log.read_text()[-2000:])
            time.sleep(0.5)
        status = request(control, "status")
        proofs = status["proofs"]
        assert proofs["policy"] == "one_in_n" and proofs["n"] == N and proofs["queue_max"] == 1
        assert len(proofs["worker_pids"]) == 1 and proofs["worker_pids"][0] != daemon.pid
        # the loop thread may be inside `offer` while we read: one offer in progress at most
        assert 0 <= proofs["offered"] - (proofs["skipped"] + proofs["accepted"] + proofs["dropped"]) <= 1
        assert abs((proofs["accepted"] + proofs["dropped"]) - proofs["offered"] // N) <= 1
        done = proofs["proved"] + proofs["failed"] + proofs["cancelled"]
        assert 0 <= proofs["accepted"] - done - proofs["queue_depth"] - proofs["in_flight"] <= 1
        assert proofs["queue_depth"] <= 1 and proofs["in_flight"] <= 1 and proofs["failed"] == 0

        m = scrape(status["metrics_url"])
        after = request(control, "status")["proofs"]
        offers = {d: m[("sitsd_proof_offers_total", (("decision", d),))] for d in ("skipped", "accepted", "dropped")}
        outcomes = {o: m[("sitsd_proofs_total", (("outcome", o),))] for o in ("proved", "failed", "cancelled")}
        for k, v in {**offers, **outcomes}.items():  # counters between the two status reads
            assert proofs[k] <= v <= after[k], (k, v, proofs, after)
        assert abs((offers["accepted"] + offers["dropped"]) - sum(offers.values()) // N) <= 1
        depth, in_flight = m[("sitsd_proof_queue_depth", ())], m[("sitsd_proofs_in_flight", ())]
        assert 0 <= depth <= m[("sitsd_proof_queue_capacity", ())] == 1
        assert m[("sitsd_proof_backlog", ())] == depth + in_flight
        assert m[("sitsd_proof_workers", ())] == 1

        r = subprocess.run([sys.executable, "-m", "sitsd.cli", "status", "--socket", str(control)],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
        assert r.returncode == 0, r.stderr
        line = next(x for x in r.stdout.splitlines() if x.strip().startswith("proofs"))
        assert f"one_in_n n={N}" in line and re.search(r"dropped \(queue full\) [1-9]", line)
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", "top", "--socket", str(control), "--iterations", "1"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
        assert r.returncode == 0 and re.search(r"proofs\s+\d+\s+proved", r.stdout), r.stdout + r.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert daemon.returncode == 0, log.read_text()[-2000:]
    # stopped: nothing in flight, so the identities hold exactly
    final = [json.loads(x) for x in log.read_text().splitlines() if '"prover stopped"' in x][-1]
    assert final["offered"] == final["skipped"] + final["accepted"] + final["dropped"]
    assert final["accepted"] == final["proved"] + final["failed"] + final["cancelled"]
    assert final["proved"] >= 2 and final["dropped"] > 0
    index = [json.loads(x) for x in (tmp_path / "proofs" / "index.jsonl").read_text().splitlines()]
    assert sum(e.get("status") == "ok" for e in index) == final["proved"]


def test_a_stopped_prover_is_alerted_once_commands_go_on_and_proofs_resume(plcsim, tmp_path):
    """Fault injection: the prover processes are stopped (SIGSTOP) under load. Commands never wait for proofs:
    the PLC keeps accepting model commands, offers are dropped once the queue is full, one `prover` alert names
    the stall; after SIGCONT proofs finish again, the stall clears, and every audited proof reference is either
    proved or listed as dropped in the proof index."""
    import os

    from sitsd.audit import audit_files, read_records, verify_directory
    from sitsd.control import request

    from ..conftest import sim_stats, wait_for

    def status():
        return request(control, "status")

    audit, control = tmp_path / "audit", tmp_path / "c.sock"
    endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem")
    log = tmp_path / "sitsd.log"
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none", audit__directory=audit,
                                         control__socket=control, proof__policy="one_in_n", proof__n=N,
                                         proof__workers=1, proof__queue=2, proof__stall_alert_s=2,
                                         proof__directory=tmp_path / "proofs"),
                              stderr=open(log, "wb"), cwd=REPO)
    stopped: list[int] = []
    try:
        wait_ready(daemon, log)
        proofs = wait_for(lambda s: s["proofs"]["proved"] >= 2, 120, "two proofs", status)["proofs"]
        assert not proofs["stalled"] and proofs["stalls"] == 0
        stopped = stopped_pids = list(proofs["worker_pids"])
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        at_stop = request(control, "status")
        plc_at_stop = sim_stats(sim)["accepted"]
        # the alert is counted by the daemon's housekeeping, up to 50 ms after the stall is flagged
        stalled = wait_for(lambda s: s["proofs"]["stalled"] and s["alerts"].get("prover"), 60, "the stall reported",
                           status)
        assert stalled["alerts"].get("prover") == 1, stalled["alerts"]
        # the loop does not wait for the prover: the PLC keeps accepting commands, and offers are dropped
        wait_for(lambda s: s["proofs"]["dropped"] > at_stop["proofs"]["dropped"] + 3, 60,
                 "offers dropped while the prover is stopped", status)
        wait_for(lambda st: st["accepted"] > plc_at_stop + 200, 60, "commands during the stall", lambda: sim_stats(sim))
        assert request(control, "status")["alerts"].get("prover") == 1  # one alert per stall, not one per check
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", "status", "--socket", str(control)],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
        assert "STALLED (alert prover)" in r.stdout, r.stdout + r.stderr
        proved_in_stall = request(control, "status")["proofs"]["proved"]
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        stopped = []
        after = wait_for(lambda s: s["proofs"]["proved"] > proved_in_stall + 1 and not s["proofs"]["stalled"], 120,
                         "proofs again after SIGCONT", status)["proofs"]
        assert after["stalls"] == 1 and after["failed"] == 0
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert daemon.returncode == 0, log.read_text()[-2000:]
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    assert any(x.get("event") == "prover recovered" for x in lines)
    (alert,) = [x for x in lines if x.get("event") == "alert" and x.get("kind") == "prover"]
    assert "prover stalled" in alert["reason"] and str(stopped_pids[0]) in alert["reason"], alert
    verify_directory(audit)  # raises AuditError naming the first bad record
    records = [r for f in audit_files(audit) for r in read_records(f)]
    index = {}
    for line in (tmp_path / "proofs" / "index.jsonl").read_text().splitlines():
        e = json.loads(line)
        if "id" in e:
            index[e["id"]] = e["status"]
    referenced = [r["proof"]["id"] for r in records if r.get("proof")]
    assert len(referenced) >= 4
    # each proof an audit record names was made, or the index says it was dropped (never a dangling reference)
    assert all(index.get(pid) in ("ok", "dropped") for pid in referenced), \
        [(pid, index.get(pid)) for pid in referenced if index.get(pid) not in ("ok", "dropped")]


def test_commands_of_a_hot_swapped_model_are_not_offered_to_a_circuit_for_another_model(tmp_path):
    """The circuit proves the config's model; after a hot swap the new model's commands are skipped (counted, one
    `prover` alert), never queued for a proof that would fail and leave a dangling audit reference."""
    from collections import deque

    from sitsd.config import load_config
    from sitsd.prover import ProofService

    cfg = load_config(EXAMPLE_CONFIG, {"proof.policy": "every", "audit.directory": str(tmp_path / "audit")})
    service = ProofService(cfg)  # not started: offers only queue
    service.circuit_model = b"\x01" * 32
    alerts: deque = deque()
    inputs = (1.0,) * 6
    assert service.offer(1, inputs, b"\x01" * 32, alerts) == "cmd-1"
    assert service.offer(2, inputs, b"\x02" * 32, alerts) is None
    assert service.offer(3, inputs, b"\x02" * 32, alerts) is None
    st = service.status()
    assert st["skipped_model"] == 2 and st["accepted"] == 1 and service.reference(2) == {}
    assert st["offered"] == st["skipped"] + st["accepted"] + st["dropped"]
    assert [a[1] for a in alerts] == ["prover"] and "not the one the proof circuit was compiled for" in alerts[0][2]
