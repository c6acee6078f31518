"""The audit log's TPM anchor (sitsd/audit_anchor.py): real AuditLogs against a real swtpm.

swtpm has no resource manager: one ESAPI connection at a time. Each "start" below opens its own connection
and closes it at its "stop"; `sitsctl audit verify --tpm` runs only while no AuditLog is attached."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sitsd.audit import AuditLog, anchor_summary, audit_files, verify_directory
from sitsd.audit_anchor import DEFAULT_NV_INDEX, AuditAnchor, TpmNvCounter

from ..conftest import EXAMPLE_CONFIG, REPO, example_config_data, sitsd_args, wait_ready

NV = DEFAULT_NV_INDEX


@pytest.fixture(autouse=True)
def _no_cli_tcti_left_behind():
    """sitsctl's global --tcti lands in sitsd.config.CLI_OVERRIDES: never let it reach another test."""
    from sitsd import config

    yield
    config.CLI_OVERRIDES.clear()


class Run:
    """One daemon-side start: an AuditLog with its anchor, on its own TPM connection."""

    def __init__(self, directory: Path, tcti: str, interval_s: float = 3600.0, counter: TpmNvCounter | None = None,
                 **log_kw) -> None:
        self.alerts: list[tuple[str, str]] = []
        self.counter = counter or TpmNvCounter.own(tcti, NV)
        self.log = AuditLog(directory, **log_kw)
        self.anchor = AuditAnchor(self.counter, interval_s,
                                  on_alert=lambda kind, reason: self.alerts.append((kind, reason))).attach(self.log)

    def append(self, n: int, start: int = 0) -> None:
        for seq in range(start, start + n):
            self.log.append({"seq": seq, "frame_seq": seq, "values": [0.5], "failsafe": False, "sent_ns": seq,
                             "outcome": "acknowledged", "pad": "x" * 120})

    def settled(self, timeout_s: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while self.anchor.status()["pending_increment"]:
            assert time.monotonic() < deadline, f"anchor increment still pending: {self.anchor.status()}"
            time.sleep(0.01)
        return self.anchor.status()

    def stop(self) -> None:
        self.log.close()
        self.counter.close()
        # the closed segments' compression runs on a thread of this log: done before the next "start" in this
        # process opens the directory (its start removes *.zst.tmp files as a crash's leftovers)
        assert self.log.flush_housekeeping()


def _tpm_value(tcti: str) -> int | None:
    counter = TpmNvCounter.own(tcti, NV)
    try:
        return counter.read()
    finally:
        counter.close()


def _records(path: Path) -> list[dict]:
    return [json.loads(line)["record"] for line in path.read_text().splitlines()]


def _verify(capsys, directory: Path, *extra: str) -> tuple[int, str, str]:
    from sitsd.cli import main

    capsys.readouterr()
    rc = main(["audit", "verify", str(directory), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_anchors_are_written_and_the_counter_follows(swtpm, tmp_path, capsys):
    run = Run(tmp_path, swtpm.tcti, segment_max_mb=0.004)  # ~4 KB segments: a rotation every dozen records
    advance, seen = run.counter.advance_to, []

    def checked_advance(target):  # the order that makes a crash look like "log ahead", never like a deletion
        on_disk = anchor_summary(audit_files(tmp_path), newest_only=True)["newest"]["counter"]
        value = advance(target)
        seen.append((on_disk, value))
        return value

    run.counter.advance_to = checked_advance
    first = _records(run.log.path)
    # the first-use marker is on disk before the counter is defined, the start anchor follows
    assert [r["type"] for r in first] == ["segment", "anchor_init", "anchor"] and first[2]["reason"] == "start"
    assert first[1]["index"] == "missing" and first[1]["previous_segments"] == 0
    st = run.anchor.status()
    assert st["start_check"] == "first_use" and st["counter"] == first[2]["counter"] == 2 and st["errors"] == 0
    for burst in range(6):  # at most one rotation per burst; the anchor thread catches up in between
        run.append(8, start=8 * burst)
        deadline = time.monotonic() + 5
        while run.anchor._anchored_path != run.log.path or run.anchor.status()["pending_increment"]:
            assert time.monotonic() < deadline, run.anchor.status()
            time.sleep(0.01)
    assert len(audit_files(tmp_path)) >= 4
    assert run.anchor.anchor_now("interval")
    segment = run.log.path
    run.append(1, start=100)  # a record after the interval anchor: the close anchor covers it
    last = "close" if run.log.path == segment else "rotation"  # (unless it filled the segment: a rotation anchor)
    run.stop()
    assert run.anchor.status()["counter"] == run.anchor.status()["last_anchor"]
    files = audit_files(tmp_path)
    verify_directory(files[0].parent)
    from sitsd.audit import _open_text

    anchors, unanchored = [], []
    for f in files:
        with _open_text(f) as fh:
            body = [json.loads(line)["record"] for line in fh]
        anchors += [r for r in body if r.get("type") == "anchor"]
        if not any(r.get("type") == "anchor" for r in body):
            unanchored.append(f.name)
    # every segment holds an anchor (deleting a whole newest segment shows too); a segment opened while the
    # previous anchor's increment was pending gets its anchor from the anchor thread a moment later
    assert unanchored == []
    reasons = [a["reason"] for a in anchors]
    assert reasons[0] == "start" and reasons[-1] == last and "rotation" in reasons and "interval" in reasons
    counters = [a["counter"] for a in anchors]
    assert counters == list(range(counters[0], counters[0] + len(counters)))  # one increment per anchor
    assert all(a["nv_index"] == f"0x{NV:08x}" for a in anchors)
    assert _tpm_value(swtpm.tcti) == counters[-1]  # the TPM holds the newest anchor
    assert len(seen) >= 6 and all(on_disk == value for on_disk, value in seen), seen  # record first, then TPM
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti)
    assert rc == 0 and f"newest anchor: counter {counters[-1]}" in out
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")
    assert rc == 0, err
    assert "matches the newest anchor" in out and "0 command record(s) after that anchor are not covered" in out


def _cut_before_newest_anchors(path: Path, keep_anchors: int) -> None:
    """Truncate a segment after its `keep_anchors`-th anchor record: a valid prefix of the chain."""
    lines = path.read_bytes().splitlines(keepends=True)
    seen, keep = 0, len(lines)
    for i, line in enumerate(lines):
        if b'"type":"anchor"' in line:
            seen += 1
            if seen == keep_anchors + 1:
                keep = i
                break
    assert keep < len(lines)
    path.write_bytes(b"".join(lines[:keep]))


@pytest.mark.parametrize("cut", ["tail", "newest_segment"])
def test_deleting_the_newest_anchored_records_is_found_by_verify_and_the_next_start(swtpm, tmp_path, capsys, cut):
    run = Run(tmp_path, swtpm.tcti)
    run.append(5)
    assert run.anchor.anchor_now("interval")
    run.append(5, start=5)
    run.stop()  # anchors: start, interval, close
    if cut == "newest_segment":
        run = Run(tmp_path, swtpm.tcti)
        run.append(5, start=10)
        run.stop()
        newest = audit_files(tmp_path)[-1]
        newest.unlink()  # the whole newest segment: what remains is a valid log
        kept = anchor_summary(audit_files(tmp_path))["newest"]["counter"]
    else:
        _cut_before_newest_anchors(run.log.path, keep_anchors=1)  # keep the start anchor and 5 records
        kept = anchor_summary(audit_files(tmp_path))["newest"]["counter"]
    tpm = _tpm_value(swtpm.tcti)
    assert tpm > kept
    verify_directory(tmp_path)  # the chain alone cannot see it
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti)
    assert rc == 0
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")
    assert rc == 1
    assert f"the newest {tpm - kept} anchor(s) are missing: records after anchor {kept} were deleted" in err

    again = Run(tmp_path, swtpm.tcti)  # the next daemon-side start on the same directory
    assert [k for k, _ in again.alerts] == ["audit_truncated"]
    assert f"TPM counter at 0x{NV:08x} is {tpm}" in again.alerts[0][1]
    assert f"newest anchor is {kept}" in again.alerts[0][1]
    st = again.anchor.status()
    assert st["start_check"] == "tpm_ahead" and st["gap"]["tpm_counter"] == tpm and st["gap"]["last_anchor"] == kept
    body = _records(again.log.path)
    assert body[1]["type"] == "anchor_gap" and body[1]["tpm_counter"] == tpm and body[1]["last_anchor"] == kept
    assert body[2]["type"] == "anchor" and body[2]["counter"] == tpm + 1  # and anchoring goes on from the TPM
    again.append(3, start=100)  # the line keeps running
    again.stop()
    verify_directory(tmp_path)  # the gap record is part of the chain
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti)
    assert rc == 1 and "GAP recorded at" in err and f"records after anchor {kept} were deleted" in err
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")
    assert rc == 1 and "GAP recorded at" in err and "matches the newest anchor" in out

    third = Run(tmp_path, swtpm.tcti)  # a gap is reported once, at the start that found it
    assert third.alerts == [] and third.anchor.status()["start_check"] == "ok"
    third.stop()


