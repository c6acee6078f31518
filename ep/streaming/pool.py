"""`StreamPool`: many token streams over one ORT session, hot KV slots, tiers, suspend/resume, recovery.

What attention sees: each hot slot holds `capacity = window + page_tokens` tokens per layer. When
it is full, the oldest page slides out (to the warm tier) before the next step, so a step attends to
the last `window + 1` to `window + page_tokens` tokens, itself included (a sawtooth; exactly all
tokens while the stream is shorter than the capacity). Archived pages are **not** seen by attention
again: they are stored for audit, replay and inspection, never read back on the per-token path.

Per token (`step`): write the frame and the positional encoding into bound input arrays, write
`seqlens_k` / `total_sequence_length`, `run_with_iobinding`. The slot's KV buffers are bound as both
`past_*` and `present_*`, so GroupQueryAttention appends in place; no array is allocated. Every
`page_tokens` tokens a full window slides by one page (encode ~10 us + a memmove of the window).

Streams beyond `hot_slots` are parked: the least recently used hot stream is suspended (lossless
snapshot of its window to the cold file, warm pages demoted to cold), and resumed on its next
token (snapshot read and copied back into a free slot). Suspend/resume is bit-exact: the window is
restored byte for byte and the position enters only through the positional encoding.

Crash recovery: with a journal, each frame is appended to `frames.journal` before its step; on
open, each stream's last snapshot is loaded and the journaled frames after it are replayed (one
thread: ORT recomputes the same bits). `checkpoint()` snapshots every hot stream, moves warm pages
to cold, fsyncs and truncates the journal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import EpError
from ..kv.codec import KvError, SnapshotCodec
from ..kv.cold import SLOT_HEADER, ColdStore
from ..kv.journal import FrameJournal
from ..kv.tiers import PageTiers, page_slot_bytes
from ..session import Session
from .model import StreamSpec, build_model

COLD_FILE, JOURNAL_FILE = "cold.slots", "frames.journal"


@dataclass(slots=True)
class StreamState:
    stream: int
    position: int = 0   # tokens consumed since the stream began
    count: int = 0      # tokens in the window (hot buffer or snapshot)
    slot: int = -1      # hot slot, -1 while suspended
    last_used: int = 0


@dataclass(frozen=True, slots=True)
class PoolConfig:
    window: int = 256
    page_tokens: int = 16
    hot_slots: int = 8
    warm_pages: int = 8
    ring_pages: int = 256
    page_format: str = "int8"
    journal: bool = True
    policy: str = "cpu"  # the KV buffers are host memory: an accelerator EP would copy them every step
    threads: int = 1
    archive: bool = True  # False (KV policy `window`): a page that slides out is dropped, not kept warm/cold

    @property
    def capacity(self) -> int:
        return self.window + self.page_tokens


class StreamPool:
    def __init__(self, directory: str | Path, spec: StreamSpec = StreamSpec(), config: PoolConfig = PoolConfig(),
                 seed: int = 0, model: bytes | None = None, fp8: bool = False) -> None:
        """`model`: the graph's ONNX bytes (a compiled artifact's, `fp8` when its weights are FP8); by default
        `build_model(spec, seed)`. `spec` must give the graph's shapes (`ep.compile.streaming.stream_shape`)."""
        if config.window < 1 or config.page_tokens < 1 or config.hot_slots < 1:
            raise EpError(f"stream pool: window, page_tokens and hot_slots must be >= 1 ({config})")
        self.spec, self.config = spec, config
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.model_bytes = model if model is not None else build_model(spec, seed).SerializeToString()
        self.ep = Session(self.model_bytes, policy=config.policy, threads=config.threads, label="streaming model",
                          fp8_storage=fp8)
        self.sha256 = self.ep.sha256
        L, H, C, D = spec.n_layers, spec.kv_heads, config.capacity, spec.head_dim
        # shared inputs/outputs, written in place every step
        self.frame = np.zeros((1, 1, spec.n_inputs), np.float32)
        self.pe = np.zeros((1, 1, spec.d_model), np.float32)
        self.seqlens = np.zeros(1, np.int32)
        self.total = np.zeros((), np.int32)
        self.action = np.zeros((1, 1, spec.n_outputs), np.float32)
        self._inv_freq = np.exp(-math.log(10000.0) * np.arange(0, spec.d_model, 2) / spec.d_model)
        self._angle = np.zeros_like(self._inv_freq)
        # hot tier: one slab, [slot, layer, key/value, batch 1, kv_heads, capacity, head_dim]
        self.hot = np.zeros((config.hot_slots, L, 2, 1, H, C, D), np.float32)
        self._bindings = []
        for s in range(config.hot_slots):
            shared = {"frame": self.frame, "pe": self.pe, "seqlens_k": self.seqlens,
                      "total_sequence_length": self.total}
            outs = {"action": self.action}
            for layer in range(L):
                for kv, kind in enumerate(("key", "value")):
                    buf = self.hot[s, layer, kv]
                    shared[f"past_{kind}_{layer}"] = buf
                    outs[f"present_{kind}_{layer}"] = buf
            self._bindings.append(self.ep.bind(shared, outs))
        self._owner = [-1] * config.hot_slots
        self._free = list(range(config.hot_slots - 1, -1, -1))
        page_bytes = page_slot_bytes(L, H, config.page_tokens, D)
        cold_slot = -(-(SLOT_HEADER.size + page_bytes) // 512) * 512
        self.cold = ColdStore(self.directory / COLD_FILE, slot_bytes=max(cold_slot, 4096),
                              ring_pages=config.ring_pages)
        self.tiers = PageTiers(self.cold, config.hot_slots, config.warm_pages, page_bytes, config.page_format)
        self.snapshots = SnapshotCodec()
        self.journal = FrameJournal(self.directory / JOURNAL_FILE, spec.n_inputs) if config.journal else None
        self.streams: dict[int, StreamState] = {}
        self._tick = 0
        self._warm_up()
        self.recovered = self._recover()

    # --- per token ---------------------------------------------------------------------------
    def step(self, stream: int, frame: np.ndarray | None = None) -> np.ndarray:
        """One token of `stream` (the frame in `frame`, or already written to `self.frame`); returns
        the output view `action[0, 0]` (overwritten by the next step)."""
        st = self.streams.get(stream)
        if st is None:
            if type(stream) is not int or not 0 <= stream < 1 << 63:
                raise EpError(f"stream pool: stream id {stream!r} must be an int in 0..2**63-1")
            st = self.streams[stream] = StreamState(stream)
        if st.slot < 0:
            self._resume(st)
        if frame is not None:
            self.frame[0, 0] = frame
        if self.journal is not None:
            self.journal.append(stream, st.position, self.frame)
        self._advance(st)
        return self.action[0, 0]

    def _advance(self, st: StreamState) -> None:
        if st.count == self.config.capacity:
            self._slide(st)
        self._tick += 1
        st.last_used = self._tick
        np.multiply(self._inv_freq, st.position, out=self._angle)
        np.sin(self._angle, out=self.pe[0, 0, 0::2])
        np.cos(self._angle, out=self.pe[0, 0, 1::2])
        self.seqlens[0] = st.count
        self.total[...] = st.count + 1
        self._bindings[st.slot].run()
        st.count += 1
        st.position += 1

    def _slide(self, st: StreamState) -> None:
        """The window is full: its oldest page goes to the warm tier, the rest moves down one page."""
        p, kv = self.config.page_tokens, self.hot[st.slot]
        page_index = (st.position - st.count) // p
        if self.config.archive:
            self.tiers.archive(st.stream, page_index, kv[:, :, 0, :, :p, :])
        kv[:, :, :, :, :-p, :] = kv[:, :, :, :, p:, :]  # overlapping: numpy copies through a buffer
        st.count -= p

    # --- hot slots ---------------------------------------------------------------------------
    def _take_slot(self) -> int:
        if not self._free:
            victim = min((self.streams[o] for o in self._owner if o >= 0), key=lambda s: s.last_used)
            self.suspend(victim.stream)
        return self._free.pop()

    def _resume(self, st: StreamState) -> None:
        slot = self._take_slot()
        if st.count:
            window, position = self.snapshots.decode(self.cold.get_snapshot(st.stream))
            if position != st.position or window.shape[3] != st.count:
                raise KvError(f"stream {st.stream}: snapshot holds position {position} with {window.shape[3]} "
                              f"tokens, the stream is at {st.position} with {st.count}")
            self.hot[slot, :, :, 0, :, :st.count, :] = window
        self.tiers.attach(st.stream, slot)
        self._owner[slot] = st.stream
        st.slot = slot

    def suspend(self, stream: int) -> None:
        """Parks a hot stream: lossless snapshot to cold, warm pages to cold, slot freed."""
        st = self.streams[stream]
        if st.slot < 0:
            return
        self._snapshot(st)
        self.tiers.demote(stream)
        self._owner[st.slot] = -1
        self._free.append(st.slot)
        st.slot = -1

    def _snapshot(self, st: StreamState) -> None:
        window = self.hot[st.slot, :, :, 0, :, :st.count, :]
        self.cold.put_snapshot(st.stream, self.snapshots.encode(window, st.position))

    def window(self, stream: int) -> np.ndarray:
        """A copy of the stream's window, float32 [layers, 2, kv_heads, count, head_dim] (hot or parked)."""
        st = self.streams[stream]
        if st.slot >= 0:
            return self.hot[st.slot, :, :, 0, :, :st.count, :].copy()
        if not st.count:
            return np.zeros((self.spec.n_layers, 2, self.spec.kv_heads, 0, self.spec.head_dim), np.float32)
        return self.snapshots.decode(self.cold.get_snapshot(stream))[0]

    def close_stream(self, stream: int) -> None:
        """Forgets `stream`: frees its slot and every tier (its journal records become inert)."""
        st = self.streams.pop(stream, None)
        if st is not None and st.slot >= 0:
            self._owner[st.slot] = -1
            self._free.append(st.slot)
        self.tiers.drop(stream)

    # --- durability --------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Every hot stream snapshotted, every warm page in cold, fsync, journal truncated."""
        for st in self.streams.values():
            if st.slot >= 0:
                self._snapshot(st)
                self.tiers.flush(st.stream)
        self.cold.sync()
        if self.journal is not None:
            self.journal.sync()
            self.journal.truncate()

    def _recover(self) -> dict[int, int]:
        """Streams found on disk: snapshot + journaled frames replayed. Returns stream -> frames replayed."""
        replayed: dict[int, int] = {}
        for stream in sorted(self.cold.streams()):
            if not self.cold.has_snapshot(stream):
                continue
            window, position = self.snapshots.decode(self.cold.get_snapshot(stream))
            self.streams[stream] = StreamState(stream, position=position, count=window.shape[3])
            replayed[stream] = 0
        if self.journal is None:
            return replayed
        for stream, records in self.journal.read().items():
            st = self.streams.get(stream)
            if st is None:
                st = self.streams[stream] = StreamState(stream)
                replayed[stream] = 0
            for position, frame in records:
                if position < st.position:
                    continue  # already in the snapshot
                if position != st.position:
                    raise KvError(f"frame journal {self.journal.path}: stream {stream} jumps from position "
                                  f"{st.position} to {position}; its state cannot be recovered exactly")
                if st.slot < 0:
                    self._resume(st)
                self.frame[0, 0] = frame
                self._advance(st)
                replayed[stream] += 1
        return replayed

    def _warm_up(self) -> None:
        """A few steps on slot 0 before any stream (first-call allocations), then the slot is zeroed."""
        self.seqlens[0], self.total[...] = 0, 1
        self._bindings[0].warm_up()
        self.hot[0] = 0.0
        self.action[...] = 0.0

    # --- accounting --------------------------------------------------------------------------
    @property
    def slot_bytes(self) -> int:
        return self.hot[0].nbytes

    def kv_ram_bytes(self, stream: int) -> int:
        """KV bytes in RAM held for `stream`: while hot, its slot (the whole capacity: it is allocated)
        and its warm arena; while parked, none."""
        st = self.streams[stream]
        return self.slot_bytes + self.tiers.arena_bytes() if st.slot >= 0 else 0

    def state_bytes(self) -> dict[str, int]:
        return {"hot": self.hot.nbytes, "warm": self.tiers.slab.nbytes, "cold_index": self.cold.index_bytes(),
                "cold_file": self.cold.file_bytes,
                "journal_file": self.journal.file_bytes if self.journal is not None else 0}

    def close(self) -> None:
        self.cold.close()
        if self.journal is not None:
            self.journal.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
