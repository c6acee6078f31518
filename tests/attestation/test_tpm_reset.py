"""tpm-session across a TPM reset, a cleared TPM and a hung TPM: real swtpm, real sitsd process, real PLC simulator.

A TPM reset (swtpm restarted on its state: TPM2_Startup(CLEAR), PCRs back at zero, resetCount + 1) must be
detected, alerted as a reset, the running model, modules and config measured anew, and a PLC that reconnects must
accept the new credential. A TPM that holds no attestation key any more cannot re-bind: nothing is signed until it
can, and the daemon keeps retrying. A hung TPM must never keep SIGTERM from stopping the daemon.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from attestation.tpm import Swtpm
from sitsd.control import request

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO, sim_stats, sitsd_args, wait_for, wait_ready
from .test_deploy import vendor  # noqa: F401 (fixture)

MODEL_SHA = hashlib.sha256(DEMO_MODEL.read_bytes()).hexdigest()
EXIT_BOUND_S = 10.0  # generous: 2 shared noisy cores; the daemon itself gives up on the TPM after a few seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_sim(sim) -> dict:
    sim.stdin.write("stop\n")
    sim.stdin.flush()
    final = next(json.loads(line)["final"] for line in sim.stdout if line.startswith('{"final"'))
    sim.wait(10)
    return final


def _tpm_alerts(log) -> list[str]:
    """The `tpm` alerts sitsd logged (recent_alerts in status keeps only 5: `sign` refusals may push them out)."""
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"alert"' in line:
            entry = json.loads(line)
            if entry.get("event") == "alert" and entry.get("kind") == "tpm":
                out.append(entry["reason"])
    return out


class _Daemon:
    """sitsd in tpm-session mode against `tpm` and a PLC simulator on a fixed port (so it can come back)."""

    def __init__(self, plcsim, tmp_path, tpm: Swtpm) -> None:
        self.tmp, self.audit, self.control = tmp_path, tmp_path / "audit", tmp_path / "c.sock"
        self.port = _free_port()
        self.plcsim = plcsim
        self.endpoint, self.udp_url, self.sim = plcsim(self.audit / "device.pub.pem", model_sha256=MODEL_SHA,
                                                        session=True, port=self.port)
        self.log = tmp_path / "sitsd.log"
        self.proc = subprocess.Popen(
            sitsd_args(EXAMPLE_CONFIG, plc__endpoint=self.endpoint, transport__url=self.udp_url,
                       attestation__tcti=tpm.tcti, plc__security="none", plc__timeout_s=2,
                       audit__directory=self.audit, control__socket=self.control),
            stderr=open(self.log, "wb"), cwd=REPO, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
        wait_ready(self.proc, self.log)

    def status(self) -> dict:
        return request(self.control, "status")

    def restart_plc(self) -> tuple[dict, object]:
        """The PLC goes away and comes back on the same endpoint: it asks for a fresh credential."""
        first = _stop_sim(self.sim)
        time.sleep(0.3)
        _, _, self.sim = self.plcsim(self.audit / "device.pub.pem", model_sha256=MODEL_SHA, session=True,
                                     port=self.port, udp_url=self.udp_url)
        return first, self.sim

    def sigterm(self) -> float:
        """SIGTERM; returns the seconds until the process exited (fails past EXIT_BOUND_S)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack into the log
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            pytest.fail(f"sitsd ignored SIGTERM for {EXIT_BOUND_S} s:\n{self.log.read_text()[-6000:]}")
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_tpm_reset_is_alerted_remeasured_and_a_reconnecting_plc_accepts_the_new_credential(plcsim, tmp_path):
    from attestation.measurement import read_log, replay_file

    tpm = Swtpm(tmp_path / "tpm").start()
    d = None
    try:
        d = _Daemon(plcsim, tmp_path, tpm)
        before = wait_for(lambda s: s["counters"]["commands"] > 30, 20, "commands flowing", d.status)
        assert before["tpm"]["resets"] == 0 and before["tpm"]["bound"] is True
        log_before = read_log(d.audit / "measurements.jsonl")[1]
        # TPM reset: swtpm restarts on its state (persistent AK stays), TPM2_Startup(CLEAR): PCRs zero, resetCount+1
        tpm.stop_process()
        t_reset = time.monotonic()
        tpm = Swtpm(tmp_path / "tpm").start()
        after = wait_for(lambda s: s["tpm"]["resets"] >= 1 and s["tpm"]["bound"], 20,
                         "the reset detected and the session re-measured", d.status)
        remeasured_s = time.monotonic() - t_reset
        wait_for(lambda s: any("reset" in r for r in _tpm_alerts(d.log)), 5, "the reset alerted", d.status)
        reasons = [r for r in _tpm_alerts(d.log) if "reset" in r]
        assert len(reasons) == 1 and "resetCount 1→2" in reasons[0] and "re-measured" in reasons[0], reasons
        assert after["tpm"]["last_reset"].startswith("TPM reset (resetCount")
        assert after["tpm"]["remeasure_failures"] == 0
        # the new measurement log explains the PCR from zero with what runs: the model, the modules, the config
        header, events = read_log(d.audit / "measurements.jsonl")
        assert header["initial"] == "00" * 32
        assert [e.kind for e in events] == [e.kind for e in log_before]
        assert [e.sha256 for e in events] == [e.sha256 for e in log_before]
        assert events[0].kind == "model" and events[0].sha256 == MODEL_SHA
        assert replay_file(d.audit / "measurements.jsonl").hex() == events[-1].pcr_after
        assert list(d.audit.glob("measurements-before-tpm-reset-*.jsonl"))
        # the PLC reconnects and asks for a fresh quote: it must accept it and take commands again
        t_plc = time.monotonic()
        first, sim2 = d.restart_plc()
        wait_for(lambda s: s["plc_link"]["reconnects"] >= 1 and s["state"] == "running", 30,
                 "the PLC re-bound after the TPM reset", d.status)
        deadline = time.monotonic() + 20
        while sim_stats(sim2)["accepted"] < 50:
            assert time.monotonic() < deadline, f"the new PLC session accepts no commands:\n{d.log.read_text()[-3000:]}"
            time.sleep(0.2)
        rebind_s = time.monotonic() - t_plc
        second = sim_stats(sim2)
        assert first["rejected"] == 0 and second["rejected"] == 0
        assert "session key bound to the TPM quote" in d.log.read_text()
        print(f"\nre-measured {remeasured_s:.2f} s after the reset; PLC re-bound and 50 commands in {rebind_s:.2f} s")
        exit_s = d.sigterm()
        assert d.proc.returncode == 0, d.log.read_text()[-3000:]
        print(f"SIGTERM exit in {exit_s:.2f} s")
    finally:
        if d is not None:
            d.kill()
        tpm.stop()


