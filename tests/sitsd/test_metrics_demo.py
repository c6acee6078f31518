"""The Prometheus endpoint of the real demo (`sitsd.demo.run_demo`, `sitsctl demo --metrics`), scraped over HTTP while
the demo runs and once more after its daemon stopped, against the demo's own JSON summary.

What is compared: the summary's latency_us and the endpoint's sitsd_latency_seconds histogram both come from the
daemon's TimingRing latency column, the span from the PLC's send timestamp of a frame to the acknowledged write of its
command (sitsd/daemon.py `_writer`). The startup fail-safe command answers no frame and has no latency, so the
histogram's count is the summary's commands - 1 (and its latency_us count). The percentiles are checked against the
histogram's buckets, never against a timing threshold: the summary's p50/p99/max must lie in the buckets that hold the
samples of that rank, and the bucket-interpolated estimate (Prometheus histogram_quantile) within the same buckets.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sitsd.cli import build_parser
from sitsd.demo import parse_metrics_address, run_demo

from ..conftest import REPO

ROUNDING_US = 0.05  # the summary rounds its percentiles to 0.1 us (sitsd/stats.py)


def scrape(url: str) -> dict:
    """{family name: family} from one GET."""
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict, family: str, name: str, **labels) -> float:
    for s in families[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"{name}{labels} not in the scrape")


def latency_histogram(families: dict) -> tuple[list[float], list[int], int]:
    """(upper bounds in microseconds, +inf last; cumulative counts; count) of sitsd_latency_seconds."""
    rows = sorted((float(s.labels["le"]), int(s.value)) for s in families["sitsd_latency_seconds"].samples
                  if s.name == "sitsd_latency_seconds_bucket")
    count = int(sample(families, "sitsd_latency_seconds", "sitsd_latency_seconds_count"))
    assert rows and math.isinf(rows[-1][0]) and rows[-1][1] == count
    return [b * 1e6 for b, _ in rows], [c for _, c in rows], count


def bucket_of(k: int, cumulative: list[int]) -> int:
    """The bucket holding the k-th smallest sample (0-based)."""
    return next(i for i, c in enumerate(cumulative) if c > k)


def bucket_span(i: int, j: int, bounds: list[float]) -> tuple[float, float]:
    """(lower, upper] in microseconds of buckets i..j."""
    return (bounds[i - 1] if i > 0 else 0.0), bounds[j]


def histogram_quantile(q: float, bounds: list[float], cumulative: list[int]) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket where the rank q * count falls."""
    rank = q * cumulative[-1]
    i = next(i for i, c in enumerate(cumulative) if c >= rank)
    if math.isinf(bounds[i]):  # the +Inf bucket: Prometheus answers the highest finite bound
        return bounds[-2]
    lower, prev = (bounds[i - 1], cumulative[i - 1]) if i > 0 else (0.0, 0)
    in_bucket = cumulative[i] - prev
    return lower + (bounds[i] - lower) * ((rank - prev) / in_bucket if in_bucket else 1.0)


def assert_percentile_matches(q: float, summary_value: float, bounds: list[float], cumulative: list[int]) -> None:
    n = cumulative[-1]
    # numpy's percentile (the summary) interpolates between the samples of rank floor / ceil of q * (n - 1)
    r = q * (n - 1)
    lo, hi = bucket_of(math.floor(r), cumulative), bucket_of(math.ceil(r), cumulative)
    lower, upper = bucket_span(lo, hi, bounds)
    assert lower - ROUNDING_US <= summary_value <= upper + ROUNDING_US, (
        f"summary p{q * 100:g} {summary_value} us is outside the histogram's buckets for that rank "
        f"({lower}, {upper}] us")
    # histogram_quantile picks the bucket of the sample of rank ceil(q * n) - 1: within the buckets of both ranks
    k = bucket_of(max(math.ceil(q * n) - 1, 0), cumulative)
    lower, upper = bucket_span(min(lo, k), max(hi, k), bounds)
    estimate = histogram_quantile(q, bounds, cumulative)
    assert lower - ROUNDING_US <= estimate <= upper + ROUNDING_US
    assert lower - ROUNDING_US <= summary_value <= upper + ROUNDING_US
    if not math.isinf(upper) and lo == hi == k:  # one bucket holds both ranks: the two agree to its width
        assert abs(estimate - summary_value) <= upper - lower + ROUNDING_US


