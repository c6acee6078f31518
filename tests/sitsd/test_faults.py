"""Fault injection against a real sitsd and the PLC simulator: each fault ends in a defined state
(commands held or fail-safe, an alert) and the daemon recovers by itself when the fault clears."""
from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_for, wait_ready


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs for the audit directory, so the test can fill it (root, like CI)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, f"mount tmpfs: {r.stderr} (the fault tests need root)"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)




def test_disk_full_holds_commands_loses_no_acknowledged_record_and_recovers(plcsim, small_disk, tmp_path):
    from sitsd.audit import read_records, verify_directory
    from sitsd.control import request

    audit = small_disk / "audit"
    control = tmp_path / "c.sock"
    endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem")
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__mode="software", plc__security="none",
                                       audit__directory=audit, control__socket=control),
                            stderr=open(tmp_path / "sitsd.log", "wb"), cwd=REPO)
    status = lambda: request(control, "status")  # noqa: E731
    try:
        wait_ready(proc, tmp_path / "sitsd.log")
        wait_for(lambda s: s["counters"]["commands"] > 50, 10, "commands flowing", status, interval_s=0.2)
        filler = small_disk / "filler"
        with open(filler, "wb", buffering=0) as fh:  # the disk fills up
            try:
                while True:
                    fh.write(b"\0" * 65536)
            except OSError:
                pass
        full = wait_for(lambda s: s["audit_held"] > 20, 10, "commands held while the disk is full", status,
                        interval_s=0.2)
        assert full["audit_backlog"] >= 1 and full["alerts"].get("audit", 0) >= 1
        assert proc.poll() is None
        time.sleep(1.5)  # the PLC's watchdog runs out: it falls back to its safe state on its own
        held = status()
        assert held["counters"]["commands"] == full["counters"]["commands"]  # nothing left unrecorded
        filler.unlink()  # the disk has room again
        back = wait_for(lambda s: s["audit_backlog"] == 0 and s["counters"]["commands"] > held["counters"]["commands"]
                         + 50, 15, "recovery after the disk has room", status, interval_s=0.2)
        assert back["alerts"].get("audit_recovered", 0) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, (tmp_path / "sitsd.log").read_text()[-2000:]
    final = back["counters"]["commands"]
    segments = verify_directory(audit)
    acked = [r for f, _ in segments for r in read_records(f) if r["outcome"] == "acknowledged"]
    assert len(acked) >= final  # every command the daemon counted as acknowledged has its record
    seqs = [r["seq"] for f, _ in segments for r in read_records(f)]
    assert seqs == sorted(set(seqs))
    sim.stdin.write("stats\n")
    sim.stdin.flush()
    stats = json.loads(sim.stdout.readline())["stats"]
    assert stats["fallbacks"] >= 1 and stats["rejected"] == 0


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_ten_times_the_nominal_rate_is_bounded_counted_without_memory_growth_and_recovers(plcsim, tmp_path):
    """Fault injection: the PLC publishes at ten times the nominal rate for 12 s (10 frames per cycle). The
    daemon's queues are bounded (commands it cannot write in time expire and are counted, what the gates refuse
    is counted by reason), its memory does not grow during the flood, and when the flood stops the line goes
    on with model (not fail-safe) commands the PLC accepts."""
    import statistics

    from sitsd.control import request
    from sitsd.daemon import QUEUE_DEPTH

    from ..conftest import sim_stats

    audit, control = tmp_path / "audit", tmp_path / "c.sock"
    endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem")
    log = tmp_path / "sitsd.log"
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none", audit__directory=audit,
                                         control__socket=control), stderr=open(log, "wb"), cwd=REPO)

    def status():
        return request(control, "status")

    try:
        wait_ready(daemon, log)
        wait_for(lambda s: s["counters"]["commands"] > 200, 60, "commands before the flood", status)
        before = status()["counters"]
        sim.stdin.write("publish-factor 10\n")  # the PLC publishes ten frames per cycle: 1 kHz
        sim.stdin.flush()
        assert json.loads(sim.stdout.readline()) == {"publish_factor": 10}
        t0 = time.monotonic()
        samples = []  # (seconds into the flood, RSS MB)
        while time.monotonic() - t0 < 12:
            time.sleep(0.5)
            samples.append((time.monotonic() - t0, _rss_mb(daemon.pid)))
            assert daemon.poll() is None, log.read_text()[-2000:]
        during = status()["counters"]
        sim.stdin.write("publish-factor 1\n")
        sim.stdin.flush()
        assert json.loads(sim.stdout.readline()) == {"publish_factor": 1}
        # the flood arrived: far more frames than the nominal 100 Hz would bring in 12 s
        assert during["frames"] - before["frames"] > 5 * 12 * 100, (before, during)
        # bounded: every command is written (the startup command too, which the loop did not submit), expired
        # (queue full: the oldest dropped), or failed; at most the queue's depth, one write and the few handed
        # over while status was being read are in flight
        time.sleep(0.5)
        settled = status()["counters"]
        in_flight = settled["submitted"] - (settled["commands"] - 1) - settled["expired"] - settled["write_errors"]
        assert 0 <= in_flight <= QUEUE_DEPTH + 4, settled
        assert during["expired"] + during["dropped"] > before["expired"] + before["dropped"], (before, during)
        # no growth: after the first 3 s (the second publisher's state and the allocator's warm-up), the
        # median RSS of the last samples is within 10 MB of the median of the first ones
        steady = [mb for t, mb in samples if t >= 3]
        first, last = statistics.median(steady[:4]), statistics.median(steady[-4:])
        assert last - first < 10, samples
        # recovery: model commands the PLC accepts, after the flood
        plc0 = sim_stats(sim)["accepted"]
        after = status()["counters"]
        wait_for(lambda s: s["counters"]["commands"] - s["counters"]["failsafe"]
                 > after["commands"] - after["failsafe"] + 100, 60, "model commands after the flood", status)
        assert sim_stats(sim)["accepted"] > plc0 + 50 and sim_stats(sim)["rejected"] == 0
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert daemon.returncode == 0, log.read_text()[-2000:]
