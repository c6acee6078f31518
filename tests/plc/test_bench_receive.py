"""bench/receive_gil.py runs end to end (a short run) and its JSON line has what its doc promises; no timing
is asserted (this box's timings are noise)."""
import json
import subprocess
import sys

from ..conftest import REPO


def test_the_receive_benchmark_runs_both_modes_and_reports_them():
    r = subprocess.run([sys.executable, "bench/receive_gil.py", "--frames", "300", "--rounds", "2", "--json"],
                       capture_output=True, text=True, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for mode in ("kernel_timeout", "socket_timeout"):
        s = out[mode]
        assert s["frames"] >= 500, s  # 2 rounds x 300, minus frames stamped in user space at the start
        assert 0 < s["p50"] <= s["p90"] <= s["p99"] <= s["p99_9"] <= s["max"], s
        assert len(s["round_p99"]) == 2
    assert out["p99_ratio_socket_over_kernel"] > 0
    assert out["loop_policy"].startswith("SCHED_")
