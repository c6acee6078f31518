"""Fault attribution inside the daemon: the bounded event stream, the signal ring the loop feeds, and the
control-socket command `events` that hands both to `sitsctl diagnose` (which localizes off the daemon).

Threads: `RcaRecorder.observe` (the ring's writer) runs on the loop thread and allocates no arrays;
everything else on the I/O thread. Update events (`reload`, `model_swap`, `module_swap`) arrive as alerts
through the daemon's alert queue, like every other alert.

The model replay check (`model.replay_mismatch`) must compare like with like: the loop runs
pre module -> model -> post module -> safety envelope, and a hot swap may replace any of them. So each
ring row also holds what the model itself saw and returned on that frame (its input buffer after the pre
module, its output before the post module), tagged with the StageSet generation of the frame; `events`
names the model that runs now and marks usable the rows whose generation ran that same model (by SHA-256),
so `sitsctl diagnose` replays exactly that model on exactly those inputs.
"""
from __future__ import annotations

import time

from .events import EventStream, SignalRing, event_from_alert, event_from_plc

RING_SECONDS = 60.0


class RcaRecorder:
    def __init__(self, daemon) -> None:
        cfg = daemon.cfg
        self.cfg = cfg
        self.daemon = daemon
        self.loop = daemon.loop
        self.events = EventStream()
        capacity = int(RING_SECONDS * 1000.0 / cfg.timing.cycle_ms)
        # a streaming model carries state from frame to frame (its KV cache): one frame cannot be replayed alone
        self.replayable = cfg.model.kind != "streaming"
        self.ring = SignalRing(cfg.signal_names, cfg.model.outputs, capacity=capacity,
                               n_model_inputs=len(cfg.model.inputs) if self.replayable else 0)

    def observe(self, t_ns: int, values, command, failsafe: bool) -> None:
        """The loop's observer (loop thread, right after the command is signed): the frame, the command and,
        for a command the model produced, the model's own input and output buffers of this frame. A frame during
        which a hot swap replaced the set (its generation is no longer the set's) gets no model record."""
        loop = self.loop
        st = loop.stage_set
        model = st.model
        if failsafe or st.generation != loop.last_generation or not self.replayable:
            self.ring.push(t_ns, values, command, failsafe)
        else:
            self.ring.push_model(t_ns, values, command, failsafe, model.input[0], model.output[0], st.generation)

    def on_alert(self, t_ns: int, kind: str, text: str, publisher: int = 0, seq: int = 0) -> None:
        self.events.append(event_from_alert(t_ns, kind, text, publisher, seq))

    def on_plc_event(self, event) -> None:
        self.events.append(event_from_plc(event))

    def _running_model(self) -> tuple[str, str, set[int]]:
        """(path, sha256 hex, generations that ran this same model) of the model running now."""
        cur = self.loop.stage_set
        sets = list(getattr(getattr(self.daemon, "hotswap", None), "sets", None) or [cur])
        same = {st.generation for st in sets if st.model_sha256 == cur.model_sha256}
        return str(cur.model_path), cur.model_sha256.hex(), same | {cur.generation}

    def events_request(self, req: dict) -> dict:
        """`{"command": "events", "since_s": 600}` -> recent events, the signal window and what replay needs:
        `model` is the file of the model running now (a hot-swapped one after a swap), `model_sha256` its hash."""
        try:
            since_s = float(req.get("since_s", 600.0))
        except (TypeError, ValueError):
            raise ValueError(f"since_s must be a number of seconds, got {req.get('since_s')!r}") from None
        now = time.time_ns()
        since = now - int(since_s * 1e9)
        model_path, model_sha, generations = self._running_model()
        return {"line": self.cfg.line, "now_ns": now, "model": model_path if self.replayable else None,
                "model_sha256": model_sha,
                "inputs": list(self.cfg.model.inputs),
                "events": [e.as_dict() for e in self.events.since(since)],
                "signals": self.ring.window(since, model_tags=generations).as_dict(raw=True)}


def attach_rca(daemon) -> RcaRecorder:
    """Called once the loop is built: the loop reports every command it sends into the ring."""
    rca = RcaRecorder(daemon)
    daemon.loop.observe = rca.observe
    return rca
