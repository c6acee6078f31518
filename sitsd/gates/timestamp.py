"""Timestamp gate: is this frame fresh, from the present, and next in its writer's sequence?

State per (publisher id, writer id). Sequence numbers are UInt16 and wrap: a forward step of
1..0x7FFF is new (steps above 1 count lost frames), 0 is a duplicate, anything else is an old
frame replayed or reordered. Returns 0 for pass, otherwise a reason code (see REASONS).
"""
from __future__ import annotations

from plc.frame import Frame

PASS, STALE, FUTURE, DUPLICATE, REPLAY = 0, 1, 2, 3, 4
REASONS = {STALE: "stale", FUTURE: "future", DUPLICATE: "duplicate", REPLAY: "replay"}


class TimestampGate:
    def __init__(self, max_transit_ns: int, max_future_ns: int) -> None:
        self.max_transit_ns = max_transit_ns
        self.max_future_ns = max_future_ns
        self._last_seq: dict[tuple[int, int], int] = {}
        self.lost = 0  # frames missing from sequence gaps
        self.last_transit_ns = 0

    def check(self, frame: Frame) -> int:
        transit = frame.rx_timestamp_ns - frame.sender_timestamp_ns
        self.last_transit_ns = transit
        if transit > self.max_transit_ns:
            return STALE
        if -transit > self.max_future_ns:
            return FUTURE
        key = (frame.publisher_id, frame.writer_id)
        last = self._last_seq.get(key)
        if last is not None:
            step = (frame.sequence_number - last) & 0xFFFF
            if step == 0:
                return DUPLICATE
            if step >= 0x8000:
                return REPLAY
            self.lost += step - 1
        self._last_seq[key] = frame.sequence_number
        return PASS
