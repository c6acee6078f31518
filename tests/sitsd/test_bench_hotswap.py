"""bench/hotswap.py runs end to end (a short run: 8 swaps, every 2nd the model with its proof in the worker) and
its JSON last line has the keys issue 8 names, consistent with each other; no timing is asserted (this box's
timings are noise: the benchmark measures them, with their ratios, on the box it runs on)."""
import json
import subprocess
import sys

from ..conftest import REPO


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
    assert s["timing"]["deadline_ms"] == 8.0 and s["proof"] == "worker"
    assert any(line.startswith("hot swap under a 1000 Hz loop") for line in lines), lines[:3]
