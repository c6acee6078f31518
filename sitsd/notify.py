"""sd_notify in pure Python, never blocking: READY, STATUS, WATCHDOG, STOPPING, EXTEND_TIMEOUT_USEC.

systemd-python's notify holds the GIL while the socket is full; a plain sendto with
MSG_DONTWAIT only fails (and is counted) instead. Without NOTIFY_SOCKET every call is a no-op.
"""
from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET", "")
        self._address = ("\0" + addr[1:]) if addr.startswith("@") else addr
        self._sock: socket.socket | None = None
        if self._address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.failed = 0
        usec = int(env.get("WATCHDOG_USEC", "0") or 0)
        pid = env.get("WATCHDOG_PID")
        self.watchdog_usec = usec if usec > 0 and (not pid or int(pid) == os.getpid()) else 0

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, message: str, retry_s: float = 0.0) -> bool:
        """One datagram, never blocking. `retry_s`: for the once-per-life messages (READY, STOPPING),
        keep trying that long while the manager's queue is full (net.unix.max_dgram_qlen is small)."""
        if self._sock is None:
            return False
        deadline = time.monotonic() + retry_s
        while True:
            try:
                self._sock.sendto(message.encode(), socket.MSG_DONTWAIT, self._address)
                return True
            except BlockingIOError:  # full queue: drop a periodic message, retry a lifecycle one
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
            except OSError:  # manager gone
                break
        self.failed += 1
        return False

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1" + (f"\nSTATUS={status}" if status else ""), retry_s=0.5)

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def extend_timeout(self, seconds: float, status: str = "") -> bool:
        """EXTEND_TIMEOUT_USEC: the service manager waits at least `seconds` from now (before READY=1: for the
        start; it only ever extends TimeoutStartSec, never shortens it), with an optional STATUS= line. sitsd
        sends it while it waits on a TPM call whose own bound lies beyond what systemd would allow."""
        usec = max(1, int(seconds * 1e6))
        return self.send(f"EXTEND_TIMEOUT_USEC={usec}" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", retry_s=0.5)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
