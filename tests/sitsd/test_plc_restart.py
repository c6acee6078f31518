"""The PLC link survives what a real line does to it: the PLC restarting (with and without message
security, with frames over UADP or over an OPC UA subscription) and frames stopping while the session
stays up. Real peers only: the simulator process (or the simulator's server in this process, where the
test has to stop its frames), a real sitsd process, deadlines only to bound the waiting."""
import asyncio
import json
import signal
import socket
import subprocess
import threading
import time

import pytest

from plc.opcua_security import Pki

from ..conftest import EXAMPLE_CONFIG, REPO, check_commands_across_a_plc_restart, sitsd_args, wait_ready

FRAME_NODE = "nsu=urn:sits2026:plc-simulator;s=RollingMill.SensorFrame"
SUBSCRIPTION = f"{{kind: opcua-subscription, node: '{FRAME_NODE}', publishing_interval_ms: 1}}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(control, done, timeout_s: float = 30.0) -> dict:
    """Poll `status` until done(status) or the deadline; returns the last status."""
    from sitsd.control import request

    deadline = time.monotonic() + timeout_s
    status = request(control, "status")
    while not done(status) and time.monotonic() < deadline:
        time.sleep(0.1)
        status = request(control, "status")
    return status


@pytest.fixture
def pkis(tmp_path):
    """sitsd's and the PLC's PKI, each trusting the other (what `sitsctl pki init` plus the operator do)."""
    client, server = Pki(tmp_path / "pki-sitsd"), Pki(tmp_path / "pki-plc")
    client_cert = client.create_own("urn:sits2026:sitsd", "sitsd test", server=False)
    server_cert = server.create_own("urn:sits2026:plc-simulator", "plc test", server=True, ips=["127.0.0.1"])
    client.trust(server_cert)
    server.trust(client_cert)
    return client, server


@pytest.mark.parametrize("transport,security", [("opcua-subscription", "none"),
                                                ("opcua-subscription", "sign-and-encrypt"),
                                                ("uadp-udp", "sign-and-encrypt")])
def test_plc_restart_reconnects_frames_and_commands_resume(plcsim, pkis, tmp_path, transport, security):
    """The PLC process stops and comes back on the same port: sitsd notices without a command write,
    says so (alert, state), rebuilds session and frame subscription, and nothing acknowledged is lost
    or sent twice: every audited command was applied by exactly one of the two PLC incarnations."""

    client_pki, server_pki = pkis
    port = _free_port()
    audit = tmp_path / "audit"
    sim_kwargs = dict(port=port, extra_args=("--opcua-frames",) if transport == "opcua-subscription" else ())
    if security != "none":
        sim_kwargs.update(security=security, pki=server_pki.root)
    endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem", **sim_kwargs)
    sets = dict(plc__endpoint=endpoint, attestation__mode="software", plc__security=security,
                plc__pki_dir=client_pki.root, audit__directory=audit, control__socket=tmp_path / "c.sock")
    if transport == "opcua-subscription":
        sets["transport"] = SUBSCRIPTION
    else:
        sets["transport__url"] = udp_url
    control = tmp_path / "c.sock"
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, **sets), stderr=open(tmp_path / "sitsd.log", "wb"), cwd=REPO)
    try:
        wait_ready(daemon, tmp_path / "sitsd.log")
        status = _wait_for(control, lambda s: s["counters"]["commands"] >= 50)
        assert status["counters"]["commands"] >= 50, status
        before = status["counters"]
        sim.stdin.write("stop\n")  # the PLC goes away ...
        sim.stdin.flush()
        first = next(json.loads(line)["final"] for line in sim.stdout if line.startswith('{"final"'))
        sim.wait(10)
        # ... and sitsd notices by itself: no frame comes, so no write could fail
        status = _wait_for(control, lambda s: s["state"] == "reconnecting" and s["alerts"].get("plc_link"))
        assert status["state"] == "reconnecting", status
        assert status["alerts"]["plc_link"] == 1 and not status["plc_link"]["connected"], status
        assert status["plc_link"]["down_s"] is not None
        assert daemon.poll() is None
        _, _, sim2 = plcsim(audit / "signer.pub.pem", udp_url=udp_url, **sim_kwargs)  # the PLC is back
        status = _wait_for(control, lambda s: s["state"] == "running"
                           and s["counters"]["frames"] >= before["frames"] + 100
                           # 110: commands counted by sitsd include the one in flight and the one the restart
                           # cut; the PLC's own count must reach 100 (check_commands_across_a_plc_restart)
                           and s["counters"]["commands"] >= before["commands"] + 110)
        assert status["state"] == "running", status
        assert status["counters"]["frames"] >= before["frames"] + 100, status
        assert status["counters"]["commands"] >= before["commands"] + 110, status
        link = status["plc_link"]
        assert link["connected"] and link["losses"] == 1 and link["reconnects"] == 1 and link["down_s"] is None
        assert status["alerts"]["plc_link"] == 1  # one alert for the outage, however many signals saw it
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    sim2.stdin.write("stats\n")
    sim2.stdin.flush()
    second = json.loads(sim2.stdout.readline())["stats"]
    check_commands_across_a_plc_restart(audit, first, second)
    log = (tmp_path / "sitsd.log").read_text()
    assert "PLC link lost: reconnecting" in log and "reconnected to PLC" in log
    if transport == "opcua-subscription":
        assert '"frame_subscription": "re-created"' in log


