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
    with pytest.raises(ValueError, match=":3: record 2 was modified"):
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
    assert ok.returncode == 0 and "OK, 3 records" in ok.stdout
    shown = subprocess.run([sys.executable, "-m", "sitsd.cli", "audit", "show", str(tmp_path), "--last", "2"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert shown.stdout.count("acknowledged") == 2
    data = log.path.read_bytes()
    log.path.write_bytes(data[:-10])  # power loss mid-write
    with pytest.raises(ValueError, match=":3: truncated record"):
        verify_chain(log.path)
    bad = subprocess.run([sys.executable, "-m", "sitsd.cli", "audit", "verify", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 1 and "truncated record" in bad.stderr
