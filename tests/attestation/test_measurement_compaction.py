"""Measurement-log compaction (attestation/measurement.py, real swtpm): a log that reaches its threshold is archived,
PCR 23 is reset and what the log says runs is measured again from reset, so a session credential never outgrows what
it carries (256 entries, 32 KiB). The compacted log binds and verifies with the same pins; the archive replays and
its SHA-256 is the first event of the new log; a compaction that fails after the reset refuses measurements until a
retry succeeds, and never lets a bind carry a log that does not explain the PCR."""
import hashlib
import json
import os
import threading

import pytest

from attestation.errors import TpmError
from attestation.measurement import (COMPACTED_KIND, MeasurementError, measured_state, read_log, replay_file)
from attestation.session import MAX_LOG_EVENTS, SessionVerifier

from .test_session import MODEL
from .test_session_measured import CONFIG, POST, PRE, STARTUP, bound, started


def config_event(i: int) -> tuple[str, str, str]:
    return ("config", "rolling-mill.yaml", hashlib.sha256(f"config bytes {i}".encode()).hexdigest())


def entries(log) -> list[tuple[str, str, str]]:
    return [(e.kind, e.name, e.sha256) for e in log.events]


def test_a_log_at_its_threshold_is_compacted_and_still_binds_with_the_same_pins(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    log.compact_at = 10
    seen = []
    log.on_compacted = seen.append
    heard = []
    log.listeners.append(lambda e: heard.append(e.kind))
    try:
        for i in range(6):  # 4 at start + 6 = 10 events: due, but nothing is compacted until the next record
            log.record(*config_event(i))
        assert len(log.events) == 10 and log.compactions == 0 and log.compaction_due() is not None
        before_state = measured_state(entries(log))
        before_value = log.value
        log.record("module:pre", "pre_filter", PRE)  # the 11th: compacts first, then is measured
        assert log.compactions == 1 and len(seen) == 1 and "error" not in seen[0]
        (archive,) = tmp_path.glob("measurements-compacted-*.jsonl")
        assert seen[0]["archived"] == str(archive) and seen[0]["events_before"] == 10
        # the archive is the old log, byte for byte: it replays to the PCR value the old log had
        assert replay_file(archive) == before_value and len(read_log(archive)[1]) == 10
        # the new log: a link to the archive, then what ran (newest model, module per stage, config), then the event
        kinds = [k for k, _, _ in entries(log)]
        assert kinds == [COMPACTED_KIND, "model", "module:pre", "module:post", "config", "module:pre"], kinds
        assert entries(log)[0] == (COMPACTED_KIND, archive.name, hashlib.sha256(archive.read_bytes()).hexdigest())
        assert measured_state(entries(log)[:-1]) == before_state
        assert log.initial == bytes(32) and heard[-1] == "module:pre"
        # the file is the log in memory and the TPM holds its replay
        assert replay_file(log.path) == log.value == log.tpm.read()
        assert [e["kind"] for e in map(json.loads, log.path.read_text().splitlines()[1:])] == kinds
        # the credential carries the short log; the PLC's pins hold as before
        nonce, cred = bound(signer, log)
        assert len(cred.measurement_log) == 6 and cred.measurement_value == log.value
        session = SessionVerifier(signer.device_public_key_pem(), MODEL, expected_modules={"pre": PRE, "post": POST},
                                  expected_config_sha256=config_event(5)[2]).accept(cred.to_cbor(), nonce)
        assert session.measured.config == ("rolling-mill.yaml", config_event(5)[2])
        assert log.status()["compactions"] == 1 and log.status()["events"] == 6
    finally:
        signer.close()


def test_hundreds_of_measurements_never_outgrow_the_credential(swtpm, tmp_path):
    """Without compaction the 257th event makes the log unbindable (test_session_measured); with it, any number."""
    signer, log = started(swtpm, tmp_path)
    log.compact_at = 64
    try:
        for i in range(MAX_LOG_EVENTS + 40):
            log.record(*config_event(i))
        assert len(log.events) <= 64 and log.compactions >= (MAX_LOG_EVENTS + 40) // 64
        nonce, cred = bound(signer, log)
        SessionVerifier(signer.device_public_key_pem(), MODEL,
                        expected_config_sha256=config_event(MAX_LOG_EVENTS + 39)[2]).accept(cred.to_cbor(), nonce)
        archives = sorted(tmp_path.glob("measurements-compacted-*.jsonl"))
        assert len(archives) == log.compactions
        for older, newer in zip(archives, archives[1:]):  # each archive starts with the link to the one before
            first = read_log(newer)[1][0]
            assert (first.kind, first.name) == (COMPACTED_KIND, older.name)
            assert first.sha256 == hashlib.sha256(older.read_bytes()).hexdigest()
            replay_file(older)
    finally:
        signer.close()


def test_long_names_compact_by_size_before_the_event_count(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    log.compact_at, log.compact_bytes = 200, 4096
    try:
        for i in range(40):  # ~300 bytes each: 4 KiB after about 14 events
            log.record("config", f"{i:03d}-" + "c" * 240 + ".yaml", config_event(i)[2])
        assert log.compactions >= 2 and log.entry_bytes < 4096 + 400
        nonce, cred = bound(signer, log)
        assert len(cred.to_cbor()) < 8192
        SessionVerifier(signer.device_public_key_pem(), MODEL).accept(cred.to_cbor(), nonce)
    finally:
        signer.close()


def test_a_compaction_that_fails_after_the_reset_refuses_measurements_until_it_is_retried(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    log.compact_at = 8
    failures = []
    log.on_compacted = lambda info: failures.append(info) if info.get("error") else None
    try:
        for i in range(4):
            log.record(*config_event(i))
        good_value, good_events = log.value, list(log.events)
        real_extend = log.tpm.extend
        calls = {"n": 0}

        def flaky(digest):  # the TPM goes away in the middle of the re-measurement
            calls["n"] += 1
            if calls["n"] == 2:
                raise MeasurementError("TPM2_PCR_Extend of PCR 23 failed: the TPM does not answer")
            return real_extend(digest)

        log.tpm.extend = flaky
        with pytest.raises(MeasurementError, match="not measured: compacting .* failed in its reset and re-meas"):
            log.record(*config_event(99))
        assert log.damaged and log.value == good_value and log.events == good_events  # nothing was measured
        assert failures and failures[0]["damaged"] and log.compactions == 0
        assert not list(tmp_path.glob("measurements-compacted-*.jsonl"))  # the old file stays until it succeeds
        # a bind now refuses: the PCR is not what the log says (never a credential for a log it does not explain)
        with pytest.raises(TpmError):
            signer.bind(os.urandom(32), log)
        # the TPM answers again: the next measurement compacts from reset and goes ahead
        log.tpm.extend = real_extend
        log.record(*config_event(100))
        assert log.damaged is None and log.compactions == 1 and log.compaction_error is None
        assert entries(log)[-2:] == [config_event(3), config_event(100)]  # the state before, then the new event
        assert replay_file(log.path) == log.value == log.tpm.read()
        nonce, cred = bound(signer, log)
        SessionVerifier(signer.device_public_key_pem(), MODEL, expected_config_sha256=config_event(100)[2]).accept(
            cred.to_cbor(), nonce)
    finally:
        signer.close()


def test_explicit_compaction_and_binds_racing_compacting_measurements(swtpm, tmp_path):
    """A bind holds the log still: measurements that compact meanwhile never yield a credential whose log and quoted
    PCR disagree."""
    signer, log = started(swtpm, tmp_path)
    log.compact_at = 8
    info = log.compact("by hand")
    assert info["events_before"] == len(STARTUP) and len(log.events) == 5  # the link, model, pre, post, config
    stop = threading.Event()
    errors = []

    def measure():
        i = 0
        try:
            while not stop.is_set():
                log.record(*config_event(i))
                i += 1
        except BaseException as exc:  # re-raised below: a failing measurement must fail the test
            errors.append(exc)

    t = threading.Thread(target=measure)
    t.start()
    try:
        ak = signer.device_public_key_pem()
        for _ in range(15):
            nonce, cred = bound(signer, log)
            SessionVerifier(ak, MODEL, expected_modules={"pre": PRE, "post": POST}).accept(cred.to_cbor(), nonce)
    finally:
        stop.set()
        t.join()
        signer.close()
    if errors:
        raise errors[0]
    assert log.compactions > 2
    assert replay_file(log.path) == log.value


def test_compaction_is_off_unless_set_and_keeps_a_software_log_consistent(tmp_path):
    from attestation.measurement import MeasurementLog

    log = MeasurementLog(tmp_path / "m.jsonl")
    for e in STARTUP:
        log.record(*e)
    for i in range(50):
        log.record(*config_event(i))
    assert log.compactions == 0 and log.compaction_due() is None and len(log.events) == 54
    log.compact_at = 20
    log.record(*config_event(50))
    assert log.compactions == 1 and replay_file(log.path) == log.value
    assert measured_state(entries(log)).config == ("rolling-mill.yaml", config_event(50)[2])
    assert measured_state(entries(log)).model == ("rolling_mill.onnx", MODEL.hex())
    assert CONFIG not in {e.sha256 for e in log.events}  # the startup config was superseded
