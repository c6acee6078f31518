"""Measurements that fail half-way (attestation/measurement.py, real swtpm): an extension of unknown outcome marks the
log damaged and the next record or bind repairs it by compaction (never "restart sitsd" forever); a file append that
fails measures nothing (the PCR is not extended); an entry a session credential could not carry is refused before
anything is measured."""
import hashlib
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.errors import TpmError
from attestation.measurement import MeasurementError, MeasurementLog, read_log, replay, replay_file
from attestation.session import SessionVerifier

from .test_session import MODEL
from .test_session_measured import CONFIG, PRE, POST, bound, started


def config_event(i: int) -> tuple[str, str, str]:
    return ("config", "rolling-mill.yaml", hashlib.sha256(f"config {i}".encode()).hexdigest())


def accepts(signer, log, config_sha256: str) -> None:
    nonce, cred = bound(signer, log)
    SessionVerifier(signer.device_public_key_pem(), MODEL, expected_modules={"pre": PRE, "post": POST},
                    expected_config_sha256=config_sha256).accept(cred.to_cbor(), nonce)


def test_an_extension_that_times_out_after_the_tpm_extended_is_repaired_at_the_next_record(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    try:
        good_value, good_events = log.value, list(log.events)
        real_extend = log.tpm.extend

        def extends_then_times_out(digest):  # the TPM extended, the answer never came back
            real_extend(digest)
            raise TpmError("TPM2_PCR_Extend: no answer within 5 s")

        log.tpm.extend = extends_then_times_out
        with pytest.raises(MeasurementError, match="not measured"):
            log.record(*config_event(1))  # the reload it measured is refused
        log.tpm.extend = real_extend
        assert log.damaged and "config/rolling-mill.yaml" in log.damaged
        assert log.value == good_value and log.events == good_events  # the refused config is not in the log
        assert log.compaction_due() is not None  # damaged: due even though compaction is off (compact_at None)
        with pytest.raises(TpmError, match="damaged"):  # the PCR holds the event: no credential for this log
            signer.bind(os.urandom(32), log)
        # the next record compacts (resets PCR 23, re-measures what runs) and is measured
        log.record(*config_event(2))
        assert log.damaged is None and log.compactions == 1
        assert log.value == log.tpm.read() == replay_file(log.path)
        assert [e.sha256 for e in log.events if e.kind == "config"] == [CONFIG, config_event(2)[2]]
        # the archive is the log as it was in memory (the file held the unmeasured event as well)
        assert log.last_compaction["archive_from"] == "memory"
        (archive,) = tmp_path.glob("measurements-compacted-*.jsonl")
        header, events = read_log(archive)
        assert replay(events, bytes.fromhex(header["initial"])) == good_value and len(events) == len(good_events)
        accepts(signer, log, config_event(2)[2])
    finally:
        signer.close()


def test_an_extension_that_fails_is_repaired_at_the_next_bind(swtpm, tmp_path):
    """The PLC link compacts a damaged log before it binds (compaction_due); the bind then succeeds."""
    signer, log = started(swtpm, tmp_path)
    try:
        real_extend = log.tpm.extend

        def fails(_digest):
            raise MeasurementError("TPM2_PCR_Extend of PCR 23 failed: the TPM does not answer")

        log.tpm.extend = fails
        with pytest.raises(MeasurementError, match="not measured"):
            log.record(*config_event(1))
        log.tpm.extend = real_extend
        assert log.damaged and log.compaction_due()
        log.compact(log.compaction_due())  # what sitsd's PLC link does before a bind
        assert log.damaged is None and log.value == log.tpm.read()
        accepts(signer, log, CONFIG)
    finally:
        signer.close()


def test_a_pcr_that_does_not_follow_the_log_is_reset_and_remeasured(swtpm, tmp_path):
    from tpm2_pytss import ESAPI

    from attestation.tpm.quote import extend_pcr

    signer, log = started(swtpm, tmp_path)
    try:
        with signer._lock:  # an extension the log does not know of (another writer, or a lost one)
            intruder = ESAPI(swtpm.tcti)
            try:
                extend_pcr(intruder, 23, hashlib.sha256(b"unlogged").digest())
            finally:
                intruder.close()
        with pytest.raises(MeasurementError, match="another writer"):
            log.record(*config_event(1))
        assert log.damaged
        log.record(*config_event(2))  # repaired: not "restart sitsd" for every later record
        assert log.damaged is None and log.value == log.tpm.read() == replay_file(log.path)
        accepts(signer, log, config_event(2)[2])
    finally:
        signer.close()


def _failing_append(target: Path, torn: int):
    """A Path.open stand-in: an append to `target` writes `torn` characters of the line, then fails as a full disk."""
    real_open = Path.open

    def fake_open(self, mode="r", *args, **kwargs):
        fh = real_open(self, mode, *args, **kwargs)
        if self != target or mode != "a":
            return fh

        class Torn:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                fh.close()
                return False

            def write(self, text):
                fh.write(text[:torn])
                fh.flush()
                raise OSError(28, "No space left on device")

            def flush(self):
                fh.flush()

        return Torn()

    return fake_open


@pytest.mark.parametrize("torn", [0, 40])
def test_a_failed_append_measures_nothing(swtpm, tmp_path, monkeypatch, torn):
    signer, log = started(swtpm, tmp_path)
    try:
        good_value, good_events = log.value, list(log.events)
        monkeypatch.setattr(Path, "open", _failing_append(log.path, torn))
        with pytest.raises(OSError):
            log.record(*config_event(1))  # the swap or reload it measured is refused ...
        monkeypatch.undo()
        # ... and nothing claims it: not the PCR, not the log in memory
        assert log.tpm.read() == good_value == log.value and log.events == good_events and log.damaged is None
        accepts(signer, log, CONFIG)
        log.record(*config_event(2))  # a torn line is not left in the file: it is rewritten from memory first
        assert replay_file(log.path) == log.value == log.tpm.read()
        assert [json.loads(line)["sha256"] for line in log.path.read_text().splitlines()[1:]][-1] == \
            config_event(2)[2]
        accepts(signer, log, config_event(2)[2])
    finally:
        signer.close()


@pytest.mark.parametrize("kind, name", [
    ("k" * 65, "x"), ("", "x"), ("config", "n" * 256), ("config", "é" * 128), ("config", "a\0b"), ("con\0fig", "x"),
    ("config", "\udc80"), ("config", 7),
])
def test_an_entry_a_credential_cannot_carry_is_refused_with_nothing_measured(swtpm, tmp_path, kind, name):
    signer, log = started(swtpm, tmp_path)
    try:
        good_value, good_events, good_file = log.value, list(log.events), log.path.read_bytes()
        with pytest.raises(MeasurementError):
            log.record(kind, name, CONFIG)
        assert log.tpm.read() == good_value == log.value and log.events == good_events
        assert log.path.read_bytes() == good_file and log.damaged is None
        accepts(signer, log, CONFIG)
        log.record("k" * 64, "n" * 255, CONFIG)  # the limits themselves are carried
        nonce, cred = bound(signer, log)
        SessionVerifier(signer.device_public_key_pem(), MODEL).accept(cred.to_cbor(), nonce)
    finally:
        signer.close()


def test_a_software_log_refuses_the_same_entries(tmp_path):
    log = MeasurementLog(tmp_path / "m.jsonl")
    with pytest.raises(MeasurementError, match="1..64"):
        log.record("k" * 65, "x", CONFIG)
    assert log.events == [] and log.value == bytes(32)


def test_hex_pins_with_spaces_are_refused():
    ak = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    spaced = "ab " * 20 + "abcd"  # 64 characters, but 22 bytes once decoded
    assert len(spaced) == 64
    with pytest.raises(ValueError, match="SHA-256"):
        SessionVerifier(ak, MODEL, expected_config_sha256=spaced)
    with pytest.raises(ValueError, match="SHA-256"):
        SessionVerifier(ak, MODEL, expected_modules={"pre": spaced})
    assert SessionVerifier(ak, MODEL, expected_config_sha256=CONFIG.upper()).expected_config_sha256 == CONFIG