def test_demo_metrics_endpoint_matches_the_demo_summary():
    scrapes: list[dict] = []
    final: dict = {}
    done = threading.Event()
    scraper_errors: list[BaseException] = []
    seen: dict = {}

    def scrape_while_running(url: str) -> None:
        try:
            while not done.wait(0.5):
                scrapes.append(scrape(url))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            scraper_errors.append(exc)

    def on_metrics(event: str, url: str) -> None:
        seen.setdefault(event, url)
        if event == "serving":
            seen["thread"] = threading.Thread(target=scrape_while_running, args=(url,), daemon=True)
            seen["thread"].start()
        elif event == "stopped":
            done.set()
            seen["thread"].join(10)
            final.update(scrape(url))  # the daemon stopped; the endpoint is still up until the summary

    r = run_demo(seconds=7, progress=None, metrics="127.0.0.1:0", on_metrics=on_metrics)
    assert not scraper_errors, scraper_errors
    assert list(seen)[:2] == ["serving", "thread"] and "stopped" in seen
    url = r["metrics_url"]
    assert url == seen["serving"] == seen["stopped"] and url.startswith("http://127.0.0.1:")
    assert not url.endswith(":0/metrics")  # port 0 reports the port it bound
    with pytest.raises(urllib.error.URLError):  # closed when the demo returned
        scrape(url)
    assert r["signing_mode"] == "tpm-session" and r["rejected_by_plc"] == 0 and r["commands"] > 100

    # scraped while the demo ran: the daemon was running and the histogram already counted commands
    running = [f for f in scrapes if sample(f, "sitsd_state", "sitsd_state", state="running") == 1.0]
    assert len(running) >= 2, f"only {len(running)} scrapes while running"
    assert latency_histogram(running[0])[2] > 0
    # cumulative series never fall between scrapes, and the final scrape holds everything the others saw
    series = [*scrapes, final]
    for before, after in zip(series, series[1:]):
        b_bounds, b_cum, _ = latency_histogram(before)
        a_bounds, a_cum, _ = latency_histogram(after)
        assert b_bounds == a_bounds and all(x <= y for x, y in zip(b_cum, a_cum))
        for name in ("sitsd_commands", "sitsd_frames"):
            assert sample(before, name, name + "_total") <= sample(after, name, name + "_total")

    # the last scrape, after the daemon stopped, against the summary
    assert sample(final, "sitsd_state", "sitsd_state", state="running") == 0.0
    assert sample(final, "sitsd_commands", "sitsd_commands_total") == r["commands"]
    assert sample(final, "sitsd_frames", "sitsd_frames_total") == r["frames"]
    assert sample(final, "sitsd_timing_rows_lost", "sitsd_timing_rows_lost_total") == 0
    bounds, cumulative, count = latency_histogram(final)
    lat = r["latency_us"]
    assert count == lat["count"] == r["commands"] - 1  # the startup fail-safe command has no frame, no latency
    assert_percentile_matches(0.50, lat["p50"], bounds, cumulative)
    assert_percentile_matches(0.99, lat["p99"], bounds, cumulative)
    top = bucket_of(count - 1, cumulative)  # the largest sample is the summary's max
    lower, upper = bucket_span(top, top, bounds)
    assert lower - ROUNDING_US <= lat["max"] <= upper + ROUNDING_US
    total_s = sample(final, "sitsd_latency_seconds", "sitsd_latency_seconds_sum")
    per_bucket = [c - (cumulative[i - 1] if i else 0) for i, c in enumerate(cumulative)]
    floor_s = sum(n * bucket_span(i, i, bounds)[0] for i, n in enumerate(per_bucket)) * 1e-6
    assert floor_s <= total_s <= (lat["max"] + ROUNDING_US) * 1e-6 * count  # every sample <= the summary's max


def test_sitsctl_demo_metrics_flag_prints_the_port_and_serves_while_running():
    """`sitsctl demo --metrics 127.0.0.1:0` in its own process: the URL it prints serves the running daemon's
    metrics, the --json summary names the same URL, and nothing serves there once the demo exited."""
    proc = subprocess.Popen([sys.executable, "-m", "sitsd.cli", "demo", "--seconds", "3", "--software",
                             "--security", "none", "--proofs", "0", "--json", "--metrics", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    got: dict = {}
    stderr: list[str] = []

    def read_stderr() -> None:
        for line in proc.stderr:
            stderr.append(line)
            if line.startswith("metrics: http://") and "url" not in got:
                got["url"] = line.split()[1]
                try:
                    got["scrape"] = scrape(got["url"])
                except Exception as exc:  # noqa: BLE001 - asserted below
                    got["error"] = exc

    out: list[str] = []
    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)]
    for t in readers:
        t.start()
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for t in readers:
        t.join(10)
    stdout = "".join(out)
    assert proc.returncode == 0, "".join(stderr)[-2000:]
    assert "url" in got, "no metrics URL printed:\n" + "".join(stderr)[-2000:]
    assert "error" not in got, got.get("error")
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["metrics_url"] == got["url"] and not got["url"].endswith(":0/metrics")
    f = got["scrape"]
    assert sample(f, "sitsd_state", "sitsd_state", state="running") == 1.0
    assert sample(f, "sitsd_signer_info", "sitsd_signer_info", kind="software") == 1.0
    assert summary["latency_us"]["count"] == summary["commands"] - 1 > 0
    with pytest.raises(urllib.error.URLError):
        scrape(got["url"])


def test_metrics_address_is_checked_before_anything_starts():
    assert parse_metrics_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_metrics_address(":9464") == ("127.0.0.1", 9464)
    assert parse_metrics_address("[::1]:9464") == ("::1", 9464)
    for bad in ("9464:", "localhost", "::1:9464", "1.2.3.4:70000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_metrics_address(bad)
    with pytest.raises(ValueError, match="HOST:PORT"):
        run_demo(seconds=1, progress=None, metrics="nonsense")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--metrics", "nonsense"])
    assert "--metrics HOST:PORT" in build_parser()._subparsers._group_actions[0].choices["demo"].format_help()
