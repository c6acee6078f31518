"""What the UDP and raw-Ethernet frame sources share: the receive buffer, decoding one UADP payload of
the configured layout into the reused values array, skipping other publishers, writer groups and
writers, the counters, and riding out a link that goes away.

The compiled layout is the fast path. A message it refuses is not necessarily malformed: a publisher
may add a flag (PicoSeconds, a DataSetClassId, a status) or use DataValue field encoding. Such a
message is read as general UADP (`plc.uadp.decode`) when its headers name the configured publisher,
writer group and writer and it carries a key frame of exactly the configured number of numeric
fields; it is counted in `fallback_decodes` (the slow path costs 10-40 us instead of ~1 us, and
operators should see it is in use; `last_fallback_reason` says what the fast path refused).
Messages whose headers name another publisher, group or writer are counted in `foreign` after
reading just those headers (`header_ids`), so other traffic on the group never reaches the general
decoder; only messages up to `fallback_max_bytes` are decoded, so the cost per frame stays bounded.
Keep-alive messages of the configured writer (nothing new to send) are counted in `keep_alives` and
skipped. Everything else (not UADP, or ours but unusable) is counted in `malformed` with a UadpDecodeError.

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
import struct
import time

import numpy as np
from asyncua import ua

from .errors import TransportError, UadpDecodeError
from .frame import Frame, RxStampSource
from .timestamps import HwStampSetup
from .uadp import DataSetMessageType, FieldEncoding, FixedLayout, NetworkMessage, RawDoubleLayout, decode
from .uadp.fixed import header_ids, ns_from_datetime_ticks

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


def count_send_error(publisher, exc: OSError, where: str) -> None:
    """A publisher's failed send: a link that is down or congested is counted on the publisher
    (`send_errors`, `last_send_error`) and the caller carries on, as a PLC keeps publishing through a link
    flap; anything else means the socket is unusable and raises TransportError naming `where`."""
    if not is_transient(exc):
        raise TransportError(f"{where} failed: {exc}") from exc
    publisher.send_errors += 1
    publisher.last_send_error = exc


# Variant types the fallback turns into the loop's float64 values
_NUMERIC = frozenset({ua.VariantType.Boolean, ua.VariantType.SByte, ua.VariantType.Byte, ua.VariantType.Int16,
                      ua.VariantType.UInt16, ua.VariantType.Int32, ua.VariantType.UInt32, ua.VariantType.Int64,
                      ua.VariantType.UInt64, ua.VariantType.Float, ua.VariantType.Double})


class _Unusable(Exception):
    """A well-formed message for this source that the loop cannot use; the text says why."""


class UadpSocketSource:
    def __init__(self, sock: socket.socket, layout: FixedLayout | RawDoubleLayout, publisher_id: int | str | None,
                 writer_id: int | None, buffer_size: int, where: str = "", writer_group_id: int | None = None) -> None:
        self._sock = sock
        # blocking, with the kernel's own receive timeout (`receive_flags`): one GIL release per receive
        self._rcvtimeo_s: float | None = None
        self._timeval = "qq"  # struct timeval: two 64-bit fields, or two 32-bit ones on a 32-bit time_t ABI
        if sock is not None:  # None: a decoder only (tests)
            sock.settimeout(None)
            if len(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)) == 8:
                self._timeval = "ii"
        self.layout = layout
        self._publisher_id = publisher_id
        self._writer_id = writer_id
        self._writer_group_id = writer_group_id
        self._buffer = bytearray(buffer_size)
        self._view = memoryview(self._buffer)
        self._values = np.zeros(layout.field_count, dtype=np.float64)
        self.malformed = 0
        self.foreign = 0  # another publisher, writer group or writer (skipped)
        self.fallback_decodes = 0  # frames the fast path refused and the general decoder delivered
        self.keep_alives = 0  # keep-alive DataSetMessages of the configured writer (no data, skipped)
        self.last_fallback_reason: str | None = None  # what the fast path refused in the last of them
        self.last_error: UadpDecodeError | None = None
        # a fallback decode copies and parses the message: bound what a single frame may cost (DataValue
        # fields with timestamps are ~4x a Double Variant; headers add a few dozen bytes)
        self.fallback_max_bytes = max(1500, 4 * layout.size + 512)
        # RawData carries no types: the fallback reads it as the layout's configured field types
        self._raw_types = tuple(getattr(layout, "field_types", (ua.VariantType.Double,) * layout.field_count))
        self.where = where  # "<url> on <interface>", for messages
        # called right after the blocking receive returns, before the message is parsed: the control loop sets
        # its GIL switch interval back there (sitsd.pipeline.GilPriority), as early as Python code can
        self.after_wait = None
        self.link_errors = 0  # transient socket errors (link down, no buffer space): counted, not raised
        self.last_link_error: OSError | None = None
        self.link_recoveries = 0  # re-binds / re-joins after the interface came back with a new index
        self.link_down = False  # an error was seen and no frame has arrived since
        self.hw_stamps = HwStampSetup("", False, "not attempted", detail="hardware stamps not requested")
        self._backoff_s = 0.0
        self._last_frame = time.monotonic()
        self._next_check = 0.0

    def receive_flags(self, timeout_s: float) -> int:
        """The flags for the next `recvmsg_into`, which returns within `timeout_s` or raises BlockingIOError.

        The socket stays in blocking mode and the kernel keeps the timeout (SO_RCVTIMEO, set again only when
        it changes), so a receive is one system call and releases the GIL once. Python's own socket timeout
        polls first and receives after, releasing the GIL twice per frame: a thread that takes it in between
        (a preparing hot swap) holds the loop up. `bench/receive_gil.py` measures both with a Python thread that
        always wants the GIL (2-core VM, loop pinned: from the kernel's receive stamp to Python, p99 1.08 ms
        with this vs 1.36 ms; a bare-socket probe, unpinned: 300-480 us vs 610-720 us). The kernel rounds
        the timeout up to its tick (4 ms at HZ=250). `timeout_s` <= 0: a non-blocking receive (SO_RCVTIMEO 0
        would mean no timeout at all)."""
        if timeout_s <= 0:
            return socket.MSG_DONTWAIT
        if timeout_s != self._rcvtimeo_s:
            sec, usec = divmod(max(1, round(timeout_s * 1e6)), 1_000_000)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack(self._timeval, sec, usec))
            self._rcvtimeo_s = timeout_s
        return 0

    def _frame(self, payload, rx_ns: int, source: RxStampSource, vlan_pcp: int = -1) -> Frame | None:
        """The Frame in `payload`, or None after counting it as malformed or foreign (another publisher,
        writer group or writer). What the compiled layout refuses goes to `_fallback`."""
        try:
            publisher_id, group, writer_id, _net_seq, ds_seq, sent_ns = self.layout.decode_into(payload, self._values)
        except UadpDecodeError as exc:
            return self._fallback(payload, exc, rx_ns, source, vlan_pcp)
        if (self._publisher_id is not None and publisher_id != self._publisher_id) or (
                self._writer_id is not None and writer_id != self._writer_id) or (
                self._writer_group_id is not None and group != self._writer_group_id):
            self.foreign += 1
            return None
        self._last_frame = time.monotonic()
        if self.link_down:
            self.link_down = False
            self._backoff_s = 0.0
        return Frame(publisher_id, writer_id, ds_seq, sent_ns, rx_ns, source, self._values, vlan_pcp=vlan_pcp)

    def _malformed(self, exc: UadpDecodeError) -> None:
        self.malformed += 1
        self.last_error = exc

    def _fallback(self, payload, refused: UadpDecodeError, rx_ns: int, source: RxStampSource,
                  vlan_pcp: int) -> Frame | None:
        """A message the compiled layout refused (`refused`): foreign if its headers name another publisher,
        group or writer; decoded by the general decoder if it is ours and usable; malformed otherwise."""
        try:
            publisher_id, group, writer_ids = header_ids(payload)
        except UadpDecodeError as exc:  # not UADP at all
            self._malformed(exc)
            return None
        if (self._publisher_id is not None and publisher_id is not None and publisher_id != self._publisher_id) or (
                self._writer_group_id is not None and group is not None and group != self._writer_group_id) or (
                self._writer_id is not None and writer_ids is not None and self._writer_id not in writer_ids):
            self.foreign += 1
            return None
        if len(payload) > self.fallback_max_bytes:
            self._malformed(UadpDecodeError(
                f"{refused.reason}; at {len(payload)} bytes the message is too large for the general-decoder "
                f"fallback (at most {self.fallback_max_bytes} bytes for {self.layout.field_count} fields)",
                refused.offset))
            return None
        try:
            msg = decode(payload, self._raw_types)
        except UadpDecodeError as exc:
            self._malformed(UadpDecodeError(f"{exc.reason} (and the fast path refused it: {refused.reason} at byte "
                                            f"{refused.offset})", exc.offset))
            return None
        if self._only_keep_alives(msg):  # the publisher is alive with nothing new to say: not a fault
            self.keep_alives += 1
            return None
        try:
            writer_id, seq, sent_ns = self._usable(msg)
        except _Unusable as why:
            self._malformed(UadpDecodeError(f"{refused.reason}; read as general UADP it {why}", refused.offset))
            return None
        self.fallback_decodes += 1
        self.last_fallback_reason = f"{refused.reason} (byte {refused.offset})"
        self._last_frame = time.monotonic()
        if self.link_down:
            self.link_down = False
            self._backoff_s = 0.0
        return Frame(msg.publisher_id, writer_id, seq, sent_ns, rx_ns, source, self._values, vlan_pcp=vlan_pcp)

    def _only_keep_alives(self, msg: NetworkMessage) -> bool:
        """Keep-alive DataSetMessages (Part 14 §7.2.3.3.4: sent when a writer has no new data) from the configured
        writer, or a message of keep-alives only: skipped and counted, never malformed."""
        kinds = [(w, ds.message_type) for w, ds in zip(msg.dataset_writer_ids or [None] * len(msg.messages),
                                                        msg.messages)]
        mine = [k for w, k in kinds if self._writer_id is None or w == self._writer_id]
        return bool(mine) and all(k is DataSetMessageType.KEEP_ALIVE for k in mine)

    def _usable(self, msg: NetworkMessage) -> tuple[int, int, int]:
        """Write the configured writer's key-frame values into `_values`; (writer id, sequence, send ns).
        Raises _Unusable naming what the loop would lack."""
        if self._publisher_id is not None and msg.publisher_id is None:
            raise _Unusable(f"carries no PublisherId; the config filters on publisher_id {self._publisher_id!r}")
        if self._writer_group_id is not None and msg.writer_group_id is None:
            raise _Unusable(f"carries no WriterGroupId; the config filters on writer_group_id {self._writer_group_id}")
        ids = msg.dataset_writer_ids
        if ids is None:
            if self._writer_id is not None:
                raise _Unusable(f"has no PayloadHeader (DataSetWriterIds); the config filters on dataset_writer_id "
                                f"{self._writer_id}")
            index, writer_id = 0, 0
        elif self._writer_id is not None:
            index, writer_id = ids.index(self._writer_id), self._writer_id  # header_ids saw it there
        elif len(ids) == 1:
            index, writer_id = 0, ids[0]
        else:
            raise _Unusable(f"carries {len(ids)} DataSetMessages and no dataset_writer_id is configured to pick one")
        ds = msg.messages[index]
        if ds.message_type is not DataSetMessageType.KEY_FRAME:
            raise _Unusable(f"carries a {ds.message_type.name.lower().replace('_', '-')} DataSetMessage from writer "
                            f"{writer_id}; only key frames carry every field")
        if not ds.valid:
            raise _Unusable(f"marks writer {writer_id}'s DataSetMessage invalid (DataSetFlags1 bit 0)")
        seq = ds.sequence_number if ds.sequence_number is not None else msg.sequence_number
        if seq is None:
            raise _Unusable("carries no sequence number (DataSetMessage or GroupHeader); the timestamp gate needs one "
                            "to see loss and replays")
        ticks = ds.timestamp if ds.timestamp is not None else msg.timestamp
        if ticks is None:
            raise _Unusable("carries no timestamp (DataSetMessage or NetworkMessage); the timestamp gate needs the "
                            "send time")
        n = self.layout.field_count
        if len(ds.fields) != n:
            raise _Unusable(f"carries {len(ds.fields)} fields, the config declares {n} signals")
        values = self._values
        data_value = ds.field_encoding is FieldEncoding.DATA_VALUE
        for i, field in enumerate(ds.fields):
            if data_value:
                status = field.StatusCode
                if status is not None and not status.is_good():
                    raise _Unusable(f"has field {i} with status {status.name} (not Good)")
                field = field.Value
            if field is None or field.is_array or field.VariantType not in _NUMERIC:
                kind = "no value" if field is None else (
                    f"a {field.VariantType.name} array" if field.is_array else field.VariantType.name)
                raise _Unusable(f"has field {i} of {kind}; the loop needs numeric scalars")
            values[i] = field.Value
        return writer_id, seq, ns_from_datetime_ticks(ticks)

    def decode_status(self) -> dict:
        """The decode counters, for status and metrics."""
        return {"malformed": self.malformed, "foreign": self.foreign, "fallback_decodes": self.fallback_decodes,
                "keep_alives": self.keep_alives,
                "last_fallback_reason": self.last_fallback_reason,
                "last_error": str(self.last_error) if self.last_error else None}

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
