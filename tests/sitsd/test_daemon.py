"""sitsd as a process: startup refusals say what is wrong and how to fix it."""
import hashlib
import subprocess

from attestation.signers import SoftwareSigner

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO, check_commands_across_a_plc_restart, sitsd_args, wait_ready


def test_plc_that_does_not_trust_the_key_refuses_startup(plcsim, tmp_path):
    other_key = tmp_path / "other.pem"
    other_key.write_bytes(SoftwareSigner().public_key_pem())
    endpoint, udp_url, _ = plcsim(other_key)
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                  attestation__mode="software", plc__security="none", audit__directory=tmp_path / "audit",
                                  control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert "refused the startup fail-safe command" in r.stderr
    assert "signer.pub.pem" in r.stderr


def test_unreachable_plc_is_a_startup_error(tmp_path):
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, plc__endpoint="opc.tcp://127.0.0.1:9/none",
                                  plc__timeout_s=1, attestation__mode="software", plc__security="none",
                                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert "cannot connect to the PLC at opc.tcp://127.0.0.1:9/none" in r.stderr


def test_unreachable_tpm_is_a_startup_error_not_a_downgrade(tmp_path):
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, attestation__tcti=f"swtpm:path={tmp_path}/no.sock",
                                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert "cannot open TPM through TCTI" in r.stderr and "attestation.mode: software" in r.stderr


def test_bad_config_exits_2_with_file_line_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE_CONFIG.read_text().replace("publisher_id: 7", "publisher_id: seven"))
    r = subprocess.run(sitsd_args(bad), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2
    assert f"{bad}:" in r.stderr and "transport.publisher_id" in r.stderr


def test_plc_restart_reconnects_and_commands_resume(plcsim, tmp_path):
    """The session recovers after a PLC restart, and no acknowledged command is lost or duplicated:
    every record in the audit log was accepted by exactly one of the two PLC incarnations."""
    import json
    import signal
    import socket
    import time

    from sitsd.control import request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    audit = tmp_path / "audit"
    endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem", port=port)
    control = tmp_path / "c.sock"
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none",
                                         audit__directory=audit, control__socket=control),
                              stderr=open(tmp_path / "sitsd.log", "wb"), cwd=REPO)
    try:
        wait_ready(daemon, tmp_path / "sitsd.log")
        time.sleep(1.0)
        before = request(control, "status")["counters"]["commands"]
        assert before > 0
        sim.stdin.write("stop\n")  # the PLC goes away ...
        sim.stdin.flush()
        first = next(json.loads(line)["final"] for line in sim.stdout if line.startswith('{"final"'))
        sim.wait(10)
        time.sleep(0.5)
        _, _, sim2 = plcsim(audit / "signer.pub.pem", port=port, udp_url=udp_url)  # ... and comes back
        deadline = time.monotonic() + 20
        status = request(control, "status")
        # 110: the commands sitsd counts include the one in flight and one the restart cut (audited unconfirmed),
        # which the second PLC never applied; its own count must still reach 100 (checked below)
        while status["counters"]["commands"] < before + 110 and time.monotonic() < deadline:
            time.sleep(0.2)
            status = request(control, "status")
        assert status["counters"]["commands"] >= before + 110, status
        assert status["state"] == "running"
        assert status["alerts"].get("publisher_restart", 0) >= 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(20)
    sim2.stdin.write("stats\n")
    sim2.stdin.flush()
    second = json.loads(sim2.stdout.readline())["stats"]
    records = check_commands_across_a_plc_restart(audit, first, second)
    assert "reconnected to PLC" in (tmp_path / "sitsd.log").read_text()
    # each record names what the command follows from: the model (as in its envelope) and the inputs' digest
    from attestation.envelope import decode

    model_sha = hashlib.sha256(DEMO_MODEL.read_bytes()).hexdigest()
    assert records[0].get("reason") == "startup" and records[0]["input_sha256"] is None  # from no frame
    for r in records[:50]:
        env, _ = decode(bytes.fromhex(r["envelope"]))
        assert r["model_sha256"] == env.command.model_sha256.hex() == model_sha
        assert r is records[0] or len(r["input_sha256"]) == 64
    assert len({r["input_sha256"] for r in records}) > len(records) // 2  # frames differ, so do their digests


def test_pinned_model_hash_mismatch_refuses_startup(tmp_path):
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, model__sha256="ab" * 32, attestation__mode="software", plc__security="none",
                                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert "differs from model.sha256 " + "ab" * 32 in r.stderr


