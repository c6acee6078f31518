"""What runs beside sitsd's start (sitsd/startup.py: the blocking start runs on a thread while the I/O loop stays
free), against real swtpm and real sitsd processes: a SIGHUP during the start is applied after READY=1, never
mid-start; a stop leaves what the start thread makes after it to that thread, which closes it; a stop during the
audit-anchor step never waits for the anchor's TPM call; a start error that is not the TPM's is not called one.
And tpm-direct's TpmSigner: its probe never opens a second TPM connection beside its own, and `remeasure` measures
PCR 16 from zero and checks the result. Bounds are generous (2 shared noisy cores).
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

from attestation.errors import EnvelopeError, TpmError
from attestation.tpm import Swtpm, TpmSigner

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_for, wait_ready
from .test_tpm_startup import EXIT_BOUND_S, UNREACHABLE_PLC, _log_events, _wait_logged, manager  # noqa: F401

MODEL = hashlib.sha256(b"rolling mill model").digest()


def _config(tmp_path, tcti: str, *extra: str):
    from sitsd.cli import parse_overrides
    from sitsd.config import load_config

    return load_config(EXAMPLE_CONFIG, parse_overrides([
        f"plc.endpoint={UNREACHABLE_PLC}", f"attestation.tcti={tcti}", "attestation.signing=tpm-direct",
        f"audit.directory={tmp_path / 'audit'}", f"control.socket={tmp_path / 'c.sock'}", "metrics.port=0",
        *extra]))


def _serve_in_thread(daemon) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        out["rc"] = asyncio.run(daemon.serve())

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


def test_sighup_while_starting_is_applied_after_ready(plcsim, tmp_path, manager):  # noqa: F811
    """SIGHUP while the start waits on a frozen TPM: no RELOADING=1 and no second READY=1 during the start, no
    exception, and the reload runs once after READY=1."""
    notify_path, received = manager
    tpm = Swtpm(tmp_path / "tpm").start()
    key = TpmSigner(tpm.tcti)
    (tmp_path / "device.pem").write_bytes(key.public_key_pem())
    key.close()
    endpoint, udp_url, _sim = plcsim(tmp_path / "device.pem")
    log = tmp_path / "sitsd.log"
    tpm._proc.send_signal(signal.SIGSTOP)  # opening the TPM waits (bound 10 s) until it is thawed
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=tpm.tcti, attestation__signing="tpm-direct",
                                       plc__security="none", audit__directory=tmp_path / "audit",
                                       control__socket=tmp_path / "c.sock"),
                            stderr=open(log, "wb"), cwd=REPO,
                            env=dict(os.environ, PYTHONFAULTHANDLER="1", NOTIFY_SOCKET=notify_path))
    messages: list[str] = []
    try:
        _wait_logged(proc, log, "waiting for the TPM")  # the start is mid-way, waiting on the TPM
        proc.send_signal(signal.SIGHUP)
        _wait_logged(proc, log, "reload requested while starting: applied after the start", 20)
        messages += received()
        assert not any(m.startswith(("RELOADING=1", "READY=1")) for m in messages), messages
        tpm._proc.send_signal(signal.SIGCONT)
        wait_ready(proc, log)
        _wait_logged(proc, log, "config reloaded", 30)
        time.sleep(0.5)
        assert proc.poll() is None, log.read_text()[-3000:]
        messages += received()
        text = log.read_text()
        assert text.index("sitsd ready") < text.index("applying the reload requested while starting") \
            < text.index("config reloaded"), text[-3000:]
        # READY=1 of the start first, then the reload's RELOADING=1 ... READY=1: nothing of the reload before
        kinds = [m.split("\n")[0].split("=")[0] for m in messages if m.startswith(("READY=1", "RELOADING=1"))]
        assert kinds == ["READY", "RELOADING", "READY"], messages
        assert text.count("reload requested while starting: applied after the start") == 1
        assert text.count("config reloaded") == 1
        assert "Traceback" not in text and "AttributeError" not in text and "config reload failed" not in text, \
            text[-3000:]
        events = _log_events(log)
        assert not any(e.get("level") in ("error", "critical") for e in events), \
            [e for e in events if e.get("level") in ("error", "critical")]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_BOUND_S + 10) == 0
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tpm.stop()


def test_a_stop_leaves_what_the_start_makes_late_to_the_start_thread_which_closes_it(tmp_path, monkeypatch):
    """Stopped while opening the TPM (frozen): serve() returns at once; when the TPM answers later, the start
    thread stops at its next step and closes the signer it made; nothing after that step is made (no public key
    file, no frame socket)."""
    from attestation.tpm import worker
    from sitsd.daemon import Daemon
    from sitsd.notify import Notifier

    monkeypatch.setattr(worker, "TPM_OPEN_TIMEOUT_S", 120.0)  # only the stop, then the thaw, end this open
    tpm = Swtpm(tmp_path / "tpm").start()
    daemon = Daemon(_config(tmp_path, tpm.tcti), notifier=Notifier({}))
    tpm._proc.send_signal(signal.SIGSTOP)
    try:
        th, out = _serve_in_thread(daemon)
        wait_for(lambda calls: any(c["what"] == "opening the TPM" and c["waited_s"] > 0.5 for c in calls), 60,
                 "the start to wait on the frozen TPM", worker.pending_calls)
        t0 = time.monotonic()
        daemon.request_stop()
        th.join(EXIT_BOUND_S)
        assert not th.is_alive(), "serve() did not return on the stop request"
        print(f"\nstop request to serve() returning, frozen while opening: {time.monotonic() - t0:.2f} s")
        assert out["rc"] == 0 and daemon.signer is None and "build" in daemon._startup.given_up
        assert daemon._startup.running  # still blocked in the TPM: its cleanup is its own
        tpm._proc.send_signal(signal.SIGCONT)  # the open returns late
        wait_for(lambda running: not running, 30, "the start thread to finish", lambda: daemon._startup.running)
        signer = daemon.signer
        assert signer is not None, "the late open did not return a signer"
        assert signer._esapi is None, "the signer the start thread made after the stop was never closed"
        assert daemon.source is None and daemon.loop is None
        assert not (tmp_path / "audit" / "signer.pub.pem").exists()
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()


def test_a_stop_during_the_audit_anchor_step_does_not_wait_for_its_tpm_call(plcsim, tmp_path, monkeypatch):
    """The TPM freezes during the audit anchor's start check (an NV read): a stop returns without the closing
    anchor (which would wait for that read: here up to 60 s), the anchor is never registered with the log, and
    its thread is stopped once the read returns."""
    from attestation.tpm import worker
    from sitsd.daemon import Daemon
    from sitsd.notify import Notifier

    monkeypatch.setattr(worker, "TPM_CALL_TIMEOUT_S", 60.0)  # the NV read is ended only by the thaw
    tpm = Swtpm(tmp_path / "tpm").start()
    signer = TpmSigner(tpm.tcti)
    (tmp_path / "device.pem").write_bytes(signer.public_key_pem())
    endpoint, _udp_url, _sim = plcsim(tmp_path / "device.pem")
    frozen = threading.Event()
    attach = Daemon._attach_audit_anchor

    def attach_frozen(self):
        tpm._proc.send_signal(signal.SIGSTOP)
        frozen.set()
        return attach(self)

    monkeypatch.setattr(Daemon, "_attach_audit_anchor", attach_frozen)
    cfg = _config(tmp_path, tpm.tcti, f"plc.endpoint={endpoint}", "plc.security=none", "audit.anchor=tpm")
    daemon = Daemon(cfg, signer=signer, notifier=Notifier({}))
    try:
        th, out = _serve_in_thread(daemon)
        assert frozen.wait(90), "the start never reached the audit anchor"
        wait_for(lambda calls: any(c["waited_s"] > 0.5 for c in calls), 30,
                 "the anchor's start check to wait on the frozen TPM", worker.pending_calls)
        t0 = time.monotonic()
        daemon.request_stop()
        th.join(EXIT_BOUND_S + 5)
        took = time.monotonic() - t0
        assert not th.is_alive(), "serve() waited for the anchor's TPM call"
        print(f"\nstop request to serve() returning, frozen in the audit anchor's start check: {took:.2f} s")
        assert out["rc"] == 0 and daemon.audit.closed and daemon.audit.anchor is None
        assert daemon.audit_anchor is None and "audit anchor" in daemon._startup.given_up
        records = [json.loads(line) for f in sorted((tmp_path / "audit").glob("*.jsonl"))
                   for line in f.read_text().splitlines() if line.startswith("{")]
        assert not any(r.get("type") == "anchor" and r.get("reason") == "close" for r in records)
        tpm._proc.send_signal(signal.SIGCONT)
        wait_for(lambda running: not running, 90, "the anchor step to finish", lambda: daemon._startup.running)
        wait_for(lambda names: "sits-audit-anchor" not in names, 20, "the abandoned anchor's thread to stop",
                 lambda: [t.name for t in threading.enumerate()])
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        signer.close()
        tpm.stop()


def test_a_start_error_that_is_not_the_tpms_is_not_called_one(tmp_path):
    """The self-test's envelope does not verify (a signer whose public key is not its signing key): the start
    fails naming the step and the envelope error, without the TPM's text and fix."""
    from attestation.signers import SoftwareSigner
    from sitsd.daemon import Daemon
    from sitsd.notify import Notifier
    from sitsd.startup import startup_error

    class Mismatched(SoftwareSigner):
        def public_key_pem(self) -> bytes:
            return SoftwareSigner().public_key_pem()  # another key

    daemon = Daemon(_config(tmp_path, "device:/dev/null", "attestation.mode=software"), signer=Mismatched(),
                    notifier=Notifier({}))
    assert asyncio.run(daemon.serve()) == 1
    error = str(daemon.startup_error)
    assert error.startswith("startup failed while the signer's self-test: "), error
    assert "TPM" not in error and "group tss" not in error, error
    # the TPM's own failures keep the TPM's text and fix
    from attestation.tpm.worker import TpmTimeout

    assert str(startup_error("x", TpmError("boom"), "t")).startswith("TPM failed while x (TCTI 't'): boom")
    assert str(startup_error("x", TpmTimeout("slow"), "t")).startswith("TPM hung while x (TCTI 't'): slow")
    assert str(startup_error("x", EnvelopeError("bad", "key"), "t")) == "startup failed while x: bad"


