"""One timestamped event stream for fault attribution, and the ring of recent signal values beside it.

Everything the daemon notices becomes an `Event` with a machine-readable `code`: gate alerts
(timestamp, constraint, safety envelope, deadline), PLC events decoded by the vendor profiles,
signer/TPM errors, updates (config reload, model swap), and anomalies the detectors derive from
the signal ring (model residuals, stuck sensors, broken relations). `SignalRing` is written by
the loop thread into preallocated arrays (no allocation per frame) and read by the I/O thread.
"""
from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import DiagnoseError

SOURCES = ("gate", "plc", "model", "signer", "update", "runtime", "anomaly", "network")

# pipeline/daemon alert kind -> (source, code prefix); the alert's text up to ':' completes the code
_ALERT_KINDS = {
    "timestamp": ("gate", "timestamp"),
    "constraint": ("gate", "constraint"),
    "hold_last": ("gate", "constraint.hold_last"),
    "safety": ("gate", "safety"),
    "deadline": ("gate", "deadline"),
    "sign": ("signer", "signer.error"),
    "clock": ("gate", "clock.ptp"),
    "publisher_restart": ("plc", "plc.restart"),
    "plc_rejected": ("network", "plc_link.rejected"),
    "plc_write": ("network", "plc_link.write"),
    "plc_link": ("network", "plc_link.lost"),  # the PLC session died (restart, cable): sitsd reconnects
    "frame_timeout": ("network", "plc_link.frames"),  # no frame for timing.frame_timeout_ms
    "runtime": ("runtime", "runtime"),
    "loop_crashed": ("runtime", "runtime.loop_crashed"),
    "reload": ("update", "update.reload"),
    "model_swap": ("update", "update.model"),
    "rollback": ("update", "update.rollback"),
    "persisted_update": ("update", "update.persisted"),  # a persisted hot swap rejected at start (sitsd/persist.py)
    "update_refused": ("update", "update.refused"),  # `sitsctl update` refused: nothing changed, the old version runs
    "tpm": ("signer", "signer.tpm"),
    "prover": ("runtime", "runtime.prover"),  # proofs stalled (sitsd/prover.py watch); commands go on unproven
}
_DETAILED = {"timestamp", "constraint", "safety"}  # the text before ':' names the rule or reason


@dataclass(frozen=True, slots=True)
class Event:
    """`code` is what the FMEA detections match (dotted, e.g. `timestamp.future`, `plc.S7.IO.STATION_FAILURE`,
    `anomaly.stuck.entry_thickness`); `text` is for people; `signal` names a signal when one is involved."""

    t_ns: int
    source: str
    code: str
    text: str
    severity: str = "warning"
    component: str = ""
    signal: str = ""
    value: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Event:
        return cls(int(d["t_ns"]), str(d["source"]), str(d["code"]), str(d.get("text", "")),
                   str(d.get("severity", "warning")), str(d.get("component", "")), str(d.get("signal", "")),
                   float(d.get("value", 0.0)))


def event_from_alert(t_ns: int, kind: str, text: str, publisher: int = 0, seq: int = 0) -> Event:
    """An alert tuple as the loop and the I/O thread append them: (t_ns, kind, text, publisher, seq)."""
    source, code = _ALERT_KINDS.get(kind, ("runtime", kind))
    if kind in _DETAILED and ":" in text:
        code = f"{code}.{text.split(':', 1)[0].strip()}"
    severity = "critical" if kind in ("loop_crashed", "sign") else "warning"
    return Event(int(t_ns), source, code, text, severity)


def event_from_plc(event) -> Event:
    """A `plc.profiles.PlcEvent` (any vendor) as a stream event; the vendor code stays in the code."""
    return Event(int(event.timestamp_ns), "plc", f"plc.{event.code}", event.text, event.severity, event.component)


class EventStream:
    """Bounded, in arrival order; the oldest events fall out first."""

    def __init__(self, maxlen: int = 8192) -> None:
        self._events: deque[Event] = deque(maxlen=maxlen)

    def append(self, event: Event) -> None:
        self._events.append(event)

    def extend(self, events) -> None:
        self._events.extend(events)

    def since(self, t_ns: int = 0) -> list[Event]:
        return sorted((e for e in self._events if e.t_ns >= t_ns), key=lambda e: e.t_ns)

    def __len__(self) -> int:
        return len(self._events)


