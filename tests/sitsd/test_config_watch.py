"""A config put live by `sitsctl update --config` is health-watched like a module or model swap: when most of the
frames after it get the fail-safe, the daemon rolls it back on its own (measured as `rollback:config`), raises a
`rollback` alert, and the line runs on the config before it; a good config update passes its watch and stays."""
import time

from sitsd.control import request

from ..conftest import sim_stats, wait_ready
from .rca.test_daemon_updates import Line, _config


def _alerts(control) -> tuple[dict, list]:
    s = request(control, "status")
    return s["alerts"], s["recent_alerts"]


def _wait_for(predicate, timeout_s: float = 30.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    return predicate()


def test_a_config_update_that_sends_mostly_fail_safes_is_rolled_back_automatically(plcsim, tmp_path):
    config = _config(tmp_path)
    line = Line(plcsim, tmp_path, config)
    try:
        wait_ready(line.proc, line.log)
        line.run_for(2.0)
        # the rolling force runs at about 8000-8700 kN: a band that ends at 7500 breaks a rule on every frame
        bad = tmp_path / "bad.yaml"
        text = config.read_text()
        assert "max: 13000.0" in text
        bad.write_text(text.replace("max: 13000.0", "max: 7500.0"))
        good = tmp_path / "good.yaml"
        good.write_text(text.replace("max: 13000.0", "max: 12500.0"))  # still holds on every frame

        r = line.sitsctl("update", "--config", str(good))
        assert r.returncode == 0, r.stdout + r.stderr
        line.run_for(3.0)  # past its watch (200 frames at 100 Hz): it stays
        assert request(line.control, "status")["alerts"].get("rollback", 0) == 0
        accepted_before = sim_stats(line.sim)["accepted"]

        r = line.sitsctl("update", "--config", str(bad))
        assert r.returncode == 0, r.stdout + r.stderr
        rolled = _wait_for(lambda: request(line.control, "status")["alerts"].get("rollback", 0))
        assert rolled == 1, _alerts(line.control)
        events = request(line.control, "events", since_s=60)["events"]
        said = [e["text"] for e in events if "config update rolled back to" in e["text"]]
        assert len(said) == 1 and str(good) in said[0] and "fail-safe rate" in said[0], said
        reloads = [e["text"] for e in events if e["code"] == "update.reload"]
        assert len(reloads) == 3, reloads  # good, bad, and the rollback back to good
        line.run_for(2.0)
        stats = sim_stats(line.sim)
        assert stats["accepted"] > accepted_before + 100  # the line runs on the good config again
        constraint_before = request(line.control, "status")["alerts"].get("constraint", 0)
        line.run_for(1.0)
        assert request(line.control, "status")["alerts"].get("constraint", 0) == constraint_before
    finally:
        line.stop()
