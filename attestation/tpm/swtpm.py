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
    def __init__(self, state_dir: str | os.PathLike | None = None) -> None:
        self._own_dir = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="sits-swtpm-"))
        self.socket_path = self.state_dir / "swtpm.sock"
        self.ctrl_path = self.state_dir / "swtpm.sock.ctrl"
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def tcti(self) -> str:
        return f"swtpm:path={self.socket_path}"

    def start(self, timeout_s: float = 10.0) -> "Swtpm":
        exe = shutil.which("swtpm")
        if exe is None:
            raise TpmError("swtpm is not installed (Debian: apt-get install swtpm swtpm-tools)")
        if len(str(self.socket_path)) > 100:
            raise TpmError(f"swtpm socket path {self.socket_path} is too long for a unix socket")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.state_dir / "swtpm.log", "ab")
        self._proc = subprocess.Popen(
            [exe, "socket", "--tpm2", "--tpmstate", f"dir={self.state_dir}",
             "--flags", "not-need-init,startup-clear",
             "--server", f"type=unixio,path={self.socket_path}",
             "--ctrl", f"type=unixio,path={self.ctrl_path}"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise TpmError(f"swtpm exited with {self._proc.returncode}; see {self.state_dir / 'swtpm.log'}")
            if self._connectable(self.ctrl_path) and self._connectable(self.socket_path):
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

    def stop(self) -> None:
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
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "Swtpm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
