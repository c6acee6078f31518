"""tpm-direct with a TPM that hangs (swtpm SIGSTOPped: connections accepted, no reply): every TPM call is bounded.

TPM2_Sign runs on the signer's TPM thread (attestation.tpm.worker) and the loop waits at most SIGN_TIMEOUT_S: a hung
TPM costs sign errors (nothing unsigned leaves), never a stalled loop; later signs fail at once while the stuck call is
outstanding; signing resumes when the TPM answers again; `close` and SIGTERM never wait for it. The measurement log
and the audit anchor share the signer's context and lock, and are bounded the same way. Real swtpm, real sitsd.
"""
from __future__ import annotations

import hashlib
import signal
import subprocess
import threading
import time
import types

import pytest

from attestation.envelope import Command, EnvelopeVerifier
from attestation.errors import TpmError
from attestation.tpm import Swtpm, TpmSigner

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_for, wait_ready

MODEL = hashlib.sha256(b"rolling mill model").digest()
BOUND_S = 8.0  # generous: 2 shared noisy cores; the signer gives up after SIGN_TIMEOUT_S (1 s)
EXIT_BOUND_S = 10.0


def _cmd(seq: int) -> Command:
    now = time.time_ns()
    return Command("t", (0.5,), seq, seq, now, now + 10**9, MODEL)


def _timed(fn):
    t0 = time.monotonic()
    try:
        return fn(), time.monotonic() - t0
    except Exception as exc:
        return exc, time.monotonic() - t0


def test_sign_to_a_hung_tpm_is_bounded_fails_fast_then_recovers_and_close_does_not_wait(tmp_path):
    tpm = Swtpm(tmp_path / "tpm").start()
    signer = TpmSigner(tpm.tcti)
    verifier = EnvelopeVerifier(signer.public_key_pem(), MODEL, freshness=False)
    try:
        verifier.verify(signer.sign_command(_cmd(1)))
        tpm._proc.send_signal(signal.SIGSTOP)
        first, took = _timed(lambda: signer.sign_command(_cmd(2)))
        assert isinstance(first, TpmError) and "did not answer TPM2_Sign within 1 s" in str(first), first
        assert took < BOUND_S
        again, took = _timed(lambda: signer.sign_command(_cmd(3)))  # the stuck call is outstanding: at once
        assert isinstance(again, TpmError) and "not attempted" in str(again), again
        assert took < BOUND_S
        tpm._proc.send_signal(signal.SIGCONT)
        seq = [3]

        def signs(_):
            seq[0] += 1
            try:
                verifier.verify(signer.sign_command(_cmd(seq[0])))
                return True
            except TpmError:
                return False

        wait_for(signs, 20, "signing to resume once the TPM answers", lambda: None, interval_s=0.2)
        for i in range(5):  # and it stays up
            verifier.verify(signer.sign_command(_cmd(100 + i)))
        tpm._proc.send_signal(signal.SIGSTOP)
        with pytest.raises(TpmError):
            signer.sign_command(_cmd(200))
        result, took = _timed(signer.close)  # a call the TPM never answered is outstanding: close leaves it
        assert result is None and took < BOUND_S
        with pytest.raises(TpmError, match="closed"):
            signer.sign_command(_cmd(201))
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()


def test_measurement_log_and_audit_anchor_through_a_hung_tpm_direct_signer_are_bounded(tmp_path, monkeypatch):
    from attestation.measurement import MeasurementError, TpmPcr
    from attestation.tpm import worker
    from sitsd.audit_anchor import DEFAULT_NV_INDEX, AnchorTpmError, counter_for_signer

    monkeypatch.setattr(worker, "TPM_CALL_TIMEOUT_S", 1.0)  # read at each call
    tpm = Swtpm(tmp_path / "tpm").start()
    signer = TpmSigner(tpm.tcti)
    try:
        pcr = TpmPcr(signer._open_esapi, 23, signer._lock)  # as sitsd/hotswap.py shares the signer's context
        pcr.reset()
        pcr.extend(hashlib.sha256(b"module").digest())
        counter = counter_for_signer(signer, tpm.tcti, DEFAULT_NV_INDEX)
        assert counter.read() is None  # not defined yet; the call works through the shared context
        tpm._proc.send_signal(signal.SIGSTOP)
        for call, error in ((lambda: pcr.extend(hashlib.sha256(b"config").digest()), MeasurementError),
                            (counter.read, AnchorTpmError),
                            (lambda: signer.sign_command(_cmd(1)), TpmError),
                            (pcr.read, TpmError)):
            result, took = _timed(call)
            assert isinstance(result, error), result
            assert took < BOUND_S
        assert signer._worker.timeouts == 1  # the first call timed out; every later one failed at once
        tpm._proc.send_signal(signal.SIGCONT)
        wait_for(lambda _: _answers(pcr), 20, "the PCR readable once the TPM answers", lambda: None, interval_s=0.2)
        signer.sign_command(_cmd(2))
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        signer.close()
        tpm.stop()