def test_cleared_tpm_stops_signing_keeps_retrying_and_recovers_when_the_identity_is_back(plcsim, tmp_path):
    """swtpm restarted without its state: the AK the PLC trusts is gone, so the session cannot be re-bound.
    sitsd must not crash, must alert, must sign nothing (the PLC's watchdog holds its fail-safe), and must retry:
    when the TPM with that identity is back (the original state), it re-measures and commands resume."""
    tpm = Swtpm(tmp_path / "tpm").start()
    d = None
    try:
        d = _Daemon(plcsim, tmp_path, tpm)
        wait_for(lambda s: s["counters"]["commands"] > 30, 20, "commands flowing", d.status)
        tpm.stop_process()
        # the daemon's TCTI names tmp_path/tpm/swtpm.sock: serve a TPM without state (no AK) there
        shutil.move(tmp_path / "tpm", tmp_path / "tpm-original")
        tpm = Swtpm(tmp_path / "tpm").start()
        unbound = wait_for(lambda s: not s["tpm"]["bound"] and s["tpm"]["remeasure_failures"] >= 1, 20,
                           "the lost attestation key seen and signing stopped", d.status)
        wait_for(lambda s: any("attestation key" in r for r in _tpm_alerts(d.log)), 5, "the lost AK alerted", d.status)
        reasons = [r for r in _tpm_alerts(d.log) if "attestation key" in r]
        assert len(reasons) == 1 and "0x81000002" in reasons[0] and "cleared or replaced" in reasons[0], reasons
        assert d.proc.poll() is None
        time.sleep(1.0)
        held = sim_stats(d.sim)["accepted"]
        s1 = wait_for(lambda s: s["tpm"]["remeasure_failures"] >= unbound["tpm"]["remeasure_failures"] + 1, 20,
                      "re-binding retried", d.status)
        assert s1["tpm"]["bound"] is False
        assert sim_stats(d.sim)["accepted"] == held  # nothing signed by the unbound key reached the PLC
        assert s1["counters"]["sign_errors"] > 0
        # the TPM with the identity the PLC trusts comes back (reset: PCRs zero): re-measured, commands resume
        tpm.stop()
        shutil.rmtree(tmp_path / "tpm")
        shutil.move(tmp_path / "tpm-original", tmp_path / "tpm")
        tpm = Swtpm(tmp_path / "tpm").start()
        wait_for(lambda s: s["tpm"]["bound"], 20, "re-bound once the TPM with the AK is back", d.status)
        deadline = time.monotonic() + 20
        while sim_stats(d.sim)["accepted"] < held + 50:
            assert time.monotonic() < deadline, d.log.read_text()[-3000:]
            time.sleep(0.2)
        assert sim_stats(d.sim)["rejected"] == 0
        d.sigterm()
        assert d.proc.returncode == 0, d.log.read_text()[-3000:]
    finally:
        if d is not None:
            d.kill()
        tpm.stop()


