"""The tolerant audit reader (`iter_records`, `read_records`, `iter_entries`): random damage of a segment never makes
it raise, it never returns a record that is not in the log as written, and what it does not return is reported with
the segment's file name, line, byte offset and reason. Plain segments: every record whose line the damage did not
touch is still returned. Compressed (zstd) segments: a damaged frame is reported as such; the records decompressed
before the damage are returned, each checked by its own hash. `sitsctl audit verify` keeps failing on damage."""
import json
import tempfile
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sitsd.audit import (AuditError, AuditLog, audit_files, compress_segment, iter_entries, iter_records,
                         read_records, verify_chain)

N_RECORDS = 40


def _segment(directory: Path, n: int = N_RECORDS) -> Path:
    log = AuditLog(directory)
    for seq in range(1, n + 1):
        log.append({"seq": seq, "frame_seq": seq, "values": [0.001 * seq, -1.5e-05 * seq], "failsafe": seq % 7 == 0,
                    "outcome": "acknowledged", "sent_ns": 1_700_000_000_000_000_000 + seq,
                    "envelope": f"{seq:064x}"})
    log.close()
    return log.path


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[bytes, list[dict], list[tuple[int, int]]]:
    """A closed plain segment: its bytes, every record body in order (header, commands, close) and each line's span
    [start, end) including its newline."""
    path = _segment(tmp_path_factory.mktemp("plain"))
    data = path.read_bytes()
    spans, at = [], 0
    for line in data.splitlines(keepends=True):
        spans.append((at, at + len(line)))
        at += len(line)
    return data, [json.loads(line)["record"] for line in data.splitlines()], spans


@pytest.fixture(scope="module")
def compressed(tmp_path_factory) -> tuple[bytes, list[dict]]:
    """The same kind of segment compressed as sitsd does it (one zstd frame with a content checksum), large enough
    for several zstd blocks."""
    directory = tmp_path_factory.mktemp("zst")
    path = compress_segment(_segment(directory, 1500))
    text = zstandard.ZstdDecompressor().decompress(path.read_bytes(), max_output_size=1 << 26)
    return path.read_bytes(), [json.loads(line)["record"] for line in text.splitlines()]


