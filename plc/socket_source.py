"""What the UDP and raw-Ethernet frame sources share: the receive buffer, decoding one UADP payload of
the configured layout into the reused values array, skipping other publishers, the counters, and
riding out a link that goes away.

A link going down is an operating condition, not a bug: a cable pulled, a switch rebooting, a
USB NIC re-enumerated. The socket then reports ENETDOWN (a packet socket, once), ENOBUFS, ENXIO
and the like; `receive()` counts these in `link_errors`, waits a little (never spinning while the
link is gone), returns None like a timeout, and checks the link every so often until frames come
back (re-binding or re-joining when the interface was re-created with a new index). Errors that
mean the socket itself is broken (EBADF, EFAULT, ...) still raise, as a TransportError that says so.
"""
from __future__ import annotations

import errno
import socket
import time

import numpy as np

from .errors import TransportError, UadpDecodeError
from .frame import Frame, RxStampSource
from .timestamps import HwStampSetup
from .uadp import FixedLayout

# errors a socket reports while its link is down, flapping or congested; all clear by themselves
TRANSIENT_ERRNOS = frozenset({
    errno.ENETDOWN, errno.ENETUNREACH, errno.ENETRESET, errno.EHOSTDOWN, errno.EHOSTUNREACH,
    errno.ENXIO, errno.ENODEV, errno.ENOBUFS, errno.ENOMEM, errno.ECONNREFUSED, errno.EAGAIN, errno.EINTR,
})
_BACKOFF_FIRST_S = 0.01
_BACKOFF_MAX_S = 1.0
_CHECK_DOWN_S = 0.5  # how often a link that reported an error is checked
_CHECK_QUIET_S = 1.0  # how often a link without frames for this long is checked (re-created interfaces)


def is_transient(exc: OSError) -> bool:
    return exc.errno in TRANSIENT_ERRNOS


class UadpSocketSource:
    def __init__(self, sock: socket.socket, layout: FixedLayout, publisher_id: int | None, writer_id: int | None,
                 buffer_size: int, where: str = "") -> None:
        self._sock = sock
        self.layout = layout
        self._publisher_id = publisher_id
        self._writer_id = writer_id
        self._buffer = bytearray(buffer_size)
        self._view = memoryview(self._buffer)
        self._values = np.zeros(layout.field_count, dtype=np.float64)
        self.malformed = 0
        self.foreign = 0
        self.last_error: UadpDecodeError | None = None
        self.where = where  # "<url> on <interface>", for messages
        self.link_errors = 0  # transient socket errors (link down, no buffer space): counted, not raised
        self.last_link_error: OSError | None = None
        self.link_recoveries = 0  # re-binds / re-joins after the interface came back with a new index
        self.link_down = False  # an error was seen and no frame has arrived since
        self.hw_stamps = HwStampSetup("", False, "not attempted", detail="hardware stamps not requested")
        self._backoff_s = 0.0
        self._last_frame = time.monotonic()
        self._next_check = 0.0

    def _frame(self, payload, rx_ns: int, source: RxStampSource, vlan_pcp: int = -1) -> Frame | None:
        """The Frame in `payload`, or None after counting it as malformed or from another publisher."""
        try:
            publisher_id, _group, writer_id, _net_seq, ds_seq, sent_ns = self.layout.decode_into(payload, self._values)
        except UadpDecodeError as exc:
            self.malformed += 1
            self.last_error = exc
            return None
        if (self._publisher_id is not None and publisher_id != self._publisher_id) or (
                self._writer_id is not None and writer_id != self._writer_id):
            self.foreign += 1
            return None
        self._last_frame = time.monotonic()
        if self.link_down:
            self.link_down = False
            self._backoff_s = 0.0
        return Frame(publisher_id, writer_id, ds_seq, sent_ns, rx_ns, source, self._values, vlan_pcp=vlan_pcp)

    def _socket_error(self, exc: OSError, timeout_s: float) -> None:
        """A recvmsg error: count and back off if the link is to blame, raise if the socket is."""
        if not is_transient(exc):
            raise TransportError(f"{self.where}: receiving failed: {exc} (not a link problem: the socket itself "
                                 "is unusable; the transport must be reopened, i.e. the daemon restarted)") from exc
        self.link_errors += 1
        self.last_link_error = exc
        self.link_down = True
        # a link that keeps failing (ENOBUFS in a loop) must not spin: 10 ms, 20 ms, ... 1 s between tries,
        # but never longer than the caller's timeout, so its loop (and the watchdog heartbeat) keeps turning
        self._backoff_s = min(self._backoff_s * 2, _BACKOFF_MAX_S) if self._backoff_s else _BACKOFF_FIRST_S
        time.sleep(min(self._backoff_s, max(timeout_s, 0.0)))
        self._next_check = 0.0  # check the link right away

    def _no_frame(self) -> None:
        """Before receive() returns None: look at the link when it failed, or has been quiet for a while."""
        now = time.monotonic()
        if now < self._next_check:
            return
        if self.link_down:
            self._next_check = now + _CHECK_DOWN_S
        elif now - self._last_frame >= _CHECK_QUIET_S:
            self._next_check = now + _CHECK_QUIET_S
        else:
            return
        try:
            if self._relink():
                self.link_recoveries += 1
        except OSError as exc:  # the interface is still gone: keep counting, try again later
            if not is_transient(exc) and exc.errno not in (errno.EADDRNOTAVAIL, errno.EINVAL):
                raise TransportError(f"{self.where}: cannot re-attach to the interface: {exc}") from exc
            self.last_link_error = exc
            self.link_down = True

    def _relink(self) -> bool:
        """Re-attach the socket if the interface came back as a new device; True if it did. Subclasses."""
        return False

    def link_status(self) -> dict:
        """The link counters, for status and metrics."""
        return {"link_errors": self.link_errors, "link_down": self.link_down, "link_recoveries": self.link_recoveries,
                "last_link_error": str(self.last_link_error) if self.last_link_error else None,
                "hw_stamps": self.hw_stamps.detail}

    def discard_pending(self) -> int:
        """Drop what was queued before the consumer was ready (it predates it); returns how many."""
        dropped = 0
        while True:
            try:
                self._sock.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)
                dropped += 1
            except (BlockingIOError, InterruptedError):
                return dropped
            except OSError as exc:
                if not is_transient(exc):
                    raise
                self.link_errors += 1
                self.last_link_error = exc
                return dropped

    def close(self) -> None:
        self._sock.close()