def test_sigterm_stops_the_daemon_while_a_hung_tpm_blocks_the_plc_rebind(plcsim, tmp_path):
    """A TPM that stops answering (swtpm frozen: connections accepted, no reply) while the PLC reconnects: the
    probe and the re-bind wait on it. The control socket must keep answering and SIGTERM must stop sitsd."""
    tpm = Swtpm(tmp_path / "tpm").start()
    d = None
    try:
        d = _Daemon(plcsim, tmp_path, tpm)
        wait_for(lambda s: s["counters"]["commands"] > 30, 20, "commands flowing", d.status)
        tpm._proc.send_signal(signal.SIGSTOP)  # hung TPM
        d.restart_plc()  # the PLC reconnects and asks for a fresh credential: the quote needs the hung TPM
        hung = wait_for(lambda s: s["alerts"].get("tpm") and s["plc_link"]["losses"] >= 1, 20,
                        "the hung TPM alerted while the PLC reconnects", d.status)
        assert not hung["tpm"]["reachable"]
        time.sleep(3.0)  # several probes and re-bind attempts against the hung TPM
        t0 = time.monotonic()
        d.status()  # the I/O loop is not blocked by the TPM
        assert time.monotonic() - t0 < 5.0
        exit_s = d.sigterm()
        print(f"\nSIGTERM exit with a hung TPM: {exit_s:.2f} s")
    finally:
        if d is not None:
            d.kill()
        if tpm._proc is not None:
            tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()


# --- the signer alone ---------------------------------------------------------------------------------------------

