"""A TPM that hangs while sitsd starts, and tpm-direct's probe: real swtpm (SIGSTOPped: connections accepted, no
reply), real sitsd processes.

While starting, every TPM call is bounded and the start runs off the I/O event loop (sitsd/startup.py): SIGTERM
stops a start frozen in the TPM within about 2 s (exit 0, "sitsd stopped while starting", no READY=1), a start
whose TPM call outlives its bound fails naming the step, the TCTI and what to check, and systemd hears why it waits
(STATUS=, EXTEND_TIMEOUT_USEC). tpm-direct probes the TPM like tpm-session does: a TPM lost, reset or cleared while
no command is signed raises the `tpm` alert and recovers. Bounds are generous (2 shared noisy cores).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from attestation.envelope import Command, EnvelopeVerifier
from attestation.errors import TpmError
from attestation.tpm import Swtpm, TpmSigner

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_for, wait_ready

EXIT_BOUND_S = 10.0  # SIGTERM to exit (measured: well under 2 s)
SEEN_BOUND_S = 60.0  # sitsd to get as far as waiting on the TPM (imports, model load on a loaded VM)
UNREACHABLE_PLC = "opc.tcp://127.0.0.1:9/none"  # the start never gets this far with a frozen TPM


def _log_events(log) -> list[dict]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _wait_logged(proc, log, text: str, timeout_s: float = SEEN_BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert proc.poll() is None, f"sitsd exited with {proc.returncode} before {text!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def _sigterm(proc, log) -> float:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack into the log
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pytest.fail(f"sitsd ignored SIGTERM for {EXIT_BOUND_S} s while starting:\n{log.read_text()[-6000:]}")
    return time.monotonic() - t0


@pytest.fixture
def manager(tmp_path):
    """A fake service manager: NOTIFY_SOCKET for sitsd, and what it sent."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)

    def received() -> list[str]:
        out = []
        while True:
            try:
                out.append(sock.recv(4096).decode())
            except BlockingIOError:
                return out

    yield path, received
    sock.close()


@pytest.mark.parametrize("signing", ["tpm-direct", "tpm-session"])
def test_sigterm_stops_a_start_frozen_in_the_tpm(tmp_path, manager, signing):
    notify_path, received = manager
    tpm = Swtpm(tmp_path / "tpm").start()
    log = tmp_path / "sitsd.log"
    tpm._proc.send_signal(signal.SIGSTOP)  # frozen before sitsd opens it: opening the TPM hangs
    proc = None
    try:
        proc = subprocess.Popen(
            sitsd_args(EXAMPLE_CONFIG, plc__endpoint=UNREACHABLE_PLC, attestation__tcti=tpm.tcti,
                       attestation__signing=signing, audit__directory=tmp_path / "audit",
                       control__socket=tmp_path / "c.sock"),
            stderr=open(log, "wb"), cwd=REPO,
            env=dict(os.environ, PYTHONFAULTHANDLER="1", NOTIFY_SOCKET=notify_path))
        _wait_logged(proc, log, "waiting for the TPM")  # logged once a TPM call of the start takes > 2 s
        took = _sigterm(proc, log)
        print(f"\n{signing}: SIGTERM to exit during a start frozen in the TPM: {took:.2f} s")
        assert proc.returncode == 0, log.read_text()[-3000:]
        events = _log_events(log)
        waiting = next(e for e in events if e.get("event") == "waiting for the TPM")
        assert waiting["tcti"] == tpm.tcti and waiting["call"] == "opening the TPM"
        stopped = next(e for e in events if e.get("event") == "sitsd stopped while starting")
        assert "opening the TPM" in stopped["during"] and tpm.tcti in stopped["during"], stopped
        assert "sitsd ready" not in log.read_text() and "startup failed" not in log.read_text()
        messages = received()
        assert not any(m.startswith("READY=1") for m in messages), messages
        extend = [m for m in messages if m.startswith("EXTEND_TIMEOUT_USEC=")]
        assert extend and "STATUS=starting: waiting for the TPM at " in extend[0], messages
        # the call's bound (opening: 10 s tpm-direct, 30 s tpm-session) plus EXTEND_MARGIN_S (10 s), no more
        from attestation.tpm import worker
        from sitsd.startup import EXTEND_MARGIN_S

        bound_s = worker.TPM_OPEN_TIMEOUT_S if signing == "tpm-direct" else worker.TPM_SETUP_TIMEOUT_S
        assert 0 < int(extend[0].split("\n")[0].split("=")[1]) <= (bound_s + EXTEND_MARGIN_S) * 1e6, extend[0]
        assert any(m.startswith("STOPPING=1") for m in messages), messages
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        tpm._proc.send_signal(signal.SIGCONT)  # thawed, so it stops cleanly
        tpm.stop()