class _CountingEsapi:
    """tpm2_pytss.ESAPI, counting the contexts open at once (from the start of each open until close)."""

    def __init__(self, real):
        self.real, self.lock, self.open, self.max = real, threading.Lock(), 0, 0
        counter = self

        class Counted(real):
            def __init__(self, *args, **kwargs):
                with counter.lock:
                    counter.open += 1
                    counter.max = max(counter.max, counter.open)
                self._counted = True
                try:
                    super().__init__(*args, **kwargs)
                except BaseException:
                    self._uncount()
                    raise

            def _uncount(self):
                if self.__dict__.pop("_counted", False):
                    with counter.lock:
                        counter.open -= 1

            def close(self):
                self._uncount()
                super().close()

        self.cls = Counted


def test_tpm_direct_probe_never_opens_a_second_connection_beside_its_own(tmp_path, monkeypatch):
    """swtpm comes back without the signing key (its state gone: a cleared or replaced TPM): the probe tells that
    from a missing TPM through its own reconnect, with at most one TPM connection open at any time (a TPM without
    a resource manager may never answer a second one)."""
    import tpm2_pytss

    from attestation.session import TpmIdentityLost

    counting = _CountingEsapi(tpm2_pytss.ESAPI)
    tpm = Swtpm(tmp_path / "tpm").start()
    monkeypatch.setattr(tpm2_pytss, "ESAPI", counting.cls)
    signer = TpmSigner(tpm.tcti)
    try:
        assert signer.probe() is None and counting.open == 1
        tpm.stop_process()
        with pytest.raises(TpmError, match="does not answer"):  # gone: its context fails, it reconnects (in vain)
            signer.probe()
        for f in (tmp_path / "tpm").glob("tpm2-*"):
            f.unlink()  # the TPM's state: back empty, without the persistent signing key
        tpm = Swtpm(tmp_path / "tpm").start()
        seen = []
        deadline = time.monotonic() + 30
        while True:
            try:
                signer.probe()
                seen.append("ok")
            except TpmIdentityLost as exc:
                assert "has no key at 0x81000001" in str(exc), exc
                break
            except TpmError as exc:
                seen.append(str(exc))
            assert time.monotonic() < deadline, f"the probe never saw the missing key: {seen[-3:]}"
            time.sleep(0.3)  # also probes within the reconnect's rate limit (1 s)
        for _ in range(4):  # probed on: each time through its own (re)connection only
            time.sleep(0.6)
            try:
                signer.probe()
            except TpmError:
                pass
        assert counting.max == 1, f"{counting.max} TPM connections open at once (probe results: {seen[-3:]})"
        with pytest.raises(TpmError, match="not signed"):
            from attestation.envelope import Command

            now = time.time_ns()
            signer.sign_command(Command("t", (0.5,), 1, 1, now, now + 10**9, MODEL))
    finally:
        signer.close()
        tpm.stop()


