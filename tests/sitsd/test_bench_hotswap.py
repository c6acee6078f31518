"""bench/hotswap.py runs end to end (a short run: 8 swaps, every 2nd the model with its proof in the worker) and
its JSON last line has the keys issue 8 names, consistent with each other; no timing is asserted (this box's
timings are noise: the benchmark measures them, with their ratios, on the box it runs on)."""
import importlib.util
import json
import subprocess
import sys

import numpy as np

from ..conftest import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("bench_hotswap", REPO / "bench" / "hotswap.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_hotswap_benchmark_swaps_and_reports_its_json_line():
    r = subprocess.run([sys.executable, "bench/hotswap.py", "--swaps", "8", "--model-every", "2", "--baseline-s",
                        "0.5", "--json"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    s = json.loads(lines[-1])
    assert s["swaps"] == 8 and s["model_swaps"]["swaps"] == 4 and s["module_swaps"]["swaps"] == 4, s
    assert isinstance(s["frames"], int) and s["frames"] > 100
    assert isinstance(s["frames_lost"], int) and 0 <= s["frames_lost"] <= s["frames"]
    for key in ("latency_away_us", "latency_near_swap_us"):
        q = s[key]
        assert 0 < q["p50"] <= q["p99"] <= q["max"], (key, q)
    assert 0 < s["prepare_ms"]["p50"] <= s["prepare_ms"]["max"]
    split = s["frames_lost_split"]
    assert split["near_swap"] + split["away"] == s["frames_lost"], split
    assert (split["after_kernel_stall"] + split["after_gil_wait"] + split["after_slow_step"] + split["other"]
            == s["frames_lost"]), split
    assert s["frames_lost"] >= s["frames_lost_at_swap"]
    assert 0 <= split["with_steal"] <= s["frames_lost"], split  # this box has /proc: the probe ran
    assert sum(e["lost"] for e in s["loss_events"]) == s["frames_lost"] or len(s["loss_events"]) == 20
    assert isinstance(s["steal_ms"], int) and s["steal_ms"] >= 0 and s["loop_run_delay_ms"] >= 0, s
    assert s["timing"]["deadline_ms"] == 8.0 and s["proof"] == "worker"
    assert any(line.startswith("hot swap under a 1000 Hz loop") for line in lines), lines[:3]


class _Probe:
    """StealProbe's samples as /proc/stat and /proc/thread-self/schedstat give them (two vCPUs)."""

    def __init__(self, steal_ticks: list[tuple[int, int]], run_delay_ns: list[int]):
        self.samples = [(b"cpu  1 2 3 4 5 6 7 %d 0 0\ncpu0 1 2 3 4 5 6 7 %d 0 0\ncpu1 1 2 3 4 5 6 7 %d 0 0\nintr 9\n"
                         % (a + b, a, b), b"123 %d 7\n" % d) for (a, b), d in zip(steal_ticks, run_delay_ns)]


def test_loss_events_group_lost_frames_by_backlog_and_read_steal_over_its_span():
    b = _bench()
    n = 8
    # frames 0-2 on time; 3 woke 20 ms late and 4-5 ran back to back behind it (3-5 lost); 6 slept, 7 lost alone
    lost = np.array([0, 0, 0, 1, 1, 1, 0, 1], dtype=bool)
    slept = np.array([1, 1, 1, 1, 0, 0, 1, 1], dtype=bool)
    last_slept = np.maximum.accumulate(np.where(slept, np.arange(n), 0))
    due = np.arange(n) * 1_000_000
    kernel_late = np.where(slept, [10, 20, 30, 20_000, 0, 0, 40, 50], np.nan)
    gil = np.where(slept, [1, 1, 1, 2, 0, 0, 1, 9_000], np.nan)
    step = np.array([300, 300, 300, 300, 5_000, 300, 300, 300], dtype=float)
    near = np.array([0, 0, 0, 0, 0, 0, 1, 1], dtype=bool)
    # steal (ticks per vCPU) after each frame: 2 ticks on cpu1 during frames 3-5's backlog, none after
    probe = _Probe([(0, 5)] * 3 + [(0, 7)] * 5, [1000, 1000, 1000, 501_000, 501_000, 501_000, 501_000, 501_000])
    events, with_steal = b._loss_events(probe, lost, last_slept, near, due, kernel_late, gil, step)
    assert [e["lost"] for e in events] == [3, 1] and [e["frames"] for e in events] == [3, 1]
    first, second = events
    assert first["at_s"] == 0.003 and not first["near_swap"] and second["near_swap"]
    assert first["kernel_late_ms"] == 20.0 and first["longest_step_ms"] == 5.0 and second["gil_wait_ms"] == 9.0
    assert first["steal_ms"] == 2 * 1000 // b.CLK_TCK and first["run_delay_ms"] == 0.5
    assert second["steal_ms"] == 0 and second["run_delay_ms"] == 0
    assert with_steal == 3  # only the first backlog saw steal time
    assert b._loss_events(None, lost, last_slept, near, due, kernel_late, gil, step)[1] is None