def test_start_against_a_frozen_tpm_fails_naming_the_step_and_the_fix(tmp_path):
    """No SIGTERM: the start gives up when opening the TPM outlives its bound (TPM_OPEN_TIMEOUT_S, 10 s)."""
    tpm = Swtpm(tmp_path / "tpm").start()
    tpm._proc.send_signal(signal.SIGSTOP)
    try:
        r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=UNREACHABLE_PLC, attestation__tcti=tpm.tcti,
                                      attestation__signing="tpm-direct", audit__directory=tmp_path / "audit",
                                      control__socket=tmp_path / "c.sock"),
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()
    assert r.returncode == 1, r.stderr[-3000:]
    failed = next(e for e in map(json.loads, filter(lambda x: x.startswith("{"), r.stderr.splitlines()))
                  if e.get("event") == "startup failed")
    error = failed["error"]
    assert f"cannot open TPM through TCTI {tpm.tcti!r}" in error, error
    assert "did not answer opening the TPM within 10 s" in error, error
    assert "fix: the TPM behind" in error and "tpm2-abrmd" in error and "swtpm" in error, error
    assert failed["step"] == "opening the TPM and loading its keys"


def _daemon(tmp_path, signer):
    from sitsd.cli import parse_overrides
    from sitsd.config import load_config
    from sitsd.daemon import Daemon
    from sitsd.notify import Notifier

    cfg = load_config(EXAMPLE_CONFIG, parse_overrides([
        f"plc.endpoint={UNREACHABLE_PLC}", f"attestation.tcti={signer.tcti}", "attestation.signing=tpm-direct",
        f"audit.directory={tmp_path / 'audit'}", f"control.socket={tmp_path / 'c.sock'}", "metrics.port=0"]))
    return Daemon(cfg, signer=signer, notifier=Notifier({}))


def _serve_in_thread(daemon) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        out["rc"] = asyncio.run(daemon.serve())

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


def test_a_start_step_after_opening_times_out_with_its_name_or_stops_on_request(tmp_path, monkeypatch):
    """The TPM freezes after the signer is open: measuring the model into PCR 16 is bounded (TPM_CALL_TIMEOUT_S,
    lowered here) and named; a stop request meanwhile ends the start within about 2 s."""
    from attestation.tpm import worker

    monkeypatch.setattr(worker, "TPM_CALL_TIMEOUT_S", 1.0)
    tpm = Swtpm(tmp_path / "tpm").start()
    signers = []
    try:
        # 1: the step times out
        signer = TpmSigner(tpm.tcti)
        signers.append(signer)
        daemon = _daemon(tmp_path / "a", signer)
        tpm._proc.send_signal(signal.SIGSTOP)
        th, out = _serve_in_thread(daemon)
        th.join(60)
        assert not th.is_alive() and out["rc"] == 1
        error = str(daemon.startup_error)
        assert error.startswith(f"TPM hung while measuring the model into PCR 16 (TCTI {tpm.tcti!r})"), error
        assert "did not answer TPM2 pcr_extend within 1 s" in error and "fix: the TPM behind" in error, error
        tpm._proc.send_signal(signal.SIGCONT)
        wait_for(lambda busy: not busy, 20, "the stuck call to return", lambda: signer._worker.busy)

        # 2: stopped while that step waits (the bound raised so that only the stop can end it)
        monkeypatch.setattr(worker, "TPM_CALL_TIMEOUT_S", 60.0)
        signer = TpmSigner(tpm.tcti)
        signers.append(signer)
        daemon = _daemon(tmp_path / "b", signer)
        tpm._proc.send_signal(signal.SIGSTOP)
        th, out = _serve_in_thread(daemon)
        wait_for(lambda calls: any(c["what"] == "TPM2 pcr_extend" and c["waited_s"] > 0.5 for c in calls), 60,
                 "the start to wait on the frozen TPM", worker.pending_calls)
        t0 = time.monotonic()
        daemon.request_stop()
        th.join(EXIT_BOUND_S)
        assert not th.is_alive(), "the start did not stop on request"
        print(f"\nstop request to serve() returning, frozen while measuring: {time.monotonic() - t0:.2f} s")
        assert out["rc"] == 0 and daemon.startup_error is None and daemon.state == "stopping"
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        for s in signers:
            s.close()
        tpm.stop()


MODEL = hashlib.sha256(b"rolling mill model").digest()


def _cmd(seq: int) -> Command:
    now = time.time_ns()
    return Command("t", (0.5,), seq, seq, now, now + 10**9, MODEL)