def test_a_gap_that_cannot_be_recorded_yet_is_not_covered_by_a_later_anchor(swtpm, tmp_path):
    """Disk full at the start that finds a deletion: no anchor may follow before the anchor_gap record does, or
    the next start would find the log and the TPM in step and the deletion would be forgotten."""
    from sitsd.audit import AuditWriteError

    run = Run(tmp_path, swtpm.tcti)
    run.append(3)
    run.stop()
    _cut_before_newest_anchors(run.log.path, keep_anchors=1)
    tpm = _tpm_value(swtpm.tcti)
    counter = TpmNvCounter.own(swtpm.tcti, NV)
    log = AuditLog(tmp_path)
    write = log.write_typed_locked

    def disk_full(record, sync=True):
        raise AuditWriteError("no space left on device")

    log.write_typed_locked = disk_full
    alerts = []
    anchor = AuditAnchor(counter, 3600, on_alert=lambda k, r: alerts.append(k)).attach(log)
    assert "audit_truncated" in alerts and anchor.status()["errors"] >= 1
    assert not anchor.checked and not anchor.anchor_now("interval")  # still disk full: nothing anchored
    log.write_typed_locked = write  # space again
    assert anchor.anchor_now("interval")
    log.close()
    counter.close()
    types = [(r.get("type"), r.get("tpm_counter") or r.get("counter")) for r in _records(log.path)]
    # no close anchor: nothing was recorded after the interval anchor (it covers everything); the clean stop's
    # close record (no command, after the closing anchor's turn) ends the segment
    assert types == [("segment", None), ("anchor_gap", tpm), ("anchor", tpm + 1), ("close", None)]
    assert _tpm_value(swtpm.tcti) == tpm + 1