def test_signer_probe_sees_the_reset_refuses_until_remeasured_and_then_binds_anew(tmp_path):
    """TpmSessionSigner on a swtpm that is reset: probe names it (resetCount), signing and binding refuse until
    `remeasure`, and the new credential verifies for the PLC with the same AK."""
    import os

    from attestation.envelope import Command
    from attestation.errors import TpmError
    from attestation.session import SessionVerifier, TpmSessionSigner, replay_measurements

    model = hashlib.sha256(b"model").digest()
    tpm = Swtpm(tmp_path / "tpm").start()
    signer = None
    try:
        signer = TpmSessionSigner(tpm.tcti)
        signer.measure_model(model)
        verifier = SessionVerifier(signer.device_public_key_pem(), model)
        nonce = os.urandom(16)
        verifier.accept(signer.bind(nonce).to_cbor(), nonce)
        assert signer.probe() is None
        tpm.stop_process()
        tpm = Swtpm(tmp_path / "tpm").start()  # reset: same state, PCRs zero, resetCount + 1
        try:
            seen = signer.probe()
        except TpmError:  # a TCTI that kept its connection finds it dead: reopened, seen at the next probe
            seen = signer.probe()
        assert seen is not None and "TPM reset (resetCount" in seen and "back at zero" in seen
        assert not signer.bound and signer.resets == 1
        now = time.time_ns()
        cmd = Command("n", (0.0,), 1, 0, now, now + 100_000_000, model, True)
        with pytest.raises(TpmError, match="not bound"):
            signer.sign_command(cmd)
        with pytest.raises(TpmError, match="not bound"):
            signer.bind(os.urandom(16))
        assert signer.remeasure([model]) == replay_measurements([model])
        assert signer.bound and signer.probe() is None
        nonce = os.urandom(16)
        session = verifier.accept(signer.bind(nonce).to_cbor(), nonce)  # the PLC re-accepts, same AK
        session.verify(signer.sign_command(cmd))
    finally:
        if signer is not None:
            signer.close()
        tpm.stop()


def test_signer_calls_to_a_hung_tpm_are_bounded_and_close_does_not_wait(tmp_path, monkeypatch):
    import os

    from attestation.errors import TpmError
    from attestation.session import TpmSessionSigner
    from attestation.tpm import worker

    monkeypatch.setattr(worker, "TPM_CALL_TIMEOUT_S", 1.0)  # read at each call (not bound at definition time)
    tpm = Swtpm(tmp_path / "tpm").start()
    signer = TpmSessionSigner(tpm.tcti)
    try:
        signer.measure_model(hashlib.sha256(b"model").digest())
        tpm._proc.send_signal(signal.SIGSTOP)
        for call in (signer.probe, lambda: signer.bind(os.urandom(16)), signer.probe):
            t0 = time.monotonic()
            with pytest.raises(TpmError):
                call()
            assert time.monotonic() - t0 < 8.0  # 1 s per TPM call; a hung call makes the next fail at once
        t0 = time.monotonic()
        signer.close()
        assert time.monotonic() - t0 < 3.0
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()


def test_sigterm_stops_the_daemon_while_it_waits_to_rebind_a_plc_that_is_gone(plcsim, tmp_path):
    """SIGTERM while reconnecting (the PLC gone, its re-bind pending): the reconnect supervisor used to spin on with the
    stop flag set (a cancellation swallowed by asyncio.wait_for), and sitsd never exited."""
    tpm = Swtpm(tmp_path / "tpm").start()
    d = None
    try:
        d = _Daemon(plcsim, tmp_path, tpm)
        wait_for(lambda s: s["counters"]["commands"] > 30, 20, "commands flowing", d.status)
        _stop_sim(d.sim)
        wait_for(lambda s: s["state"] == "reconnecting" and s["plc_link"]["losses"] >= 1, 20, "reconnecting", d.status)
        time.sleep(1.0)
        exit_s = d.sigterm()
        assert d.proc.returncode == 0, d.log.read_text()[-3000:]
        assert "sitsd stopped" in d.log.read_text()
        print(f"\nSIGTERM exit while reconnecting: {exit_s:.2f} s")
    finally:
        if d is not None:
            d.kill()
        tpm.stop()


