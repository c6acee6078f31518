"""sitsd's log lines through a real systemd-journald, started in a private mount namespace (the host's
journal is untouched): the `<N>` prefix becomes PRIORITY and MESSAGE stays one JSON object."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import EXAMPLE_CONFIG, REPO

JOURNALD = Path("/lib/systemd/systemd-journald")

# a private journald: tmpfs over its runtime directories, then wait for its sockets
JOURNALD_UP = """
set -e
mount -t tmpfs tmpfs /run/systemd
mount -t tmpfs tmpfs /run/log
mkdir -p /run/systemd/journal
{journald} &
JPID=$!
for i in $(seq 200); do [ -S /run/systemd/journal/stdout ] && [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done
"""

SCRIPT = JOURNALD_UP + """systemd-cat --level-prefix=true -t sitsd {python} -m sitsd --config {config} --syslog-prefix \\
    --set attestation.mode=software --set plc.security=none --set plc.timeout_s=1 \\
    --set plc.endpoint=opc.tcp://127.0.0.1:9/none --set audit.directory={tmp}/audit \\
    --set control.socket={tmp}/c.sock --set metrics.port=0 || true
sleep 0.5
journalctl --directory=/run/log/journal -o json SYSLOG_IDENTIFIER=sitsd
kill $JPID
"""


def test_priorities_and_json_messages_in_a_real_journal(tmp_path):
    assert JOURNALD.exists() and shutil.which("systemd-cat") and shutil.which("unshare"), \
        "systemd-journald, systemd-cat and unshare come with Debian's systemd and util-linux"
    script = tmp_path / "journal.sh"
    script.write_text(SCRIPT.format(journald=JOURNALD, python=sys.executable, config=EXAMPLE_CONFIG, tmp=tmp_path))
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", str(script)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    entries = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if not entries:
        pytest.fail(f"no journal entries; stdout {r.stdout[-500:]!r} stderr {r.stderr[-800:]!r}")
    by_event = {}
    for e in entries:
        message = json.loads(e["MESSAGE"])  # MESSAGE is exactly one JSON object, the prefix is gone
        by_event[message["event"]] = (e["PRIORITY"], message)
    assert by_event["software signing key"][0] == "4"  # warning
    priority, failed = by_event["startup failed"]
    assert priority == "3"  # error
    assert "cannot connect to the PLC at opc.tcp://127.0.0.1:9/none" in failed["error"]


NATIVE = JOURNALD_UP + """{python} -m sitsd --config {config} --log-target journal \\
    --set attestation.mode=software --set plc.security=none --set plc.timeout_s=1 \\
    --set plc.endpoint=opc.tcp://127.0.0.1:9/none --set audit.directory={tmp}/audit \\
    --set control.socket={tmp}/c.sock --set metrics.port=0 2>{tmp}/stderr || true
sleep 0.5
journalctl --directory=/run/log/journal -o json SYSLOG_IDENTIFIER=sitsd
kill $JPID
"""


def test_native_journal_entries_carry_one_field_per_event_field(tmp_path):
    """--log-target journal (the default when systemd connects stderr to the journal): entries go to
    journald's native socket with SITS_* fields, so journalctl can select by them."""
    script = tmp_path / "native.sh"
    script.write_text(NATIVE.format(journald=JOURNALD, python=sys.executable, config=EXAMPLE_CONFIG, tmp=tmp_path))
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", str(script)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    entries = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert entries, f"no journal entries; stderr {r.stderr[-800:]!r}"
    by_event = {e.get("SITS_EVENT"): e for e in entries}
    failed = by_event["startup failed"]
    assert failed["PRIORITY"] == "3" and "cannot connect to the PLC" in failed["SITS_ERROR"]
    assert json.loads(failed["MESSAGE"])["event"] == "startup failed"  # MESSAGE keeps the whole event
    assert by_event["software signing key"]["PRIORITY"] == "4" and "SITS_DETAIL" in by_event["software signing key"]
    assert (tmp_path / "stderr").read_text() == ""  # nothing fell back to stderr: journald took every entry