CRASH = """
import os, sys
from sitsd.audit import AuditLog
from sitsd.audit_anchor import AuditAnchor, TpmNvCounter
counter = TpmNvCounter.own(sys.argv[1], int(sys.argv[3]))
log = AuditLog(sys.argv[2])
anchor = AuditAnchor(counter, 3600).attach(log)
for seq in range(3):
    log.append({"seq": seq, "values": [0.0], "outcome": "acknowledged"})
with log.lock:
    assert anchor._record_locked("interval")  # the record is on disk ...
os._exit(0)  # ... and the process dies before TPM2_NV_Increment
"""


def test_a_crash_between_record_and_increment_is_not_a_deletion(swtpm, tmp_path, capsys):
    r = subprocess.run([sys.executable, "-c", CRASH, swtpm.tcti, str(tmp_path), str(NV)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    newest = anchor_summary(audit_files(tmp_path))["newest"]
    assert newest["reason"] == "interval"
    assert _tpm_value(swtpm.tcti) == newest["counter"] - 1  # the log is one anchor ahead
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")
    assert rc == 0, err
    assert "one anchor ahead" in out and "not a deletion" in out

    run = Run(tmp_path, swtpm.tcti)
    assert run.alerts == []
    st = run.anchor.status()
    assert st["start_check"] == "caught_up" and st["gap"] is None and st["errors"] == 0
    body = _records(run.log.path)
    assert [r["type"] for r in body] == ["segment", "anchor"]  # no anchor_gap
    assert body[1]["counter"] == newest["counter"] + 1
    run.append(1)
    run.stop()
    assert _tpm_value(swtpm.tcti) == newest["counter"] + 2  # start and close anchors
    assert _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")[0] == 0


def test_a_failing_tpm_is_counted_and_never_stops_records(swtpm, tmp_path, capsys):
    run = Run(tmp_path, swtpm.tcti, segment_max_mb=0.002)
    before = run.log.records
    swtpm.stop_process()  # the TPM goes away (state kept)
    assert not run.anchor.anchor_now("interval")
    st = run.anchor.status()
    # the counter is read before a record is written: no anchor record while the TPM cannot be read
    assert st["errors"] >= 1 and "TPM2_NV_Increment" in st["last_error"] and not st["pending_increment"]
    assert run.alerts and {k for k, _ in run.alerts} == {"audit_anchor"}
    run.append(40)  # rotations while the TPM is gone: every record is written, no exception
    assert run.log.records == before + 40
    assert len(audit_files(tmp_path)) >= 3
    time.sleep(0.2)
    st = run.anchor.status()
    assert st["pending_increment"]  # one rotation anchor waits for its increment; no further ones are written
    waiting = st["last_anchor"]
    swtpm.start()  # back, with its state
    assert run.anchor.anchor_now("interval")  # the waiting increment first, then a new anchor
    st = run.anchor.status()
    assert st["counter"] == st["last_anchor"] == waiting + 1 and not st["pending_increment"]
    errors = st["errors"]
    assert run.anchor.anchor_now("interval") and run.anchor.status()["errors"] == errors  # recovered
    run.stop()
    verify_directory(tmp_path)
    summary = anchor_summary(audit_files(tmp_path))
    assert summary["newest"]["counter"] == _tpm_value(swtpm.tcti)
    assert _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")[0] == 0


def test_a_tpm_that_is_gone_at_start_is_retried_at_the_next_interval(swtpm, tmp_path):
    swtpm.stop_process()
    run = Run(tmp_path, swtpm.tcti)
    st = run.anchor.status()
    assert st["start_check"] == "pending" and st["errors"] == 1 and st["counter"] is None
    run.append(3)  # records go on
    assert [r.get("type") for r in _records(run.log.path)] == ["segment", None, None, None]  # no anchor yet
    swtpm.start()
    assert run.anchor.anchor_now("interval")
    assert run.anchor.status()["start_check"] == "first_use"
    run.stop()
    assert anchor_summary(audit_files(tmp_path))["newest"]["counter"] == _tpm_value(swtpm.tcti)


def test_an_nv_index_taken_by_something_else_is_reported_not_used(swtpm, tmp_path):
    import tpm2_pytss as t

    e = t.ESAPI(swtpm.tcti)  # an ordinary 8-byte index where the counter should go
    a = t.TPMA_NV
    public = t.TPM2B_NV_PUBLIC(nvPublic=t.TPMS_NV_PUBLIC(
        nvIndex=NV, nameAlg=t.TPM2_ALG.SHA256, attributes=a.AUTHWRITE | a.AUTHREAD | a.OWNERREAD | a.NO_DA,
        dataSize=8))
    e.tr_close(e.nv_define_space(None, public, t.ESYS_TR.OWNER))
    e.close()
    run = Run(tmp_path, swtpm.tcti)
    st = run.anchor.status()
    assert st["start_check"] == "pending" and st["errors"] == 1 and "not an 8-byte counter" in st["last_error"]
    assert [k for k, _ in run.alerts] == ["audit_anchor"]
    run.append(3)  # records go on, unanchored
    run.stop()
    assert anchor_summary(audit_files(tmp_path))["anchors"] == 0


@pytest.mark.parametrize("audit,attestation,field,reason", [
    ({"anchor": "tpm"}, {"mode": "software"}, "audit.anchor", "needs attestation.mode tpm2"),
    ({"anchor": "tpm", "anchor_interval_s": 5}, {}, "audit.anchor_interval_s", "greater than or equal to 10"),
    ({"anchor": "tpm", "anchor_interval_s": 100000}, {}, "audit.anchor_interval_s", "less than or equal to 86400"),
    ({"anchor": "tpm", "anchor_nv_index": 0x01500016}, {}, "audit.anchor_nv_index", "not an owner NV index"),
    ({"anchor": "tpm", "anchor_nv_index": 0x01C00002}, {}, "audit.anchor_nv_index", "0x01800000-0x01BFFFFF"),
    ({"anchor": "yes"}, {}, "audit.anchor", "'off' or 'tpm'"),
    ({"anchor": True}, {}, "audit.anchor", "write anchor: tpm"),
])
def test_anchor_config_errors(tmp_path, audit, attestation, field, reason):
    from sitsd.config import load_config
    from sitsd.errors import ConfigError

    data = example_config_data()
    data["audit"].update(audit)
    data["attestation"].update(attestation)
    path = tmp_path / "line.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    problems = {p[0]: p[2] for p in exc.value.problems}
    assert field in problems and reason in problems[field], problems


def test_anchor_config_defaults_and_a_bare_off(tmp_path):
    from sitsd.config import load_config

    cfg = load_config(EXAMPLE_CONFIG)
    assert cfg.audit.anchor == "off" and cfg.audit.anchor_interval_s == 300 and cfg.audit.anchor_nv_index == NV
    text = EXAMPLE_CONFIG.read_text()
    assert "# anchor: off" in text  # documented as a commented default
    path = tmp_path / "line.yaml"
    data = example_config_data()
    path.write_text(yaml.safe_dump(data, sort_keys=False).replace(
        "audit:\n", "audit:\n  anchor: off\n  anchor_interval_s: 600\n  anchor_nv_index: 0x01800010\n", 1))
    cfg = load_config(path)
    assert cfg.audit.anchor == "off" and cfg.audit.anchor_interval_s == 600 and cfg.audit.anchor_nv_index == 0x01800010
    path.write_text(path.read_text().replace("anchor: off", "anchor: tpm"))
    assert load_config(path).audit.anchor == "tpm"


# -- review findings: each test fails without its fix ---------------------------------------------------------

INTERRUPTED_FIRST_START = """
import os, sys
from sitsd.audit import AuditLog
from sitsd.audit_anchor import AuditAnchor, TpmNvCounter
counter = TpmNvCounter.own(sys.argv[1], int(sys.argv[3]))
if sys.argv[4] == "before_define":  # the anchor_init record is on disk, the process dies before the TPM is touched
    TpmNvCounter.initialise = lambda self: os._exit(0)
AuditAnchor.anchor_now = lambda self, reason="interval": os._exit(0)  # counter initialised, no start anchor yet
log = AuditLog(sys.argv[2])
log.append({"seq": 1, "values": [0.0], "outcome": "acknowledged"})
AuditAnchor(counter, 3600).attach(log)
"""


@pytest.mark.parametrize("where", ["after_increment", "before_define"])
def test_an_interrupted_first_start_is_not_a_deletion(swtpm, tmp_path, capsys, where):
    r = subprocess.run([sys.executable, "-c", INTERRUPTED_FIRST_START, swtpm.tcti, str(tmp_path), str(NV), where],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    summary = anchor_summary(audit_files(tmp_path))
    assert summary["newest"] is None and summary["init"]["index"] == "missing"
    assert _tpm_value(swtpm.tcti) == (1 if where == "after_increment" else None)
    if where == "after_increment":
        rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")
        assert rc == 0, err
        assert "not anchored yet" in out
    run = Run(tmp_path, swtpm.tcti)
    assert run.alerts == []  # no audit_truncated, no anchor_gap: nothing was ever anchored
    st = run.anchor.status()
    assert st["start_check"] == "first_use" and st["gap"] is None and st["counter"] == 2
    # before_define: the counter was never defined, so this start writes its own anchor_init record first
    assert [r["type"] for r in _records(run.log.path)] == (
        ["segment", "anchor"] if where == "after_increment" else ["segment", "anchor_init", "anchor"])
    run.append(1)
    run.stop()
    assert _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")[0] == 0


def _undefine(tcti: str) -> None:
    import tpm2_pytss as t

    e = t.ESAPI(tcti)
    try:
        e.nv_undefine_space(e.tr_from_tpmpublic(NV), t.ESYS_TR.OWNER)
    finally:
        e.close()


def test_an_anchor_init_record_with_the_counter_moved_on_is_a_deletion(swtpm, tmp_path):
    """The marker does not excuse a counter that went further: the start anchor (2) was cut off with the records."""
    run = Run(tmp_path, swtpm.tcti)
    run.append(3)
    run.stop()
    _cut_before_newest_anchors(run.log.path, keep_anchors=0)  # keeps the segment header and the anchor_init record
    again = Run(tmp_path, swtpm.tcti)
    assert [k for k, _ in again.alerts] == ["audit_truncated"] and again.anchor.status()["start_check"] == "tpm_ahead"
    again.stop()


class _LostReply:
    """An ESAPI context whose next `arm` TPM2_NV_Increment(s) reach the TPM, but whose reply is lost (a TCTI I/O
    error): exactly what makes a blind retry after reconnecting increment twice."""

    armed = 0

    def __init__(self, esapi) -> None:
        self._e = esapi

    def __getattr__(self, name):
        return getattr(self._e, name)

    def nv_increment(self, *args):
        import tpm2_pytss as t

        self._e.nv_increment(*args)
        if _LostReply.armed:
            _LostReply.armed -= 1
            raise t.TSS2_Exception(0xA000A)  # TSS2_TCTI_RC_IO_ERROR


def test_an_increment_whose_reply_is_lost_is_not_repeated(swtpm, tmp_path):
    from sitsd.audit_anchor import AnchorTpmError, OwnTpm

    conn = OwnTpm(swtpm.tcti)
    counter = TpmNvCounter(lambda: _LostReply(conn.esapi()), NV, conn.lock, conn.reopen)
    counter.connection = conn
    _LostReply.armed = 1  # the initialising increment at first use
    run = Run(tmp_path, swtpm.tcti, counter=counter)
    assert _LostReply.armed == 0
    st = run.anchor.status()
    assert st["start_check"] == "first_use" and st["counter"] == st["last_anchor"] == 2 and st["errors"] == 0
    for _ in range(2):  # an interval anchor's increment, then the close anchor's
        run.append(2)
        _LostReply.armed = 1
        assert run.anchor.anchor_now("interval")
        assert _LostReply.armed == 0
        st = run.anchor.status()
        assert st["counter"] == st["last_anchor"] and not st["pending_increment"]
    run.append(1)
    _LostReply.armed = 1
    run.stop()
    assert run.alerts == [] and run.anchor.status()["errors"] == 0  # never "something else increments it"
    newest = anchor_summary(audit_files(tmp_path))["newest"]
    assert newest["reason"] == "close" and _tpm_value(swtpm.tcti) == newest["counter"] == 5
    # a bare increment is not repeated after the reconnect either: it reports that its outcome is unknown
    raw = TpmNvCounter(lambda: _LostReply(conn.esapi()), NV, conn.lock, conn.reopen)
    _LostReply.armed = 1
    with pytest.raises(AnchorTpmError, match="unknown"):
        raw.increment()
    assert raw.read() == 6
    conn.close()


def test_a_counter_moved_by_someone_else_gets_a_fresh_anchor_at_once(swtpm, tmp_path):
    run = Run(tmp_path, swtpm.tcti)
    run.append(2)
    before = run.anchor.status()["counter"]
    run.counter.increment()  # someone else who can use the TPM, twice
    run.counter.increment()
    assert run.anchor.anchor_now("interval")
    kinds = [k for k, _ in run.alerts]
    assert kinds == ["audit_anchor"] and "something else increments it" in run.alerts[0][1]
    newest = anchor_summary(audit_files(tmp_path), newest_only=True)["newest"]
    # the log's newest anchor matches the TPM now, not at the next interval: a crash here is no false deletion
    assert newest["counter"] == _tpm_value_via(run) == before + 3
    run.stop()
    again = Run(tmp_path, swtpm.tcti)
    assert again.alerts == [] and again.anchor.status()["start_check"] == "ok"
    again.stop()


def _tpm_value_via(run: Run) -> int:
    return run.counter.read()  # through the run's own connection (swtpm: one at a time)


def test_verify_tpm_reads_the_counter_before_the_log(swtpm, tmp_path, capsys, monkeypatch):
    """A running sitsd anchors while `verify --tpm` reads the files: the counter it reaches afterwards is above
    the newest anchor the scan saw, which is no deletion."""
    import sitsd.audit

    run = Run(tmp_path, swtpm.tcti)
    run.append(3)
    run.stop()
    real, anchored = sitsd.audit.anchor_summary, []

    def scan_then_daemon_anchors(files, newest_only=False):
        summary = real(files, newest_only)
        if not newest_only and not anchored:  # the scan is done; the daemon starts and anchors twice
            anchored.append(True)
            daemon = Run(tmp_path, swtpm.tcti)
            daemon.append(2, start=10)
            daemon.stop()
        return summary

    monkeypatch.setattr(sitsd.audit, "anchor_summary", scan_then_daemon_anchors)
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")
    assert anchored and rc == 0, err
    assert "TRUNCATED" not in err and "while the log was read" in out, out


def test_open_text_falls_back_to_the_compressed_copy_when_the_plain_file_goes(tmp_path, monkeypatch):
    from sitsd.audit import _open_text, compress_segment

    plain = tmp_path / "commands-000001-x.jsonl"
    plain.write_text('{"a":1}\n')
    compress_segment(plain)
    # the segment existed when it was checked and was compressed (and unlinked) before the open
    monkeypatch.setattr(Path, "exists", lambda self: True if self == plain else Path.is_file(self))
    with _open_text(plain) as fh:
        assert fh.read() == '{"a":1}\n'


def test_an_unreadable_segment_fails_the_start_check_not_a_false_deletion(swtpm, tmp_path):
    first = Run(tmp_path, swtpm.tcti)
    first.append(2)
    first.stop()
    second = Run(tmp_path, swtpm.tcti)  # the newest anchors go into segment 2
    second.append(2, start=10)
    second.stop()
    plain = AuditLog(tmp_path)  # segment 3: no anchor (audit.anchor off for a while); segment 2 gets compressed
    plain.append({"seq": 20, "values": [0.0], "outcome": "acknowledged"})
    assert plain.flush_housekeeping()
    plain.close()
    damaged = audit_files(tmp_path)[1]
    assert damaged.name.endswith(".zst")
    damaged.write_bytes(b"not a zstd frame" * 64)
    third = Run(tmp_path, swtpm.tcti)
    kinds = [k for k, _ in third.alerts]
    assert kinds == ["audit_anchor"] and "cannot read" in third.alerts[0][1] and damaged.name in third.alerts[0][1]
    st = third.anchor.status()
    assert st["start_check"] == "pending" and st["gap"] is None and "cannot read" in st["last_error"]
    third.append(2, start=30)  # records go on
    third.stop()


@pytest.mark.parametrize("forged", ["counter_not_a_number", "no_counter", "record_not_an_object"])
def test_a_malformed_anchor_record_is_reported_never_a_crash(swtpm, tmp_path, capsys, forged):
    run = Run(tmp_path, swtpm.tcti)
    run.append(2)
    run.stop()
    log = AuditLog(tmp_path)  # a forged record with a valid chain (or, last, a line appended by hand)
    assert log.flush_housekeeping()
    if forged != "record_not_an_object":
        with log.lock:
            log.write_typed_locked({"type": "anchor", "counter": "nine"} if forged == "counter_not_a_number"
                                   else {"type": "anchor"})
        log.close()
    else:
        log.close()
        with open(log.path, "a") as fh:
            fh.write('{"hash":"0","record":[{"type":"anchor","counter":9}]}\n')
    again = Run(tmp_path, swtpm.tcti)  # the attach does not raise (sitsd would exit 70)
    st = again.anchor.status()
    assert st["start_check"] == "pending" and st["errors"] == 1 and "malformed anchor record" in st["last_error"]
    assert [k for k, _ in again.alerts] == ["audit_anchor"] and log.path.name in again.alerts[0][1]
    again.append(2, start=10)
    again.stop()
    if forged != "record_not_an_object":  # the chain verifies: the anchor check names the record
        rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti)
        assert rc == 1 and "malformed anchor record" in err and log.path.name in err


def test_the_anchor_thread_survives_an_exception(swtpm, tmp_path):
    run = Run(tmp_path, swtpm.tcti)
    settle, calls = run.anchor.settle, []

    def broken_once(check=True):
        calls.append(check)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return settle(check)

    run.anchor.settle = broken_once
    run.anchor._wake.set()  # as a rotation does
    deadline = time.monotonic() + 10
    while not run.anchor.status()["errors"]:
        assert time.monotonic() < deadline, "no failure counted: the anchor thread died, or never ran"
        time.sleep(0.01)
    assert run.anchor._thread.is_alive()
    assert "the anchor thread" in run.anchor.status()["last_error"] and [k for k, _ in run.alerts] == ["audit_anchor"]
    run.append(1)
    assert run.anchor.anchor_now("interval")
    run.stop()


def test_retention_keeps_the_newest_anchor_of_a_removed_segment(swtpm, tmp_path, capsys):
    run = Run(tmp_path, swtpm.tcti)  # segment 1: the only anchors
    run.append(3)
    run.stop()
    anchored = _tpm_value(swtpm.tcti)
    log = AuditLog(tmp_path)  # segment 2, audit.anchor off
    log.append({"seq": 10, "values": [0.0], "outcome": "acknowledged"})
    assert log.flush_housekeeping()
    log.close()
    log = AuditLog(tmp_path, max_total_mb=0.000001)  # segment 3: retention removes segment 1 (the newest closed stays)
    assert log.flush_housekeeping()
    log.close()
    assert [f.name.split("-")[1] for f in audit_files(tmp_path)] == ["000002", "000003"]
    retention = [r for r in _records(log.path) if r.get("type") == "retention"]
    assert len(retention) == 1 and retention[0]["removed_newest_anchor"] == anchored
    verify_directory(tmp_path)
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")
    assert rc == 0, err
    assert "matches the newest anchor" in out and "removed by retention" in out
    again = Run(tmp_path, swtpm.tcti)  # anchor on again: no anchor record left, the retention record carries it
    assert again.alerts == [] and again.anchor.status()["start_check"] == "ok"
    again.stop()


@pytest.mark.parametrize("cut", ["tail", "nothing"])
def test_an_undefined_index_is_reported_as_a_possible_deletion(swtpm, tmp_path, capsys, cut):
    run = Run(tmp_path, swtpm.tcti)
    run.append(3)
    assert run.anchor.anchor_now("interval")
    run.append(3, start=3)
    run.stop()
    if cut == "tail":
        _cut_before_newest_anchors(run.log.path, keep_anchors=1)
    kept = anchor_summary(audit_files(tmp_path))["newest"]["counter"]
    _undefine(swtpm.tcti)  # anyone in group tss can (empty owner auth)
    again = Run(tmp_path, swtpm.tcti)
    assert [k for k, _ in again.alerts] == ["audit_truncated"]
    assert "was missing" in again.alerts[0][1] and f"newest anchor is {kept}" in again.alerts[0][1]
    st = again.anchor.status()
    assert st["start_check"] == "index_recreated" and st["gap"]["last_anchor"] == kept
    body = _records(again.log.path)
    assert [r["type"] for r in body] == ["segment", "anchor_init", "anchor_gap", "anchor"]
    assert body[2]["reason"] == "index_recreated" and body[3]["counter"] == st["counter"]
    again.append(1)
    again.stop()
    rc, out, err = _verify(capsys, tmp_path, "--tcti", swtpm.tcti, "--tpm")
    assert rc == 1 and "GAP recorded at" in err and "index undefined" in err


def test_an_index_undefined_while_running_is_recorded_before_anchoring_goes_on(swtpm, tmp_path):
    import tpm2_pytss as t

    run = Run(tmp_path, swtpm.tcti)
    run.append(2)
    kept = run.anchor.status()["last_anchor"]
    # through the run's own connection (swtpm: one at a time)
    run.counter._run("undefine", lambda e: e.nv_undefine_space(e.tr_from_tpmpublic(NV), t.ESYS_TR.OWNER))
    assert not run.anchor.anchor_now("interval")  # the index is gone: counted, and the start check is due again
    assert run.anchor.status()["start_check"] == "pending" and "vanished" in run.anchor.status()["last_error"]
    assert run.anchor.anchor_now("interval")
    st = run.anchor.status()
    assert st["start_check"] == "index_recreated" and st["gap"]["last_anchor"] == kept
    assert [k for k, _ in run.alerts] == ["audit_anchor", "audit_truncated"]
    types = [r.get("type") for r in _records(run.log.path)]
    assert types[-3:] == ["anchor_init", "anchor_gap", "anchor"]
    run.append(1)
    run.stop()
    again = Run(tmp_path, swtpm.tcti)
    assert again.alerts == [] and again.anchor.status()["start_check"] == "ok"
    again.stop()


@pytest.mark.parametrize("before", ["wiped_and_undefined", "unanchored_segments"])
def test_first_use_on_a_used_tpm_or_an_existing_log_is_flagged(swtpm, tmp_path, before):
    if before == "wiped_and_undefined":
        run = Run(tmp_path, swtpm.tcti)
        run.append(3)
        run.stop()
        for f in audit_files(tmp_path):
            f.unlink()
        _undefine(swtpm.tcti)
    else:
        log = AuditLog(tmp_path)  # audit.anchor was off so far
        log.append({"seq": 1, "values": [0.0], "outcome": "acknowledged"})
        log.close()
    run = Run(tmp_path, swtpm.tcti)
    st = run.anchor.status()
    assert st["start_check"] == "first_use"
    assert [k for k, _ in run.alerts] == ["audit_anchor"]
    text = run.alerts[0][1]
    if before == "wiped_and_undefined":
        first = st["counter"] - 1  # the value the new counter started at (the start anchor is one above)
        assert f"starts at {first}: a counter on this TPM had counted to {first - 1}" in text and first > 1
    else:
        assert f"{tmp_path} already held 1 segment(s)" in text and st["counter"] == 2
    run.stop()


def test_no_anchor_when_nothing_was_recorded_since_the_last(swtpm, tmp_path):
    run = Run(tmp_path, swtpm.tcti)
    start = run.anchor.status()["counter"]
    assert run.anchor.anchor_now("interval")  # nothing since the start anchor: no NV write
    assert run.anchor.anchor_now("interval")
    st = run.anchor.status()
    assert st["counter"] == st["last_anchor"] == start and st["skipped"] == 2 and st["anchors"] == 1
    run.append(1)
    assert run.anchor.anchor_now("interval")
    assert run.anchor.status()["counter"] == start + 1
    run.stop()  # nothing since the interval anchor: no close anchor
    assert _tpm_value(swtpm.tcti) == start + 1
    assert [r["reason"] for r in _records(run.log.path) if r.get("type") == "anchor"] == ["start", "interval"]
    again = Run(tmp_path, swtpm.tcti)
    assert again.alerts == [] and again.anchor.status()["start_check"] == "ok"
    again.stop()


def test_the_close_anchor_waits_for_a_pending_increment(swtpm, tmp_path):
    run = Run(tmp_path, swtpm.tcti)
    run.append(2)
    with run.log.lock:  # an interval anchor whose increment is still pending when the daemon stops
        assert run.anchor._record_locked("interval")
    assert run.anchor.status()["pending_increment"]
    run.append(2, start=2)  # records after it that only a close anchor covers
    run.stop()
    newest = anchor_summary(audit_files(tmp_path))["newest"]
    assert newest["reason"] == "close" and newest["counter"] == _tpm_value(swtpm.tcti)
    assert anchor_summary(audit_files(tmp_path))["after_newest"] == 0


@pytest.mark.parametrize("variant", ["no_NO_DA", "OWNERWRITE", "auth_policy"])
def test_a_counter_sitsd_did_not_define_is_not_used(swtpm, tmp_path, variant):
    import tpm2_pytss as t

    e = t.ESAPI(swtpm.tcti)
    a = t.TPMA_NV
    attrs = a.AUTHWRITE | a.AUTHREAD | a.OWNERREAD | (t.TPM2_NT.COUNTER << a.TPM2_NT_SHIFT)
    if variant != "no_NO_DA":
        attrs |= a.NO_DA
    if variant == "OWNERWRITE":
        attrs |= a.OWNERWRITE
    policy = t.TPM2B_DIGEST(b"\x01" * 32) if variant == "auth_policy" else t.TPM2B_DIGEST()
    public = t.TPM2B_NV_PUBLIC(nvPublic=t.TPMS_NV_PUBLIC(nvIndex=NV, nameAlg=t.TPM2_ALG.SHA256, attributes=attrs,
                                                         authPolicy=policy, dataSize=8))
    e.tr_close(e.nv_define_space(None, public, t.ESYS_TR.OWNER))
    e.close()
    run = Run(tmp_path, swtpm.tcti)
    st = run.anchor.status()
    assert st["start_check"] == "pending" and st["errors"] == 1 and "sitsd did not define" in st["last_error"]
    assert {"no_NO_DA": "lacks NO_DA", "OWNERWRITE": "has OWNERWRITE",
            "auth_policy": "authPolicy"}[variant] in st["last_error"]
    run.append(2)
    run.stop()
    assert anchor_summary(audit_files(tmp_path))["anchors"] == 0
    assert _tpm_value_raw(swtpm.tcti) is None  # never incremented by sitsd


def _tpm_value_raw(tcti: str) -> int | None:
    """The counter without sitsd's checks (None: never incremented)."""
    import tpm2_pytss as t

    e = t.ESAPI(tcti)
    try:
        nv = e.tr_from_tpmpublic(NV)
        try:
            return int.from_bytes(bytes(e.nv_read(nv, 8, 0, nv)), "big")
        except t.TSS2_Exception:
            return None
    finally:
        e.close()


def test_sitsd_anchors_its_log_and_reports_a_cut_at_the_next_start(plcsim, swtpm, tmp_path, capsys):
    """End to end: the daemon shares the signer's TPM connection for the anchor, shows it in status, anchors at
    its stop; the newest records cut off while it is stopped raise audit_truncated at its next start."""
    import signal

    from attestation.tpm import TpmSigner
    from sitsd.control import request

    audit, control = tmp_path / "audit", tmp_path / "c.sock"
    key = TpmSigner(swtpm.tcti)  # provision the device key so the PLC can trust it before the first start
    (tmp_path / "device.pem").write_bytes(key.public_key_pem())
    key.close()
    endpoint, udp_url, _sim = plcsim(tmp_path / "device.pem")

    def start(log_name):
        proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                           attestation__tcti=swtpm.tcti, attestation__signing="tpm-direct",
                                           plc__security="none", audit__directory=audit, control__socket=control,
                                           audit__anchor="tpm", audit__anchor_interval_s=10),
                                stderr=open(tmp_path / log_name, "wb"), cwd=REPO)
        wait_ready(proc, tmp_path / log_name)
        return proc

    first = start("first.log")
    try:
        status = request(control, "status")["audit_anchor"]
        assert status["start_check"] == "first_use" and status["counter"] == status["last_anchor"]
        assert status["errors"] == 0 and status["nv_index"] == f"0x{NV:08x}"
        time.sleep(0.5)
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(20) == 0
    newest = anchor_summary(audit_files(audit))["newest"]
    assert newest["reason"] == "close" and newest["counter"] > status["counter"]
    assert _verify(capsys, audit, "--tcti", swtpm.tcti, "--tpm")[0] == 0  # the daemon is stopped: swtpm is free
    _cut_before_newest_anchors(audit_files(audit)[-1], keep_anchors=1)  # keep the start anchor, cut the rest
    kept = anchor_summary(audit_files(audit))["newest"]
    assert kept["reason"] == "start" and kept["counter"] == status["last_anchor"]
    verify_directory(audit)
    second = start("second.log")
    try:
        answer = request(control, "status")
        st = answer["audit_anchor"]
        assert st["start_check"] == "tpm_ahead" and st["gap"]["tpm_counter"] == newest["counter"]
        assert st["gap"]["last_anchor"] == kept["counter"]
        assert _alerted(control, "audit_truncated")
        assert answer["state"] in ("running", "reconnecting")  # the line keeps running
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0
    log_text = (tmp_path / "second.log").read_text()
    assert "audit log truncated" in log_text
    rc, out, err = _verify(capsys, audit, "--tcti", swtpm.tcti, "--tpm")
    assert rc == 1 and "GAP recorded at" in err


def _alerted(control: Path, kind: str, timeout_s: float = 3.0) -> bool:
    """Alerts are counted by the housekeeping task every 50 ms: wait for it."""
    from sitsd.control import request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if request(control, "status")["alerts"].get(kind):
            return True
        time.sleep(0.05)
    return False
