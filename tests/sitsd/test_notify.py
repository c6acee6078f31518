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

from ..conftest import EXAMPLE_CONFIG, REPO, example_config_data, sitsd_args


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
        assert "  runtime CPUExecutionProvider (policy cpu)" in human.stdout, human.stdout
        assert "certified" not in human.stdout and "TPM" not in human.stdout  # software signer: neither applies

        _drain(sock, lambda m: False, 0.2)  # like systemd, read what is queued (the kernel keeps ~10 datagrams)
        daemon.send_signal(signal.SIGTERM)
        msgs = _drain(sock, lambda m: "STOPPING=1" in m, 20)  # read while it stops, as systemd does
        assert daemon.wait(20) == 0
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


def test_sighup_reloads_live_rules_and_refuses_the_rest(manager, plcsim, tmp_path):
    import yaml

    from sitsd.control import request

    path, sock = manager
    audit = tmp_path / "audit"
    endpoint, udp_url, _ = plcsim(audit / "signer.pub.pem")
    control = tmp_path / "control.sock"
    data = example_config_data()
    config = tmp_path / "line.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    args = sitsd_args(config, plc__endpoint=endpoint, transport__url=udp_url, attestation__mode="software",
                      plc__security="none", audit__directory=audit, control__socket=control)
    daemon = subprocess.Popen(args, env=dict(os.environ, NOTIFY_SOCKET=path), stderr=open(tmp_path / "log", "wb"),
                              cwd=REPO)
    try:
        assert any(m.startswith("READY=1") for m in _drain(sock, lambda m: any(x.startswith("READY=1") for x in m), 60))
        time.sleep(0.5)
        before = request(control, "status")["counters"]["failsafe"]

        # tighten a constraint the running mill violates (force is ~8000 kN): fail-safe commands follow
        band = next(c for c in data["constraints"] if c["name"] == "force_in_band_under_agc")
        band["max"] = 5000.0
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        daemon.send_signal(signal.SIGHUP)
        msgs = _drain(sock, lambda m: any(x.startswith("READY=1") for x in m), 10)
        reloading = [i for i, x in enumerate(msgs) if x.startswith("RELOADING=1\nMONOTONIC_USEC=")]
        ready = [i for i, x in enumerate(msgs) if x.startswith("READY=1")]
        assert reloading and ready and reloading[0] < ready[0]  # RELOADING=1 first, READY=1 when done
        time.sleep(0.5)
        status = request(control, "status")
        assert status["reloads"] == 1 and status["state"] == "running"
        assert status["counters"]["failsafe"] > before + 10
        assert any("force_in_band_under_agc" in a["reason"] for a in status["recent_alerts"])

        # a change that needs a restart is refused, and so is a broken file; the loop keeps running
        data["plc"]["command_mode"] = "method"
        data["plc"]["command_object"] = "ns=2;s=Line"
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        answer = subprocess.run([sys.executable, "-m", "sitsd.cli", "reload", "--socket", str(control)],
                                capture_output=True, text=True, timeout=30, cwd=REPO)
        assert answer.returncode == 1 and "need a restart: plc" in answer.stderr
        config.write_text("version: [")
        daemon.send_signal(signal.SIGHUP)
        msgs = _drain(sock, lambda m: any(x.startswith("READY=1") for x in m), 10)
        assert any("STATUS=reload refused" in x for x in msgs)
        frames = request(control, "status")["counters"]["frames"]
        time.sleep(0.3)
        assert request(control, "status")["counters"]["frames"] > frames

        # actuator limits tighter than the running model's proven output range (+-0.14 mm): refused with the proof
        del data["plc"]["command_mode"], data["plc"]["command_object"]
        act = data["safety"]["actuators"][0]
        act["min"], act["max"], act["failsafe"] = -0.1, 0.1, 0.0
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        answer = subprocess.run([sys.executable, "-m", "sitsd.cli", "reload", "--socket", str(control)],
                                capture_output=True, text=True, timeout=60, cwd=REPO)
        assert answer.returncode == 1 and "the running model is not proven inside" in answer.stderr, answer.stderr
        assert request(control, "status")["reloads"] == 1
        act["min"], act["max"] = -0.15, 0.15  # back inside what the model is proven for: goes live
        band["max"] = 13000.0
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        answer = subprocess.run([sys.executable, "-m", "sitsd.cli", "reload", "--socket", str(control)],
                                capture_output=True, text=True, timeout=60, cwd=REPO)
        assert answer.returncode == 0, answer.stderr
        assert request(control, "status")["reloads"] == 2
        assert daemon.poll() is None
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(20)
