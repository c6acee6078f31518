"""`sitsctl demo`: the closed loop on one box. Starts swtpm (when installed), the PLC simulator
in its own process and the daemon in this one, runs for a while, and summarises.

The result dict is also what `bench/loop_latency.py` reports.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import numpy as np

from attestation.signers import SoftwareSigner
from plc.udp import private_multicast_url

from .config import Config, load_config
from .daemon import Daemon
from .errors import StartupError
from .hotswap import POLICY_KEY_FILE
from .model import model_sha256

REPO_ROOT = Path(__file__).resolve().parents[1]
TRANSPORTS = ("udp", "opcua", "eth")
DEMO_ETH_URL = "opc.eth://01-00-5E-7F-00-01:100.5"  # multicast MAC, VLAN 100, PCP 5
SIM_NAMESPACE = "urn:sits2026:plc-simulator"
DEFAULT_CONFIG = REPO_ROOT / "examples" / "rolling-mill.yaml"


def parse_metrics_address(text: str) -> tuple[str, int]:
    """`sitsctl demo --metrics HOST:PORT` (also `[::1]:PORT`, and `:PORT` or `PORT` for 127.0.0.1; port 0 picks a
    free one): (host, port). ValueError for anything else."""
    t = text.strip()
    if t.startswith("["):  # an IPv6 address
        host, _, rest = t[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif ":" in t:
        host, _, port = t.rpartition(":")
    else:
        host, port = "", t
    if not port.isdigit() or int(port) > 65535 or (":" in host and not t.startswith("[")) or " " in host:
        raise ValueError(f"metrics address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 (port 0: a free one)")
    return host or "127.0.0.1", int(port)


def _metrics_url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


class Simulator:
    """The PLC simulator subprocess, spoken to over its stdin/stdout lines."""

    def __init__(self, udp_url: str, trust_key: Path, model_sha256: str, seed: int, rate_hz: float, workdir: Path,
                 opcua_frames: bool = False, link=None, security: str = "none", pki: Path | None = None,
                 field_encoding: str = "variant", profile: str = "simulator", session: bool = False,
                 port: int = 0, extra_args: tuple[str, ...] = (), log_name: str = "plcsim.log"):
        self._stderr = open(workdir / log_name, "ab")
        extra = ["--opcua-frames"] if opcua_frames else []
        extra += list(extra_args)
        extra += ["--field-encoding", field_encoding, "--profile", profile]
        if security != "none":
            extra += ["--security", security, "--pki", str(pki)]
        prefix = []
        if link is not None:  # the PLC lives in its own network namespace behind a veth pair
            prefix = link.exec_prefix()
            extra += ["--host", link.plc_ip, "--eth-url", DEMO_ETH_URL, "--eth-interface", link.plc_if,
                      "--launch-offset-us", "200"]
        self.proc = subprocess.Popen(
            prefix + [sys.executable, "-m", "sitsd.plcsim", "--udp-url", udp_url, "--port", str(port),
                      "--trust-device-key" if session else "--trust-key", str(trust_key), "--control-stdin",
             "--model-sha256", model_sha256, "--seed", str(seed), "--rate", str(rate_hz)] + extra,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
            cwd=str(REPO_ROOT))
        self.log_path = workdir / log_name
        line = self._read_line(timeout_s=30.0)
        if not line or not json.loads(line).get("ready"):
            self.close()
            raise StartupError(f"PLC simulator did not start; see {self.log_path}")
        ready = json.loads(line)
        self.endpoint = ready["endpoint"]
        self.launch_time = ready.get("launch_time", "not requested")

    def _read_line(self, timeout_s: float) -> str:
        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout_s)
        return result[0] if result else ""

    def ask(self, command: str, key: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        while True:
            line = self._read_line(timeout_s=10.0)
            if not line:
                raise StartupError(f"PLC simulator stopped answering; see {self.log_path}")
            msg = json.loads(line)
            if key in msg:
                return msg[key]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


def _demo_approval(config_path: Path, base, workdir: Path, say) -> dict:
    """A throwaway authority's approval of the model and modules `base` loads: the config overrides that turn on
    attestation.certify_session with it (a real plant's approval comes from its vendor, docs/deploy.md)."""
    from attestation.deploy import split_events
    from attestation.tpm.policy import approve, generate_authority, load_authority_private

    from .deploy import config_events

    private, public = generate_authority(workdir / "authority")
    approved, _ = split_events(config_events(base, config_path))
    approval = approve(load_authority_private(private), base.attestation.measurement_pcr, approved)
    path = workdir / "demo.approval.json"
    path.write_text(approval.to_json())
    say(f"attestation: a demo authority approved model {approval.model_sha256[:16]}… and {len(approved) - 1} "
        "module(s); the TPM certifies the session key only in that measured state, and the PLC requires it")
    return {"attestation.certify_session": True, "attestation.approval": str(path),
            "attestation.authority_key": str(public)}


def _accepted_models(paths, say) -> list[str]:
    """The SHA-256 (hex) of each model the demo's PLC is to accept besides the demo model (--accept-model)."""
    if not paths:
        return []
    from ep.artifact import resolve_model
    from ep.errors import ModelLoadError

    out = []
    for path in paths:
        try:
            sha = resolve_model(Path(path))[1].hex()
            if Path(path).is_file():  # an artifact directory's manifest was checked by resolve_model
                import onnx

                try:
                    onnx.load_model(str(path), load_external_data=False)
                except Exception as exc:  # protobuf's DecodeError and friends
                    raise ModelLoadError(f"not an ONNX model: {exc}") from None
        except (ModelLoadError, OSError) as exc:
            raise StartupError(f"--accept-model {path}: cannot read it as a model ({exc}); give an ONNX file or a "
                               "`sitsctl compile` artifact directory") from None
        say(f"PLC: also accepts commands from model {sha[:16]}… ({path}): `sitsctl update --model {path}` can swap it in")
        out.append(sha)
    return out


def run_demo(seconds: float | None = 20.0, frames: int | None = None, config_path: Path | None = None,
             progress: TextIO | None = sys.stderr, force_software: bool = False, seed: int = 1,
             rate_hz: float = 100.0, overrides: dict | None = None, transport: str = "udp",
             security: str = "sign-and-encrypt", field_encoding: str = "variant",
             profile: str = "simulator", signing: str = "tpm-session", proof_every: int = 0,
             compiled: bool = True, certify_session: bool = False, metrics: str | None = None,
             on_metrics: Callable[[str, str], None] | None = None, accept_models: tuple = ()) -> dict:
    """Run the closed loop for `seconds` (or until `frames` frames) and return the summary dict.

    transport: "udp" (UADP over UDP multicast, read by the loop thread) or "opcua" (an OPC UA
    subscription on the simulator's SensorFrame variable) or "eth" (UADP over raw Ethernet with a
    VLAN tag, the simulator in its own network namespace behind a veth pair; needs root).
    proof_every: prove every n-th command (Groth16, off the fast path); each proof made is then
    verified by our verifier and by snarkjs (one Node process) and counted in the summary.
    compiled: an MLP given as a .onnx file runs as the artifact examples/compile-demo-model.sh makes of it
    (compiled into a cache directory on first use, sitsd/demo_model.py); False runs the .onnx as is.
    metrics: "HOST:PORT" (port 0: a free one) to serve the daemon's Prometheus endpoint (sitsd/metrics.py) there. The
    demo owns this endpoint rather than the daemon (the config's metrics section is turned off): it serves from the
    daemon's READY until the summary has been read after the daemon stopped, so a last scrape sees exactly the
    rows the summary's latency_us comes from. Its URL is printed and returned as metrics_url.
    accept_models: model files or artifact directories whose commands the simulated PLC accepts besides the demo
    model's (it pins the model hash in every command): the models `sitsctl update --model` may then swap in. With
    tpm-session signing the PLC accepts a session credential measuring any of them (sitsd writes a new one after
    the swap). Not with certify_session, whose approval pins one measured state.
    on_metrics: called as on_metrics("serving", url) once the endpoint serves the running daemon, and as
    on_metrics("stopped", url) after the daemon stopped and the summary's numbers were taken, the endpoint still up.

    The summary's latency_us and the endpoint's sitsd_latency_seconds histogram measure the same span, read from the
    same TimingRing column: the PLC's send timestamp of a frame to the acknowledged write of its command. latency_us
    count is the number of those samples: commands - 1 (the startup fail-safe command answers no frame and has no
    latency), as long as the run stays within the ring (65536 frames; beyond that the percentiles cover the newest
    65536 frames while the histogram stays cumulative)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r}: choose one of {', '.join(TRANSPORTS)}")
    metrics_at = parse_metrics_address(metrics) if metrics is not None else None
    from attestation.tpm import Swtpm, TpmSigner, swtpm_available

    def say(msg: str) -> None:
        if progress is not None:
            print(msg, file=progress, flush=True)

    config_path = Path(config_path or DEFAULT_CONFIG)
    workdir = Path(tempfile.mkdtemp(prefix="sits-demo-"))
    swtpm = None
    sim = None
    signer = None
    link = None
    exporter = None
    try:
        if transport == "eth":
            from .demo_netns import DemoLink

            link = DemoLink().open()
        if swtpm_available() and not force_software:
            from attestation.session import TpmSessionSigner

            swtpm = Swtpm(workdir / "tpm").start()
            if signing == "tpm-direct":
                signer = TpmSigner(swtpm.tcti)
                say(f"signer: TPM 2.0 (swtpm, {swtpm.tcti}), TPM2_Sign per command with the P-256 key at 0x81000001")
            else:
                signer = TpmSessionSigner(swtpm.tcti)
                say(f"signer: TPM 2.0 (swtpm, {swtpm.tcti}), a P-256 session key bound by a TPM2_Quote of the "
                    f"attestation key at 0x81000002")
            attestation = {"attestation.mode": "tpm2", "attestation.tcti": swtpm.tcti,
                           "attestation.signing": signing}
        else:
            signer = SoftwareSigner()
            if force_software:
                say("signer: a software Ed25519 key (--software), not a TPM-anchored one")
            else:
                say("WARNING: swtpm is not installed: commands are signed with a software Ed25519 key, "
                    "not a TPM-anchored one (apt-get install swtpm swtpm-tools)")
            attestation = {"attestation.mode": "software"}
        base = load_config(config_path, overrides)  # the model the demo runs may be overridden
        if compiled and base.model.kind == "mlp" and Path(base.model.artifact).is_file():
            from .demo_model import compiled_artifact

            overrides = {**(overrides or {}), "model.artifact": str(compiled_artifact(config_path, base, say))}
            base = load_config(config_path, overrides)
        udp_url = private_multicast_url()
        model_sha = model_sha256(base)  # a file's hash, a compiled artifact's, or the streaming graph's
        if base.model.kind == "streaming":
            say("model: the streaming transformer (model.kind streaming) with deterministic random weights: it is "
                "not a trained controller, so no control quality is expected; the safety envelope keeps every "
                "command inside the actuator limits")
            if proof_every:
                say("proofs: off (skipped: there is no circuit for the streaming transformer's attention)")
                proof_every = 0
        session = hasattr(signer, "bind")
        also_accepted = _accepted_models(accept_models, say)
        # certify_session (tpm-session on an MLP): a throwaway authority approves this model and these modules, the
        # TPM certifies the session key only in that measured state, and the simulated PLC accepts only a certified
        # session key. Off by default: under it hot swaps are refused, and the demo is where one tries them
        certify = _demo_approval(config_path, base, workdir, say) if certify_session and hasattr(signer, "certify") \
            and base.model.kind == "mlp" else {}
        if certify_session and not certify:
            say("certify-session: skipped (needs swtpm, --signing tpm-session and an MLP model)")
        if certify and also_accepted:
            raise StartupError("--accept-model cannot go with --certify-session: the approval pins one measured state "
                               "(the demo's model and modules), so the PLC would refuse the swapped model's session")
        sim_extra = ("--trust-policy-key", str(workdir / "audit" / POLICY_KEY_FILE),
                     "--approval", certify["attestation.approval"],
                     "--authority-pub", certify["attestation.authority_key"]) if certify else ()
        for sha in also_accepted:
            sim_extra += ("--also-accept-model-sha256", sha)
        key_path = workdir / ("device.pub.pem" if session else "signer.pub.pem")
        key_path.write_bytes(signer.device_public_key_pem() if session else signer.public_key_pem())
        how = {"udp": f"UADP on {udp_url}", "opcua": "OPC UA subscription",
               "eth": f"UADP over Ethernet {DEMO_ETH_URL} via {link.host_if if link else ''}"}[transport]
        say(f"starting PLC simulator ({how}, {rate_hz:g} Hz)")
        plc_pki = workdir / "pki-plc"
        if security != "none":
            _cross_trust(workdir / "pki-sitsd", plc_pki, link.plc_ip if link else "127.0.0.1")
            say(f"OPC UA security: Basic256Sha256 {security}, certificates trusted both ways")
        sim = Simulator(udp_url, key_path, model_sha, seed, rate_hz, workdir, opcua_frames=transport == "opcua",
                        link=link, security=security, pki=plc_pki, field_encoding=field_encoding,
                        profile=profile, session=session, extra_args=sim_extra)
        launch_time = sim.launch_time
        if transport == "udp":
            transport_cfg = {"transport.url": udp_url, "transport.interface": "127.0.0.1",
                             "transport.field_encoding": field_encoding}
        elif transport == "eth":
            transport_cfg = {"transport": {"kind": "uadp-eth", "url": DEMO_ETH_URL, "interface": link.host_if,
                                           "publisher_id": 7, "writer_group_id": 1, "dataset_writer_id": 1,
                                           "field_encoding": field_encoding}}
        else:
            transport_cfg = {"transport": {"kind": "opcua-subscription", "publishing_interval_ms": 1.0,
                                           "node": f"nsu={SIM_NAMESPACE};s=RollingMill.SensorFrame"}}
        cfg: Config = load_config(config_path, {
            **attestation, **certify, **transport_cfg,
            "plc.endpoint": sim.endpoint, "plc.command_node": f"nsu={SIM_NAMESPACE};s=RollingMill.RollGapCommand",
            "plc.security": security, "plc.pki_dir": str(workdir / "pki-sitsd"), "plc.profile": profile,
            # without --metrics the daemon serves its own endpoint on a free port (status: metrics_url); with it the
            # demo serves one that outlives the daemon's stop (see the docstring)
            **({"metrics.enabled": False} if metrics_at else {"metrics.port": 0}),
            "plc.session_nonce_node": f"nsu={SIM_NAMESPACE};s=RollingMill.SessionNonce",
            "plc.session_credential_node": f"nsu={SIM_NAMESPACE};s=RollingMill.SessionCredential",
            **({} if profile == "simulator" else {  # only vendor profiles emulate status words and diagnostics
                "plc.status_node": f"nsu={SIM_NAMESPACE};s=RollingMill.Status",
                "plc.diagnostic_node": f"nsu={SIM_NAMESPACE};s=RollingMill.Diagnostic"}),
            "audit.directory": str(workdir / "audit"), "control.socket": str(workdir / "control.sock"),
            **({"proof.policy": "one_in_n", "proof.n": proof_every, "proof.directory": str(workdir / "proofs")}
               if proof_every else {}),
            **(overrides or {})})
        if proof_every:
            say(f"proofs: every {proof_every}th command gets a Groth16 proof off the fast path "
                f"(circuit setup at start takes a second or two)")
        daemon = Daemon(cfg, signer=signer)
        thread = threading.Thread(target=lambda: asyncio.run(daemon.serve()), name="sitsd-io", daemon=True)
        thread.start()
        daemon.ready.wait(60)
        if daemon.startup_error is not None:
            raise StartupError(f"sitsd did not start: {daemon.startup_error}")
        say(f"sitsd running: model {model_sha[:16]}…, PLC {sim.endpoint}, control socket {workdir / 'control.sock'}")
        metrics_url = None
        if metrics_at is not None:
            from .metrics import MetricsExporter

            exporter = MetricsExporter(daemon)
            try:
                bound = exporter.start(*metrics_at)
            except OSError as exc:
                exporter = None
                daemon.request_stop()
                thread.join(10)
                raise StartupError(f"metrics endpoint {metrics_at[0]}:{metrics_at[1]}: {exc}") from exc
            metrics_url = _metrics_url(metrics_at[0], bound)
            say(f"metrics: {metrics_url} (Prometheus; serves until the summary)")
            if on_metrics is not None:
                on_metrics("serving", metrics_url)
        start = time.monotonic()
        next_report = start + 1.0
        while True:
            time.sleep(0.05)
            now = time.monotonic()
            c = daemon.counters
            done = (frames is not None and c.frames >= frames) or (seconds is not None and now - start >= seconds)
            if now >= next_report or done:
                lat = daemon.timings.latency_summary()
                say(f"  {now - start:5.1f}s  frames {c.frames:6d}  commands {c.commands:6d}  "
                    f"dropped {c.dropped_timestamp + c.dropped_constraint:4d}  fail-safe {c.failsafe:4d}  "
                    f"latency p50 {lat['p50'] / 1000:.2f} ms  p99 {lat['p99'] / 1000:.2f} ms")
                next_report += 1.0
            if done or daemon.loop.crashed is not None or not thread.is_alive():
                break
        daemon.request_stop()
        thread.join(10)
        # after the daemon stopped: the commands its shutdown drain still wrote are in the PLC's count too
        plc_stats = sim.ask("stats", "stats")
        status = daemon.status()
        filled = daemon.timings.latency_us[:min(daemon.timings.rows_written, daemon.timings.capacity)]
        latency_count = int(np.isfinite(filled).sum())
        sim.close()
        sim = None
        if exporter is not None:
            if on_metrics is not None:
                on_metrics("stopped", metrics_url)
            exporter.stop()
            exporter = None
        c = status["counters"]
        proofs = verify_demo_proofs(workdir / "proofs", say) if proof_every else None
        return {
            "proofs": proofs,
            "frames": c["frames"],
            "commands": c["commands"],
            "dropped": c["dropped"],
            "rejected_by_plc": plc_stats["rejected"],
            "latency_us": {**status["latency_us"], "count": latency_count},
            "metrics_url": metrics_url,
            "stages_us": {k: {"p50": v["p50"], "p99": v["p99"]} for k, v in status["stages_us"].items()},
            "signer": status["signer"],
            "signing_mode": status["signing_mode"],
            "session_certified": status["session_certified"],
            "transport": transport,
            "security": security,
            "rx_stamp_source": status["rx_stamp_source"],
            "vlan_pcp": status["vlan_pcp"],
            "launch_time": launch_time,
            "plc_profile": profile,
            "plc_events": status["plc_events"],
            "model_sha256": status["model_sha256"],
            "model_kind": base.model.kind,
            "model": status["model"],
            "stream": status.get("stream"),
            "thickness_error_um": {k: round(v, 2) for k, v in plc_stats["thickness_error_um"].items()},
            "failsafe": c["failsafe"],
            "deadline_missed": c["deadline_missed"],
            "expired": c["expired"],
            "submitted": c["submitted"],
            "write_errors": c["write_errors"],
            "lost": c["lost"],
            "plc_accepted": plc_stats["accepted"],
            "plc_fallbacks": plc_stats["fallbacks"],
            "audit_records": daemon.audit.records if daemon.audit else 0,
            "alerts": status["alerts"],
            "recent_alerts": [f"{a['kind']}: {a['reason']}" for a in status["recent_alerts"]],
        }
    finally:
        if exporter is not None:
            exporter.stop()
        if sim is not None:
            sim.close()
        if signer is not None:
            signer.close()
        if swtpm is not None:
            swtpm.stop()
        if link is not None:
            link.close()
        shutil.rmtree(workdir, ignore_errors=True)


_VERIFY_JS = """
const snarkjs = require(process.argv[2]);
const fs = require("fs");
(async () => {
  const vk = JSON.parse(fs.readFileSync(process.argv[3]));
  const ok = [];
  for (const stem of process.argv.slice(4)) {
    const pub = JSON.parse(fs.readFileSync(stem + ".public.json"));
    const proof = JSON.parse(fs.readFileSync(stem + ".proof.json"));
    if (await snarkjs.groth16.verify(vk, pub, proof, {info() {}, debug() {}, warn() {}, error() {}})) ok.push(stem);
  }
  console.log(JSON.stringify(ok));
  process.exit(0);
})();
"""


def verify_demo_proofs(directory: Path, say) -> dict:
    """Every proof the run made, checked by our verifier and, with the pinned snarkjs installed
    (make setup), by snarkjs in one Node process; counts by outcome."""
    from attestation.zk import verify
    from attestation.zk.formats import snarkjs_json as sj

    index = directory / "index.jsonl"
    entries = [json.loads(line) for line in index.read_text().splitlines()] if index.exists() else []
    made = [e["id"] for e in entries if e.get("status") == "ok"]
    result = {"made": len(made), "failed": sum(e.get("status") == "failed" for e in entries),
              "dropped": sum(e.get("status") == "dropped" for e in entries), "verified": 0, "snarkjs_verified": None}
    if not made:
        return result
    vk_file = directory / "vk.json"
    vk = sj.vk_from_json(sj.load(vk_file))
    result["verified"] = sum(verify(vk, sj.public_from_json(sj.load(directory / f"{p}.public.json")),
                                    sj.proof_from_json(sj.load(directory / f"{p}.proof.json"))) for p in made)
    snarkjs = REPO_ROOT / "node_modules" / "snarkjs"
    if snarkjs.is_dir() and shutil.which("node"):
        script = directory / "verify.js"
        script.write_text(_VERIFY_JS)
        r = subprocess.run(["node", str(script), str(snarkjs), str(vk_file), *(str(directory / p) for p in made)],
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            result["snarkjs_verified"] = len(json.loads(r.stdout.strip().splitlines()[-1]))
        else:
            say(f"snarkjs could not run: {r.stderr.strip()[-300:]}")
    say(f"proofs: {result['made']} made, {result['verified']} verified by sits2026, "
        f"{result['snarkjs_verified'] if result['snarkjs_verified'] is not None else 'n/a (no snarkjs)'} by snarkjs, "
        f"{result['dropped']} dropped, {result['failed']} failed")
    return result


def _cross_trust(client_dir: Path, server_dir: Path, server_ip: str) -> None:
    """Certificates for both ends of the demo's OPC UA session, each trusting the other."""
    from plc.opcua_security import Pki

    client, server = Pki(client_dir), Pki(server_dir)
    client_cert = client.create_own("urn:sits2026:sitsd", "sitsd demo", server=False)
    server_cert = server.create_own("urn:sits2026:plc-simulator", "sits2026 PLC simulator", server=True,
                                    hostnames=[socket.gethostname(), "localhost"], ips=[server_ip])
    client.trust(server_cert)
    server.trust(client_cert)


def human_summary(r: dict) -> str:
    lat, th = r["latency_us"], r["thickness_error_um"]
    improvement = th["open_loop"] / th["closed_loop"] if th["closed_loop"] else float("inf")
    lines = [
        "",
        "sits2026 demo summary",
        f"  frames received      {r['frames']}",
        f"  commands written     {r['commands']} (fail-safe {r['failsafe']}, expired {r['expired']})",
        f"  frames dropped       {r['dropped']} by the gates, {r['lost']} lost in transit",
        f"  alerts               {', '.join(f'{k} {v}' for k, v in r['alerts'].items()) or 'none'}",
        f"  rejected by the PLC  {r['rejected_by_plc']} (the simulator verified {r['plc_accepted']} envelopes)",
        f"  signer               {r['signer']} ({r['signing_mode']})",
        f"  OPC UA security      {r['security']}",
        f"  PLC profile          {r['plc_profile']}"
        + (f", events: {', '.join(f'{k} x{v}' for k, v in r['plc_events'].items())}" if r["plc_events"] else ""),
        f"  transport            {r['transport']} (RX timestamps: {r['rx_stamp_source']}"
        + (f", VLAN PCP {r['vlan_pcp']})" if r["vlan_pcp"] >= 0 else ")"),
        *([f"  launch time          {r['launch_time']}"] if r["transport"] == "eth" else []),
        f"  model SHA-256        {r['model_sha256']}" + (f" ({r['model']})" if r.get("model") else ""),
        f"  latency (PLC send -> write acknowledged)  p50 {lat['p50'] / 1000:.2f} ms  p99 {lat['p99'] / 1000:.2f} ms"
        f"  max {lat['max'] / 1000:.2f} ms",
        "  stages (p50 / p99, us): " + ", ".join(f"{k} {v['p50']:g}/{v['p99']:g}" for k, v in r["stages_us"].items()),
        f"  exit thickness error (mean |h - target|): closed loop {th['closed_loop']:.2f} um, "
        f"open loop {th['open_loop']:.2f} um ({improvement:.1f}x better with the model in the loop)"
        if r.get("model_kind", "mlp") == "mlp" else
        f"  exit thickness error (mean |h - target|): closed loop {th['closed_loop']:.2f} um, open loop "
        f"{th['open_loop']:.2f} um (streaming transformer with random weights: no control quality expected)",
        *([f"  stream               position {r['stream']['position']}, KV in RAM {r['stream']['kv_ram_bytes']} B "
           f"(allocated once), window {r['stream']['window']} tokens"] if r.get("stream") else []),
    ]
    pr = r.get("proofs")
    if pr is not None:
        lines.append(f"  Groth16 proofs       {pr['made']} made off the fast path, {pr['verified']} verified by sits2026, "
                     + (f"{pr['snarkjs_verified']} by snarkjs" if pr["snarkjs_verified"] is not None
                        else "snarkjs not installed (make setup)")
                     + (f", {pr['dropped']} dropped (queue full or stopped)" if pr["dropped"] else ""))
    return "\n".join(lines)