def test_certification_refused_after_a_reset_signs_nothing_retries_and_recovers(plcsim, tmp_path, vendor):
    """attestation.certify_session: after a TPM reset the session key must be certified again. With an approval that
    does not cover what runs (here: the approval file replaced by one for another model), the TPM refuses: nothing is
    signed, one alert, retried at every probe; once the approval covers what runs again, bound again, and a PLC that
    requires certification accepts the reconnect."""
    from attestation.tpm.policy import Approval, approve, load_authority_private

    approval_bytes = vendor["approval"].read_bytes()
    tpm = Swtpm(tmp_path / "tpm").start()
    audit = tmp_path / "audit"
    port = _free_port()
    trust = ("--trust-policy-key", str(audit / "device-policy.pub.pem"), "--approval", str(vendor["approval"]),
             "--authority-pub", str(vendor["pub"]))
    endpoint, udp_url, sim = plcsim(audit / "device.pub.pem", model_sha256=MODEL_SHA, session=True, port=port,
                                    extra_args=trust)
    log = tmp_path / "sitsd.log"
    proc = subprocess.Popen(
        sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url, attestation__tcti=tpm.tcti,
                   plc__security="none", attestation__certify_session="true",
                   attestation__approval=vendor["approval"], attestation__authority_key=vendor["pub"],
                   audit__directory=audit, control__socket=tmp_path / "c.sock"),
        stderr=open(log, "wb"), cwd=REPO, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    status = lambda: request(tmp_path / "c.sock", "status")  # noqa: E731
    try:
        wait_ready(proc, log)
        wait_for(lambda s: s["counters"]["commands"] > 30 and s["session_certified"], 20, "certified commands", status)
        # the approval on disk now approves another model: what runs is not covered by it
        other = Approval.load(vendor["approval"]).events
        other = ((other[0][0], other[0][1], hashlib.sha256(b"another model").hexdigest()), *other[1:])
        vendor["approval"].write_text(approve(load_authority_private(vendor["key"]), 23, other).to_json())
        tpm.stop_process()
        tpm = Swtpm(tmp_path / "tpm").start()  # TPM reset
        refused = wait_for(lambda s: s["tpm"]["resets"] >= 1 and s["tpm"]["remeasure_failures"] >= 1, 20,
                           "the certification refused after the reset", status)
        assert refused["tpm"]["bound"] is False and proc.poll() is None
        wait_for(lambda s: any("failed" in r for r in _tpm_alerts(log)), 5, "the refusal alerted", status)
        reasons = [r for r in _tpm_alerts(log) if "reset" in r]
        assert len(reasons) == 1 and "re-measuring the running model, modules and config failed" in reasons[0] \
            and "nothing is signed" in reasons[0], reasons
        time.sleep(1.0)
        held = sim_stats(sim)["accepted"]
        retried = wait_for(lambda s: s["tpm"]["remeasure_failures"] >= refused["tpm"]["remeasure_failures"] + 2, 20,
                           "re-measurement retried", status)
        assert retried["tpm"]["bound"] is False and sim_stats(sim)["accepted"] == held
        assert retried["tpm"]["resets"] == 1  # one reset, retried: not counted again per probe
        assert len([r for r in _tpm_alerts(log) if "reset" in r]) == 1  # one alert per reset, not per retry
        # the approval covers what runs again: the next retry certifies, commands resume
        vendor["approval"].write_bytes(approval_bytes)
        wait_for(lambda s: s["tpm"]["bound"] and s["session_certified"], 20, "certified again", status)
        deadline = time.monotonic() + 20
        while sim_stats(sim)["accepted"] < held + 50:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        # a PLC that requires certification reconnects: it gets a fresh, certified credential
        _stop_sim(sim)
        time.sleep(0.3)
        _, _, sim = plcsim(audit / "device.pub.pem", model_sha256=MODEL_SHA, session=True, port=port,
                           udp_url=udp_url, extra_args=trust)
        deadline = time.monotonic() + 30
        while sim_stats(sim)["accepted"] < 50:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert sim_stats(sim)["rejected"] == 0
        assert log.read_text().count('"certified": true') >= 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_BOUND_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tpm.stop()
