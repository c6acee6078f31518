"""A refused `sitsctl update` on a running sitsd: one alert `update_refused` with the reason per refusal, counted in
`sitsctl status` (alerts, recent_alerts) and the metrics (sitsd_updates_refused_total, sitsd_alerts_total), while
the loop keeps running the version it ran before."""
from __future__ import annotations

import json
import shutil
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sitsd.control import ControlError, request

from ..conftest import REPO, sitsd_serving_simulator

MODULES = REPO / "wasm_modules"


@pytest.fixture
def running():
    """sitsd (in this process, its loop and I/O threads) serving the PLC simulator at 100 Hz, with its metrics."""
    with sitsd_serving_simulator("sits-refused-") as (daemon, _, workdir, _, port):
        yield daemon, port, workdir


def _metric(port: int, name: str, **labels) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    for s in families[name].samples if name in families else []:
        if s.name == name + "_total" and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def _refused_count(sock, want: int, timeout_s: float = 5.0) -> dict:
    """status once the housekeeping drained `want` update_refused alerts (it runs every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = request(sock, "status")
        if status["alerts"].get("update_refused", 0) >= want:
            return status
        assert time.monotonic() < deadline, f"no update_refused alert #{want}: {status['alerts']}"
        time.sleep(0.05)


def test_a_refused_update_is_one_alert_counted_in_status_and_metrics_and_the_old_version_runs(running, tmp_path,
                                                                                            capsys):
    from sitsd.cli import main

    daemon, port, workdir = running
    sock = workdir / "control.sock"
    assert _metric(port, "sitsd_updates_refused") == 0.0  # exported from the start
    before = request(sock, "versions")["current"]
    first = daemon.loop.stage_set

    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(MODULES / "post_command.wat", bad / "post_command.wat")  # golden vectors that do not fit it
    (bad / "post_command.golden.json").write_text(json.dumps({"steps": [{"in": [0.5], "out": [0.7]}]}))
    with pytest.raises(ControlError, match="refused, the running version stays: .*golden step"):
        request(sock, "update", timeout_s=60, module=str(bad / "post_command.wat"))
    frames = daemon.loop.stage_set.frames
    status = _refused_count(sock, 1)
    time.sleep(0.3)  # more housekeeping rounds: still one alert for one refusal
    status = request(sock, "status")
    assert status["alerts"]["update_refused"] == 1
    last = [a for a in status["recent_alerts"] if a["kind"] == "update_refused"]
    assert len(last) == 1 and last[0]["reason"].startswith("module post_command.wat: refused, the running version")
    assert "golden step" in last[0]["reason"]
    assert _metric(port, "sitsd_updates_refused") == 1.0
    assert _metric(port, "sitsd_alerts", kind="update_refused") == 1.0
    # the running version is untouched and keeps serving frames
    assert daemon.loop.stage_set is first and request(sock, "versions")["current"]["generation"] == before["generation"]
    deadline = time.monotonic() + 5
    while daemon.loop.stage_set.frames <= frames:
        assert time.monotonic() < deadline, "the loop stopped serving frames after the refused update"
        time.sleep(0.02)
    assert daemon.loop.crashed is None and request(sock, "versions")["history"] == []

    # through sitsctl: exit 2 with the reason; `sitsctl status` counts it with the other alerts
    rc = main(["update", "--model", str(REPO / "examples" / "rolling-mill.yaml"), "--socket", str(sock)])
    err = capsys.readouterr().err
    assert rc == 2 and "refused, the running version stays" in err
    _refused_count(sock, 2)
    assert main(["status", "--socket", str(sock)]) == 0
    out = capsys.readouterr().out
    assert "update_refused 2" in out
    assert _metric(port, "sitsd_updates_refused") == 2.0 and daemon.loop.stage_set is first
    # fault attribution (`sitsctl diagnose`) reads them as events of the update component
    events = [e for e in daemon.rca.events.since(0) if e.code == "update.refused"]
    assert len(events) == 2 and {e.source for e in events} == {"update"}
