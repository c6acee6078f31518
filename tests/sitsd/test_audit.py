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
    with pytest.raises(ValueError, match=":3: record was modified"):
        verify_chain(edited)

    dropped = tmp_path / "dropped.jsonl"
    dropped.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    with pytest.raises(ValueError, match=":2: chain broken"):
        verify_chain(dropped)
