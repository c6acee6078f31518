"""`sitsctl update`/`rollback` against a control socket that does not answer, or answers badly, and option
combinations that would be ignored: each ends with a message that says what happened and what to do."""
from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from sitsd import hotswap
from sitsd.cli import main
from sitsd.cli_update import UPDATE_TIMEOUT_S
from sitsd.control import recv_line, request
from sitsd.errors import ControlError


class FakeDaemon:
    """A real AF_UNIX control socket served by a thread: reads one request line per connection, records it, then
    does what `behaviour` says ("silent": keeps the connection open without answering, "close": closes it, or bytes:
    sends them and closes)."""

    def __init__(self, path: Path, behaviour) -> None:
        self.path, self.behaviour = path, behaviour
        self.requests: list[dict] = []
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(4)
        self._sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                self.requests.append(json.loads(recv_line(conn)))  # the protocol's framing, as sitsctl sends it
                if self.behaviour == "silent":
                    self._stop.wait(10)  # the client gives up first
                elif isinstance(self.behaviour, bytes):
                    conn.sendall(self.behaviour)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@pytest.fixture
def daemon():
    workdir = Path(tempfile.mkdtemp(prefix="sits-ctl-", dir="/tmp"))  # short: AF_UNIX paths stop at 108 bytes
    started: list[FakeDaemon] = []

    def start(behaviour) -> FakeDaemon:
        d = FakeDaemon(workdir / f"control{len(started)}.sock", behaviour)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()
    shutil.rmtree(workdir, ignore_errors=True)


def test_the_cli_waits_longer_than_the_daemons_bound_proof():
    """An update may wait PREP_QUEUE_S for another one's preparation, then prove for PROOF_TIMEOUT_S."""
    assert UPDATE_TIMEOUT_S > hotswap.PREP_QUEUE_S + hotswap.PROOF_TIMEOUT_S + 10


def test_an_update_without_an_answer_times_out_saying_it_may_still_be_applied(daemon, capsys):
    d = daemon("silent")
    t0 = time.monotonic()
    rc = main(["update", "--module", "/tmp/post_command.wat", "--socket", str(d.path), "--timeout", "0.5"])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2
    assert "no answer to 'update' within 0.5 s" in err and "may still be working on it" in err
    assert "may still be applied" in err and "sitsctl versions" in err and "--timeout" in err
    assert 0.4 < took < 5  # --timeout was used, not the 360 s default
    assert d.requests == [{"command": "update", "module": "/tmp/post_command.wat"}]


def test_a_rollback_without_an_answer_names_rollback_and_versions(daemon, capsys):
    d = daemon("silent")
    rc = main(["rollback", "--model", "--socket", str(d.path), "--timeout", "0.3"])
    err = capsys.readouterr().err
    assert rc == 2 and "no answer to 'rollback' within 0.3 s" in err and "sitsctl versions" in err
    assert d.requests == [{"command": "rollback", "model": True}]


def test_a_read_only_command_without_an_answer_does_not_talk_of_updates(daemon):
    d = daemon("silent")
    with pytest.raises(ControlError, match=r"no answer to 'status' within 0.3 s; sitsd may still be working") as e:
        request(d.path, "status", timeout_s=0.3)
    assert "update" not in str(e.value) and "versions" not in str(e.value)


def test_a_daemon_that_closes_without_answering_is_reported_not_a_json_traceback(daemon):
    d = daemon("close")
    with pytest.raises(ControlError, match=r"closed the connection without answering 'update' \(no answer at all\)"
                       ) as e:
        request(d.path, "update", timeout_s=2, config="/tmp/x.yaml", sha256="ab" * 32)
    assert "systemctl status sitsd" in str(e.value) and "journalctl -u sitsd" in str(e.value)
    assert d.requests == [{"command": "update", "config": "/tmp/x.yaml", "sha256": "ab" * 32}]


