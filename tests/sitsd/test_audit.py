import json
import re

import pytest

from sitsd.audit import AuditLog, verify_chain


def _without_close(path) -> bytes:
    """The segment as a crash leaves it: a clean close ends it with a `close` record, which a kill never writes."""
    data = path.read_bytes()
    head, _, last = data.rstrip(b"\n").rpartition(b"\n")
    assert json.loads(last)["record"]["type"] == "close"
    return head + b"\n"


def test_chain_verifies_and_detects_edits(tmp_path):
    log = AuditLog(tmp_path)
    for seq in range(5):
        log.append({"seq": seq, "values": [0.1 * seq]})
    log.close()
    assert verify_chain(log.path) == 5

    lines = log.path.read_text().splitlines()
    entry = json.loads(lines[2])
    entry["record"]["values"] = [9.9]
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(lines[:2] + [json.dumps(entry)] + lines[3:]) + "\n")
    with pytest.raises(ValueError, match=":3: record 1 was modified"):
        verify_chain(edited)

    dropped = tmp_path / "dropped.jsonl"
    dropped.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    with pytest.raises(ValueError, match=":2: chain broken"):
        verify_chain(dropped)


def test_truncation_and_cli(tmp_path):
    import subprocess
    import sys

    from ..conftest import REPO

    log = AuditLog(tmp_path)
    for seq in range(3):
        log.append({"seq": seq, "frame_seq": seq, "values": [0.1], "failsafe": False, "sent_ns": 1,
                    "outcome": "acknowledged"})
    log.close()
    ok = subprocess.run([sys.executable, "-m", "sitsd.cli", "audit", "verify", str(tmp_path)],
                        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert ok.returncode == 0 and "OK, 3 records" in ok.stdout and "chain intact across 1 segment" in ok.stdout
    shown = subprocess.run([sys.executable, "-m", "sitsd.cli", "audit", "show", str(tmp_path), "--last", "2"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert shown.stdout.count("acknowledged") == 2
    data = _without_close(log.path)
    log.path.write_bytes(data[:-10])  # power loss mid-write
    with pytest.raises(ValueError, match=":4: truncated record"):
        verify_chain(log.path)
    bad = subprocess.run([sys.executable, "-m", "sitsd.cli", "audit", "verify", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 1 and "truncated record" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "sitsd.cli", "audit", "verify", str(tmp_path / "nowhere")],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    assert missing.returncode == 2 and "nowhere does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_segments_chain_across_restarts_and_name_a_crash_cut(tmp_path):
    from sitsd.audit import read_records, verify_directory

    first = AuditLog(tmp_path)
    for seq in range(3):
        first.append({"seq": seq, "outcome": "acknowledged"})
    first.close()
    first.path.write_bytes(_without_close(first.path)[:-7])  # kill -9 while writing the last record
    second = AuditLog(tmp_path)  # the restart: links to the last whole record and names the cut
    second.append({"seq": 3, "outcome": "acknowledged"})
    second.close()
    results = verify_directory(tmp_path)
    assert [n for _, n in results] == [2, 1]
    assert [r["seq"] for r in read_records(second.path)] == [3]

    # with the segment that vouched for the cut deleted, the gap is named
    third = AuditLog(tmp_path)
    third.append({"seq": 4, "outcome": "acknowledged"})
    assert third.flush_housekeeping()
    third.close()
    from sitsd.audit import audit_files

    audit_files(tmp_path)[1].unlink()
    with pytest.raises(ValueError, match="000003.*follows commands-000002.*a segment in between was deleted"):
        verify_directory(tmp_path)


def test_deleting_a_whole_segment_breaks_the_chain(tmp_path):
    from sitsd.audit import verify_directory

    from sitsd.audit import audit_files

    for seq in range(3):
        log = AuditLog(tmp_path)
        log.append({"seq": seq})
        assert log.flush_housekeeping()
        log.close()
    assert [n for _, n in verify_directory(tmp_path)] == [1, 1, 1]
    audit_files(tmp_path)[1].unlink()
    with pytest.raises(ValueError, match="000003.*a segment in between was deleted"):
        verify_directory(tmp_path)
    audit_files(tmp_path)[0].unlink()  # and the oldest, without a retention record
    with pytest.raises(ValueError, match="000003.*:1: segment commands-000002.*no retention record"):
        verify_directory(tmp_path)


def test_fsync_policy_is_checked(tmp_path):
    with pytest.raises(ValueError, match="every, interval or never"):
        AuditLog(tmp_path, fsync="sometimes")
    log = AuditLog(tmp_path, fsync="every")
    log.append({"seq": 1})
    log.close()
    assert verify_chain(log.path) == 1


def test_interval_policy_fsyncs_the_last_record_when_no_further_record_comes(tmp_path, monkeypatch):
    """The written promise: under `interval` a power loss loses at most the last second, also when the
    commands stop after a record (before, it waited for the next record to fsync)."""
    import os
    import time

    import sitsd.audit as audit

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(audit.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    log = AuditLog(tmp_path, fsync="interval")
    try:
        fd = log._fh.fileno()
        time.sleep(1.1)  # past the interval: the next append fsyncs inline
        log.append({"seq": 1})
        inline = synced.count(fd)
        log.append({"seq": 2})  # within the second: left for the background flush
        assert synced.count(fd) == inline
        deadline = time.monotonic() + 10
        while synced.count(fd) == inline:  # no further record: the flusher must sync it
            assert time.monotonic() < deadline, "the last record was never fsynced"
            time.sleep(0.05)
    finally:
        log.close()
    assert verify_chain(log.path) == 2


# -- segments: rotation, zstd compression, retention ---------------------------------------------

def _fill(log, first_seq: int, n: int) -> None:
    for seq in range(first_seq, first_seq + n):
        log.append({"seq": seq, "frame_seq": seq, "values": [0.001 * seq], "failsafe": False,
                    "outcome": "acknowledged", "pad": "x" * 200})


def test_rotation_compresses_closed_segments_and_the_chain_runs_through_them(tmp_path):
    import zstandard

    from sitsd.audit import audit_files, read_records, verify_directory

    log = AuditLog(tmp_path, segment_max_mb=0.01)  # about 40 records per segment
    _fill(log, 1, 200)
    assert log.flush_housekeeping()
    log.close()
    files = audit_files(tmp_path)
    assert len(files) >= 5
    assert all(f.name.endswith(".jsonl.zst") for f in files[:-1]) and files[-1].name.endswith(".jsonl")
    assert log.compressed == len(files) - 1
    # one zstd frame with a content checksum per closed segment
    params = zstandard.get_frame_parameters(files[0].read_bytes())
    assert params.has_checksum
    assert sum(n for _, n in verify_directory(tmp_path)) == 200
    assert [r["seq"] for f in files for r in read_records(f)] == list(range(1, 201))
    # a restart continues the chain and the sequence numbers
    again = AuditLog(tmp_path, segment_max_mb=0.01)  # compresses the last plain segment in the background
    assert again.last_sequence == 200
    _fill(again, 201, 3)
    assert sum(n for _, n in verify_directory(tmp_path)) == 203  # while that may run: reads follow the rename
    assert again.flush_housekeeping()
    again.close()
    assert sum(n for _, n in verify_directory(tmp_path)) == 203


def test_a_modified_or_damaged_compressed_segment_is_named(tmp_path):
    import zstandard

    from sitsd.audit import audit_files, verify_directory

    log = AuditLog(tmp_path, segment_max_mb=0.01)
    _fill(log, 1, 100)
    assert log.flush_housekeeping()
    log.close()
    target = audit_files(tmp_path)[1]
    text = zstandard.ZstdDecompressor().decompress(target.read_bytes(), max_output_size=1 << 26).decode()
    target.write_bytes(zstandard.ZstdCompressor().compress(text.replace('"values":[0.0', '"values":[9.0', 1).encode()))
    with pytest.raises(ValueError, match=f"{target.name}:2: record .* was modified"):
        verify_directory(tmp_path)
    data = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(text.encode()))
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{target.name}.*(damaged|modified|chain broken|not an audit record)"):
        verify_directory(tmp_path)


def test_a_crash_mid_compression_leaves_a_complete_copy(tmp_path):
    from sitsd.audit import audit_files, compress_segment, verify_directory

    log = AuditLog(tmp_path, segment_max_mb=0.01)
    _fill(log, 1, 60)
    assert log.flush_housekeeping()
    log.close()
    closed = audit_files(tmp_path)[0]
    # the two crash windows: a partial temporary file, and both copies after the rename
    plain = closed.with_name(closed.name.removesuffix(".zst"))
    import zstandard

    plain.write_bytes(zstandard.ZstdDecompressor().decompress(closed.read_bytes(), max_output_size=1 << 26))
    (tmp_path / (plain.name + ".zst.tmp")).write_bytes(b"partial")
    restarted = AuditLog(tmp_path, segment_max_mb=0.01)
    assert restarted.flush_housekeeping()
    restarted.close()
    assert not list(tmp_path.glob("*.tmp")) and not plain.exists() and closed.exists()
    assert sum(n for _, n in verify_directory(tmp_path)) == 60
    assert compress_segment  # the function the housekeeping thread uses is public for operators' tools


def test_retention_removes_old_segments_with_a_record_and_verify_accepts_only_that(tmp_path):
    from sitsd.audit import audit_files, verify_directory

    log = AuditLog(tmp_path, segment_max_mb=0.01, max_total_mb=0.012)
    _fill(log, 1, 400)
    assert log.flush_housekeeping()
    log.close()
    files = audit_files(tmp_path)
    assert log.removed, "nothing was removed"
    assert int(files[0].name[9:15]) > 1  # the oldest segments are gone
    assert sum(f.stat().st_size for f in files) < 0.02 * 1024 * 1024
    results = verify_directory(tmp_path)  # the first remaining segment links to a removed one: by policy
    assert results and all(n >= 0 for _, n in results)
    # removing one more by hand is caught
    files[0].unlink()
    with pytest.raises(ValueError, match="no retention record"):
        verify_directory(tmp_path)


# -- the durable watermark (status audit_durable) -------------------------------------------------

def _on_disk(log) -> list[dict]:
    return [json.loads(line) for line in log.path.read_text().splitlines()]


def test_every_policy_makes_each_record_durable_before_the_next(tmp_path):
    log = AuditLog(tmp_path, fsync="every")
    try:
        for seq in (10, 11, 12):
            digest = log.append({"seq": seq, "outcome": "acknowledged"})
            d = log.durability()
            assert (d["records"], d["seq"], d["hash"], d["not_durable"]) == (seq - 9, seq, digest, 0)
            assert d["at_ns"] is not None and d["policy"] == "every"
            assert log.head_status() == {"records": seq - 9, "seq": seq, "hash": digest}
        assert _on_disk(log)[-1]["hash"] == log.durability()["hash"]
    finally:
        log.close()


def test_never_policy_says_so_and_counts_what_is_not_on_disk(tmp_path):
    log = AuditLog(tmp_path, fsync="never")
    try:
        for seq in range(1, 6):
            log.append({"seq": seq, "outcome": "acknowledged"})
        d = log.durability()
        assert d["policy"] == "never" and "no fsync per record" in d["promise"]
        assert (d["records"], d["seq"], d["at_ns"]) == (0, None, None)  # nothing fsynced by this process yet
        assert d["not_durable"] == 5 and d["head_records"] == 5 and d["head_seq"] == 5
        with log.lock:  # an anchor record (audit.anchor tpm) is fsynced even under never: the mark moves
            anchored = log.write_typed_locked({"type": "anchor_test"})
        d = log.durability()
        assert (d["records"], d["seq"], d["hash"], d["not_durable"]) == (5, 5, anchored, 0)
        log.append({"seq": 6, "outcome": "acknowledged"})
        assert log.durability()["not_durable"] == 1 and log.durability()["seq"] == 5
    finally:
        log.close()
    d = log.durability()  # the close fsyncs the rest
    assert (d["records"], d["seq"], d["not_durable"]) == (6, 6, 0)
    assert d["hash"] == _on_disk(log)[-1]["hash"]


def test_interval_policy_watermark_catches_up_with_the_head(tmp_path):
    from ..conftest import wait_for

    log = AuditLog(tmp_path, fsync="interval")
    try:
        for seq in range(1, 4):
            log.append({"seq": seq, "outcome": "acknowledged"})
        d = wait_for(lambda d: d["records"] == 3, 20, "the flusher to fsync the records", log.durability)
        assert d["seq"] == 3 and d["not_durable"] == 0 and d["hash"] == log.head == _on_disk(log)[-1]["hash"]
        assert d["records"] <= d["head_records"]
    finally:
        log.close()


def test_rotation_keeps_the_watermark_on_the_last_record(tmp_path):
    log = AuditLog(tmp_path, fsync="never", segment_max_mb=0.001)  # ~1 KB segments: rotation every few records
    try:
        _fill(log, 1, 20)
        assert log.flush_housekeeping()
        from sitsd.audit import audit_files, read_records

        closed = [r for f in audit_files(tmp_path) if f.name != log.path.name for r in read_records(f)]
        assert len(audit_files(tmp_path)) > 2 and closed
        d = log.durability()
        # each rotation fsynced the segment it closed: every record in a closed segment is durable, and those in
        # the open one are counted as not yet on disk
        assert d["records"] == len(closed) and d["seq"] == closed[-1]["seq"]
        assert d["not_durable"] == 20 - len(closed) == len(read_records(log.path))
    finally:
        log.close()
    assert log.durability()["records"] == 20


# -- damage is not a crash cut; the clean-stop marker; reordering; show ----------------------------

def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from sitsd.cli import main

    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _commands(n: int, tmp_path, **kw):
    log = AuditLog(tmp_path, **kw)
    for seq in range(1, n + 1):
        log.append({"seq": seq, "frame_seq": seq, "values": [0.5 * seq], "failsafe": False, "sent_ns": seq,
                    "outcome": "acknowledged", "model_sha256": "ab" * 32, "input_sha256": "cd" * 32,
                    "envelope": "a1b2c3", "proof": {"id": f"p{seq}", "proof": f"/proofs/p{seq}.proof.json"}})
    return log


def _garble(path, lineno: int) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[lineno - 1] = lines[lineno - 1][:40] + b"\x00garbled"
    path.write_bytes(b"\n".join(lines))


def test_a_damaged_record_is_not_a_crash_cut_the_restart_keeps_and_names_it(tmp_path, capsys):
    """The review's repro: 10 records, line 4 garbled. Before the fix the restart took it for a crash cut, linked
    to line 3 and `verify` said "chain intact, 3 records": 7 acknowledged records dropped without a word."""
    from sitsd.audit import audit_files, read_entries, segment_header, verify_directory

    first = _commands(10, tmp_path)
    first.close()
    _garble(first.path, 4)  # line 1 is the header: the record of seq 3
    rc, _, err = _cli(capsys, "audit", "verify", str(tmp_path))
    assert rc == 1 and f"{first.path.name}:4: not an audit record" in err

    last_hash = json.loads(first.path.read_bytes().splitlines()[-1])["hash"]  # its close record
    second = AuditLog(tmp_path)  # the restart
    damage = second.start_damage
    assert damage is not None and second.start_cut is None
    assert (damage["file"], damage["line"]) == (str(first.path), 4) and "not an audit record" in damage["damage"]
    assert f"{first.path}:4" in damage["message"] and "(8 line(s))" in damage["message"]
    assert second.last_sequence == 10  # the sequence numbers after the damage count (the PLC's replay check)
    second.append({"seq": 11, "outcome": "acknowledged"})
    second.close()
    header = segment_header(second.path)
    assert header["previous_damaged_at_line"] == 4 and header["previous_lines"] == 12
    assert "previous_cut_after_lines" not in header and header["previous_closed"] is True
    # the chain goes on from the last record of the damaged segment (its close record), not from line 3
    assert header["prev"] == last_hash
    # every record after the damage is still there, and verify keeps failing on the damaged one
    assert second.flush_housekeeping()  # the damaged segment is compressed (bytes as they are)
    kept = [b["seq"] for _, b, e in read_entries(audit_files(tmp_path)[0]) if e is None and "type" not in b]
    assert kept == [1, 2, 4, 5, 6, 7, 8, 9, 10]
    with pytest.raises(ValueError, match=rf"{first.path.name}(\.zst)?:4: not an audit record.*recorded it in "
                                         rf"{second.path.name}:1 \(previous_damaged_at_line 4\)"):
        verify_directory(tmp_path)
    rc, out, err = _cli(capsys, "audit", "verify", str(tmp_path))
    assert rc == 1 and re.search(rf"{first.path.name}(\.zst)?:4: not an audit record", err)
    assert "chain intact" not in out
    # later starts do not bury it: the damaged segment is no longer the newest (and compressed), verify names it
    third = AuditLog(tmp_path)
    assert third.flush_housekeeping()
    third.close()
    assert len(audit_files(tmp_path)) == 3 and audit_files(tmp_path)[0].name == first.path.name + ".zst"
    rc, _, err = _cli(capsys, "audit", "verify", str(tmp_path))
    assert rc == 1 and f"{first.path.name}.zst:4: not an audit record" in err


def test_recorded_damage_that_later_verifies_is_reported_as_a_change(tmp_path):
    from sitsd.audit import verify_directory

    first = _commands(3, tmp_path)
    first.close()
    original = first.path.read_bytes()
    _garble(first.path, 2)
    second = AuditLog(tmp_path)  # compresses the damaged segment in the background
    assert second.flush_housekeeping()
    second.close()
    import zstandard

    compressed = first.path.with_name(first.path.name + ".zst")
    compressed.write_bytes(zstandard.ZstdCompressor().compress(original))  # "repaired" by hand since
    with pytest.raises(ValueError, match="damaged at line 2 at its start.*verifies now: it was changed since"):
        verify_directory(tmp_path)


def test_a_modified_or_reordered_record_is_damage_at_start_too(tmp_path):
    first = _commands(5, tmp_path)
    first.close()
    lines = first.path.read_text().splitlines(keepends=True)
    entry = json.loads(lines[2])
    entry["record"]["values"] = [9.0]  # still JSON: only the hash shows it
    first.path.write_text("".join(lines[:2] + [json.dumps(entry) + "\n"] + lines[3:]))
    second = AuditLog(tmp_path)
    second.close()
    assert second.start_damage["line"] == 3 and "modified" in second.start_damage["damage"]
    assert second.last_sequence == 5


def test_reordered_records_are_named(tmp_path, capsys):
    from sitsd.audit import verify_directory

    log = _commands(5, tmp_path)
    log.close()
    lines = log.path.read_text().splitlines(keepends=True)
    lines[2], lines[3] = lines[3], lines[2]  # seq 2 and seq 3 swapped
    log.path.write_text("".join(lines))
    with pytest.raises(ValueError, match=rf"{log.path.name}:3: chain broken: a record before it was deleted or "
                                         "reordered"):
        verify_chain(log.path)
    with pytest.raises(ValueError, match=":3: chain broken"):
        verify_directory(tmp_path)
    rc, _, err = _cli(capsys, "audit", "verify", str(tmp_path))
    assert rc == 1 and f"{log.path.name}:3: chain broken" in err


def test_a_cut_is_accepted_only_as_the_last_bytes_after_the_recorded_whole_lines(tmp_path):
    from sitsd.audit import segment_header, verify_directory

    first = _commands(4, tmp_path)
    first.close()
    data = _without_close(first.path)
    first.path.write_bytes(data[:-9])  # a torn final write: the only thing a crash leaves
    second = AuditLog(tmp_path)
    second.close()
    header = segment_header(second.path)
    assert header["previous_cut_after_lines"] == 4 and header["previous_closed"] is False
    assert second.start_damage is None and second.start_cut == {"file": first.path.name, "after_lines": 4}
    assert [n for _, n in verify_directory(tmp_path)] == [3, 0]
    # the cut must be where the header says: after exactly 4 whole lines, as the file's last bytes
    with pytest.raises(ValueError, match="after 4 whole lines, but the next segment's header recorded the cut "
                                         "after line 3"):
        verify_chain(first.path, cut_after_lines=3)
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(data)
    with pytest.raises(ValueError, match="ends on a whole record at line 5, but the next segment's header recorded "
                                         "a cut after line 5"):
        verify_chain(whole, cut_after_lines=5)
    garbled = tmp_path / "garbled.jsonl"  # a bad whole line followed by more lines is never a cut
    garbled.write_bytes(data)
    _garble(garbled, 3)
    with pytest.raises(ValueError, match=":3: not an audit record"):
        verify_chain(garbled, allow_cut=True)


def test_damage_followed_by_a_torn_last_line_is_damage(tmp_path):
    from sitsd.audit import segment_header, verify_directory

    first = _commands(6, tmp_path)
    first.close()
    first.path.write_bytes(_without_close(first.path)[:-9])
    _garble(first.path, 3)
    second = AuditLog(tmp_path)
    second.close()
    header = segment_header(second.path)
    assert header["previous_damaged_at_line"] == 3 and header["previous_cut_after_lines"] == 6
    assert second.start_damage["line"] == 3 and second.last_sequence == 5
    with pytest.raises(ValueError, match=rf"{first.path.name}(\.zst)?:3: not an audit record"):
        verify_directory(tmp_path)


def test_a_garbled_last_line_with_its_newline_is_damage_not_a_cut(tmp_path):
    first = _commands(3, tmp_path)
    first.close()
    _garble(first.path, 5)  # the close record, newline kept
    second = AuditLog(tmp_path)
    second.close()
    assert second.start_damage["line"] == 5 and second.start_cut is None


def test_a_clean_close_ends_the_segment_with_a_close_record_and_the_next_header_says_so(tmp_path):
    from sitsd.audit import read_records, segment_header, segment_tail

    log = _commands(3, tmp_path)
    log.close()
    last = json.loads(log.path.read_text().splitlines()[-1])["record"]
    assert last["type"] == "close" and last["records"] == 3 and last["last_seq"] == 3
    assert verify_chain(log.path) == 3 and [r["seq"] for r in read_records(log.path)] == [1, 2, 3]
    assert segment_tail(log.path)["closed"] and segment_tail(log.path)["seq"] == 3
    second = AuditLog(tmp_path)
    second.close()
    assert segment_header(second.path)["previous_closed"] is True
    second.path.write_bytes(_without_close(second.path))  # as a kill -9 leaves it
    third = AuditLog(tmp_path)
    third.close()
    assert segment_header(third.path)["previous_closed"] is False and third.start_damage is None


def test_verify_says_when_the_newest_records_are_not_covered(tmp_path, capsys):
    log = _commands(3, tmp_path)  # a running daemon: its live segment has no close record yet
    try:
        rc, out, _ = _cli(capsys, "audit", "verify", str(tmp_path))
        assert rc == 0 and "chain intact" in out
        assert "caveat: the newest records are not covered" in out and "a cut of the tail would not show" in out
        assert "audit_head" in out and "audit.anchor: tpm" in out
        with log.lock:  # an anchor after the newest command record covers them (audit.anchor: tpm; --tpm checks)
            log.write_typed_locked({"type": "anchor", "counter": 1, "nv_index": "0x01a0d170", "reason": "test",
                                    "t_ns": 1})
        rc, out, _ = _cli(capsys, "audit", "verify", str(tmp_path))
        assert rc == 0 and "caveat" not in out and "newest anchor: counter 1" in out
        log.append({"seq": 4, "outcome": "acknowledged"})
    finally:
        log.close()
    rc, out, _ = _cli(capsys, "audit", "verify", str(tmp_path))
    assert rc == 0 and "caveat" not in out and "newest segment closed cleanly" in out
    # a cut of the tail of a cleanly closed log takes the close record with it: that shows
    lines = log.path.read_bytes().splitlines(keepends=True)
    log.path.write_bytes(b"".join(lines[:-3]))  # close, seq 4 and the anchor before it
    rc, out, _ = _cli(capsys, "audit", "verify", str(tmp_path))
    assert rc == 0 and "chain intact" in out and "caveat: the newest records are not covered" in out
    # after a crash the next segment's header says the previous run did not stop cleanly
    AuditLog(tmp_path).close()
    rc, out, _ = _cli(capsys, "audit", "verify", str(tmp_path))
    assert rc == 0 and f"note: {log.path.name} before it ended without a clean stop" in out


def test_show_names_a_damaged_line_and_goes_on_and_full_prints_the_references(tmp_path, capsys):
    log = _commands(4, tmp_path)
    log.close()
    rc, out, err = _cli(capsys, "audit", "show", str(tmp_path), "--full")
    assert rc == 0 and out.count("acknowledged") == 4
    assert f"model {'ab' * 32}  input {'cd' * 32}" in out and "proof p2 (/proofs/p2.proof.json)" in out
    assert "envelope a1b2c3" in out and f"{log.path.name}:3" in out
    _garble(log.path, 3)
    rc, out, err = _cli(capsys, "audit", "show", str(tmp_path))
    assert rc == 1 and "Traceback" not in err
    assert f"{log.path}:3: not an audit record" in err
    assert [line.split()[1] for line in out.splitlines()] == ["1", "3", "4"]  # the others are shown
    assert "envelope" not in out
    rc, out, err = _cli(capsys, "audit", "show", str(tmp_path), "--last", "2")
    assert rc == 0 and [line.split()[1] for line in out.splitlines()] == ["3", "4"]