def _answers(pcr) -> bool:
    try:
        pcr.read()
        return True
    except Exception:
        return False


def test_worker_reads_the_call_timeout_at_call_time_and_fails_fast_behind_a_stuck_call(monkeypatch):
    from attestation.tpm import worker

    monkeypatch.setattr(worker, "TPM_CALL_TIMEOUT_S", 0.2)
    w = worker.TpmWorker("test")
    release = threading.Event()
    ran = []
    try:
        with pytest.raises(TpmError, match=r"did not answer stuck within 0\.2 s"):
            w.call("stuck", release.wait)
        with pytest.raises(TpmError, match="not attempted"):
            w.call("next", ran.append, 1)
        assert w.hung and w.busy
        release.set()
        wait_for(lambda _: not w.busy, 5, "the stuck call to return", lambda: None, interval_s=0.02)
        assert w.call("after", lambda: 42) == 42
        assert ran == []  # a call that timed out before it started never runs later
    finally:
        release.set()
        w.stop()
    assert w.call("restarted after stop", lambda: 7) == 7  # a later call starts a fresh thread
    w.stop()


def test_remeasure_attempt_given_up_on_never_commits_and_attempts_never_overlap():
    """sitsd/daemon.py: an attempt `_watch_tpm` gave up on (its generation moved on) stops before its next step; one
    still running (a hung TPM call) makes the next attempt fail at once instead of running alongside."""
    from sitsd.daemon import Daemon

    steps = []

    def locked(archive, current, check):
        steps.append(current())
        check("committing")
        return "done"

    fake = types.SimpleNamespace(_remeasure_lock=threading.Lock(), _remeasure_generation=3,
                                 _remeasure_locked=locked)
    assert Daemon._remeasure_after_reset(fake, False, 3) == "done"
    fake._remeasure_generation = 4  # the watcher timed out on attempt 3
    with pytest.raises(TpmError, match="abandoned"):
        Daemon._remeasure_after_reset(fake, False, 3)
    assert steps == [True, False]
    fake._remeasure_lock.acquire()  # an earlier attempt is still inside the TPM
    try:
        with pytest.raises(TpmError, match="has not returned yet"):
            Daemon._remeasure_after_reset(fake, False, 4)
    finally:
        fake._remeasure_lock.release()


def test_session_remeasure_does_not_commit_once_superseded(tmp_path):
    from attestation.session import TpmSessionSigner, replay_measurements

    model = hashlib.sha256(b"model").digest()
    tpm = Swtpm(tmp_path / "tpm").start()
    signer = TpmSessionSigner(tpm.tcti)
    try:
        signer.measure_model(model)
        signer.unbind("TPM reset; re-measurement pending")
        with pytest.raises(TpmError, match="not committed"):
            signer.remeasure([model], still_current=lambda: False)
        assert not signer.bound and signer.measurements == (model,)
        assert signer.remeasure([model], still_current=lambda: True) == replay_measurements([model])
        assert signer.bound
    finally:
        signer.close()
        tpm.stop()


def test_sigterm_stops_a_tpm_direct_daemon_while_the_tpm_hangs(plcsim, tmp_path):
    """tpm-direct signs every command with the TPM: frozen, the loop must go on refusing (sign errors, a `sign`
    alert, nothing unsigned sent), the control socket must answer, and SIGTERM must stop sitsd (the audit anchor's
    close and the signer's close included)."""
    from sitsd.control import request

    tpm = Swtpm(tmp_path / "tpm").start()
    key = TpmSigner(tpm.tcti)
    (tmp_path / "device.pem").write_bytes(key.public_key_pem())
    key.close()
    audit, control, log = tmp_path / "audit", tmp_path / "c.sock", tmp_path / "sitsd.log"
    endpoint, udp_url, _sim = plcsim(tmp_path / "device.pem")
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=tpm.tcti, attestation__signing="tpm-direct",
                                       plc__security="none", audit__directory=audit, audit__anchor="tpm",
                                       control__socket=control),
                            stderr=open(log, "wb"), cwd=REPO)
    status = lambda: request(control, "status")  # noqa: E731
    try:
        wait_ready(proc, log)
        wait_for(lambda s: s["counters"]["commands"] > 30, 20, "commands flowing", status)
        tpm._proc.send_signal(signal.SIGSTOP)  # hung TPM
        hung = wait_for(lambda s: s["counters"]["sign_errors"] > 20 and s["alerts"].get("sign"), 20,
                        "sign errors and a sign alert while the TPM hangs", status)
        time.sleep(1.0)
        later = status()  # the loop goes on (refusing), the I/O loop answers
        assert later["counters"]["sign_errors"] > hung["counters"]["sign_errors"]
        assert proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            pytest.fail(f"sitsd ignored SIGTERM for {EXIT_BOUND_S} s with a hung TPM:\n{log.read_text()[-6000:]}")
        print(f"\ntpm-direct: SIGTERM exit with a hung TPM: {time.monotonic() - t0:.2f} s")
        assert proc.returncode == 0, log.read_text()[-3000:]
        assert "sitsd stopped" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()
