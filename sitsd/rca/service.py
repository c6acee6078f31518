"""Fault attribution inside the daemon: the bounded event stream, the signal ring the loop feeds, and the
control-socket command `events` that hands both to `sitsctl diagnose` (which localizes off the daemon).

Threads: `SignalRing.push` runs on the loop thread (no allocation); everything else on the I/O thread.
"""
from __future__ import annotations

import time

from .events import EventStream, SignalRing, event_from_alert, event_from_plc

RING_SECONDS = 60.0


class RcaRecorder:
    def __init__(self, daemon) -> None:
        cfg = daemon.cfg
        self.cfg = cfg
        self.events = EventStream()
        capacity = int(RING_SECONDS * 1000.0 / cfg.timing.cycle_ms)
        self.ring = SignalRing(cfg.signal_names, cfg.model.outputs, capacity=capacity)

    def on_alert(self, t_ns: int, kind: str, text: str, publisher: int = 0, seq: int = 0) -> None:
        self.events.append(event_from_alert(t_ns, kind, text, publisher, seq))

    def on_plc_event(self, event) -> None:
        self.events.append(event_from_plc(event))

    def events_request(self, req: dict) -> dict:
        """`{"command": "events", "since_s": 600}` -> recent events, the signal window and what replay needs."""
        try:
            since_s = float(req.get("since_s", 600.0))
        except (TypeError, ValueError):
            raise ValueError(f"since_s must be a number of seconds, got {req.get('since_s')!r}") from None
        now = time.time_ns()
        since = now - int(since_s * 1e9)
        return {"line": self.cfg.line, "now_ns": now, "model": str(self.cfg.model.artifact),
                "inputs": list(self.cfg.model.inputs),
                "events": [e.as_dict() for e in self.events.since(since)],
                "signals": self.ring.window(since).as_dict()}


def attach_rca(daemon) -> RcaRecorder:
    """Called once the loop is built: the loop reports every command it sends into the ring."""
    rca = RcaRecorder(daemon)
    daemon.loop.observe = rca.ring.push
    return rca
