"""`sitsctl measurements verify` (sitsd/cli_measurements.py) on logs measured on a real swtpm: a compacted chain with
a TPM-reset archive verifies (and matches PCR 23 with --tpm); an edited or deleted archive, an edited event of the
current log, carried-over state that differs from its archive, and a PCR 23 the log does not explain each fail,
naming the file."""
import hashlib
import json
import shutil
import time
from dataclasses import asdict

import pytest

from attestation.measurement import (MeasurementEvent, MeasurementLog, TpmPcr, carried_entries, event_digest, extend,
                                     measured_state, read_log, replay_file)
from attestation.tpm import Swtpm
from sitsd.cli import main

from .test_session_measured import started

COMPACT_AT = 8


def config_event(i: int) -> tuple[str, str, str]:
    return ("config", "rolling-mill.yaml", hashlib.sha256(f"config bytes {i}".encode()).hexdigest())


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A directory as sitsd leaves it: measurements.jsonl compacted twice (two archives), then a TPM reset (the log
    archived as measurements-before-tpm-reset-<ns>.jsonl, a new log measured from reset), then one compaction more.
    Yields (directory, swtpm) with swtpm stopped-free: no connection held, PCR 23 = the current log's replay."""
    sw = Swtpm().start()
    d = tmp_path_factory.mktemp("measurements")
    signer, log = started(sw, d)
    try:
        log.compact_at = COMPACT_AT
        for i in range(10):  # 4 + 10 events at a threshold of 8: two compactions
            log.record(*config_event(i))
        assert log.compactions == 2
        # a TPM reset, as sitsd/daemon.py _remeasure_swap_locked handles it: no link event to the old log
        log.path.replace(log.path.with_name(f"measurements-before-tpm-reset-{time.time_ns()}.jsonl"))
        log.tpm.reset()
        new = MeasurementLog(log.path, 23, log.tpm, compact_at=COMPACT_AT)
        for e in carried_entries(measured_state((e.kind, e.name, e.sha256) for e in log.events)):
            new.record(*e)  # what runs: model, modules, config (4 events)
        for i in range(10, 16):
            new.record(*config_event(i))
        assert new.compactions == 1
        assert replay_file(new.path) == new.tpm.read() == new.value
    finally:
        signer.close()
    try:
        yield d, sw
    finally:
        sw.stop()


