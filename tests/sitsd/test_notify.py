"""sd_notify against a fake service manager socket, alone and with the real sitsd process."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from sitsd.notify import Notifier

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args


@pytest.fixture
def manager(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    yield path, sock
    sock.close()


def _drain(sock, until, timeout_s):
    messages = []
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            continue
        if until(messages):
            break
    return messages


def test_notifier_messages(manager):
    path, sock = manager
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    assert n.watchdog_usec == 200000
    assert n.ready("up") and n.status("ok") and n.watchdog() and n.stopping()
    assert _drain(sock, lambda m: len(m) == 4, 2) == ["READY=1\nSTATUS=up", "STATUS=ok", "WATCHDOG=1", "STOPPING=1"]


def test_notifier_without_socket_or_with_dead_manager_never_raises(tmp_path):
    assert not Notifier({}).ready()
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert not n.ready() and n.failed == 1


def test_watchdog_for_another_pid_is_ignored():
    assert Notifier({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}).watchdog_usec == 0


def test_sitsd_process_notifies_serves_status_and_stops_cleanly(manager, plcsim, tmp_path):
    path, sock = manager
    audit = tmp_path / "audit"
    endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem")
    control = tmp_path / "control.sock"
    args = sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url, attestation__mode="software", plc__security="none",
                      audit__directory=audit, control__socket=control)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="400000")
    daemon = subprocess.Popen(args, env=env, stderr=open(tmp_path / "sitsd.log", "wb"), cwd=REPO)
    try:
        msgs = _drain(sock, lambda m: any(x.startswith("READY=1") for x in m), 60)
        assert any(x.startswith("READY=1") for x in msgs), (tmp_path / "sitsd.log").read_text()
        msgs += _drain(sock, lambda m: sum(x == "WATCHDOG=1" for x in m) >= 3 and
                       any(x.startswith("STATUS=running") for x in m), 10)
        assert sum(x == "WATCHDOG=1" for x in msgs) >= 3
        status = [x for x in msgs if x.startswith("STATUS=running")][-1]
        assert "frames=" in status and "commands=" in status

        out = subprocess.run([sys.executable, "-m", "sitsd.cli", "status", "--socket", str(control), "--json"],
                             capture_output=True, text=True, timeout=30, cwd=REPO)
        assert out.returncode == 0, out.stderr
        answer = json.loads(out.stdout)
        assert answer["state"] == "running" and answer["signer"] == "software"
        assert answer["counters"]["frames"] > 0 and answer["counters"]["commands"] > 0
        assert len(answer["model_sha256"]) == 64
        human = subprocess.run([sys.executable, "-m", "sitsd.cli", "status", "--socket", str(control)],
                               capture_output=True, text=True, timeout=30, cwd=REPO)
        assert "running" in human.stdout and "latency p50" in human.stdout

        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
        msgs = _drain(sock, lambda m: "STOPPING=1" in m, 5)
        assert "STOPPING=1" in msgs
        sim.stdin.write("stats\n")
        sim.stdin.flush()
        stats = json.loads(sim.stdout.readline())["stats"]
        assert stats["accepted"] > 0 and stats["rejected"] == 0
        log_lines = [json.loads(line) for line in (tmp_path / "sitsd.log").read_text().splitlines() if line.startswith("{")]
        assert any(e["event"] == "sitsd ready" for e in log_lines)
        assert any(e["event"] == "software signing key" and e["level"] == "warning" for e in log_lines)
    finally:
        if daemon.poll() is None:
            daemon.kill()