def test_a_truncated_answer_without_its_end_of_line_is_reported_as_closed(daemon, capsys):
    d = daemon(b'{"ok": true, "component": "mod')
    rc = main(["update", "--module", "/tmp/m.wat", "--socket", str(d.path), "--timeout", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "sitsd closed the connection without answering 'update' (30 bytes without the end of the line)" in err
    assert "Traceback" not in err


def test_a_truncated_json_line_is_reported_as_closed(daemon):
    d = daemon(b'{"ok": true, "compo\n')
    with pytest.raises(ControlError, match=r"closed the connection without answering 'rollback' \(20 bytes that are "
                                           r"not JSON: "):
        request(d.path, "rollback", timeout_s=2)


def test_a_json_line_that_is_not_an_object_is_reported_as_closed(daemon):
    d = daemon(b'[1, 2]\n')
    with pytest.raises(ControlError, match=r"without answering 'versions' \(a JSON list, not an object\)"):
        request(d.path, "versions", timeout_s=2)


def test_update_config_sends_its_sha256_and_prints_the_answer(daemon, capsys):
    answer = {"ok": True, "component": "config", "name": "sitsd.yaml", "sha256": "cd" * 32, "changed": ["gates"]}
    d = daemon(json.dumps(answer).encode() + b"\n")
    rc = main(["update", "--config", "/tmp/sitsd.yaml", "--sha256", "cd" * 32, "--socket", str(d.path)])
    out = capsys.readouterr().out
    assert rc == 0 and "config sitsd.yaml applied live" in out and "changed: gates" in out
    assert d.requests == [{"command": "update", "config": "/tmp/sitsd.yaml", "sha256": "cd" * 32}]


@pytest.mark.parametrize("argv, flag", [
    (["update", "--model", "/tmp/m.onnx", "--name", "pre_filter.wat"], "--model"),
    (["update", "--config", "/tmp/c.yaml", "--name", "pre_filter.wat"], "--config"),
])
def test_update_name_without_module_is_refused(daemon, capsys, argv, flag):
    d = daemon("close")
    with pytest.raises(SystemExit) as e:
        main(argv + ["--socket", str(d.path)])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"--name picks the loaded module that --module replaces; it does not apply to {flag}" in err
    assert "usage: " in err and "drop --name" in err
    time.sleep(0.1)
    assert d.requests == []  # refused before anything was sent


@pytest.mark.parametrize("extra, flag", [
    (["--module", "pre_filter.wat"], "--module pre_filter.wat"),
    (["--model"], "--model"),
    (["--config"], "--config"),
])
def test_rollback_force_with_a_component_is_refused(daemon, capsys, extra, flag):
    d = daemon("close")
    with pytest.raises(SystemExit) as e:
        main(["rollback", "--force", *extra, "--socket", str(d.path)])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"--force applies only to a whole-set rollback, not to {flag}" in err and "drop --force" in err
    time.sleep(0.1)
    assert d.requests == []


def test_update_name_with_module_and_rollback_force_alone_are_sent(daemon, capsys):
    d = daemon(b'{"ok": false, "error": "nothing to roll back to"}\n')
    assert main(["update", "--module", "/tmp/a.wat", "--name", "pre_filter.wat", "--socket", str(d.path)]) == 2
    assert main(["rollback", "--force", "--socket", str(d.path)]) == 2
    err = capsys.readouterr().err
    assert err.count("sitsd answered: nothing to roll back to") == 2
    assert d.requests == [{"command": "update", "module": "/tmp/a.wat", "name": "pre_filter.wat"},
                          {"command": "rollback", "force": True}]


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_timeout_must_be_positive_seconds(capsys, value):
    with pytest.raises(SystemExit) as e:
        main(["rollback", "--timeout", value, "--socket", "/tmp/nowhere.sock"])
    assert e.value.code == 2 and "is not a number of seconds above 0" in capsys.readouterr().err
