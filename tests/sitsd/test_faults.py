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