@dataclass
class SignalWindow:
    """A copy of recent frames: sender time, signal values (config order) and the command sent for each."""

    names: list[str]
    outputs: list[str]
    t_ns: np.ndarray
    values: np.ndarray
    command: np.ndarray
    failsafe: np.ndarray
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.t_ns)

    def column(self, name: str) -> np.ndarray:
        if name in self.names:
            return self.values[:, self.names.index(name)]
        if name == "command" or name in self.outputs:
            return self.command[:, 0 if name == "command" else self.outputs.index(name)]
        raise DiagnoseError(f"signal {name!r} is not in the window; signals: {', '.join(self.names + ['command'])}")

    def as_dict(self) -> dict:
        return {"names": self.names, "outputs": self.outputs, "t_ns": self.t_ns.tolist(),
                "values": np.round(self.values, 6).tolist(), "command": np.round(self.command, 6).tolist(),
                "failsafe": self.failsafe.astype(int).tolist(), "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> SignalWindow:
        names = list(d["names"])
        outputs = list(d.get("outputs", ["command"]))
        t = np.asarray(d["t_ns"], dtype=np.int64)
        values = np.asarray(d["values"], dtype=np.float64).reshape(len(t), len(names))
        command = np.asarray(d["command"], dtype=np.float64).reshape(len(t), len(outputs))
        return cls(names, outputs, t, values, command, np.asarray(d["failsafe"], dtype=bool), dict(d.get("meta", {})))


class SignalRing:
    """The last `capacity` frames the loop handled; `push` is called on the loop thread and allocates nothing."""

    def __init__(self, names: list[str], outputs: list[str], capacity: int = 6000) -> None:
        self.names, self.outputs, self.capacity = list(names), list(outputs), capacity
        self.t_ns = np.zeros(capacity, dtype=np.int64)
        self.values = np.zeros((capacity, len(names)))
        self.command = np.zeros((capacity, len(outputs)))
        self.failsafe = np.zeros(capacity, dtype=bool)
        self.count = 0

    def push(self, t_ns: int, values: np.ndarray, command: np.ndarray, failsafe: bool) -> None:
        i = self.count % self.capacity
        self.t_ns[i] = t_ns
        self.values[i] = values
        self.command[i] = command
        self.failsafe[i] = failsafe
        self.count += 1

    def window(self, since_ns: int = 0) -> SignalWindow:
        """A copy, oldest first (I/O thread; a row being written meanwhile may be torn, which is harmless)."""
        n = min(self.count, self.capacity)
        order = (np.arange(n) + (self.count - n)) % self.capacity
        keep = order[self.t_ns[order] >= since_ns]
        return SignalWindow(self.names, self.outputs, self.t_ns[keep].copy(), self.values[keep].copy(),
                            self.command[keep].copy(), self.failsafe[keep].copy())


def dump(path: str | Path, events: list[Event], window: SignalWindow | None) -> None:
    """The offline form `sitsctl diagnose --events FILE` reads: one JSON object."""
    Path(path).write_text(json.dumps({"events": [e.as_dict() for e in events],
                                      "signals": window.as_dict() if window is not None else None}))


def load(path: str | Path) -> tuple[list[Event], SignalWindow | None]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DiagnoseError(f"{path}: no such events file (write one with `sitsctl diagnose --dump FILE` or "
                            f"bench/rca.py --dump DIR)") from None
    except (OSError, ValueError) as exc:
        raise DiagnoseError(f"{path}: not a readable events JSON file: {exc}") from None
    try:
        events = [Event.from_dict(e) for e in data.get("events", [])]
        window = SignalWindow.from_dict(data["signals"]) if data.get("signals") else None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DiagnoseError(f"{path}: events file has the wrong shape ({exc!r}); expected {{'events': [...], "
                            f"'signals': {{'names', 't_ns', 'values', 'command', 'failsafe'}}}}") from None
    return events, window