def test_malformed_frames_are_reported_and_the_loop_keeps_running(plcsim, tmp_path):
    import signal
    import time

    from plc.udp import UdpPublisher
    from sitsd.control import request

    audit = tmp_path / "audit"
    endpoint, udp_url, _ = plcsim(audit / "signer.pub.pem")
    control = tmp_path / "c.sock"
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none", audit__directory=audit,
                                         control__socket=control),
                              stderr=open(tmp_path / "sitsd.log", "wb"), cwd=REPO)
    try:
        wait_ready(daemon, tmp_path / "sitsd.log")
        time.sleep(0.5)
        pub = UdpPublisher(udp_url, "127.0.0.1")
        for _ in range(5):
            pub.send(b"\xf1\x21junk")
        pub.close()
        time.sleep(1.0)
        status = request(control, "status")
        assert status["counters"]["malformed"] == 5
        assert status["alerts"]["malformed_frame"] == 5
        before = status["counters"]["commands"]
        time.sleep(0.5)
        assert request(control, "status")["counters"]["commands"] > before
        daemon.send_signal(signal.SIGHUP)  # a reload, never fatal
        time.sleep(0.3)
        assert daemon.poll() is None
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    log = (tmp_path / "sitsd.log").read_text()
    assert "malformed frames skipped" in log and "UADP decode error at byte" in log
    assert "config reloaded" in log


def test_plc_refusing_the_session_credential_stops_startup(plcsim, swtpm, tmp_path):
    """tpm-session: the PLC trusts another device's attestation key, so it refuses the quote."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    other = tmp_path / "other-device.pem"
    other.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    from ep.session import sha256_file

    from ..conftest import DEMO_MODEL

    endpoint, udp_url, sim = plcsim(other, model_sha256=sha256_file(DEMO_MODEL).hex(), session=True)
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                  attestation__tcti=swtpm.tcti, plc__security="none",
                                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1, r.stderr
    assert "refused the session credential" in r.stderr and "device.pub.pem" in r.stderr


def test_kill_9_loses_no_acknowledged_record_and_the_restart_resumes_the_chain(plcsim, swtpm, tmp_path):
    """tpm-direct keeps the device key across restarts, so the PLC's replay check spans both daemons."""
    import json
    import signal
    import time

    from sitsd.audit import _digest, read_records, verify_directory
    from sitsd.control import request

    audit = tmp_path / "audit"
    control = tmp_path / "c.sock"

    def start(log_name):
        proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                           attestation__tcti=swtpm.tcti, attestation__signing="tpm-direct",
                                           plc__security="none", audit__directory=audit,
                                           control__socket=control), stderr=open(tmp_path / log_name, "wb"), cwd=REPO)
        wait_ready(proc, tmp_path / log_name)
        return proc

    from attestation.tpm import TpmSigner

    key = TpmSigner(swtpm.tcti)  # provision the device key so the PLC can trust it before the first start
    (tmp_path / "device.pem").write_bytes(key.public_key_pem())
    key.close()
    endpoint, udp_url, sim = plcsim(tmp_path / "device.pem")
    def plc_stats() -> dict:
        sim.stdin.write("stats\n")
        sim.stdin.flush()
        return json.loads(sim.stdout.readline())["stats"]

    first = start("first.log")
    time.sleep(1.5)
    status = request(control, "status")
    acknowledged, durable = status["counters"]["commands"], status["audit_durable"]
    assert durable["records"] and durable["seq"], durable  # audit.fsync interval: fsynced within about a second
    running = plc_stats()
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    before = plc_stats()
    time.sleep(0.5)  # commands stopped: the PLC's watchdog (100 ms) puts the stand on its safe setpoint
    stopped = plc_stats()
    assert stopped["fallbacks"] > running["fallbacks"], (running, stopped)
    assert stopped["accepted"] == before["accepted"]
    second = start("second.log")  # same TPM key: its sequence numbers must continue above the first's
    time.sleep(1.0)
    second.send_signal(signal.SIGTERM)
    assert second.wait(20) == 0
    segments = verify_directory(audit)  # chain intact across the crash
    assert len(segments) == 2
    first_records = read_records(segments[0][0])
    acked = [r for r in first_records if r["outcome"] == "acknowledged"]
    assert len(acked) >= acknowledged
    # what the daemon had declared durable before the kill is there, under the hash it reported
    assert durable["seq"] in {r["seq"] for r in acked}
    assert durable["hash"] in {_digest(r) for r in acked}
    stats = plc_stats()
    assert stats["rejected"] == 0  # the restarted daemon was not taken for a replay
    assert stats["accepted"] >= len(first_records) + 50  # the restart brought the line back, no operator


