"""One timestamped event stream for fault attribution, and the ring of recent signal values beside it.

Everything the daemon notices becomes an `Event` with a machine-readable `code`: gate alerts
(timestamp, constraint, safety envelope, deadline), PLC events decoded by the vendor profiles,
signer/TPM errors, updates (config reload, model swap), and anomalies the detectors derive from
the signal ring (model residuals, stuck sensors, broken relations). `SignalRing` is written by
the loop thread into preallocated arrays (no allocation per frame) and read by the I/O thread.
"""
from __future__ import annotations

import base64
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
    "reload": ("update", "update.reload"),  # a config reload went live (SIGHUP, reload, update --config, deploy)
    "model_swap": ("update", "update.model"),  # a hot-swapped model runs (update, deploy, operator rollback)
    "module_swap": ("update", "update.module"),  # a hot-swapped WASM module runs (update, operator rollback)
    "rollback": ("update", "update.rollback"),
    "persisted_update": ("update", "update.persisted"),  # a persisted hot swap rejected at start (sitsd/persist.py)
    "update_refused": ("update", "update.refused"),  # `sitsctl update` refused: nothing changed, the old version runs
    "wasm_cache": ("runtime", "runtime.wasm_cache"),  # a .cwasm entry failed its integrity check: recompiled
    "tpm": ("signer", "signer.tpm"),
    "prover": ("runtime", "runtime.prover"),  # proofs stalled (sitsd/prover.py watch); commands go on unproven
}
_DETAILED = {"timestamp", "constraint", "safety"}  # the text before ':' names the rule or reason
# a change to what runs, not a fault: one is a symptom however rare (localize.event_symptoms), with severity info
CHANGE_KINDS = {"reload": "config", "model_swap": "model", "module_swap": "module"}
CHANGE_CODES = ("update.reload", "update.model", "update.module", "update.rollback", "update.persisted")


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
    severity = "critical" if kind in ("loop_crashed", "sign") else "info" if kind in CHANGE_KINDS else "warning"
    component = ""
    if kind in CHANGE_KINDS:  # "<what> <name> ...": the component changed (a module's name, `model`, `config`)
        words = text.split(None, 2)
        component = words[1] if kind == "module_swap" and len(words) > 1 else CHANGE_KINDS[kind]
    return Event(int(t_ns), source, code, text, severity, component)


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
    """A copy of recent frames: sender time, signal values (config order) and the command sent for each.

    `model_in`/`model_out` (optional): what the model itself saw and returned on each frame, i.e. after
    the `pre` WASM module and before the `post` module and the safety envelope, and `model_ok` the rows
    where those are from the model the window's `meta["model"]` names (the one running when the window was
    taken: rows from before a hot swap to another model, fail-safe rows and rows of a frame during which the
    model was swapped are False). The model replay check compares like with like on those rows only."""

    names: list[str]
    outputs: list[str]
    t_ns: np.ndarray
    values: np.ndarray
    command: np.ndarray
    failsafe: np.ndarray
    meta: dict = field(default_factory=dict)
    model_in: np.ndarray | None = None
    model_out: np.ndarray | None = None
    model_ok: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.t_ns)

    def select(self, keep: np.ndarray) -> SignalWindow:
        """The rows where `keep` (a boolean mask or indices) holds, model records included."""
        def pick(a):
            return None if a is None else a[keep]

        return SignalWindow(self.names, self.outputs, self.t_ns[keep], self.values[keep], self.command[keep],
                            self.failsafe[keep], self.meta, pick(self.model_in), pick(self.model_out),
                            pick(self.model_ok))

    def column(self, name: str) -> np.ndarray:
        if name in self.names:
            return self.values[:, self.names.index(name)]
        if name == "command" or name in self.outputs:
            return self.command[:, 0 if name == "command" else self.outputs.index(name)]
        raise DiagnoseError(f"signal {name!r} is not in the window; signals: {', '.join(self.names + ['command'])}")

    def as_dict(self, raw: bool = False) -> dict:
        """Every column as base64 of its little-endian buffer: exact, and a fraction of the size and of the
        encoding time of number lists (a 60 s window at 1 kHz: ~300 ms as lists). `raw`: the columns as
        `sitsd.control.RawJsonString`, for the daemon's `events` answer, which the I/O thread encodes with the GIL
        held while the loop thread waits: the base64 is made in 48 KiB steps (the loop thread can take the GIL
        between them) and spliced into the answer without json.dumps scanning it. `from_dict` also reads the
        older form (plain lists), which dumps written before this hold."""
        if raw:
            from ..control import RawJsonString

            def col(a, dtype):
                return RawJsonString(_b64_chunked(a, dtype))
        else:
            col = _b64
        out = {"names": self.names, "outputs": self.outputs, "t_ns": col(self.t_ns, "<i8"),
               "values": col(self.values, "<f8"), "command": col(self.command, "<f8"),
               "failsafe": col(self.failsafe, "u1"), "meta": self.meta}
        if self.model_in is not None and self.model_out is not None and self.model_ok is not None:
            # the model's own input and output, float32 as the model saw them
            out.update(model_in=col(self.model_in, "<f4"), model_out=col(self.model_out, "<f4"),
                       model_ok=col(self.model_ok, "u1"))
        return out

    @classmethod
    def from_dict(cls, d: dict) -> SignalWindow:
        names = list(d["names"])
        outputs = list(d.get("outputs", ["command"]))
        t = _unb64(d["t_ns"], "<i8").astype(np.int64)
        values = _unb64(d["values"], "<f8").astype(np.float64).reshape(len(t), len(names))
        command = _unb64(d["command"], "<f8").astype(np.float64).reshape(len(t), len(outputs))
        w = cls(names, outputs, t, values, command, _unb64(d["failsafe"], "u1").astype(bool), dict(d.get("meta", {})))
        if d.get("model_in") is not None and d.get("model_out") is not None and d.get("model_ok") is not None:
            w.model_in = _unb64(d["model_in"], "<f4").astype(np.float32).reshape(len(t), -1)
            w.model_out = _unb64(d["model_out"], "<f4").astype(np.float32).reshape(len(t), len(outputs))
            w.model_ok = _unb64(d["model_ok"], "u1").astype(bool).reshape(len(t))
        return w


