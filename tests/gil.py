"""A probe for whether a call hands the GIL to other Python threads."""
from __future__ import annotations

import os
import sys
import threading
import time


def gil_handoffs(fn, calls: int = 20, interval_s: float = 0.05) -> int:
    """How many of `calls` calls of `fn` another Python thread ran during.

    A spinner thread always wants the GIL and notes the number of the call in progress whenever it runs.
    A call that keeps the GIL lets it run only when the caller's switch interval (`interval_s`) runs out:
    with all the calls together well under it, the count stays at 0 or 1. A call that releases the GIL for
    longer than the spinner takes to wake (tens of µs; give `fn` 0.2-2 ms of work) lets it in on nearly every
    call, and the caller then waits up to `interval_s` to get the GIL back. A release shorter than that
    wake-up is a race the caller usually wins: not a reliable control. The spinner runs SCHED_FIFO where it
    may (root), so a busy box does not keep it off the CPU while the GIL is free."""
    state = {"i": -1, "stop": False}
    seen: set[int] = set()

    def spinner():
        try:  # real-time, where allowed (root, as in CI): it runs the moment the GIL is free, whatever else
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))  # loads the box's CPUs
        except (OSError, AttributeError):
            pass
        while not state["stop"]:
            seen.add(state["i"])

    old = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    t = threading.Thread(target=spinner, name="gil-probe")
    t.start()
    try:
        time.sleep(0.01)
        for i in range(calls):
            state["i"] = i
            fn()
        state["i"] = calls
    finally:
        state["stop"] = True
        t.join()
        sys.setswitchinterval(old)
    return len(seen & set(range(calls)))
