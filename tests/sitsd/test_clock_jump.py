"""Fault injection against a real sitsd and the PLC simulator: the PLC's clock jumps (issue 9).

The simulator's `clock-offset-ms N` control command shifts the sender stamp of every frame it publishes
from then on. A jump ahead of sitsd's clock beyond timing.max_future_ms makes the timestamp gate drop
every frame as `future`, one behind it beyond timing.max_transit_ms as `transit`. Each drop raises a
`timestamp` alert; every timing.max_consecutive_drops drops the loop sends the fail-safe command, which
the PLC applies (so its own watchdog never has to fall back). When the clock is right again, frames pass,
model commands resume, the drop counters stand still, and the actuator's rate limit holds across the
return: the command moves away from the fail-safe no faster than safety max_rate allows. (After a jump
behind it does not yet, for one command: the loop commits the fail-safe to the safety envelope with the
dropped frame's stamp; the test reports that as an expected failure until sitsd/pipeline.py is fixed.)
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from ..conftest import REPO, example_config_data, sitsd_args, wait_for, wait_ready

JUMP_MS = 5000.0
FAILSAFE = -0.14  # mm: far below where the model holds the gap (0 to +0.07 here), so a fail-safe -> model step
# past the rate limit shows at whichever frame the clock comes back (at most max_consecutive_drops = 5 frames after
# the last fail-safe: 50 ms, 0.1 mm at 2 mm/s)




def _sim(sim, line: str) -> dict:
    """One control command to the simulator and its JSON answer."""
    sim.stdin.write(line + "\n")
    sim.stdin.flush()
    return json.loads(sim.stdout.readline())


def _drops_by_reason(metrics_url: str) -> dict[str, float]:
    """sitsd_timestamp_drops{reason=...} from the daemon's Prometheus endpoint."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^sitsd_timestamp_drops(?:_total)?\{reason="([a-z_]+)"\} (\S+)$', text, re.M)}