def _b64(a: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


_B64_STEP = 3 * 16384  # bytes of input per base64 step (a multiple of 3: the pieces join into one valid encoding)


def _b64_chunked(a: np.ndarray, dtype: str) -> bytes:
    """`_b64` as ASCII bytes, made in steps so that no single call holds the GIL for long."""
    buf = memoryview(np.ascontiguousarray(a, dtype=dtype).tobytes())
    return b"".join(base64.b64encode(buf[i:i + _B64_STEP]) for i in range(0, len(buf), _B64_STEP))


def _unb64(text, dtype: str) -> np.ndarray:
    """A `_b64` string (or, written by hand, a plain list of numbers)."""
    if isinstance(text, str):
        return np.frombuffer(base64.b64decode(text), dtype=dtype)
    return np.asarray(text, dtype=dtype)


class SignalRing:
    """The last `capacity` frames the loop handled; `push` is called on the loop thread and allocates nothing.

    With `n_model_inputs`, each row can also hold the model's own input and output for that frame and an int
    tag of the model that produced them (`model_tag`, -1: none, e.g. a fail-safe command): the daemon tags
    rows with the StageSet generation, and `window(..., model_tags=...)` marks the rows whose tag is in the
    given set (those the model running now produced)."""

    def __init__(self, names: list[str], outputs: list[str], capacity: int = 6000, n_model_inputs: int = 0) -> None:
        self.names, self.outputs, self.capacity = list(names), list(outputs), capacity
        self.t_ns = np.zeros(capacity, dtype=np.int64)
        self.values = np.zeros((capacity, len(names)))
        self.command = np.zeros((capacity, len(outputs)))
        self.failsafe = np.zeros(capacity, dtype=bool)
        self.model_in = np.zeros((capacity, n_model_inputs), dtype=np.float32) if n_model_inputs else None
        self.model_out = np.zeros((capacity, len(outputs)), dtype=np.float32) if n_model_inputs else None
        self.model_tag = np.full(capacity, -1, dtype=np.int64) if n_model_inputs else None
        self.count = 0

    def push(self, t_ns: int, values: np.ndarray, command: np.ndarray, failsafe: bool) -> None:
        i = self.count % self.capacity
        self.t_ns[i] = t_ns
        self.values[i] = values
        self.command[i] = command
        self.failsafe[i] = failsafe
        if self.model_tag is not None:
            self.model_tag[i] = -1
        self.count += 1

    def push_model(self, t_ns: int, values: np.ndarray, command: np.ndarray, failsafe: bool,
                   model_in: np.ndarray, model_out: np.ndarray, tag: int) -> None:
        """`push` with the model's own input and output for the frame (a ring made with n_model_inputs)."""
        i = self.count % self.capacity
        self.t_ns[i] = t_ns
        self.values[i] = values
        self.command[i] = command
        self.failsafe[i] = failsafe
        self.model_in[i] = model_in
        self.model_out[i] = model_out
        self.model_tag[i] = tag
        self.count += 1

    def window(self, since_ns: int = 0, model_tags=None) -> SignalWindow:
        """A copy, oldest first (I/O thread; a row being written meanwhile may be torn, which is harmless).
        `model_tags`: the tags whose rows the model replay may use (None: every tagged row)."""
        n = min(self.count, self.capacity)
        order = (np.arange(n) + (self.count - n)) % self.capacity
        keep = order[self.t_ns[order] >= since_ns]
        w = SignalWindow(self.names, self.outputs, self.t_ns[keep].copy(), self.values[keep].copy(),
                         self.command[keep].copy(), self.failsafe[keep].copy())
        if self.model_tag is not None:
            tags = self.model_tag[keep]
            ok = tags >= 0 if model_tags is None else np.isin(tags, np.fromiter(model_tags, dtype=np.int64))
            w.model_in, w.model_out = self.model_in[keep].copy(), self.model_out[keep].copy()
            w.model_ok = ok & ~w.failsafe
        return w


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
