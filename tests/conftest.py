"""Shared fixtures: real peers only (swtpm, the PLC simulator process, ONNX Runtime)."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIG = REPO / "examples" / "rolling-mill.yaml"
DEMO_MODEL = REPO / "examples" / "models" / "rolling_mill.onnx"


def example_config_data() -> dict:
    """The example config as a dict with its file paths made absolute, for tests that write a
    changed copy elsewhere (relative paths resolve against the copy's directory)."""
    import yaml

    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["model"]["artifact"] = str(EXAMPLE_CONFIG.parent / data["model"]["artifact"])
    for module in data.get("modules") or []:
        module["path"] = str(EXAMPLE_CONFIG.parent / module["path"])
    for key in ("approval", "authority_key"):
        if data.get("attestation", {}).get(key):
            data["attestation"][key] = str(EXAMPLE_CONFIG.parent / data["attestation"][key])
    return data


@pytest.fixture
def swtpm(tmp_path_factory):
    """A fresh swtpm per test. `make test` installs swtpm, so its absence is a failure, not a skip."""
    from attestation.tpm import Swtpm

    assert shutil.which("swtpm"), "swtpm is not installed; run `make test` (it installs swtpm) or apt-get install swtpm"
    sw = Swtpm().start()
    try:
        yield sw
    finally:
        sw.stop()


@pytest.fixture
def plcsim(tmp_path):
    """Start the PLC simulator process trusting the key at a given path; yields a starter function."""
    import json
    import os
    import random
    import socket
    import subprocess
    import sys

    procs = []

    def start(trust_key: Path, model_sha256: str | None = None, port: int = 0, udp_url: str | None = None,
              security: str = "none", pki: Path | None = None,
              session: bool = False, extra_args: tuple[str, ...] = ()) -> tuple[str, str, subprocess.Popen]:
        if udp_url is None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("127.0.0.1", 0))
                udp_url = f"opc.udp://239.255.{random.randint(1, 254)}.{random.randint(1, 254)}:{s.getsockname()[1]}"
        args = [sys.executable, "-m", "sitsd.plcsim", "--udp-url", udp_url, "--port", str(port),
                "--trust-device-key" if session else "--trust-key", str(trust_key), "--control-stdin"]
        if model_sha256:
            args += ["--model-sha256", model_sha256]
        args += list(extra_args)  # e.g. ("--fault", "network_delay@10")
        if security != "none":
            args += ["--security", security, "--pki", str(pki)]
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        procs.append(proc)
        ready = json.loads(proc.stdout.readline())
        return ready["endpoint"], udp_url, proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(10)
            except Exception:
                proc.kill()


def sitsd_args(config: Path, **sets) -> list[str]:
    import sys

    args = [sys.executable, "-m", "sitsd", "--config", str(config)]
    sets.setdefault("metrics__port", 0)  # never the fixed default port: tests may overlap with a running demo
    for key, value in sets.items():
        args += ["--set", f"{key.replace('__', '.')}={value}"]
    return args


@pytest.fixture
def veth_pair():
    """Two network namespaces joined by a veth pair: (ns_a, if_a, ns_b, if_b). Needs root (CI runs as root)."""
    import os
    import subprocess

    tag = f"{os.getpid() % 100000}{random_suffix()}"
    ns_a, ns_b, if_a, if_b = f"sitsA{tag}", f"sitsB{tag}", f"va{tag}", f"vb{tag}"

    def ip(*args):
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        assert r.returncode == 0, f"ip {' '.join(args)}: {r.stderr.strip()} (network namespaces need root)"

    ip("netns", "add", ns_a)
    try:
        ip("netns", "add", ns_b)
        ip("link", "add", if_a, "netns", ns_a, "type", "veth", "peer", "name", if_b, "netns", ns_b)
        for ns, ifname in ((ns_a, if_a), (ns_b, if_b)):
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", ifname, "up")
        yield ns_a, if_a, ns_b, if_b
    finally:
        subprocess.run(["ip", "netns", "del", ns_a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns_b], capture_output=True)


def random_suffix() -> str:
    import random

    return f"{random.randint(0, 9999):04d}"


def wait_ready(proc, log: Path, timeout_s: float = 60.0) -> None:
    """Until a sitsd process has logged "sitsd ready" (its loop runs); fails with its log if it exits or stalls."""
    import time

    deadline = time.monotonic() + timeout_s
    while "sitsd ready" not in log.read_text():
        assert proc.poll() is None, f"sitsd exited with {proc.returncode}:\n{log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"sitsd not ready after {timeout_s} s:\n{log.read_text()[-2000:]}"
        time.sleep(0.1)


def wait_for(predicate, timeout_s: float, what: str, status_fn, interval_s: float = 0.1):
    """Poll `status_fn()` until `predicate` holds on its answer (returned); fails with the last answer."""
    import json
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        status = status_fn()
        if predicate(status):
            return status
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s; status: {json.dumps(status)[:1500]}"
        time.sleep(interval_s)


