import json

import pytest

from sitsd.audit import AuditLog, verify_chain


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
    data = log.path.read_bytes()
    log.path.write_bytes(data[:-10])  # power loss mid-write
    with pytest.raises(ValueError, match=":4: truncated record"):
        verify_chain(log.path)
    bad = subprocess.run([sys.executable, "-m", "sitsd.cli", "audit", "verify", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 1 and "truncated record" in bad.stderr


def test_segments_chain_across_restarts_and_name_a_crash_cut(tmp_path):
    from sitsd.audit import read_records, verify_directory

    first = AuditLog(tmp_path)
    for seq in range(3):
        first.append({"seq": seq, "outcome": "acknowledged"})
    first.close()
    first.path.write_bytes(first.path.read_bytes()[:-7])  # kill -9 while writing the last record
    second = AuditLog(tmp_path)  # the restart: links to the last whole record and names the cut
    second.append({"seq": 3, "outcome": "acknowledged"})
    second.close()
    results = verify_directory(tmp_path)
    assert [n for _, n in results] == [2, 1]
    assert [r["seq"] for r in read_records(second.path)] == [3]

    # with the segment that vouched for the cut deleted, the cut itself is the first bad record
    third = AuditLog(tmp_path)
    third.append({"seq": 4, "outcome": "acknowledged"})
    third.close()
    second.path.unlink()
    with pytest.raises(ValueError, match="000001.*truncated record"):
        verify_directory(tmp_path)


def test_deleting_a_whole_segment_breaks_the_chain(tmp_path):
    from sitsd.audit import verify_directory

    logs = []
    for seq in range(3):
        log = AuditLog(tmp_path)
        log.append({"seq": seq})
        log.close()
        logs.append(log)
    assert [n for _, n in verify_directory(tmp_path)] == [1, 1, 1]
    logs[1].path.unlink()
    with pytest.raises(ValueError, match="000003.*:1: chain broken"):
        verify_directory(tmp_path)


def test_fsync_policy_is_checked(tmp_path):
    with pytest.raises(ValueError, match="every, interval or never"):
        AuditLog(tmp_path, fsync="sometimes")
    log = AuditLog(tmp_path, fsync="every")
    log.append({"seq": 1})
    log.close()
    assert verify_chain(log.path) == 1
