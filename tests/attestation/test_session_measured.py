"""Session credentials that prove modules and config (version 2): one TPM2_Quote over the session PCR (16) and the
measurement PCR (23), the PCR 23 log in the credential, replayed by the PLC's SessionVerifier; real swtpm."""
import dataclasses
import hashlib
import os
import threading

import cbor2
import pytest

from attestation.errors import TpmError
from attestation.measurement import MeasurementLog, TpmPcr, measured_state, replay_entries
from attestation.session import (CREDENTIAL_VERSION, CREDENTIAL_VERSION_MEASURED, MAX_LOG_EVENTS, CredentialError,
                                 SessionCredential, SessionVerifier, TpmSessionSigner)

from .test_session import MODEL, command, every_truncation_and_changed_byte_is_refused, rejected

PRE = hashlib.sha256(b"pre_filter v1").hexdigest()
POST = hashlib.sha256(b"post_command v1").hexdigest()
CONFIG = hashlib.sha256(b"rolling-mill.yaml bytes").hexdigest()
STARTUP = [("model", "rolling_mill.onnx", MODEL.hex()), ("module:pre", "pre_filter", PRE),
           ("module:post", "post_command", POST), ("config", "rolling-mill.yaml", CONFIG)]


def started(swtpm, tmp_path, events=STARTUP) -> tuple[TpmSessionSigner, MeasurementLog]:
    """A session signer and a PCR 23 measurement log on its TPM context, as sitsd sets them up at start."""
    signer = TpmSessionSigner(swtpm.tcti)
    signer.measure_model(MODEL)
    tpm = TpmPcr(signer._open_esapi, 23, signer._lock)
    tpm.reset()
    log = MeasurementLog(tmp_path / "measurements.jsonl", 23, tpm)
    for e in events:
        log.record(*e)
    return signer, log


def bound(signer, log) -> tuple[bytes, SessionCredential]:
    nonce = os.urandom(32)
    return nonce, signer.bind(nonce, log)


