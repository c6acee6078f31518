"""Timestamp gate: is this frame fresh, from the present, and next in its writer's sequence?

State per (publisher id, writer id). Sequence numbers are UInt16 and wrap: a forward step of
1..0x7FFF is new (steps above 1 count lost frames), 0 is a duplicate. A backward step is an old
frame replayed or reordered, unless its sender timestamp is newer than the last accepted one:
then the publisher restarted and reset its counter, which is accepted, counted and flagged in
`restarted` for the loop to report. Returns 0 for pass, otherwise a reason code (see REASONS).
"""
from __future__ import annotations

from plc.frame import Frame

PASS, STALE, FUTURE, DUPLICATE, REPLAY = 0, 1, 2, 3, 4
REASONS = {STALE: "stale", FUTURE: "future", DUPLICATE: "duplicate", REPLAY: "replay"}


class TimestampGate:
    def __init__(self, max_transit_ns: int, max_future_ns: int) -> None:
        self.max_transit_ns = max_transit_ns
        self.max_future_ns = max_future_ns
        self._last: dict[tuple[int, int], tuple[int, int]] = {}  # -> (sequence, sender timestamp)
        self.lost = 0  # frames missing from sequence gaps
        self.restarts = 0
        self.restarted = False  # set on the frame that revealed a publisher restart
        self.last_transit_ns = 0

    def check(self, frame: Frame) -> int:
        transit = frame.rx_timestamp_ns - frame.sender_timestamp_ns
        self.last_transit_ns = transit
        if transit > self.max_transit_ns:
            return STALE
        if -transit > self.max_future_ns:
            return FUTURE
        key = (frame.publisher_id, frame.writer_id)
        last = self._last.get(key)
        self.restarted = False
        if last is not None:
            step = (frame.sequence_number - last[0]) & 0xFFFF
            if step == 0:
                return DUPLICATE
            if step >= 0x8000:
                if frame.sender_timestamp_ns <= last[1]:
                    return REPLAY
                self.restarts += 1
                self.restarted = True
            else:
                self.lost += step - 1
        self._last[key] = (frame.sequence_number, frame.sender_timestamp_ns)
        return PASS