def _read(data: bytes, suffix: str) -> tuple[list[dict], list, int]:
    """The records and damage reports of a segment with these bytes, read three ways that must agree, and how many
    records come before the first report: those are the segment's lines 1 to k, every one of them returned."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"commands-000001-20261201T000000Z-1.jsonl{suffix}"
        path.write_bytes(data)
        damage = []
        records = list(iter_records(path, damage.append, typed=True))
        assert [str(x) for x in damage] == [str(x) for x in read_records(path, typed=True).damage]
        entries = list(iter_entries(path))
        assert [b for _, b, _ in entries if b is not None] == records
        assert [x for _, _, x in entries if x is not None] == damage
        before = [b for n, b, _ in entries if b is not None and (not damage or n < damage[0].line)]
        assert [n for n, b, _ in entries if b is not None and b in before] == list(range(1, len(before) + 1))
        return records, damage, len(before)


def _is_subsequence(part: list, whole: list) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


PLAIN_KINDS = {"not_a_record", "modified", "cut"}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_one_damaged_byte_of_a_plain_segment_loses_only_its_line_and_is_reported(plain, data):
    raw, bodies, spans = plain
    pos = data.draw(st.integers(0, len(raw) - 1), label="position")
    new = data.draw(st.integers(0, 255), label="byte")
    assume(new != raw[pos])
    damaged = bytearray(raw)
    damaged[pos] = new
    records, damage, k = _read(bytes(damaged), "")
    assert records[:k] == bodies[:k]

    hit = next(i for i, (a, b) in enumerate(spans) if a <= pos < b)
    touched = {hit} | ({hit + 1} if raw[pos] == 0x0A and hit + 1 < len(spans) else set())  # a newline joins two
    untouched = [b for i, b in enumerate(bodies) if i not in touched]
    assert _is_subsequence(records, bodies)  # nothing returned that was not written, in order
    assert _is_subsequence(untouched, records)  # every line the damage did not touch is still returned
    missing = [b for b in bodies if b not in records]
    if missing:  # what is not returned is reported, at the damaged line, with the file, line and byte offset
        assert damage and {d.kind for d in damage} <= PLAIN_KINDS, damage
        first = damage[0]
        assert first.line == hit + 1 and first.offset == spans[hit][0], (first, hit, pos)
        assert first.file.startswith("commands-000001-") and str(first).startswith(f"{first.file}:{hit + 1} (byte ")
    else:  # a change JSON reads back to the same record (1e-05 -> 1E-05): nothing lost, nothing to report
        assert records == bodies


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_damage_and_truncation_of_a_plain_segment_never_raise(plain, data):
    raw, bodies, spans = plain
    damaged = bytearray(raw)
    for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8), label="positions"):
        damaged[pos] = data.draw(st.integers(0, 255))
    end = data.draw(st.integers(0, len(raw)), label="truncated at")
    changed = [p for p in range(end) if damaged[p] != raw[p]]
    damaged = bytes(damaged[:end])
    records, damage, k = _read(damaged, "")
    assert records[:k] == bodies[:k]

    hit = {i for i, (a, b) in enumerate(spans) for p in changed if a <= p < b}
    hit |= {i + 1 for i, (a, b) in enumerate(spans) for p in changed if p == b - 1}  # a newline joined two lines
    whole = [i for i, (_, b) in enumerate(spans) if b <= end]  # lines the truncation left whole
    assert _is_subsequence(records, bodies)
    assert _is_subsequence([bodies[i] for i in whole if i not in hit], records)
    if any(bodies[i] not in records for i in whole):
        assert damage, "records lost without a report"
    if damaged and not damaged.endswith(b"\n"):  # the file ends mid-line: the partial line is reported as cut
        assert damage[-1].kind == "cut" and damage[-1].offset == damaged.rfind(b"\n") + 1
    assert {d.kind for d in damage} <= PLAIN_KINDS | {"chain"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_damage_of_a_compressed_segment_never_raises_and_returns_only_genuine_records(compressed, data):
    raw, bodies = compressed
    damaged = bytearray(raw)
    for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=3), label="positions"):
        damaged[pos] ^= data.draw(st.integers(1, 255))
    end = data.draw(st.one_of(st.just(len(raw)), st.integers(0, len(raw))), label="truncated at")
    damaged = bytes(damaged[:end])
    assume(damaged != raw)
    records, damage, k = _read(damaged, ".zst")
    assert records[:k] == bodies[:k]  # the records before the first report: the segment's first records
    hashes = {json.dumps(b, sort_keys=True) for b in bodies}
    assert all(json.dumps(r, sort_keys=True) in hashes for r in records)  # each one as written
    if not any(d.kind == "chain" for d in damage):
        assert _is_subsequence(records, bodies)
    # a damaged frame is named as such (not as a damaged JSON line): the last report says where reading stopped;
    # the frame's content checksum covers every decompressed byte, so any lost record comes with that report
    frame = [d for d in damage if d.kind == "frame"]
    if records != bodies:
        assert frame, f"records lost without a frame report: {[str(d) for d in damage]}"
    assert len(frame) <= 1 and (not frame or damage[-1] is frame[0])
    if frame:
        d = frame[0]
        assert d.file.endswith(".jsonl.zst") and "of the decompressed text" in str(d)
        assert "compressed segment is damaged" in d.reason and "zstd" in d.reason
        lines_read = len(records) + sum(1 for x in damage if x.kind in ("not_a_record", "modified", "cut"))
        assert d.line == lines_read + 1


def test_a_damaged_frame_keeps_the_records_before_the_damage(compressed):
    raw, bodies = compressed
    for where in (3 * len(raw) // 4, len(raw) - 2):  # late in the frame; its content checksum
        damaged = bytearray(raw)
        damaged[where] ^= 0x5A
        records, damage, k = _read(bytes(damaged), ".zst")
        assert records[:k] == bodies[:k]
        assert damage and damage[-1].kind == "frame" and "zstd" in damage[-1].reason
        assert _is_subsequence(records, bodies) and len(records) >= len(bodies) // 2
        assert records[:len(bodies) // 2] == bodies[:len(bodies) // 2]  # the first blocks: every record


def test_a_truncated_compressed_segment_is_a_damaged_frame_for_readers_and_verify(tmp_path, compressed):
    """A zstd stream reader reads a frame cut at a block boundary as a shorter, clean file; the reader does not."""
    raw, bodies = compressed
    path = tmp_path / "commands-000001-20261201T000000Z-1.jsonl.zst"
    for end in (len(raw) - 1, len(raw) // 2, 3, 0):
        path.write_bytes(raw[:end])
        got = read_records(path, typed=True)
        assert got == bodies[:len(got)] and got.damage[-1].kind == "frame", got.damage
        assert "ends early" in got.damage[-1].reason or "empty" in got.damage[-1].reason
        with pytest.raises(AuditError, match="compressed segment is damaged"):
            verify_chain(path)
        with pytest.raises(AuditError, match=rf"{path.name}:\d+ \(byte \d+ of the decompressed text\): compressed"):
            read_records(path, strict=True)


def test_damage_is_reported_with_file_line_and_offset_and_strict_raises(tmp_path):
    path = _segment(tmp_path, 6)
    original = path.read_bytes()
    lines = original.splitlines(keepends=True)
    offset = sum(len(x) for x in lines[:3])
    lines[3] = lines[3][:30] + b"\x00garbled\n"  # line 4: seq 3
    entry = json.loads(lines[5])
    entry["record"]["values"] = [9.0]  # line 6: seq 5, still JSON, hash no longer matches
    lines[5] = (json.dumps(entry) + "\n").encode()
    path.write_bytes(b"".join(lines) + b'{"hash": "to')  # and a torn final write
    seen = []
    records = read_records(path, seen.append)
    assert [r["seq"] for r in records] == [1, 2, 4, 6]
    assert [(d.kind, d.line) for d in seen] == [("not_a_record", 4), ("modified", 6), ("cut", 9)]
    assert seen == records.damage and seen[0].offset == offset and seen[0].path == str(path)
    assert str(seen[0]).startswith(f"{path.name}:4 (byte {offset}): not an audit record")
    assert "record 5 was modified" in seen[1].reason and "ends mid-line" in seen[2].reason
    with pytest.raises(AuditError, match=rf"{path.name}:4 \(byte {offset}\): not an audit record"):
        read_records(path, strict=True)
    with pytest.raises(AuditError, match=":4: not an audit record"):  # verify names the first bad record
        verify_chain(path, allow_cut=True)
    # only a torn final write: strict reading accepts what a crash leaves (reported, not raised)
    path.write_bytes(original + b'{"hash": "to')
    cut = []
    assert [r["seq"] for r in read_records(path, cut.append, strict=True)] == [1, 2, 3, 4, 5, 6]
    assert [(d.kind, d.line) for d in cut] == [("cut", 9)]


def test_a_deleted_record_is_a_chain_break_and_the_next_record_is_still_returned(tmp_path):
    path = _segment(tmp_path, 5)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3] + lines[4:]))  # seq 3 deleted by hand
    records = read_records(path)
    assert [r["seq"] for r in records] == [1, 2, 4, 5]
    assert [(d.kind, d.line) for d in records.damage] == [("chain", 4)]
    with pytest.raises(AuditError, match=":4 .*chain broken"):
        read_records(path, strict=True)
    entries = [(n, b is not None, d is not None) for n, b, d in iter_entries(path)]
    assert (4, True, True) in entries  # the intact record, with its chain damage


def test_audit_show_reads_past_a_damaged_segment_and_verify_still_fails(tmp_path, capsys):
    from sitsd.cli import main

    first = AuditLog(tmp_path, segment_max_mb=0.02)
    for seq in range(1, 301):
        first.append({"seq": seq, "frame_seq": seq, "values": [0.5], "outcome": "acknowledged", "sent_ns": seq})
    assert first.flush_housekeeping()
    first.close()
    files = audit_files(tmp_path)
    assert len(files) >= 3 and files[0].name.endswith(".zst")
    damaged = bytearray(files[0].read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    files[0].write_bytes(bytes(damaged))
    rc = main(["audit", "show", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in err
    assert f"{files[0]}:" in err and "compressed segment is damaged" in err and "of the decompressed text" in err
    later = [r["seq"] for f in files[1:] for r in read_records(f)]
    assert later and all(f"seq {seq:>8}" in out for seq in later)  # the segments after it are all shown
    rc = main(["audit", "verify", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 1 and files[0].name in err and "chain intact" not in out