def test_plc_clock_jumps_ahead_and_back_failsafe_alert_recovery(plcsim, tmp_path):
    from sitsd.audit import read_records, verify_directory
    from sitsd.control import request

    data = example_config_data()
    (actuator,) = data["safety"]["actuators"]
    actuator["failsafe"] = FAILSAFE
    config = tmp_path / "line.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    timing = data["timing"]
    max_drops = timing["max_consecutive_drops"]
    assert JUMP_MS > timing["max_future_ms"] and JUMP_MS > timing["max_transit_ms"] and max_drops > 1
    audit, control, log = tmp_path / "audit", tmp_path / "c.sock", tmp_path / "sitsd.log"
    endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem")
    proc = subprocess.Popen(sitsd_args(config, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__mode="software", plc__security="none",
                                       audit__directory=audit, control__socket=control),
                            stderr=open(log, "wb"), cwd=REPO)
    metrics_url = None

    def status() -> dict:  # the daemon's status, with the timestamp drops by reason from its metrics
        s = request(control, "status")
        s["drops"] = _drops_by_reason(metrics_url) if metrics_url else {}
        return s

    def model_commands(s: dict) -> int:
        return s["counters"]["submitted"] - s["counters"]["failsafe"]

    def jump(offset_ms: float, reason: str, base: dict) -> dict:
        """The PLC's clock jumps by offset_ms: every frame is dropped for `reason`, with an alert, and every
        max_drops-th drop sends the fail-safe, which the PLC applies; nothing else goes out."""
        plc_base = _sim(sim, "stats")["stats"]
        assert _sim(sim, f"clock-offset-ms {offset_ms:g}") == {"clock_offset_ms": offset_ms}
        s0 = wait_for(lambda s: s["drops"].get(reason, 0) >= base["drops"].get(reason, 0) + 10 * max_drops
                       and s["alerts"].get("timestamp", 0) >= base["alerts"].get("timestamp", 0) + 10 * max_drops
                       and s["counters"]["failsafe"] >= base["counters"]["failsafe"] + 5,
                       10, f"frames dropped as {reason}, alerts and fail-safe commands", status)
        assert any(a["kind"] == "timestamp" and a["reason"].startswith(f"{reason}:") for a in s0["recent_alerts"])
        time.sleep(0.5)
        s1 = status()
        d = {k: s1["counters"][k] - s0["counters"][k] for k in ("frames", "dropped_timestamp", "failsafe", "submitted")}
        assert d["frames"] >= 20 and d["dropped_timestamp"] == d["frames"], d  # every frame dropped ...
        # all for this reason (the by-reason counts trail the loop's counters by the alert drain, 50 ms)
        assert s1["drops"][reason] > s0["drops"][reason], (s0["drops"], s1["drops"])
        assert all(n == s0["drops"][r] for r, n in s1["drops"].items() if r != reason), (s0["drops"], s1["drops"])
        assert abs(d["failsafe"] - d["dropped_timestamp"] / max_drops) <= 2, d  # ... one fail-safe per max_drops
        assert d["submitted"] == d["failsafe"], d  # and no model command
        plc = _sim(sim, "stats")["stats"]
        assert plc["failsafe_commands"] >= plc_base["failsafe_commands"] + 10, (plc_base, plc)  # the PLC applied them
        assert proc.poll() is None and s1["state"] == "running"
        return s1

    def clock_back(base: dict) -> dict:
        """The clock is right again: model commands resume by themselves and the clock's drops stop. A loaded
        machine still makes a frame miss the deadline or the transit limit now and then, as it does without any
        fault (scheduling, not the clock): the checks leave room for that, not for the fault state."""
        assert _sim(sim, "clock-offset-ms 0") == {"clock_offset_ms": 0.0}
        s0 = wait_for(lambda s: model_commands(s) >= model_commands(base) + 30, 10, "model commands resumed", status)
        time.sleep(0.5)
        s1 = status()
        d = {k: s1["counters"][k] - s0["counters"][k] for k in s1["counters"]}
        why = (d, s1["recent_alerts"])
        assert d["frames"] >= 20, why
        # sender and receiver stamp with the same host clock: only a clock jump makes a frame come from the future
        assert s1["drops"]["future"] == s0["drops"]["future"], why
        assert d["dropped_timestamp"] <= d["frames"] // 10, why  # during the fault: every frame
        assert d["dropped_constraint"] == 0, why
        assert model_commands(s1) - model_commands(s0) >= d["frames"] // 2, why  # during the fault: none
        # fail-safes now only where a deadline was missed or (jitter) max_drops frames in a row were dropped
        assert d["failsafe"] - d["deadline_missed"] <= d["dropped_timestamp"] // max_drops + 1, why
        assert d["lost"] <= d["dropped_timestamp"], why
        assert d["commands"] >= 20 and s1["state"] == "running", why  # acknowledged by the PLC
        return s1

    try:
        wait_ready(proc, log)
        metrics_url = request(control, "status")["metrics_url"]
        before = wait_for(lambda s: s["counters"]["commands"] > 50, 10, "commands flowing", status)
        # a loaded machine drops a frame now and then (transit, stale): scheduling, not the clock
        assert before["counters"]["dropped_timestamp"] <= before["counters"]["frames"] // 10, before["recent_alerts"]
        plc_before = _sim(sim, "stats")["stats"]
        ahead = jump(JUMP_MS, "future", before)  # the PLC's clock 5 s ahead: frames "from the future"
        back1 = clock_back(ahead)
        behind = jump(-JUMP_MS, "transit", back1)  # 5 s behind: every frame looks 5 s in transit
        after = clock_back(behind)
        plc_after = _sim(sim, "stats")["stats"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()[-2000:]

    c, reasons = after["counters"], after["drops"]
    print(f"\ntimestamp drops by reason: { {k: v for k, v in reasons.items() if v} }; sitsd counters: {c}; "
          f"alerts: {after['alerts']}; plc: accepted {plc_after['accepted']}, failsafe "
          f"{plc_after['failsafe_commands']}, rejected {plc_after['rejected']}, fallbacks {plc_after['fallbacks']}")
    assert reasons["future"] >= 20 * max_drops and reasons["transit"] >= 20 * max_drops
    # every timestamp drop has its alert and its reason (the alerts are drained every 50 ms: the newest may trail)
    assert c["dropped_timestamp"] - 2 <= sum(reasons.values()) <= c["dropped_timestamp"]
    assert abs(after["alerts"]["timestamp"] - sum(reasons.values())) <= 2
    assert plc_after["rejected"] == 0
    # the PLC never fell back on its own watchdog: a fail-safe came every max_drops frames while the clock was off
    assert plc_after["fallbacks"] == plc_before["fallbacks"]

    # the audit chain verifies (the library and `sitsctl audit verify`) and tells the same story
    segments = verify_directory(audit)
    r = subprocess.run([sys.executable, "-m", "sitsd.cli", "audit", "verify", str(audit)], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0 and "chain intact" in r.stdout, r.stdout + r.stderr
    records = [rec for f, _ in segments for rec in read_records(f)]
    assert all(rec["outcome"] == "acknowledged" for rec in records)
    assert records[0].get("reason") == "startup"
    records = records[1:]
    fs = [i for i, rec in enumerate(records) if rec["failsafe"]]
    assert all(records[i]["values"] == [FAILSAFE] for i in fs)
    # a fail-safe's sent_ns is the stamp of the frame it replaced: 5 s ahead of its acknowledgement, or behind it
    ahead_fs = [i for i in fs if records[i]["sent_ns"] - records[i]["ack_ns"] > JUMP_MS * 1e6 / 2]
    behind_fs = [i for i in fs if records[i]["ack_ns"] - records[i]["sent_ns"] > JUMP_MS * 1e6 / 2]
    assert len(ahead_fs) >= 10 and len(behind_fs) >= 10
    assert len(fs) - len(ahead_fs) - len(behind_fs) <= len(records) // 10  # the rest: missed deadlines (load)
    tail = records[behind_fs[-1] + 1:]  # after the clock's last fail-safe: model commands, and plenty of them
    assert len(tail) >= 50 and sum(not rec["failsafe"] for rec in tail) >= 0.8 * len(tail)

    # the rate limit held: from one command to the next the gap moved at most max_rate * the time between their
    # frames: frame sequence numbers at timing.cycle_ms (a fail-safe's stamp is the wrong one), or the stamps of two
    # frames that passed the gate if further apart (a late frame), plus 5 ms for the publisher's jitter
    def too_fast(a: dict, b: dict) -> bool:
        dt_s = ((b["frame_seq"] - a["frame_seq"]) & 0xFFFF) * timing["cycle_ms"] / 1000.0
        if not a["failsafe"]:
            dt_s = max(dt_s, (b["sent_ns"] - a["sent_ns"]) * 1e-9)
        return abs(b["values"][0] - a["values"][0]) > actuator["max_rate"] * (dt_s + 0.005) + 1e-9

    def show(i: int) -> str:
        a, b = records[i - 1], records[i]
        return f"frame {a['frame_seq']} {a['values']} -> frame {b['frame_seq']} {b['values']}"

    violations = {i + 1 for i, (a, b) in enumerate(zip(records, records[1:])) if not b["failsafe"] and too_fast(a, b)}
    first_after = sorted(i + 1 for i in fs if i + 1 < len(records) and not records[i + 1]["failsafe"])
    print(f"first model commands after the fail-safes: {[show(i) for i in first_after]}; "
          f"past the rate limit: {[show(i) for i in sorted(violations)]}")
    # after the clock came back, from ahead or from behind: never. sitsd.gates.safety holds the command when the
    # stamps went back, and ControlLoop commits a fail-safe for a dropped frame at its receive time, not at the
    # dropped frame's sender stamp (5 s off here, which made the rate limit count over 5 s, i.e. not at all)
    assert not violations, [show(i) for i in sorted(violations)][:3]


def test_simulator_clock_offset_moves_the_sender_stamp_only():
    """`clock-offset-ms N` acts where the stamp is taken: every frame from then on, on top of a --fault's skew."""
    import math

    from plc.simulator.server import RollingMillSimulator, SimulatorSettings

    sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://239.255.1.1:4840"), None)
    assert abs(sim._sender_ns() - time.time_ns()) < 50e6
    assert sim.set_clock_offset_ms(JUMP_MS) == int(JUMP_MS * 1e6)
    assert abs(sim._sender_ns() - time.time_ns() - JUMP_MS * 1e6) < 50e6 and sim.stats()["clock_offset_ms"] == JUMP_MS
    sim.set_clock_offset_ms(-JUMP_MS)
    assert abs(sim._sender_ns() - time.time_ns() + JUMP_MS * 1e6) < 50e6
    sim.set_clock_offset_ms(0)
    assert abs(sim._sender_ns() - time.time_ns()) < 50e6
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError):
            sim.set_clock_offset_ms(bad)
    skewed = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://239.255.1.1:4840", fault="clock_skew@0x100"),
                                  None)
    skewed.set_clock_offset_ms(-JUMP_MS)  # clock_skew x100: 40 ms at t=0, plus the jump
    assert abs(skewed._sender_ns() - time.time_ns() - (40e6 - JUMP_MS * 1e6)) < 20e6