def sim_stats(sim) -> dict:
    """The PLC simulator process's stats (it runs with --control-stdin)."""
    import json

    sim.stdin.write("stats\n")
    sim.stdin.flush()
    return json.loads(sim.stdout.readline())["stats"]


def check_commands_across_a_plc_restart(audit_dir: Path, first: dict, second: dict) -> list[dict]:
    """The audit log of one sitsd run across a PLC restart, against the two PLC incarnations' stats: the chain
    verifies, sequence numbers strictly rise (nothing sent twice), every acknowledged command was applied by a
    PLC, and a write cut by the restart is audited unconfirmed (at most 2). Returns the records."""
    from sitsd.audit import read_records, verify_chain

    assert second["accepted"] >= 100 and first["rejected"] == second["rejected"] == 0
    (audit_file,) = Path(audit_dir).glob("commands-*.jsonl")
    records = read_records(audit_file)
    assert verify_chain(audit_file) == len(records)
    seqs = [r["seq"] for r in records]
    assert seqs == sorted(set(seqs))
    acked = sum(r["outcome"] == "acknowledged" for r in records)
    unconfirmed = sum(r["outcome"] == "unconfirmed" for r in records)
    applied = first["accepted"] + second["accepted"]
    assert acked <= applied <= acked + unconfirmed
    assert unconfirmed <= 2
    return records


def multicast_group_url() -> str:
    """An opc.udp URL on a random administratively scoped group and a free port: tests do not hear each other."""
    from plc.udp import private_multicast_url

    return private_multicast_url()


def udp_loopback(layout, **source_kwargs):
    """A UdpFrameSource on a fresh multicast group over loopback and a publisher to it: (source, publisher)."""
    from plc.udp import UdpFrameSource, UdpPublisher

    url = multicast_group_url()
    return UdpFrameSource(url, layout, "127.0.0.1", **source_kwargs), UdpPublisher(url, "127.0.0.1")


@contextlib.contextmanager
def sitsd_serving_simulator(prefix: str):
    """sitsd in this process (its loop and I/O threads, software signing) serving the PLC simulator process at
    100 Hz: UDP frames on a fresh multicast group, OPC UA writes without security, as in `sitsctl demo`.
    Yields (daemon, config, workdir, metrics exporter, its port); stops all of it and removes the workdir afterwards."""
    import asyncio
    import tempfile
    import threading

    from attestation.signers import SoftwareSigner
    from ep.session import sha256_file
    from sitsd.config import load_config
    from sitsd.daemon import Daemon
    from sitsd.demo import DEFAULT_CONFIG, SIM_NAMESPACE, Simulator
    from sitsd.metrics import MetricsExporter

    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    signer = SoftwareSigner()
    sim = daemon = thread = exporter = None
    try:
        base = load_config(DEFAULT_CONFIG)
        udp_url = multicast_group_url()
        key_path = workdir / "signer.pub.pem"
        key_path.write_bytes(signer.public_key_pem())
        sim = Simulator(udp_url, key_path, sha256_file(base.model.artifact).hex(), 1, 100.0, workdir, security="none")
        cfg = load_config(DEFAULT_CONFIG, {
            "attestation.mode": "software", "transport.url": udp_url, "transport.interface": "127.0.0.1",
            "plc.endpoint": sim.endpoint, "plc.command_node": f"nsu={SIM_NAMESPACE};s=RollingMill.RollGapCommand",
            "plc.security": "none", "plc.pki_dir": str(workdir / "pki-sitsd"),
            "plc.status_node": f"nsu={SIM_NAMESPACE};s=RollingMill.Status",
            "plc.diagnostic_node": f"nsu={SIM_NAMESPACE};s=RollingMill.Diagnostic",
            "audit.directory": str(workdir / "audit"), "control.socket": str(workdir / "control.sock")})
        daemon = Daemon(cfg, signer=signer)
        thread = threading.Thread(target=lambda: asyncio.run(daemon.serve()), name="sitsd-io", daemon=True)
        thread.start()
        assert daemon.ready.wait(60), "sitsd did not become ready"
        assert daemon.startup_error is None, f"sitsd did not start: {daemon.startup_error}"
        exporter = MetricsExporter(daemon)
        port = exporter.start("127.0.0.1", 0)
        yield daemon, cfg, workdir, exporter, port
    finally:
        if exporter is not None:
            exporter.stop()
        if daemon is not None:
            daemon.request_stop()
        if thread is not None:
            thread.join(10)
        if sim is not None:
            sim.close()
        signer.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_cli_overrides_leak():
    """`sitsctl --tcti` run in process (sitsd.cli.main) leaves its value in sitsd.config.CLI_OVERRIDES, which every
    later load_config applies: clear it after each test, so no test depends on the order the suite runs in."""
    yield
    from sitsd import config

    config.CLI_OVERRIDES.clear()