def test_tpm_direct_probe_sees_reset_loss_hang_and_a_cleared_tpm(tmp_path, monkeypatch):
    from attestation.session import TpmIdentityLost
    from attestation.tpm import worker

    monkeypatch.setattr(worker, "TPM_CALL_TIMEOUT_S", 1.0)
    tpm = Swtpm(tmp_path / "tpm").start()
    signer = TpmSigner(tpm.tcti)
    verifier = EnvelopeVerifier(signer.public_key_pem(), MODEL, freshness=False)
    try:
        signer.measure_model(MODEL)
        assert signer.probe() is None and signer.bound
        # reset: swtpm restarted on its state (TPM2_Startup(CLEAR), resetCount + 1); the key is persistent
        tpm.stop_process()
        with pytest.raises(TpmError, match="does not answer"):  # gone meanwhile
            signer.probe()
        tpm = Swtpm(tmp_path / "tpm").start()
        seen = wait_for(lambda s: isinstance(s, str), 20, "the probe to see the reset", lambda: _probe(signer))
        assert seen.startswith("TPM reset (resetCount") and "PCR 16 no longer holds the model" in seen, seen
        assert not signer.bound and signer.resets == 1
        verifier.verify(signer.sign_command(_cmd(1)))  # tpm-direct signs on: its key needs no PCR
        value = signer.remeasure([MODEL])
        assert value == hashlib.sha256(b"\0" * 32 + MODEL).digest()  # PCR 16 from zero after the reset
        assert signer.bound and signer.probe() is None
        # hung: bounded, then recovers
        tpm._proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(TpmError):
            signer.probe()
        assert time.monotonic() - t0 < 8.0
        tpm._proc.send_signal(signal.SIGCONT)
        wait_for(lambda s: s is None, 20, "the probe to answer again", lambda: _probe(signer))
        # cleared: the TPM answers without the signing key the PLC trusts; nothing is signed until it is back
        from tpm2_pytss import ESAPI, ESYS_TR

        other = ESAPI(tpm.tcti)
        try:
            other.clear(ESYS_TR.LOCKOUT)
        finally:
            other.close()
        with pytest.raises(TpmIdentityLost, match="has no key at 0x81000001"):
            for _ in range(3):  # a probe may first reopen the connection
                try:
                    signer.probe()
                except TpmIdentityLost:
                    raise
                except TpmError:
                    time.sleep(1.1)
        with pytest.raises(TpmError, match="not signed"):
            signer.sign_command(_cmd(2))
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        signer.close()
        tpm.stop()


def _probe(signer):
    try:
        return signer.probe()
    except TpmError as exc:
        return exc


def test_tpm_direct_daemon_alerts_a_tpm_lost_and_reset_while_idle_and_recovers(plcsim, tmp_path):
    """No frames (the PLC publishes elsewhere), so no command needs the TPM: without a probe its loss would go unseen.
    The probe raises one `tpm` alert per outage, sees the reset when it is back, and re-measures."""
    from sitsd.control import request

    tpm = Swtpm(tmp_path / "tpm").start()
    key = TpmSigner(tpm.tcti)
    (tmp_path / "device.pem").write_bytes(key.public_key_pem())
    key.close()
    audit, control, log = tmp_path / "audit", tmp_path / "c.sock", tmp_path / "sitsd.log"
    endpoint, _udp_url, _sim = plcsim(tmp_path / "device.pem")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a group nobody publishes on: sitsd stays idle
        s.bind(("127.0.0.1", 0))
        idle_url = f"opc.udp://239.255.{os.getpid() % 250 + 1}.{s.getsockname()[1] % 250 + 1}:{s.getsockname()[1]}"
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=idle_url,
                                       attestation__tcti=tpm.tcti, attestation__signing="tpm-direct",
                                       plc__security="none", audit__directory=audit, control__socket=control),
                            stderr=open(log, "wb"), cwd=REPO, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    status = lambda: request(control, "status")  # noqa: E731
    try:
        wait_ready(proc, log)
        before = status()
        assert before["signing_mode"] == "tpm" and before["tpm"]["reachable"] and before["tpm"]["bound"]
        tpm.stop_process()  # the TPM goes away while nothing is signed
        gone = wait_for(lambda s: not s["tpm"]["reachable"] and s["alerts"].get("tpm"), 20,
                        "the probe to see the TPM gone", status)
        assert gone["alerts"]["tpm"] == 1 and gone["tpm"]["outages"] == 1 and gone["counters"]["sign_errors"] == 0
        tpm_alerts = [e["reason"] for e in _log_events(log) if e.get("event") == "alert" and e.get("kind") == "tpm"]
        assert "no command can be signed (tpm-direct)" in tpm_alerts[0], tpm_alerts
        tpm = Swtpm(tmp_path / "tpm").start()  # back on its state: a TPM reset
        back = wait_for(lambda s: s["tpm"]["reachable"] and s["tpm"]["resets"] >= 1 and s["tpm"]["bound"], 30,
                        "the TPM back, the reset seen and re-measured", status)
        assert back["tpm"]["outages"] == 1 and back["tpm"]["remeasure_failures"] == 0
        assert back["tpm"]["last_reset"].startswith("TPM reset (resetCount")
        text = log.read_text()
        assert "TPM answers again" in text and "TPM reset detected" in text
        reset = wait_for(lambda reasons: any("TPM reset" in r for r in reasons), 10, "the reset alerted", lambda: [
            e["reason"] for e in _log_events(log) if e.get("event") == "alert" and e.get("kind") == "tpm"])
        assert any("re-measured what runs" in r and "did not depend on PCR 16 (tpm-direct)" in r for r in reset), reset
        assert proc.poll() is None
        took = _sigterm(proc, log)
        assert proc.returncode == 0 and took < EXIT_BOUND_S
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tpm.stop()
