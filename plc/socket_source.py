"""What the UDP and raw-Ethernet frame sources share: the receive buffer, decoding one UADP payload of
the configured layout into the reused values array, skipping other publishers, and the counters."""
from __future__ import annotations

import socket

import numpy as np

from .errors import UadpDecodeError
from .frame import Frame, RxStampSource
from .uadp import FixedLayout


class UadpSocketSource:
    def __init__(self, sock: socket.socket, layout: FixedLayout, publisher_id: int | None, writer_id: int | None,
                 buffer_size: int) -> None:
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
        return Frame(publisher_id, writer_id, ds_seq, sent_ns, rx_ns, source, self._values, vlan_pcp=vlan_pcp)

    def discard_pending(self) -> int:
        """Drop what was queued before the consumer was ready (it predates it); returns how many."""
        dropped = 0
        while True:
            try:
                self._sock.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)
                dropped += 1
            except (BlockingIOError, InterruptedError):
                return dropped

    def close(self) -> None:
        self._sock.close()