def run(capsys, *argv) -> tuple[int, str]:
    rc = main(["measurements", "verify", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def copy(measured, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(measured[0], d)
    return d


def archives(d, kind="compacted"):
    return sorted(d.glob(f"measurements-{kind}-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))


def rewrite(path, mutate):
    """Edit the log's entries with `mutate(list of dicts)` and recompute every digest and pcr_after, as a forger
    without the TPM would: the file then replays on its own."""
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    events = [json.loads(line) for line in lines[1:]]
    mutate(events)
    value = bytes.fromhex(header["initial"])
    out = []
    for i, e in enumerate(events):
        digest = event_digest(e["kind"], e["name"], e["sha256"])
        value = extend(value, digest)
        out.append(asdict(MeasurementEvent(i, e["kind"], e["name"], e["sha256"], digest.hex(), value.hex(),
                                           e["time_ns"])))
    path.write_text(lines[0] + "\n" + "".join(json.dumps(e) + "\n" for e in out))


def test_a_compacted_chain_with_a_tpm_reset_verifies_and_matches_pcr_23(measured, tmp_path, capsys):
    d, sw = measured
    rc, out = run(capsys, d)
    assert rc == 0, out
    compacted, (reset,) = archives(d), archives(d, "before-tpm-reset")
    assert len(compacted) == 3
    assert "3 compaction(s), 1 TPM reset(s)" in out and "measurement logs verified" in out
    assert f"{reset.name}: before a TPM reset (not linked)" in out
    # the current chain: the compaction after the reset, then the current log; the reset archive reaches the others
    assert f"chain (oldest to current): {compacted[2].name} -> measurements.jsonl" in out
    assert f"reaches {compacted[0].name} -> {compacted[1].name} -> {reset.name}" in out
    assert f"config  rolling-mill.yaml {config_event(15)[2][:16]}" in out
    rc, out = run(capsys, d, "--json")
    report = json.loads(out)
    assert rc == 0 and report["ok"] and report["compactions"] == 3 and report["tpm_resets"] == 1
    assert report["current"]["config"] == list(config_event(15)[1:])
    # --tpm: PCR 23 is the current log's replay
    rc, out = run(capsys, d, "--tpm", "--tcti", sw.tcti)
    assert rc == 0 and "= the current log's replay" in out, out
    # ... until something else extends PCR 23
    from sitsd.audit_anchor import OwnTpm

    conn = OwnTpm(sw.tcti)
    try:
        before = TpmPcr(conn.esapi, 23, conn.lock).read()
        TpmPcr(conn.esapi, 23, conn.lock).extend(hashlib.sha256(b"another writer").digest())
    finally:
        conn.close()
    try:
        rc, out = run(capsys, d, "--tpm", "--tcti", sw.tcti)
        assert rc == 1 and "FAILED measurements.jsonl: PCR 23 in the TPM is" in out, out
    finally:  # put PCR 23 back for the other tests: reset and replay the current log
        conn = OwnTpm(sw.tcti)
        try:
            pcr = TpmPcr(conn.esapi, 23, conn.lock)
            pcr.reset()
            for e in read_log(d / "measurements.jsonl")[1]:
                pcr.extend(bytes.fromhex(e.digest))
            assert pcr.read() == before
        finally:
            conn.close()


def test_an_edited_archive_is_named(measured, tmp_path, capsys):
    d = copy(measured, tmp_path)
    first = archives(d)[0]
    first.write_text(first.read_text().replace("rolling-mill.yaml", "rolling-mill.yamI", 1))
    rc, out = run(capsys, d)
    assert rc == 1, out
    assert f"FAILED {first.name}: modified: its SHA-256 is" in out
    assert f"FAILED {first.name} event 3: event 3 (config/rolling-mill.yamI): recorded digest" in out


def test_an_archive_edited_so_that_it_replays_still_fails_its_link(measured, tmp_path, capsys):
    d = copy(measured, tmp_path)
    first = archives(d)[0]
    rewrite(first, lambda events: events.pop(5))
    assert replay_file(first)  # replays on its own
    rc, out = run(capsys, d)
    assert rc == 1 and f"FAILED {first.name}: modified" in out, out


def test_a_deleted_archive_breaks_the_chain_by_name(measured, tmp_path, capsys):
    d = copy(measured, tmp_path)
    compacted = archives(d)
    compacted[-1].unlink()  # the one the current log links
    rc, out = run(capsys, d)
    assert rc == 1, out
    assert (f"FAILED measurements.jsonl event 0: its `compacted` event names archive {compacted[-1].name}, which is "
            "missing") in out
    d = copy(measured, tmp_path / "2")
    archives(d)[0].unlink()  # the oldest, behind the TPM reset
    rc, out = run(capsys, d)
    assert rc == 1 and f"names archive {compacted[0].name}, which is missing" in out, out


def test_an_edited_event_of_the_current_log_is_named(measured, tmp_path, capsys):
    d = copy(measured, tmp_path)
    path = d / "measurements.jsonl"
    lines = path.read_text().splitlines()
    event = json.loads(lines[4])  # event 3
    event["sha256"] = hashlib.sha256(b"another config").hexdigest()
    lines[4] = json.dumps(event)
    path.write_text("\n".join(lines) + "\n")
    rc, out = run(capsys, d)
    assert rc == 1 and "FAILED measurements.jsonl event 3: event 3 (" in out, out


def test_carried_over_state_that_differs_from_its_archive_is_named(measured, tmp_path, capsys):
    d = copy(measured, tmp_path)
    path = d / "measurements.jsonl"
    events = read_log(path)[1]
    index = next(e.index for e in events if e.kind == "config")

    def carry_another_config(evs):
        evs[index]["sha256"] = hashlib.sha256(b"a config that never ran").hexdigest()

    rewrite(path, carry_another_config)
    assert replay_file(path)  # the file replays on its own; only its archive shows the change
    rc, out = run(capsys, d)
    assert rc == 1, out
    assert (f"FAILED measurements.jsonl event {index}: the state carried over by compaction is not measured_state() "
            f"of {archives(d)[-1].name}: config") in out


def test_usage_and_unreadable_directories_exit_2(tmp_path, capsys):
    rc, out = run(capsys, tmp_path / "absent")
    assert rc == 2 and "is not a directory" in out
    rc, out = run(capsys, tmp_path)
    assert rc == 2 and "no measurements.jsonl" in out
    log = MeasurementLog(tmp_path / "measurements.jsonl")  # a software log, never compacted
    log.record("model", "m.onnx", "ab" * 32)
    rc, out = run(capsys, tmp_path)
    assert rc == 0 and "1 measurement log file(s), 1 events, 0 compaction(s)" in out, out
    rc, out = run(capsys, tmp_path, "--tpm", "--config", tmp_path / "none.yaml")
    assert rc == 2 and "which TPM?" in out, out