def test_tpm_direct_remeasure_resets_pcr16_and_checks_the_replay(tmp_path):
    from tpm2_pytss import ESYS_TR, TPM2_ALG, TPML_DIGEST_VALUES, TPMT_HA, TPMU_HA

    from attestation.tpm.signer import replay

    tpm = Swtpm(tmp_path / "tpm").start()
    signer = TpmSigner(tpm.tcti)
    try:
        signer.measure_model(MODEL)
        signer.measure_model(MODEL)  # PCR 16 holds more than the model (an earlier run, a half-done attempt)
        signer.unbind("test: a reset seen")
        want = hashlib.sha256(b"\0" * 32 + MODEL).digest()
        assert replay([MODEL]) == want
        assert signer.remeasure([MODEL]) == want and signer.bound
        assert signer.remeasure([MODEL]) == want  # a retry measures from zero again, never on top
        # something else extends PCR 16 between the re-measurement's extend and its read: refused, still unbound
        signer.unbind("test: a reset seen")
        opened = signer._open_esapi

        class Meddling:
            def __init__(self, esapi):
                self.esapi = esapi

            def __getattr__(self, name):
                if name != "pcr_read":
                    return getattr(self.esapi, name)

                def pcr_read(*args):
                    other = TPML_DIGEST_VALUES([TPMT_HA(hashAlg=TPM2_ALG.SHA256, digest=TPMU_HA(sha256=b"\1" * 32))])
                    self.esapi.pcr_extend(ESYS_TR.PCR16, other)
                    return self.esapi.pcr_read(*args)
                return pcr_read

        signer._open_esapi = lambda: Meddling(opened())
        with pytest.raises(TpmError, match="not the replay"):
            signer.remeasure([MODEL])
        assert not signer.bound
        del signer._open_esapi
        assert signer.remeasure([MODEL]) == want and signer.bound
    finally:
        signer.close()
        tpm.stop()