class _InProcessPlc:
    """The simulator's OPC UA server on its own event loop thread, with a publisher the test can pause
    while the server (and sitsd's session) stays up."""

    def __init__(self, trust_key, udp_url: str) -> None:
        from plc.simulator.server import RollingMillSimulator, SimulatorSettings
        from sitsd.plcsim import LazyVerifier

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-plc", daemon=True)
        self.thread.start()
        self.sim = RollingMillSimulator(SimulatorSettings(udp_url=udp_url, publish_opcua_frames=True),
                                        LazyVerifier(trust_key, None))
        asyncio.run_coroutine_threadsafe(self.sim.start(), self.loop).result(30)
        self.publisher = None
        self.resume()

    def pause(self) -> None:
        self.sim.stop()
        self.publisher.join(5)

    def resume(self) -> None:
        self.sim._stop.clear()
        self.publisher = threading.Thread(target=self.sim.run_publisher, name="test-plc-publisher", daemon=True)
        self.publisher.start()

    def close(self) -> None:
        self.sim.stop()
        try:
            asyncio.run_coroutine_threadsafe(self.sim.close(), self.loop).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.mark.parametrize("transport", ["opcua-subscription", "uadp-udp"])
def test_frames_stopping_while_the_session_lives_trips_the_frame_watchdog(tmp_path, transport):
    """The PLC stops publishing but its OPC UA server stays up. One frame_timeout alert per stall; with
    opcua-subscription the session and subscription are rebuilt (that is all sitsd can do about it), with
    UADP the session is fine and stays. Frames and commands resume when the PLC publishes again."""
    import random

    audit = tmp_path / "audit"
    udp_url = f"opc.udp://239.255.{random.randint(1, 254)}.{random.randint(1, 254)}:{_free_port()}"
    plc = _InProcessPlc(audit / "signer.pub.pem", udp_url)
    control = tmp_path / "c.sock"
    sets = dict(plc__endpoint=plc.sim.endpoint, attestation__mode="software", plc__security="none",
                audit__directory=audit, control__socket=control, timing__frame_timeout_ms=500)
    if transport == "opcua-subscription":
        sets["transport"] = SUBSCRIPTION
    else:
        sets["transport__url"] = udp_url
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, **sets), stderr=open(tmp_path / "sitsd.log", "wb"), cwd=REPO)
    try:
        wait_ready(daemon, tmp_path / "sitsd.log")
        status = _wait_for(control, lambda s: s["counters"]["commands"] >= 50)
        assert status["counters"]["commands"] >= 50, status
        plc.pause()
        status = _wait_for(control, lambda s: s["plc_link"]["frames_stalled_s"] is not None
                           and s["alerts"].get("frame_timeout")  # alerts are counted a moment after they happen
                           and (transport != "opcua-subscription" or s["plc_link"]["reconnects"] >= 1))
        link = status["plc_link"]
        assert link["frames_stalled_s"] is not None and status["alerts"].get("frame_timeout") == 1, status
        if transport == "opcua-subscription":
            assert link["losses"] >= 1 and link["reconnects"] >= 1 and status["alerts"]["plc_link"] >= 1
            assert "no frame for" in link["last_loss"]
        else:
            time.sleep(1.0)  # several timeouts long: still one alert, and the healthy session is left alone
            status = _wait_for(control, lambda s: True)
            assert status["state"] == "running" and status["alerts"].get("frame_timeout") == 1, status
            assert status["plc_link"]["losses"] == 0 and "plc_link" not in status["alerts"]
        before = status["counters"]["commands"]
        plc.resume()
        status = _wait_for(control, lambda s: s["state"] == "running" and s["plc_link"]["frames_stalled_s"] is None
                           and s["counters"]["commands"] >= before + 50)
        assert status["state"] == "running" and status["plc_link"]["connected"], status
        assert status["plc_link"]["frames_stalled_s"] is None and status["counters"]["commands"] >= before + 50
        assert status["alerts"]["frame_timeout"] == 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            assert daemon.wait(20) == 0
        finally:
            plc.close()
    assert "frames flow again" in (tmp_path / "sitsd.log").read_text()
