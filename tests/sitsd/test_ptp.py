"""PTP state from a real ptp4l (software timestamping, in a network namespace) through a real pmc."""
import shutil
import subprocess
import time

import pytest

from sitsd.demo import run_demo
from sitsd.gates.ptp import PtpStatus, parse_pmc, query_pmc

SLAVE_OUTPUT = """
\t001122.fffe.334455-0 seq 0 RESPONSE MANAGEMENT TIME_STATUS_NP
\t\tmaster_offset              -412
\t\tingress_time               1796054529174583838
\t\tgmPresent                  true
\t\tgmIdentity                 aabbcc.fffe.ddeeff
\t001122.fffe.334455-1 seq 1 RESPONSE MANAGEMENT PORT_DATA_SET
\t\tportIdentity            001122.fffe.334455-1
\t\tportState               SLAVE
"""


@pytest.fixture
def ptp4l(tmp_path, veth_pair):
    assert shutil.which("ptp4l") or shutil.which("/usr/sbin/ptp4l"), "linuxptp missing: make test installs it"
    ns_a, if_a, _, _ = veth_pair
    uds = tmp_path / "ptp4l.sock"
    log = open(tmp_path / "ptp4l.log", "wb")
    proc = subprocess.Popen(["ip", "netns", "exec", ns_a, "ptp4l", "-i", if_a, "-S", "-2", "-m",
                             f"--uds_address={uds}"], stdout=log, stderr=log)
    deadline = time.monotonic() + 10
    while not uds.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield uds
    proc.terminate()
    proc.wait(10)
    log.close()


def test_real_ptp4l_port_state_through_pmc(ptp4l):
    status = query_pmc(ptp4l)
    assert status.available, status.detail
    assert status.port_state in ("INITIALIZING", "LISTENING", "MASTER", "GRAND_MASTER")
    assert status.gm_identity  # the TIME_STATUS_NP answer was parsed
    # a listening port is not locked; a master is the reference clock itself
    assert status.locked(1000) == (status.port_state in ("MASTER", "GRAND_MASTER"))


def test_slave_offset_decides_lock():
    status = parse_pmc(SLAVE_OUTPUT)
    assert (status.port_state, status.master_offset_ns, status.gm_present) == ("SLAVE", -412, True)
    assert status.locked(1000) and not status.locked(400)
    assert "not locked (limit ±400 ns)" in status.describe(400)


def test_no_ptp4l_is_unavailable_and_explained(tmp_path):
    status = query_pmc(tmp_path / "none.sock")
    assert not status.available and "no ptp4l socket" in status.detail
    assert not parse_pmc("garbage").available
    assert not PtpStatus(False).locked(10**9)


def test_required_but_missing_ptp_drops_frames_then_failsafe():
    r = run_demo(seconds=2, progress=None, force_software=True, security="none",
                 overrides={"timing.ptp": {"enabled": "on", "uds": "/nonexistent/ptp4l", "policy": "drop"}})
    assert r["alerts"].get("clock", 0) >= 1  # the unlocked clock was reported
    assert r["dropped"] > 50 and r["dropped"] >= r["frames"] - 5  # every frame after the first poll dropped
    assert r["failsafe"] >= r["dropped"] // 5  # max_consecutive_drops 5: a fail-safe command every 5 drops


def test_a_reload_of_timing_ptp_applies_at_the_next_poll():
    """The PTP watcher reads timing.ptp at each poll (a reload replaces daemon.cfg): policy drop closes the
    timestamp gate while no ptp4l answers (a real pmc on a socket nobody serves), warn opens it again, and
    enabled off stops asking."""
    import asyncio
    from collections import deque
    from types import SimpleNamespace

    import structlog

    from sitsd.config import load_config
    from sitsd.daemon import Daemon
    from sitsd.gates import TimestampGate

    from ..conftest import EXAMPLE_CONFIG

    def cfg(**ptp):
        return load_config(EXAMPLE_CONFIG, {"timing.ptp": {"uds": "/nonexistent/ptp4l", "poll_s": 0.05, **ptp}})

    gate = TimestampGate(10**7, 10**6)
    daemon = SimpleNamespace(cfg=cfg(enabled="on", policy="drop"), loop=SimpleNamespace(ts_gate=gate),
                             alerts=deque(), log=structlog.get_logger(), ptp_status=None)

    async def main():
        task = asyncio.create_task(Daemon._watch_ptp(daemon))
        seen = []

        async def until(cond):
            for _ in range(200):
                await asyncio.sleep(0.02)
                if cond():
                    return True
            return False

        seen.append(await until(lambda: gate.clock_ok is False))
        daemon.cfg = cfg(enabled="on", policy="warn")
        seen.append(await until(lambda: gate.clock_ok is True))
        daemon.cfg = cfg(enabled="on", policy="failsafe")
        seen.append(await until(lambda: gate.clock_ok is False))
        daemon.cfg = cfg(enabled="off", policy="failsafe")
        seen.append(await until(lambda: gate.clock_ok is True))
        task.cancel()
        return seen

    assert asyncio.run(main()) == [True, True, True, True]
    assert [a[1] for a in daemon.alerts].count("clock") >= 1
