"""Controller status words and diagnostic texts, read over an OPC UA subscription and turned into
structured events by the PLC's vendor profile (plc/profiles). Runs on the I/O thread, off the loop."""
from __future__ import annotations

import time
from collections.abc import Callable

from asyncua import Client, ua

from .profiles import PlcEvent, PlcProfile


class PlcEventWatcher:
    def __init__(self, profile: PlcProfile, on_event: Callable[[PlcEvent], None],
                 publishing_interval_ms: float = 100.0) -> None:
        self.profile = profile
        self.on_event = on_event
        self.publishing_interval_ms = publishing_interval_ms
        self._kinds: dict[int, str] = {}  # monitored item handle -> "status" | "diagnostic"
        self._nodes: dict[str, str] = {}
        self.events = 0

    async def subscribe(self, client: Client, status: ua.NodeId | None, diagnostic: ua.NodeId | None) -> None:
        sub = await client.create_subscription(self.publishing_interval_ms, self)
        for kind, node_id in (("status", status), ("diagnostic", diagnostic)):
            if node_id is not None:
                node = client.get_node(node_id)
                self._nodes[node.nodeid.to_string()] = kind
                await sub.subscribe_data_change(node, sampling_interval=0.0)

    def datachange_notification(self, node, value, data) -> None:
        kind = self._nodes.get(node.nodeid.to_string())
        dv = data.monitored_item.Value
        stamp = dv.SourceTimestamp or dv.ServerTimestamp
        t_ns = int(stamp.timestamp() * 1e9) if stamp is not None else time.time_ns()
        if kind == "status" and isinstance(value, int) and not isinstance(value, bool):
            events = self.profile.decode_status(value, t_ns)
        elif kind == "diagnostic" and isinstance(value, str) and value:
            events = (self.profile.parse_diagnostic(value, t_ns),)
        else:
            return
        for event in events:
            self.events += 1
            self.on_event(event)

    def status_change_notification(self, status) -> None:  # subscription ended; the daemon's reconnect redoes it
        pass
