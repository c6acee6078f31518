"""The measurement log: events extended into a PCR (swtpm, and in software), replayed from the file."""
import hashlib
import json

import pytest

from attestation.measurement import (MeasurementError, MeasurementLog, TpmPcr, event_digest, read_log, replay,
                                     replay_file)

EVENTS = [("model", "rolling_mill.onnx", hashlib.sha256(b"model").hexdigest()),
          ("module:pre", "pre_filter", hashlib.sha256(b"pre v1").hexdigest()),
          ("module:pre", "pre_filter", hashlib.sha256(b"pre v2").hexdigest()),
          ("rollback:module:pre", "pre_filter", hashlib.sha256(b"pre v1").hexdigest())]


def by_hand(events, initial=bytes(32)):
    """TPM2_PCR_Extend semantics written out: PCR = SHA-256(PCR || SHA-256(label 0 kind 0 name 0 hash))."""
    value = initial
    for kind, name, sha in events:
        digest = hashlib.sha256(b"sits-measurement-v1\0" + kind.encode() + b"\0" + name.encode() + b"\0"
                                + bytes.fromhex(sha)).digest()
        value = hashlib.sha256(value + digest).digest()
    return value


def test_software_log_replays_and_order_matters(tmp_path):
    log = MeasurementLog(tmp_path / "m.jsonl")
    for e in EVENTS:
        log.record(*e)
    assert log.value == by_hand(EVENTS)
    assert replay_file(tmp_path / "m.jsonl") == log.value
    header, events = read_log(tmp_path / "m.jsonl")
    assert header["mode"] == "software" and [e.kind for e in events] == [k for k, _, _ in EVENTS]
    assert by_hand([EVENTS[1], EVENTS[0], *EVENTS[2:]]) != log.value


def test_edited_or_truncated_log_does_not_replay(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MeasurementLog(path)
    for e in EVENTS:
        log.record(*e)
    lines = path.read_text().splitlines()
    edited = json.loads(lines[2])
    edited["sha256"] = hashlib.sha256(b"something else").hexdigest()
    path.write_text("\n".join([lines[0], lines[1], json.dumps(edited), *lines[3:]]) + "\n")
    with pytest.raises(MeasurementError, match="event 1 .*digest does not match"):
        replay_file(path)
    path.write_text("\n".join([lines[0], lines[1], *lines[3:]]) + "\n")  # one event dropped
    with pytest.raises(MeasurementError, match="does not follow"):
        replay_file(path)
    with pytest.raises(MeasurementError, match="not a hex SHA-256"):
        event_digest("model", "m", "xyz")


def test_tpm_pcr_matches_the_replayed_log(swtpm, tmp_path):
    from tpm2_pytss import ESAPI, ESYS_TR

    esapi = ESAPI(swtpm.tcti)
    try:
        pcr = TpmPcr(esapi, 23)
        esapi.pcr_reset(ESYS_TR.PCR23)
        log = MeasurementLog(tmp_path / "m.jsonl", 23, pcr)
        for e in EVENTS:
            log.record(*e)
        in_tpm = pcr.read()
        assert in_tpm == log.value == by_hand(EVENTS) == replay_file(tmp_path / "m.jsonl")
        header, events = read_log(tmp_path / "m.jsonl")
        assert header["mode"] == "tpm2" and header["pcr"] == 23
        # a log started on a PCR that already holds a value replays from that value
        log2 = MeasurementLog(tmp_path / "m2.jsonl", 23, pcr)
        log2.record(*EVENTS[0])
        assert pcr.read() == replay(read_log(tmp_path / "m2.jsonl")[1], in_tpm)
        # another writer extending the same PCR is detected at the next record
        from attestation.tpm.quote import extend_pcr

        extend_pcr(esapi, 23, bytes(32))
        with pytest.raises(MeasurementError, match="another writer"):
            log2.record(*EVENTS[1])
    finally:
        esapi.close()
