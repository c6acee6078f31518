"""bench/rca.py's JSON summary: the keys other tools read, plus the ranking made 1 s after the first alert."""
import json
import subprocess
import sys

from ...conftest import REPO


def test_json_summary_keeps_its_keys_and_adds_the_early_ranking():
    r = subprocess.run([sys.executable, str(REPO / "bench" / "rca.py"), "--seeds", "1", "--json"], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(summary) == {"scenarios", "top1", "top3", "baseline_top1", "localize_ms", "early_top1", "early_top3"}
    assert set(summary["localize_ms"]) == {"p50", "max"}
    assert summary["scenarios"] == 8
    for key in ("top1", "top3", "baseline_top1", "early_top1", "early_top3"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["top1"] <= summary["top3"] and summary["early_top1"] <= summary["early_top3"]
    assert "ranked 1 s after the first alert" in r.stdout