def test_tpm_lost_mid_run_then_back(plcsim, tmp_path):
    """tpm-direct: while the TPM is gone nothing unsigned leaves (sign errors and alerts), the PLC falls
    back to its safe setpoint on its own, and signing resumes when the TPM returns. The daemon stays up."""
    import json
    import signal
    import time

    from attestation.tpm import Swtpm, TpmSigner
    from sitsd.control import request

    tpm = Swtpm(tmp_path / "tpm").start()  # a state directory of ours: the device key survives a restart
    key = TpmSigner(tpm.tcti)
    (tmp_path / "device.pem").write_bytes(key.public_key_pem())
    key.close()
    audit, control = tmp_path / "audit", tmp_path / "c.sock"
    endpoint, udp_url, sim = plcsim(tmp_path / "device.pem")
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=tpm.tcti, attestation__signing="tpm-direct",
                                       plc__security="none", audit__directory=audit, control__socket=control),
                            stderr=open(tmp_path / "log", "wb"), cwd=REPO)
    try:
        wait_ready(proc, tmp_path / "log")
        time.sleep(0.5)
        tpm.stop()  # the TPM goes away
        time.sleep(1.0)
        gone = request(control, "status")
        # every refused command counted; the `sign` alert at most once a second per distinct error, not per frame
        assert gone["counters"]["sign_errors"] > 20 and 1 <= gone["alerts"].get("sign", 0) <= 6, gone["alerts"]
        assert proc.poll() is None
        tpm = Swtpm(tmp_path / "tpm").start()  # ... and comes back with its state
        time.sleep(1.5)
        back = request(control, "status")
        assert back["counters"]["commands"] > gone["counters"]["commands"] + 50
        errors = back["counters"]["sign_errors"]
        time.sleep(0.5)
        assert request(control, "status")["counters"]["sign_errors"] == errors  # no new errors: recovered
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        tpm.stop()
    sim.stdin.write("stats\n")
    sim.stdin.flush()
    stats = json.loads(sim.stdout.readline())["stats"]
    assert stats["fallbacks"] >= 1 and stats["rejected"] == 0  # the PLC went to its safe setpoint meanwhile


def test_tpm_lost_in_tpm_session_mode_is_alerted_once_and_commands_go_on(plcsim, tmp_path):
    """tpm-session signs without the TPM, so losing it must not stop commands; a probe sees it (one `tpm` alert
    per outage) and the connection is reopened when it is back."""
    import signal

    from attestation.tpm import Swtpm
    from sitsd.control import request

    from ..conftest import sim_stats, wait_for

    tpm = Swtpm(tmp_path / "tpm").start()
    audit, control = tmp_path / "audit", tmp_path / "c.sock"
    model_sha = hashlib.sha256(DEMO_MODEL.read_bytes()).hexdigest()
    endpoint, udp_url, sim = plcsim(audit / "device.pub.pem", model_sha256=model_sha, session=True)
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=tpm.tcti, plc__security="none", audit__directory=audit,
                                       control__socket=control), stderr=open(tmp_path / "log", "wb"), cwd=REPO)
    try:
        wait_ready(proc, tmp_path / "log")
        status = lambda: request(control, "status")  # noqa: E731
        before = wait_for(lambda s: s["counters"]["commands"] > 30, 15, "commands flowing", status)
        assert before["tpm"] == {"reachable": True, "outages": 0, "errors": 0, "last_error": None, "bound": True,
                                 "resets": 0, "remeasure_failures": 0, "last_reset": None}
        tpm.stop()  # the TPM goes away
        gone = wait_for(lambda s: not s["tpm"]["reachable"] and s["alerts"].get("tpm"), 15,
                        "the probe to see the TPM gone", status)
        assert gone["alerts"].get("tpm") == 1 and gone["tpm"]["outages"] == 1
        later = wait_for(lambda s: s["tpm"]["errors"] >= gone["tpm"]["errors"] + 2 and s["counters"]["commands"]
                         > gone["counters"]["commands"] + 100, 20, "commands while the TPM is gone", status)
        assert later["alerts"].get("tpm") == 1  # one alert per outage, not one per probe
        assert later["counters"]["sign_errors"] == 0 and proc.poll() is None
        tpm = Swtpm(tmp_path / "tpm").start()  # ... and comes back
        # restarted on its state: a TPM reset (PCRs zero), re-measured and bound again with one more `tpm` alert
        back = wait_for(lambda s: s["tpm"]["reachable"] and s["tpm"]["resets"] and s["tpm"]["bound"]
                        and s["alerts"].get("tpm", 0) >= 2, 20, "the TPM reachable again", status)
        assert back["tpm"]["outages"] == 1 and back["alerts"].get("tpm") == 2
        assert "TPM answers again" in (tmp_path / "log").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        tpm.stop()
    stats = sim_stats(sim)
    assert stats["rejected"] == 0 and stats["accepted"] > 100