def test_the_credential_proves_modules_and_config(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    try:
        nonce, cred = bound(signer, log)
        assert cred.version == CREDENTIAL_VERSION_MEASURED and cred.measurement_pcr == 23
        assert sorted(cred.quote.pcrs) == [16, 23] and cred.measurement_value == log.value
        assert cred.measured_entries() == tuple(STARTUP)
        data = cred.to_cbor()
        assert data[:3] == b"\xac\x01\x02"  # a map of 12 keys (1..9, 13..15), version 2
        assert SessionCredential.from_cbor(data) == cred
        session = SessionVerifier(signer.device_public_key_pem(), MODEL, expected_modules={"pre": PRE, "post": POST},
                                  expected_config_sha256=bytes.fromhex(CONFIG)).accept(data, nonce)
        assert session.measured.model == ("rolling_mill.onnx", MODEL.hex())
        assert session.measured.modules == {"pre": ("pre_filter", PRE), "post": ("post_command", POST)}
        assert session.measured.config == ("rolling-mill.yaml", CONFIG)
        assert session.measurement_log == tuple(STARTUP)
        assert session.verify(signer.sign_command(command(1))).command.sequence == 1
    finally:
        signer.close()


def test_a_tampered_or_stripped_measurement_log_is_refused(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    try:
        nonce, cred = bound(signer, log)
    finally:
        signer.close()  # nothing below needs the TPM: the credential is what an attacker on the wire holds
    verifier = SessionVerifier(cred.ak_public_pem, MODEL)
    entries = list(cred.measurement_log)
    other_post = ("module:post", "post_command", hashlib.sha256(b"post_command, patched").digest())

    def refused(**changes) -> CredentialError:
        return rejected(verifier, dataclasses.replace(cred, **changes).to_cbor(), nonce)

    # the log says another module ran: it no longer replays to the quoted PCR 23
    error = refused(measurement_log=[*entries[:2], other_post, entries[3]])
    assert error.code == "measurement" and "PCR 23" in error.reason and "4 measurement events" in error.reason
    assert refused(measurement_log=entries[:3]).code == "measurement"  # an event left out (the config)
    assert refused(measurement_log=[entries[0], entries[2], entries[1], entries[3]]).code == "measurement"
    # the log's value rewritten to match the edited log: the quote's pcrDigest gives it away
    edited = [*entries[:2], other_post, entries[3]]
    forged_value = replay_entries([(k, n, s.hex()) for k, n, s in edited])
    forged = dataclasses.replace(cred, measurement_log=edited,
                                 measurement_value=forged_value,
                                 quote=dataclasses.replace(cred.quote, pcrs={16: cred.pcr_value, 23: forged_value}))
    assert rejected(verifier, forged.to_cbor(), nonce).code == "pcr-digest"
    # stripped down to a version 1 credential (PCR 16 only): the quote still selects PCR 23
    stripped = dataclasses.replace(cred, measurement_pcr=None, measurement_value=None, measurement_log=(),
                                   quote=dataclasses.replace(cred.quote, pcrs={16: cred.pcr_value}))
    assert stripped.version == CREDENTIAL_VERSION
    assert rejected(verifier, stripped.to_cbor(), nonce).code == "pcr-selection"
    # another measurement PCR than the verifier's
    assert rejected(SessionVerifier(cred.ak_public_pem, MODEL, measurement_pcr=22), cred.to_cbor(), nonce).code == \
        "pcr"
    verifier.accept(cred.to_cbor(), nonce)  # the genuine credential, for its own nonce


def test_pinned_config_or_modules_that_differ_are_refused_naming_the_measurement(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    try:
        nonce, cred = bound(signer, log)
        data = cred.to_cbor()
        ak = signer.device_public_key_pem()
        other = hashlib.sha256(b"another config").hexdigest()
        error = rejected(SessionVerifier(ak, MODEL, expected_config_sha256=other), data, nonce)
        assert error.code == "config" and "rolling-mill.yaml" in error.reason and CONFIG[:16] in error.reason
        assert other[:16] in error.reason
        error = rejected(SessionVerifier(ak, MODEL, expected_modules={"pre": PRE, "post": other}), data, nonce)
        assert error.code == "module" and "module:post post_command" in error.reason
        error = rejected(SessionVerifier(ak, MODEL, expected_modules={"pre": PRE}), data, nonce)  # post not pinned
        assert error.code == "module" and "no module is pinned at stage post" in error.reason
        error = rejected(SessionVerifier(ak, MODEL, expected_modules={"pre": PRE, "post": POST, "extra": PRE}), data,
                         nonce)
        assert error.code == "module" and "no module runs at stage extra" in error.reason
        with pytest.raises(ValueError):
            SessionVerifier(ak, MODEL, expected_config_sha256="not a digest")
        # a model swap measured into PCR 23 (a hot swap never extends PCR 16, which still names the start model only):
        # the credential says another model runs than the PLC expects ...
        model2 = hashlib.sha256(b"model v2").digest()
        log.record("model", "rolling_mill_v2.onnx", model2.hex())
        nonce2, cred2 = bound(signer, log)
        assert cred2.measurements == (MODEL,)
        error = rejected(SessionVerifier(ak, MODEL), cred2.to_cbor(), nonce2)
        assert error.code == "model" and "rolling_mill_v2.onnx" in error.reason
        # ... and a PLC that expects the swapped-in model accepts it (PCR 23's newest model, not PCR 16, decides)
        session = SessionVerifier(ak, model2, expected_config_sha256=CONFIG).accept(cred2.to_cbor(), nonce2)
        assert session.measured.model == ("rolling_mill_v2.onnx", model2.hex())
        # ... and rolled back: accepted again, the log naming both
        log.record("rollback:model", "rolling_mill.onnx", MODEL.hex())
        nonce3, cred3 = bound(signer, log)
        session = SessionVerifier(ak, MODEL, expected_config_sha256=CONFIG).accept(cred3.to_cbor(), nonce3)
        assert session.measured.model == ("rolling_mill.onnx", MODEL.hex()) and len(session.measurement_log) == 6
    finally:
        signer.close()


def test_a_credential_without_the_measurement_log_is_accepted_only_without_pins(swtpm, tmp_path):
    """An older sitsd (or measurement off) sends version 1: PCR 16 only. Accepted as before unless the verifier pins
    modules or config or requires measurements, then refused as `unmeasured` (not silently unpinned)."""
    signer, log = started(swtpm, tmp_path)
    try:
        nonce = os.urandom(32)
        cred = signer.bind(nonce)  # no log: what an older daemon sent
        assert cred.version == CREDENTIAL_VERSION and sorted(cred.quote.pcrs) == [16]
        data = cred.to_cbor()
        assert data[:3] == b"\xa9\x01\x01"
        ak = signer.device_public_key_pem()
        for pins in ({"expected_config_sha256": CONFIG}, {"expected_modules": {"pre": PRE, "post": POST}},
                     {"require_measurements": True}):
            error = rejected(SessionVerifier(ak, MODEL, **pins), data, nonce)
            assert error.code == "unmeasured" and "version 1" in error.reason
        session = SessionVerifier(ak, MODEL).accept(data, nonce)
        assert session.measured is None and session.measurement_log == ()
        # a software measurement log (no TPM) cannot be quoted: version 1 as well
        nonce = os.urandom(32)
        assert signer.bind(nonce, MeasurementLog(None, 23)).version == CREDENTIAL_VERSION
        with pytest.raises(ValueError, match="session PCR"):
            signer.bind(os.urandom(32), MeasurementLog(None, 16, TpmPcr(signer._open_esapi, 16, signer._lock)))
    finally:
        signer.close()


def test_bind_refuses_a_measurement_pcr_its_log_does_not_explain(swtpm, tmp_path):
    from tpm2_pytss import ESAPI

    from attestation.tpm.quote import extend_pcr

    signer, log = started(swtpm, tmp_path)
    try:
        with signer._lock:
            intruder = ESAPI(swtpm.tcti)  # another client of the same TPM extends PCR 23 behind the log's back
            try:
                extend_pcr(intruder, 23, hashlib.sha256(b"unlogged").digest())
            finally:
                intruder.close()
        with pytest.raises(TpmError, match="another writer"):
            signer.bind(os.urandom(32), log)
    finally:
        signer.close()


def test_bind_holds_the_log_still_and_listeners_see_each_event(swtpm, tmp_path):
    """A measurement racing a bind never yields a credential whose log and quoted PCR disagree; each recorded event
    reaches the listeners (the daemon's PLC link re-binds from there)."""
    signer, log = started(swtpm, tmp_path)
    seen = []
    log.listeners.append(lambda e: seen.append((e.kind, e.name)))
    log.listeners.append(lambda e: 1 / 0)  # a failing listener fails nothing
    stop = threading.Event()
    errors = []

    def measure():
        i = 0
        try:
            while not stop.is_set():
                log.record("config", f"c{i}.yaml", hashlib.sha256(str(i).encode()).hexdigest())
                i += 1
        except BaseException as exc:  # re-raised below: a failing measurement must fail the test
            errors.append(exc)

    t = threading.Thread(target=measure)
    t.start()
    try:
        ak = signer.device_public_key_pem()
        for _ in range(15):
            nonce, cred = bound(signer, log)
            SessionVerifier(ak, MODEL).accept(cred.to_cbor(), nonce)  # replays: never a torn snapshot
    finally:
        stop.set()
        t.join()
        signer.close()
    if errors:
        raise errors[0]
    assert len(seen) == len(log.events) - len(STARTUP) > 0 and seen[0] == ("config", "c0.yaml")


def test_a_log_longer_than_a_credential_holds_is_refused_at_bind(swtpm, tmp_path):
    events = STARTUP + [("config", "c.yaml", hashlib.sha256(str(i).encode()).hexdigest())
                        for i in range(MAX_LOG_EVENTS - len(STARTUP))]
    signer, log = started(swtpm, tmp_path, events)
    try:
        nonce, cred = bound(signer, log)  # exactly the most a credential carries
        assert len(cred.measurement_log) == MAX_LOG_EVENTS
        SessionVerifier(signer.device_public_key_pem(), MODEL).accept(cred.to_cbor(), nonce)
        log.record("config", "one-more.yaml", CONFIG)
        with pytest.raises(TpmError, match=f"at most {MAX_LOG_EVENTS}"):
            signer.bind(os.urandom(32), log)
    finally:
        signer.close()


def test_garbled_version_2_credentials_raise_only_credential_error(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    try:
        nonce, cred = bound(signer, log)
    finally:
        signer.close()
    data = cred.to_cbor()
    # the nonce is not used up by an accepted credential first: each mutation must be refused on its own merits
    verifier = SessionVerifier(cred.ak_public_pem, MODEL)
    every_truncation_and_changed_byte_is_refused(verifier, data, nonce)
    for bad_entry in (["config", "a\0b", bytes(32)], ["", "x", bytes(32)], ["config", "x", bytes(31)],
                      ["config", "x"], ["k" * 65, "x", bytes(32)], ["config", 7, bytes(32)]):
        fields = cbor2.loads(data)
        fields[15] = [bad_entry]
        assert rejected(verifier, cbor2.dumps(fields), nonce).code == "malformed"
    verifier.accept(data, nonce)  # the genuine credential, once, after every mutation was refused


def test_measured_state_names_what_runs():
    state = measured_state([("model", "m1", "a" * 64), ("module:pre", "p1", "b" * 64), ("config", "c1", "c" * 64),
                            ("rollback:module:pre", "p0", "d" * 64), ("approval", "approval.json", "e" * 64),
                            ("persisted", "state.json", "f" * 64), ("rollback:config", "c0", "0" * 64)])
    assert state.model == ("m1", "a" * 64) and state.modules == {"pre": ("p0", "d" * 64)}
    assert state.config == ("c0", "0" * 64)
