"""Runs swtpm (a software TPM 2.0) on unix sockets in a private state directory.

Unix sockets avoid port races between parallel runs. stderr goes to a file: swtpm prints a
line per client disconnect, and an unread pipe would block it.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ..errors import TpmError


def swtpm_available() -> bool:
    return shutil.which("swtpm") is not None


class Swtpm:
    def __init__(self, state_dir: str | os.PathLike | None = None, *, tcp: bool = False) -> None:
        """`tcp`: serve on a free 127.0.0.1 port pair (data P, control P+1) instead of unix sockets, for
        `swtpm:host=127.0.0.1,port=P` TCTIs; a lost race for the ports is retried with another pair."""
        self.tcp = tcp
        self.port: int | None = None
        self._own_dir = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="sits-swtpm-"))
        self.socket_path = self.state_dir / "swtpm.sock"
        self.ctrl_path = self.state_dir / "swtpm.sock.ctrl"
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def tcti(self) -> str:
        if self.tcp:
            return f"swtpm:host=127.0.0.1,port={self.port}"
        return f"swtpm:path={self.socket_path}"

    @staticmethod
    def _free_port_pair() -> int:
        for _ in range(50):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))  # Linux hands out odd ports to bind(0): start at the next even one
                port = probe.getsockname()[1] + 1 & ~1
            if port + 1 > 65535 or port in (2320, 2321, 2322):
                continue
            with socket.socket() as a, socket.socket() as b:
                try:
                    a.bind(("127.0.0.1", port))
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
        raise TpmError("no free TCP port pair on 127.0.0.1 for swtpm")

    @staticmethod
    def _tcp_connectable(port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def start(self, timeout_s: float = 10.0) -> "Swtpm":
        if self.tcp:
            for _ in range(5):
                self.port = self._free_port_pair()
                try:
                    return self._start(timeout_s)
                except TpmError:
                    if self._proc is not None:  # startup failed: stop it before the next try
                        self.stop_process()
            raise TpmError(f"swtpm did not start on a TCP port pair in 5 tries; see {self.state_dir / 'swtpm.log'}")
        return self._start(timeout_s)

    def _start(self, timeout_s: float) -> "Swtpm":
        exe = shutil.which("swtpm")
        if exe is None:
            raise TpmError("swtpm is not installed (Debian: apt-get install swtpm swtpm-tools)")
        if len(str(self.socket_path)) > 100:
            raise TpmError(f"swtpm socket path {self.socket_path} is too long for a unix socket")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.state_dir / "swtpm.log", "ab")
        if self.tcp:
            sockets = ["--server", f"type=tcp,port={self.port},bindaddr=127.0.0.1",
                       "--ctrl", f"type=tcp,port={self.port + 1},bindaddr=127.0.0.1"]
        else:
            sockets = ["--server", f"type=unixio,path={self.socket_path}",
                       "--ctrl", f"type=unixio,path={self.ctrl_path}"]
        self._proc = subprocess.Popen(
            [exe, "socket", "--tpm2", "--tpmstate", f"dir={self.state_dir}",
             "--flags", "not-need-init,startup-clear", *sockets],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise TpmError(f"swtpm exited with {self._proc.returncode}; see {self.state_dir / 'swtpm.log'}")
            if self.tcp:
                if self._tcp_connectable(self.port + 1) and self._tcp_connectable(self.port):
                    return self
            elif self._connectable(self.ctrl_path) and self._connectable(self.socket_path):
                return self
            time.sleep(0.01)
        self.stop()
        raise TpmError(f"swtpm did not open its sockets within {timeout_s} s")

    @staticmethod
    def _connectable(path: Path) -> bool:
        if not path.exists():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(path))
                return True
            except OSError:
                return False

    def stop_process(self) -> None:
        """Stop swtpm, keep its state directory (a restart with the same state: persistent keys stay)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL: a power loss without TPM2_Shutdown (tests of dictionary-attack lockout); state stays."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.stop_process()

    def stop(self) -> None:
        self.stop_process()
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "Swtpm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
