"""A long-running sitsd (tpm-session, real swtpm, real PLC simulator) whose measurement log would outgrow a session
credential (256 entries) compacts it: PCR 23 reset, what runs measured again from reset, the old log archived as
measurements-compacted-<ns>.jsonl. The PLC keeps getting credentials that verify with the same pins, commands keep
flowing, and `sitsctl status` (human and --json) and the metrics show the re-binds and the log's length.

The threshold is lowered for the test through SITSD_MEASUREMENT_COMPACT_AT (sitsd/plc_link.py)."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from attestation.measurement import COMPACTED_KIND, MeasurementError, read_log, replay_file
from attestation.session import MAX_LOG_EVENTS, SessionVerifier
from attestation.tpm import Swtpm
from sitsd.control import request
from sitsd.errors import StartupError
from sitsd.plc_link import COMPACT_AT_ENV, PlcLink, compact_at_events

from ..conftest import REPO, example_config_data, sim_stats, sitsd_args, wait_for, wait_ready
from .test_session_rebind import MODEL, plc_credential, verified

COMPACT_AT = 10


def _metric(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


def test_a_daemon_with_many_reloads_compacts_its_log_and_keeps_the_plc_session(plcsim, tmp_path):
    tpm = Swtpm(tmp_path / "tpm").start()
    audit, control, log = tmp_path / "audit", tmp_path / "c.sock", tmp_path / "sitsd.log"
    config = tmp_path / "rolling-mill.yaml"
    data = example_config_data()
    base = data["timing"]["max_consecutive_drops"]
    config.write_text(yaml.safe_dump(data))
    endpoint, udp_url, sim = plcsim(audit / "device.pub.pem", model_sha256=MODEL.hex(), session=True)
    proc = subprocess.Popen(sitsd_args(config, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=tpm.tcti, plc__security="none", plc__timeout_s=2,
                                       audit__directory=audit, control__socket=control),
                            stderr=open(log, "wb"), cwd=REPO,
                            env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path), **{COMPACT_AT_ENV: str(COMPACT_AT)}))

    def status() -> dict:
        return request(control, "status")

    try:
        wait_ready(proc, log)
        wait_for(lambda s: s["counters"]["commands"] > 20, 20, "commands flowing", status)
        ak = (audit / "device.pub.pem").read_bytes()
        first = verified(plc_credential(endpoint), ak).measured
        pins = {"pre": first.modules["pre"][1], "post": first.modules["post"][1]}
        s = status()
        assert s["measurement_log"]["events"] == 4 and s["measurement_log"]["compact_at"] == COMPACT_AT
        assert s["plc_link"]["rebinds"] == 0 and s["plc_link"]["compactions"] == 0

        reloads = 3 * COMPACT_AT  # far past the threshold, with the config's bytes alternating
        for i in range(reloads):
            data["timing"]["max_consecutive_drops"] = base + 1 + i % 2
            config.write_text(yaml.safe_dump(data))
            out = request(control, "reload", timeout_s=120)
            assert out["reloaded"] and out["measured"]["sha256"] == hashlib.sha256(config.read_bytes()).hexdigest()
        newest = hashlib.sha256(config.read_bytes()).hexdigest()

        s = wait_for(lambda s: s["plc_link"]["compactions"] >= 2 and s["measurement_log"]["compactions"] >= 2, 20,
                     "compactions", status)
        mlog = s["measurement_log"]
        assert mlog["events"] <= COMPACT_AT and mlog["compaction_error"] is None and not mlog["damaged"]
        assert s["plc_link"]["rebind_failures"] == 0 and s["plc_link"]["losses"] == 0, s["plc_link"]

        # the PLC's credential: the compacted log, replayed to the quoted PCR 23, with the same pins as at start
        deadline = time.monotonic() + 20
        while True:
            cred = plc_credential(endpoint)
            session = verified(cred, ak, expected_modules=pins)
            if session.measured.config[1] == newest:
                break
            assert time.monotonic() < deadline, session.measured
            time.sleep(0.1)
        verified(cred, ak, expected_modules=pins, expected_config_sha256=newest)
        kinds = [k for k, _, _ in cred.measured_entries()]
        assert kinds[0] == COMPACTED_KIND and len(kinds) <= COMPACT_AT, kinds

        # the history is kept: one archive per compaction, each replays, each new log names the one before
        archives = sorted(audit.glob("measurements-compacted-*.jsonl"))
        assert len(archives) == mlog["compactions"] >= 2
        assert sum(len(read_log(a)[1]) for a in archives) > reloads  # every event is in some archive
        for a in archives:
            replay_file(a)
        header, events = read_log(audit / "measurements.jsonl")
        assert replay_file(audit / "measurements.jsonl").hex() == events[-1].pcr_after == mlog["value"]
        assert (events[0].kind, events[0].name) == (COMPACTED_KIND, archives[-1].name)
        assert events[0].sha256 == hashlib.sha256(archives[-1].read_bytes()).hexdigest()
        assert "measurement log compacted" in log.read_text()

        # re-binds counted (a burst of measurements may be bound once), none failed; commands flow on
        s = wait_for(lambda s: s["plc_link"]["rebinds"] >= 1, 10, "re-binds counted", status)
        # every credential the PLC accepted is the start's or a re-bind the daemon counted (re-binds still in flight
        # when one side is read land on the other a moment later: compare once both agree)
        deadline = time.monotonic() + 20
        while True:
            stats, s = sim_stats(sim), status()
            if stats["sessions_accepted"] == 1 + s["plc_link"]["rebinds"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stats["rejected"] == 0 and stats["sessions_rejected"] == 0, stats
        assert stats["sessions_accepted"] == 1 + s["plc_link"]["rebinds"], (stats, s["plc_link"])
        accepted = stats["accepted"]
        wait_for(lambda st: st["accepted"] > accepted + 20, 20, "commands after the compactions",
                 lambda: sim_stats(sim))

        # sitsctl status, human and --json; the metrics
        human = subprocess.run([sys.executable, "-m", "sitsd.cli", "status", "--socket", str(control)],
                               capture_output=True, text=True, cwd=REPO, timeout=60)
        assert human.returncode == 0, human.stderr
        line = next(ln for ln in human.stdout.splitlines() if "session re-binds" in ln)
        assert f"failed 0); measurement log {mlog['events']} events (PCR 23)" in line
        assert f"compacted {s['plc_link']['compactions']}x at {COMPACT_AT}" in line
        js = subprocess.run([sys.executable, "-m", "sitsd.cli", "status", "--socket", str(control), "--json"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
        answer = json.loads(js.stdout)
        assert answer["plc_link"]["rebinds"] >= s["plc_link"]["rebinds"] >= 1
        assert answer["measurement_log"]["compactions"] == mlog["compactions"]
        text = urllib.request.urlopen(answer["metrics_url"], timeout=5).read().decode()  # the example enables them
        assert _metric(text, "sitsd_session_rebinds_total") >= s["plc_link"]["rebinds"]
        assert _metric(text, "sitsd_session_rebind_failures_total") == 0
        assert _metric(text, "sitsd_measurement_compactions_total") >= 2
        assert _metric(text, "sitsd_measurement_log_events") <= COMPACT_AT
        assert _metric(text, "sitsd_measurement_log_damaged") == 0
        assert _metric(text, "sitsd_measurement_compaction_failures_total") == 0

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
        # the archive chain a real daemon wrote checks out: every compaction linked, state carried over
        verify = subprocess.run([sys.executable, "-m", "sitsd.cli", "measurements", "verify", str(audit), "--json"],
                                capture_output=True, text=True, cwd=REPO, timeout=60)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        report = json.loads(verify.stdout.strip().splitlines()[-1])
        assert report["ok"] is True, report
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tpm.stop()


# --- the PLC link's bind-time compaction, in process -------------------------------------------------------------

class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def __getattr__(self, level):
        return lambda msg, **kw: self.lines.append((level, msg, kw))


def _link(signer, log) -> tuple[PlcLink, _Log]:
    journal = _Log()
    link = PlcLink(None, signer=signer, source=None, on_plc_event=None, device_key_file=None, model_sha256=MODEL,
                   log=journal, measurements=lambda: log)
    return link, journal


def test_the_link_compacts_a_due_log_before_binding_and_says_why_it_cannot(swtpm, tmp_path):
    from .test_measurement_compaction import config_event
    from .test_session import MODEL as MEASURED  # the model `started` measures
    from .test_session_measured import started

    signer, log = started(swtpm, tmp_path)
    link, journal = _link(signer, log)
    try:
        link.watch_measurements()  # what connect() does: the link's log is compacted from now on
        assert log.compact_at == compact_at_events() and log.compact_bytes is not None
        for i in range(log.compact_at - len(log.events)):
            log.record(*config_event(i))
        assert log.compaction_due() and link.compactions == 0
        asyncio.run(link._compact_before_bind(log))  # a reconnect finds the log due: compacted before the bind
        assert link.compactions == 1 and log.compaction_due() is None
        assert any(msg.startswith("measurement log compacted") and kw["events_before"] == compact_at_events()
                   for _, msg, kw in journal.lines), journal.lines
        nonce = os.urandom(32)
        SessionVerifier(signer.device_public_key_pem(), MEASURED).accept(signer.bind(nonce, log).to_cbor(), nonce)

        # the TPM fails in the middle of a compaction: the log is damaged, and a bind says why it cannot be made
        real_extend = log.tpm.extend

        def broken(_digest):
            raise MeasurementError("TPM2_PCR_Extend of PCR 23 failed: no answer")

        log.tpm.extend = broken
        with pytest.raises(MeasurementError):
            log.compact("test")
        assert log.damaged and link.compaction_failures == 1
        assert any(level == "error" and msg == "measurement log compaction failed" for level, msg, _ in journal.lines)
        with pytest.raises(StartupError, match="cannot be bound: it does not explain PCR 23 .* re-measuring the PCR "
                                               "failed") as info:
            asyncio.run(link._compact_before_bind(log))
        assert f"at most {MAX_LOG_EVENTS}" not in str(info.value)  # a short damaged log: not a length problem
        log.tpm.extend = real_extend  # the TPM is back: the next bind's compaction repairs the log
        asyncio.run(link._compact_before_bind(log))
        assert log.damaged is None and link.compactions == 2
        nonce = os.urandom(32)
        SessionVerifier(signer.device_public_key_pem(), MEASURED).accept(signer.bind(nonce, log).to_cbor(), nonce)
    finally:
        signer.close()


def test_the_compaction_threshold_knob_is_bounded(monkeypatch):
    from attestation.measurement import COMPACT_AT_EVENTS, MIN_COMPACT_AT

    for raw, expected in (("", COMPACT_AT_EVENTS), ("16", 16), (str(MIN_COMPACT_AT - 1), COMPACT_AT_EVENTS),
                          ("300", COMPACT_AT_EVENTS), ("ten", COMPACT_AT_EVENTS), ("-5", COMPACT_AT_EVENTS)):
        monkeypatch.setenv(COMPACT_AT_ENV, raw)
        assert compact_at_events() == expected, raw
    assert MIN_COMPACT_AT <= COMPACT_AT_EVENTS <= MAX_LOG_EVENTS // 2
