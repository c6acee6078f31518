"""Timestamp gate: is this frame fresh, from the present, next in its writer's sequence, stamped
by the source the config trusts, and is our clock synchronised?

State per (publisher id, writer id). Sequence numbers are UInt16 and wrap: a forward step of
1..0x7FFF is new (steps above 1 count lost frames). Backward steps are checked against a window
of the last `window` sequence numbers: one already seen is a duplicate, an unseen one within the
window arrived out of order (dropped: the loop only moves forward), anything older is a replay.
A backward step whose sender timestamp is newer than the last accepted one means the publisher
restarted and reset its counter: accepted, counted, and flagged in `restarted` for the loop.
Returns 0 for pass, otherwise a reason code (see REASONS).
"""
from __future__ import annotations

from plc.frame import Frame, RxStampSource

PASS, TRANSIT, FUTURE, DUPLICATE, REPLAY, STALE, REORDERED, STAMP_SOURCE, CLOCK = range(9)
REASONS = {TRANSIT: "transit", FUTURE: "future", DUPLICATE: "duplicate", REPLAY: "replay", STALE: "stale",
           REORDERED: "reordered", STAMP_SOURCE: "stamp_source", CLOCK: "clock"}


class TimestampGate:
    def __init__(self, max_transit_ns: int, max_future_ns: int, *, max_age_ns: int | None = None,
                 window: int = 64, require_hardware_stamps: bool = False) -> None:
        if not 1 <= window <= 0x7FFF:
            raise ValueError("replay window must be 1..32767 sequence numbers")
        self.max_transit_ns = max_transit_ns
        self.max_future_ns = max_future_ns
        self.max_age_ns = max_age_ns
        self.window = window
        self._window_mask = (1 << window) - 1
        self.require_hardware_stamps = require_hardware_stamps
        self.clock_ok = True  # set by the PTP monitor on the I/O thread; read here
        self._state: dict[tuple[int, int], list[int]] = {}  # -> [sequence, sender stamp, seen bitmap]
        self.lost = 0  # frames missing from sequence gaps
        self.restarts = 0
        self.restarted = False  # set on the frame that revealed a publisher restart
        self.last_transit_ns = 0

    def check(self, frame: Frame, now_ns: int | None = None) -> int:
        self.restarted = False
        transit = frame.rx_timestamp_ns - frame.sender_timestamp_ns
        self.last_transit_ns = transit
        if transit > self.max_transit_ns:
            return TRANSIT
        if -transit > self.max_future_ns:
            return FUTURE
        if self.max_age_ns is not None and now_ns is not None and now_ns - frame.sender_timestamp_ns > self.max_age_ns:
            return STALE
        if self.require_hardware_stamps and frame.rx_stamp_source != RxStampSource.HARDWARE:
            return STAMP_SOURCE
        if not self.clock_ok:
            return CLOCK
        key = (frame.publisher_id, frame.writer_id)
        state = self._state.get(key)
        if state is None:
            self._state[key] = [frame.sequence_number, frame.sender_timestamp_ns, 1]
            return PASS
        last, last_ts, seen = state
        step = (frame.sequence_number - last) & 0xFFFF
        if step == 0:
            return DUPLICATE
        if step < 0x8000:  # forward
            self.lost += step - 1
            state[2] = ((seen << step) | 1) & self._window_mask if step < self.window else 1
        else:
            back = 0x10000 - step
            if frame.sender_timestamp_ns > last_ts:
                self.restarts += 1
                self.restarted = True
                state[2] = 1
            elif back < self.window:
                bit = 1 << back
                if seen & bit:
                    return DUPLICATE
                state[2] = seen | bit  # remember it, so its replay is a duplicate
                return REORDERED
            else:
                return REPLAY
        state[0], state[1] = frame.sequence_number, frame.sender_timestamp_ns
        return PASS
