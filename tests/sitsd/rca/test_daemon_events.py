"""A real sitsd against the PLC simulator with an injected fault: the control socket's `events` command
hands over the event stream and the signal window, and `sitsctl diagnose` localizes from it."""
import json
import signal
import subprocess
import sys
import time

from sitsd.control import request

from ...conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_ready


def _sim_steps(sim) -> int:
    sim.stdin.write("stats\n")
    sim.stdin.flush()
    return json.loads(sim.stdout.readline())["stats"]["steps"]


def test_events_command_and_diagnose_against_a_running_daemon(plcsim, tmp_path):
    audit = tmp_path / "audit"
    fault_at_s = 10.0
    endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem", extra_args=("--fault", f"network_delay@{fault_at_s:g}"))
    control = tmp_path / "c.sock"
    log = tmp_path / "sitsd.log"
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none",
                                         audit__directory=audit, control__socket=control),
                              stderr=open(log, "wb"), cwd=REPO)
    try:
        wait_ready(daemon, log)
        deadline = time.monotonic() + 60
        while _sim_steps(sim) < (fault_at_s + 3.0) * 100 and time.monotonic() < deadline:
            time.sleep(0.5)
        answer = request(control, "events", timeout_s=10.0, since_s=120)
        window = answer["signals"]
        assert window["names"][:2] == ["entry_thickness", "exit_thickness"] and len(window["t_ns"]) > 200
        codes = [e["code"] for e in answer["events"]]
        assert "timestamp.transit" in codes, codes[:20]
        assert all(e["t_ns"] <= answer["now_ns"] for e in answer["events"])

        r = subprocess.run([sys.executable, "-m", "sitsd.cli", "diagnose", "--socket", str(control), "--since", "2m",
                            "--format", "json"], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert r.returncode == 0, r.stderr
        diagnosis = json.loads(r.stdout)
        ranking = diagnosis["ranking"]
        assert ranking[0]["cause"] == "network.congestion", json.dumps(
            {"ranking": [{k: c[k] for k in ("cause", "score", "evidence")} for c in ranking[:3]],
             "symptoms": diagnosis["symptoms"], "cleared": diagnosis["cleared"]}, indent=1)
        assert any("timestamp.transit" in line for line in ranking[0]["evidence"])
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(20)
