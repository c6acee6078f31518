"""The Prometheus exporter and `sitsctl top` against a real daemon, simulator and control socket."""
from __future__ import annotations

import io
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sitsd.config import load_config
from sitsd.daemon import Daemon
from sitsd.gates.timestamp import REASONS
from sitsd.demo import DEFAULT_CONFIG
from sitsd.metrics import LATENCY_BUCKETS_S, STAGE_BUCKETS_S, MetricsExporter, RingHistograms
from sitsd.stats import STAGE_INDEX, STAGES, TimingRing
from sitsd.top import run_top

from ..conftest import sitsd_serving_simulator


@pytest.fixture(scope="module")
def running():
    """sitsd serving the PLC simulator at 100 Hz (UDP frames, OPC UA writes without security), as in run_demo."""
    with sitsd_serving_simulator("sits-metrics-") as (daemon, cfg, _, exporter, port):
        yield daemon, exporter, port, cfg


def scrape(port: int) -> dict:
    """{family name: family} from one GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, name: str, suffix: str = "_total", **labels) -> float:
    for s in families[name].samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{name}{suffix} {labels}")


def buckets(families: dict, name: str, **labels) -> tuple[list[float], list[float], float]:
    """(upper bounds, cumulative counts, count) of one histogram series."""
    les, counts, total = [], [], None
    for s in families[name].samples:
        if not all(s.labels.get(k) == v for k, v in labels.items()):
            continue
        if s.name == name + "_bucket":
            les.append(float(s.labels["le"]))
            counts.append(s.value)
        elif s.name == name + "_count":
            total = s.value
    return les, counts, total


def quantile(q: float, les: list[float], counts: list[float]) -> tuple[float, int]:
    """histogram_quantile as Prometheus computes it; also the index of the bucket it falls in."""
    rank = q * counts[-1]
    i = next(i for i, c in enumerate(counts) if c >= rank)
    if les[i] == float("inf"):
        return les[i - 1], i
    lower, below = (les[i - 1], counts[i - 1]) if i else (0.0, 0.0)
    return lower + (les[i] - lower) * (rank - below) / (counts[i] - below), i


def test_scrape_matches_the_daemon_and_is_cumulative(running):
    daemon, exporter, port, _ = running
    time.sleep(3.0)
    c = daemon.counters
    frames0, commands0 = c.frames, c.commands
    fam = scrape(port)
    frames1, commands1 = c.frames, c.commands

    assert 0 < frames0 <= value(fam, "sitsd_frames") <= frames1
    assert 0 < commands0 <= value(fam, "sitsd_commands") <= commands1
    assert value(fam, "sitsd_dropped_frames", gate="timestamp") == c.dropped_timestamp
    assert value(fam, "sitsd_failsafe_commands") >= 1  # the startup fail-safe
    assert value(fam, "sitsd_state", "", state="running") == 1.0
    assert value(fam, "sitsd_state", "", state="reconnecting") == 0.0
    assert value(fam, "sitsd_signer_info", "", kind="software", key_id=daemon.signer.key_id.hex()) == 1.0
    assert value(fam, "sitsd_model_info", "", sha256=daemon.model.sha256.hex()) == 1.0
    assert value(fam, "sitsd_uptime_seconds", "") >= 3.0
    assert value(fam, "sitsd_proof_backlog", "") == 0.0
    assert value(fam, "sitsd_model_swaps") == 0.0  # (a later test swaps the model)
    assert value(fam, "sitsd_timing_rows_lost") == 0.0

    # the latency histogram counts exactly the acknowledged commands among the rows it folded in
    folded = int(value(fam, "sitsd_timing_rows"))
    assert frames0 - 3 <= folded <= frames1  # at most the in-flight tail is held back
    les, counts, count = buckets(fam, "sitsd_latency_seconds")
    assert les == [*LATENCY_BUCKETS_S, float("inf")]
    assert count == counts[-1] == np.isfinite(daemon.timings.latency_us[:folded]).sum()
    # ... which are all acknowledged commands but the startup fail-safe (it has no frame) and those in flight
    assert commands0 - 1 - 3 <= count <= commands1 - 1
    assert count > 100

    # quantiles estimated from the buckets: in the bucket that holds the same rank among the folded samples
    bounds = [0.0, *LATENCY_BUCKETS_S, float("inf")]
    folded_s = daemon.timings.latency_us[:folded]
    folded_s = folded_s[np.isfinite(folded_s)] * 1e-6
    for q in (0.5, 0.9, 0.99):
        estimate, i = quantile(q, les, counts)
        exact = float(np.quantile(folded_s, q, method="inverted_cdf"))
        assert bounds[i] <= exact <= bounds[i + 1] and bounds[i] <= estimate <= bounds[i + 1], (q, estimate, exact)
    # ... and the p50 agrees with the ring's own summary within the bucket resolution
    estimate, i = quantile(0.5, les, counts)
    p50_s = daemon.timings.latency_summary()["p50"] * 1e-6
    assert bounds[max(i - 1, 0)] <= p50_s <= bounds[i + 2], (estimate, p50_s)

    for stage in STAGES:
        s_les, s_counts, s_count = buckets(fam, "sitsd_stage_duration_seconds", stage=stage)
        assert s_les == [*STAGE_BUCKETS_S, float("inf")], stage
        ring_n = np.isfinite(daemon.timings.stages[:folded, STAGE_INDEX[stage]]).sum()
        assert s_count == ring_n, stage
    assert buckets(fam, "sitsd_stage_duration_seconds", stage="model")[2] > 100

    # a second scrape is cumulative: nothing decreases, and new frames were counted
    time.sleep(0.5)
    fam2 = scrape(port)
    assert value(fam2, "sitsd_frames") > value(fam, "sitsd_frames")
    for name, fam_1 in fam.items():
        if fam_1.type not in ("counter", "histogram"):
            continue
        before = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam_1.samples
                  if not s.name.endswith("_created")}
        after = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam2[name].samples}
        for key, v in before.items():
            assert after[key] >= v, key
    assert buckets(fam2, "sitsd_latency_seconds")[2] > count


def test_top_shows_the_numbers_of_the_running_daemon(running):
    daemon, _, _, cfg = running
    out = io.StringIO()
    assert run_top(cfg.control.socket, interval_s=0.3, iterations=2, out=out) == 0
    text = out.getvalue()
    assert "\x1b[" not in text  # not a terminal: plain blocks, no escape codes
    blocks = [b for b in text.split("\n\n") if b.startswith("sitsd ")]
    assert len(blocks) == 2
    frames = [int(n) for n in re.findall(r"^  frames +(\d+)", text, re.M)]
    assert len(frames) == 2 and 0 < frames[0] <= frames[1] <= daemon.counters.frames
    rate = re.findall(r"^  frames +\d+ +([\d.]+)/s", text, re.M)
    assert len(rate) == 1 and 30 < float(rate[0]) < 300  # the simulator publishes at 100 Hz
    p50 = re.findall(r"latency +p50 ([\d.]+) ms +p99 ([\d.]+) ms +max ([\d.]+) ms", text)
    assert len(p50) == 2 and 0 < float(p50[-1][0]) <= float(p50[-1][1]) <= float(p50[-1][2])
    for stage in STAGES:
        assert re.search(rf"^  {stage} +-?[\d.]+ +-?[\d.]+ +-?[\d.]+$", text, re.M), stage
    link = re.findall(r"^  link +(up|DOWN[^ ]*) +losses (\d+) +reconnects (\d+) +not sent (\d+) +frame age (\d+) ms/(\d+) ms",
                      text, re.M)
    assert len(link) == 2 and link[-1][0] == "up" and int(link[-1][5]) > 0, text
    assert "certified" not in text  # software signer: no certification line


def test_status_and_metrics_show_the_durable_audit_watermark(running, capsys):
    """What has reached the disk: the last fsynced record (audit.fsync interval here: at least once a second)
    advances with the commands, never passes the head, and is a real record of the chain."""
    import json

    from sitsd.cli import main as sitsctl
    from sitsd.control import request

    from ..conftest import wait_for

    daemon, _, port, cfg = running
    status = lambda: request(cfg.control.socket, "status")  # noqa: E731
    first = wait_for(lambda s: s["audit_durable"]["records"] >= 1, 30, "a first durable record", status)
    dur, head = first["audit_durable"], first["audit_head"]
    assert dur["policy"] == cfg.audit.fsync == "interval" and "once a second" in dur["promise"]
    assert 1 <= dur["records"] <= head["records"] and dur["seq"] <= head["seq"]
    assert dur["not_durable"] >= 0 and dur["at_ns"] > 0 and len(dur["hash"]) == 64
    later = wait_for(lambda s: s["audit_durable"]["records"] > dur["records"], 30, "the durable record to advance",
                     status)
    dur2, head2 = later["audit_durable"], later["audit_head"]
    assert dur2["seq"] > dur["seq"] and dur2["at_ns"] >= dur["at_ns"] and dur2["hash"] != dur["hash"]
    assert dur2["records"] <= head2["records"] and dur2["seq"] <= head2["seq"]
    assert head2["records"] >= dur2["records"] + dur2["not_durable"] >= dur2["records"]
    on_disk = {}
    for f in daemon.audit.directory.glob("commands-*.jsonl"):
        for line in f.read_text().splitlines():
            entry = json.loads(line)
            on_disk[entry["hash"]] = entry["record"]
    assert dur2["hash"] in on_disk  # the durable mark is a record of the chain ...
    durable_seq = on_disk[dur2["hash"]].get("seq")  # ... the command it names (or an anchor after it)
    assert durable_seq is None or durable_seq == dur2["seq"]

    fam = scrape(port)
    assert value(fam, "sitsd_audit_durable_records") >= dur2["records"]
    assert value(fam, "sitsd_audit_durable_records") <= value(fam, "sitsd_audit_records")
    assert value(fam, "sitsd_audit_not_durable_records", "", policy="interval") >= 0
    assert value(fam, "sitsd_audit_last_fsync_timestamp_seconds", "") >= dur2["at_ns"] / 1e9 - 1e-6

    capsys.readouterr()
    assert sitsctl(["status", "--socket", str(cfg.control.socket)]) == 0
    text = capsys.readouterr().out
    shown = re.search(r"^  audit   head: (\d+) records \(seq (\d+)\), hash [0-9a-f]{16}…\n"
                      r"          on disk: (\d+) records \(seq (\d+)\), hash [0-9a-f]{16}…, fsynced [\d.]+ s ago; "
                      r"not yet on disk: (\d+) records \(audit.fsync interval: ", text, re.M)
    assert shown, text
    head_n, head_seq, disk_n, disk_seq, pending = map(int, shown.groups())
    # one answer: the durable mark read before the head, so it never passes the head shown with it
    assert dur2["records"] <= disk_n <= disk_n + pending <= head_n and dur2["seq"] <= disk_seq <= head_seq


def test_top_shows_a_link_that_is_down_and_a_certification_that_ended():
    from sitsd.top import render

    status = {"line": "mill", "state": "running", "uptime_s": 5, "counters": {
        "frames": 1, "commands": 1, "dropped": 0, "failsafe": 0}, "latency_us": {"p50": 1.0, "p99": 2.0},
        "plc_link": {"connected": False, "losses": 2, "reconnects": 1, "down_s": 1.5, "commands_not_sent": 7,
                     "frame_age_ms": 1600, "frame_timeout_ms": 500, "frames_stalled_s": 1.1,
                     "last_loss": "PLC write failed"}, "session_certified": False}
    text = render(status)
    assert "link      DOWN 1.5 s  losses 2  reconnects 1  not sent 7  frame age 1600 ms/500 ms" in text
    assert "FRAMES STALLED 1.1 s" in text and "(PLC write failed)" in text
    assert "session key NOT certified" in text
    assert "session key certified by the TPM" in render({**status, "session_certified": True})


def test_a_model_swap_and_its_rollback_show_in_the_metrics(running, tmp_path):
    """sitsd_model_info names the model that runs now, sitsd_model_swaps and sitsd_swaps count the swaps."""
    import hashlib

    daemon, _, port, cfg = running
    first = daemon.loop.stage_set.model_sha256.hex()
    copy = tmp_path / "rolling_mill_v2.onnx"
    copy.write_bytes(Path(cfg.model.artifact).read_bytes() + b"\x32\x02v2")  # one more doc_string: another hash
    new = hashlib.sha256(copy.read_bytes()).hexdigest()
    daemon.hotswap.update_model(copy)
    try:
        fam = scrape(port)
        assert value(fam, "sitsd_model_info", "", sha256=new, artifact=str(copy)) == 1.0
        assert not any(s.labels.get("sha256") == first for s in fam["sitsd_model_info"].samples)
        assert value(fam, "sitsd_model_swaps") == 1.0
        assert value(fam, "sitsd_swaps", action="update", component="model") == 1.0
    finally:
        daemon.hotswap.rollback("model")
    fam = scrape(port)
    assert value(fam, "sitsd_model_info", "", sha256=first) == 1.0
    assert value(fam, "sitsd_model_swaps") == 2.0
    assert value(fam, "sitsd_swaps", action="rollback", component="model") == 1.0


def test_top_says_clearly_when_there_is_no_socket(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    assert run_top(tmp_path / "none.sock", iterations=1, out=out, err=err) == 2
    assert "no control socket" in err.getvalue() and "is sitsd running" in err.getvalue()
    assert out.getvalue() == ""


def _write(ring: TimingRing, latency_us: float, stage_us: float = 10.0, signed: bool = True) -> int:
    row = ring.next_row()
    ring.stages[row, :] = stage_us
    if not signed:  # a dropped frame: no command, so nothing from the write path
        for stage in ("sign", "handoff", "write"):
            ring.stages[row, STAGE_INDEX[stage]] = np.nan
    ring.latency_us[row] = latency_us
    return row


def test_ring_wrap_between_scrapes_counts_only_what_survived():
    ring, h = TimingRing(capacity=8), RingHistograms()
    for _ in range(5):
        _write(ring, 150.0)  # 150 us: the 200 us bucket
    h.update(ring)
    assert h.latency.count == 5 and h.folded == 5 and h.lost == 0
    for _ in range(12):
        _write(ring, 3000.0)  # 3 ms
    for _ in range(8):
        _write(ring, 40_000.0)  # 40 ms: only these 8 survive in the ring
    h.update(ring)
    assert h.lost == 12  # 20 rows since the last scrape, the last 8 survive
    assert h.folded == 25 and h.latency.count == 5 + 8
    b = dict(h.latency.buckets())
    assert b["0.0002"] == 5 and b["0.03"] == 5 and b["0.05"] == 13 and b["+Inf"] == 13
    assert h.latency.sum_s == pytest.approx(5 * 150e-6 + 8 * 40e-3)
    assert h.stages["model"].count == 13 and dict(h.stages["model"].buckets())["1e-05"] == 13
    h.update(ring)  # nothing new: nothing changes
    assert h.latency.count == 13 and h.lost == 12


def test_ring_wrap_shows_in_the_exposition():
    cfg = load_config(DEFAULT_CONFIG, {"attestation.mode": "software"})
    daemon = Daemon(cfg)  # never served: no loop, model or signer yet
    daemon.timings = TimingRing(capacity=8)
    exporter = MetricsExporter(daemon)
    for _ in range(3):
        _write(daemon.timings, 500.0)
    fam = {f.name: f for f in text_string_to_metric_families(exporter.render().decode())}
    assert buckets(fam, "sitsd_latency_seconds")[2] == 3
    assert value(fam, "sitsd_state", "", state="starting") == 1.0
    assert "sitsd_signer_info" not in fam and "sitsd_model_info" not in fam
    for _ in range(30):
        _write(daemon.timings, 500.0)
    fam = {f.name: f for f in text_string_to_metric_families(exporter.render().decode())}
    assert buckets(fam, "sitsd_latency_seconds")[2] == 3 + 8
    assert value(fam, "sitsd_timing_rows_lost") == 22
    assert value(fam, "sitsd_timing_rows") == 11
    assert value(fam, "sitsd_timestamp_drops", reason="transit") == 0  # every reason is exported, zeros too
    daemon.timestamp_drop_counts = Counter({"transit": 2, "replay": 1})
    fam = {f.name: f for f in text_string_to_metric_families(exporter.render().decode())}
    assert value(fam, "sitsd_timestamp_drops", reason="transit") == 2
    assert {s.labels["reason"] for s in fam["sitsd_timestamp_drops"].samples} == set(REASONS.values())


def test_rows_with_a_command_in_flight_wait_for_the_writer():
    ring, h = TimingRing(capacity=64), RingHistograms()
    _write(ring, 100.0)
    pending = _write(ring, np.nan)  # signed, not yet acknowledged
    ring.stages[pending, STAGE_INDEX["handoff"]] = np.nan
    ring.stages[pending, STAGE_INDEX["write"]] = np.nan
    _write(ring, np.nan, signed=False)  # a dropped frame behind it
    _write(ring, np.nan, signed=False)  # the newest row: the loop may still be on it
    h.update(ring)
    assert h.folded == 1 and h.latency.count == 1
    ring.stages[pending, STAGE_INDEX["handoff"]] = 5.0  # the writer takes it and is acknowledged
    ring.stages[pending, STAGE_INDEX["write"]] = 300.0
    ring.latency_us[pending] = 900.0
    h.update(ring)
    assert h.folded == 3 and h.latency.count == 2 and h.stages["write"].count == 2
    _write(ring, 700.0)  # the next command is acknowledged: everything before it is final
    h.update(ring)
    assert h.folded == 5 and h.latency.count == 3
