"""Roles on the control socket, decided from the peer's kernel credentials (SO_PEERCRED)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sitsd.control import RawJsonString, encode_answer

from ..conftest import EXAMPLE_CONFIG, REPO, random_suffix, sitsd_args, wait_ready

NOBODY = 65534


def _as_user(socket_path, command: str, uid: int, gid: int) -> dict:
    """Run a control request in a child process that dropped to uid/gid (root can)."""
    code = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(REPO)!r})
        from sitsd.control import request  # imported before dropping: the venv may not be readable for nobody
        from sitsd.errors import ControlError
        os.setgroups([]); os.setgid({gid}); os.setuid({uid})
        try:
            print(json.dumps(request({str(socket_path)!r}, {command!r})))
        except ControlError as exc:
            print(json.dumps({{"error": str(exc)}}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def operators_group():
    name = f"sitsop{random_suffix()}"
    r = subprocess.run(["groupadd", "--system", name], capture_output=True, text=True)
    assert r.returncode == 0, f"groupadd: {r.stderr} (the test needs root)"
    try:
        import grp

        yield name, grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


def test_viewers_read_operators_change(plcsim, tmp_path, operators_group):
    import shutil
    import tempfile
    from pathlib import Path

    group, gid = operators_group
    reachable = Path(tempfile.mkdtemp(prefix="sits-ctl-"))  # pytest's tmp dirs are private to root
    reachable.chmod(0o755)
    audit, control = tmp_path / "audit", reachable / "c.sock"
    endpoint, udp_url, _ = plcsim(audit / "signer.pub.pem")
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__mode="software", plc__security="none", audit__directory=audit,
                                       control__socket=control, control__operator_group=group),
                            stderr=open(tmp_path / "log", "wb"), cwd=REPO)
    try:
        wait_ready(proc, tmp_path / "log")
        os.chmod(control, 0o666)  # let an unprivileged user reach the socket; roles decide the rest
        viewer_status = _as_user(control, "status", NOBODY, NOBODY)
        assert viewer_status.get("state") == "running"
        head = viewer_status["audit_head"]  # what monitoring records to catch a cut of the newest records
        assert head["records"] >= 1 and len(head["hash"]) == 64
        refused = _as_user(control, "reload", NOBODY, NOBODY)
        assert "needs the operator role" in refused["error"] and f"not in group {group}" in refused["error"]
        allowed = _as_user(control, "reload", NOBODY, gid)  # same user, now in the operators' group
        assert "error" not in allowed, allowed
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        shutil.rmtree(reachable, ignore_errors=True)
    written = "".join(f.read_text() for f in audit.glob("commands-*.jsonl"))
    assert f'"hash":"{head["hash"]}"' in written  # the head was a real record of the chain
    log = (tmp_path / "log").read_text()
    assert '"command": "reload"' in log and f"uid {NOBODY}" in log  # who changed what is in the journal


def test_access_rules_without_a_daemon():
    from sitsd.control import READ_ONLY, ControlAccess, Peer

    access = ControlAccess(None)
    assert access.check("status", Peer(1, NOBODY, NOBODY)) is None
    assert "no control.operator_group is configured" in access.check("update", Peer(1, NOBODY, NOBODY))
    assert access.check("update", Peer(1, 0, 0)) is None  # root
    assert access.check("stop", Peer(1, os.geteuid(), 0)) is None  # the daemon's own user
    missing = ControlAccess("no-such-group-sits")
    assert "does not exist" in missing.check("rollback", Peer(1, NOBODY, NOBODY))
    assert {"status", "events"} <= READ_ONLY and "reload" not in READ_ONLY
    # no peer credentials: read-only commands only (fail closed)
    assert access.check("status", None) is None
    assert "did not report the peer's credentials" in access.check("update", None)


# --- answers with pre-encoded strings (the `events` answer's base64 columns) ------------------------------------

_B64 = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", max_size=40)
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                  st.text(max_size=30), st.sampled_from(["sitsraw-0", "sitsraw-00-0", '"sitsraw-x-1"', "\x00"]),
                  _B64.map(lambda s: ("raw", s)))
_ANSWER = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                       max_leaves=25)


def _split(value):
    """(what the handler returns, what the client must read): ("raw", s) leaves become RawJsonString / s."""
    if isinstance(value, tuple):
        return RawJsonString(value[1].encode()), value[1]
    if isinstance(value, dict):
        pairs = {k: _split(v) for k, v in value.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(value, list):
        pairs = [_split(v) for v in value]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    return value, value


@settings(max_examples=300, deadline=None)
@given(body=st.dictionaries(st.text(max_size=8), _ANSWER, max_size=5))
def test_encode_answer_splices_raw_strings_and_is_plain_json_otherwise(body):
    answer, expected = _split(body)
    line = encode_answer(answer)
    assert b"\n" not in line
    assert json.loads(line) == expected
    if answer == expected:  # nothing raw: exactly what json.dumps writes
        assert line == json.dumps(answer).encode()


def test_the_socket_answers_every_bad_request_and_goes_on(tmp_path, operators_group):
    """Malformed requests (a command that is not a string, JSON that is not an object, a line over the limit) and a
    handler that raises get an answer that says what was wrong; the connection serves the next request."""
    import asyncio
    import socket as socketlib

    from sitsd.control import READ_LIMIT, ControlAccess, recv_line, serve

    group, _ = operators_group
    path = tmp_path / "c.sock"

    def boom(_req):
        raise KeyError("missing piece")

    async def main():
        server = await serve(path, {"status": lambda req: {"state": "running"}, "boom": boom}, ControlAccess(group))

        def client():
            s = socketlib.socket(socketlib.AF_UNIX)
            s.connect(str(path))
            out = []
            for line in (b'{"command": ["status"]}\n', b'[1, 2]\n', b'{"command": "boom"}\n',
                         b'{"command": "status"}\n'):
                s.sendall(line)
                out.append(json.loads(recv_line(s)))
            s.sendall(b'{"command": "status", "pad": "' + b"x" * (READ_LIMIT + 10) + b'"}\n')
            out.append(json.loads(recv_line(s)))
            out.append(recv_line(s))  # then closed
            s.close()
            return out

        try:
            return await asyncio.to_thread(client), os.stat(path)
        finally:
            server.close()
            await server.wait_closed()

    answers, st_ = asyncio.run(main())
    not_str, not_obj, raised, ok, too_long, closed = answers
    assert not not_str["ok"] and '"command" must be a string, got list' in not_str["error"], not_str
    assert not not_obj["ok"] and "bad request" in not_obj["error"], not_obj
    assert not raised["ok"] and "missing piece" in raised["error"], raised
    assert ok == {"ok": True, "state": "running"}
    assert not too_long["ok"] and f"longer than {READ_LIMIT} bytes" in too_long["error"], too_long
    assert closed == b""
    assert st_.st_mode & 0o777 == 0o660
