"""Sensor frames from an OPC UA subscription: one array variable holding the signals in order.

The asyncua client lives on the I/O thread; data-change notifications are turned into Frames
there and handed to the loop thread through a bounded queue (the newest frame wins when the
loop falls behind). OPC UA client/server carries no per-message sequence number, so frames are
numbered here and the item's SourceTimestamp must rise: an equal or older stamp is counted as
a duplicate and dropped. The RX stamp is taken in user space when the notification arrives.

A subscription can end without the session noticing at once: the PLC restarts (asyncua's
connection supervisor then reports BadShutdown), its lifetime expires on the server (BadTimeout),
or another session takes it over (GoodSubscriptionTransferred). Any status-change notification of
the current subscription is reported through `on_lost` so the owner can rebuild session and
subscription; notifications of a subscription replaced by a later `subscribe()` are ignored.
"""
from __future__ import annotations

import queue
import time
from collections.abc import Callable
from datetime import datetime, timezone

import numpy as np
from asyncua import Client, ua

from .errors import TransportError
from .frame import Frame, RxStampSource

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _ns(dt: datetime) -> int:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


class OpcUaSubscriptionSource:
    def __init__(self, field_count: int, publishing_interval_ms: float = 1.0, publisher_id: int = 0,
                 queue_depth: int = 4) -> None:
        self.field_count = field_count
        self.publishing_interval_ms = publishing_interval_ms
        self.publisher_id = publisher_id
        self._queue: queue.Queue[Frame] = queue.Queue(maxsize=queue_depth)
        self._sequence = 0
        self._last_source_ns = 0
        self._subscription = None
        self._generation = 0  # bumped by every subscribe(): notifications of older subscriptions are ignored
        self._on_lost: Callable[[str], None] | None = None
        self.status_changes = 0
        self.malformed = 0
        self.duplicates = 0
        self.superseded = 0
        self.last_error: Exception | None = None

    # -- I/O thread ---------------------------------------------------------------------------
    async def subscribe(self, client: Client, node_id: ua.NodeId,
                        on_lost: Callable[[str], None] | None = None) -> None:
        """(Re)create the subscription on a connected client; call again after a reconnect.
        `on_lost(reason)` is called (on the I/O thread) when the server or asyncua ends this subscription."""
        self._generation += 1
        self._on_lost = on_lost
        node = client.get_node(node_id)
        try:
            value = await node.read_value()
        except ua.UaStatusCodeError as exc:
            raise TransportError(f"frame variable {node_id.to_string()}: cannot be read ({exc})") from exc
        if not isinstance(value, list) or len(value) != self.field_count:
            raise TransportError(f"frame variable {node_id.to_string()}: holds {value!r:.60}, expected an array "
                                 f"of {self.field_count} numbers (one per configured signal)")
        params = ua.CreateSubscriptionParameters(RequestedPublishingInterval=self.publishing_interval_ms,
                                                 RequestedLifetimeCount=10_000, RequestedMaxKeepAliveCount=1000,
                                                 MaxNotificationsPerPublish=0, Priority=255)
        self._subscription = await client.create_subscription(params, _Handler(self, self._generation))
        await self._subscription.subscribe_data_change(node, sampling_interval=0.0, queuesize=1)

    def datachange_notification(self, node, value, data) -> None:
        rx_ns = time.time_ns()
        dv = data.monitored_item.Value
        try:
            if dv.SourceTimestamp is None:
                raise ValueError("data change without SourceTimestamp: the PLC must stamp the frame variable")
            values = np.asarray(value, dtype=np.float64)
            if values.shape != (self.field_count,):
                raise ValueError(f"array of {values.size} values, expected {self.field_count}")
        except (ValueError, TypeError) as exc:
            self.malformed += 1
            self.last_error = exc
            return
        sent_ns = _ns(dv.SourceTimestamp)
        if sent_ns <= self._last_source_ns:
            self.duplicates += 1
            return
        self._last_source_ns = sent_ns
        self._sequence = (self._sequence + 1) & 0xFFFF
        frame = Frame(self.publisher_id, 0, self._sequence, sent_ns, rx_ns, RxStampSource.USER, values)
        while True:
            try:
                self._queue.put_nowait(frame)
                return
            except queue.Full:  # the loop is behind: the oldest frame is the stalest, drop it
                try:
                    self._queue.get_nowait()
                    self.superseded += 1
                except queue.Empty:
                    pass

    def status_change_notification(self, status) -> None:
        """The subscription ended (BadShutdown, BadTimeout, transferred...): no frame comes through it any more."""
        code = getattr(status, "Status", status)
        name = getattr(code, "name", None) or str(code)
        self.status_changes += 1
        self.last_error = RuntimeError(f"frame subscription status {name}")
        if self._on_lost is not None:
            self._on_lost(f"frame subscription ended: {name}")

    # -- loop thread ---------------------------------------------------------------------------
    def receive(self, timeout_s: float) -> Frame | None:
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def discard_pending(self) -> int:
        dropped = 0
        while True:
            try:
                self._queue.get_nowait()
                dropped += 1
            except queue.Empty:
                return dropped

    def close(self) -> None:
        pass


class _Handler:
    """asyncua's handler for one subscription: forwards to the source while it is the current one."""

    __slots__ = ("source", "generation")

    def __init__(self, source: OpcUaSubscriptionSource, generation: int) -> None:
        self.source = source
        self.generation = generation

    def datachange_notification(self, node, value, data) -> None:
        if self.generation == self.source._generation:
            self.source.datachange_notification(node, value, data)

    def status_change_notification(self, status) -> None:
        if self.generation == self.source._generation:
            self.source.status_change_notification(status)
