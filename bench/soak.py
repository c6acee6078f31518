#!/usr/bin/env python3
"""Soak under faults: a real sitsd against the PLC simulator, with faults injected one after another.

    python bench/soak.py [--seconds 40] [--rate 1000] [--json]

The daemon signs with swtpm (tpm-direct, so the device key survives restarts) and writes its audit
log onto a small tmpfs (root only; without root the disk-full fault is skipped and reported). Each
fault is injected, held, cleared, and then the run waits for recovery: the daemon running, its
audit backlog empty, and at least 50 new acknowledged commands. The faults, in order:

  kill9           sitsd is killed with SIGKILL under load and restarted (as systemd would)
  plc_disconnect  the PLC (simulator) stops and comes back on the same endpoint
  tpm_loss        swtpm stops and comes back with its state
  prover_stall    the daemon's Groth16 prover processes are stopped (SIGSTOP) and continued (SIGCONT):
                  the loop keeps sending commands, proofs beyond the bounded queue are dropped and
                  counted; recovered when proofs are being produced again
  burst_10x       a second publisher floods the frame stream at ten times the nominal rate
  malformed       a burst of 500 malformed UADP datagrams on the frame stream
  disk_full       the audit file system fills up, then gets room again

frames, commands and drops are those of the final daemon incarnation (the one started after kill9).
acknowledged_records_lost counts, for each daemon incarnation, the commands its status reported as
acknowledged that have no acknowledged record in the audit log. rss_growth_mb compares the final
daemon's resident memory shortly after its start with the value at the end (the faults after the
restart all hit that incarnation). RSS is the daemon's own: the prover processes are separate.
The daemon proves one model command in rate/2 (--proof-n): two proofs a second at most, when every
frame gives a model command (fail-safe commands are never proven). One prover process makes ~10 a
second on an idle core, so that is a fifth of a core: on this 2-core box ten a second took a whole
core from the 1 kHz loop and its simulator, and half the frames missed their deadline. Its queue holds PROOF_QUEUE; the proving keys are made before the run.
The last line with --json is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from attestation.tpm import Swtpm, TpmSigner  # noqa: E402
from sitsd.audit import AuditError, read_records, segment_header, verify_directory  # noqa: E402
from sitsd.config import load_config  # noqa: E402
from sitsd.control import request  # noqa: E402
from sitsd.demo import Simulator, _free_udp_port  # noqa: E402
from sitsd.errors import ControlError  # noqa: E402
from sitsd.prover import ensure_keys  # noqa: E402

CONFIG = REPO / "examples" / "rolling-mill.yaml"
FAULTS = ("kill9", "plc_disconnect", "tpm_loss", "prover_stall", "burst_10x", "malformed", "disk_full")
PROOF_QUEUE = 2  # small, so that a stalled prover fills it within the fault's hold and drops are counted
PROVER_STALL_S = 3.0  # held at least this long, and on until the full queue has dropped a proof (or MAX)
PROVER_STALL_MAX_S = 10.0


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _proved_more_than(n: int):
    return lambda status: (status.get("proofs") or {}).get("proved", 0) > n


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses


def _parent_pid(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def _proc_state(pid: int) -> str:
    return _stat_fields(pid)[0]


class Soak:
    def __init__(self, work: Path, rate_hz: float, say, proof_n: int) -> None:
        self.work, self.rate_hz, self.say, self.proof_n = work, rate_hz, say, proof_n
        self.cfg = load_config(CONFIG)
        self.model_sha = self.cfg.model.sha256 or ""
        self.root = os.geteuid() == 0
        self.disk = work / "disk"
        self.disk.mkdir()
        if self.root:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(self.disk)],
                               capture_output=True, text=True)
            self.root = r.returncode == 0
        self.audit = self.disk / "audit"
        self.control = work / "control.sock"
        self.tpm = Swtpm(work / "tpm").start()
        key = TpmSigner(self.tpm.tcti)
        (work / "device.pem").write_bytes(key.public_key_pem())
        key.close()
        # the proving keys, made once before the run (a development setup, ~1-2 s) so that a kill -9 in the
        # first seconds never meets half-written keys; every incarnation's prover loads them
        if proof_n:
            ensure_keys(self.cfg, work / "proofs" / "keys")
        self.port = _free_tcp_port()
        self.udp_url = f"opc.udp://239.255.{os.getpid() % 200 + 20}.{_free_udp_port() % 250 + 1}:{_free_udp_port()}"
        self.sim = self._start_sim()
        self.daemon: subprocess.Popen | None = None
        self.incarnations: list[dict] = []  # pid, last acknowledged count seen
        self.plc_stats: list[dict] = []
        self.stall: dict = {}

    # -- processes -----------------------------------------------------------------------------
    def _start_sim(self, **kw) -> Simulator:
        return Simulator(self.udp_url, self.work / "device.pem", self.model_sha, seed=3, rate_hz=self.rate_hz,
                         workdir=self.work, port=kw.pop("port", self.port), **kw)

    def start_daemon(self) -> None:
        args = [sys.executable, "-m", "sitsd", "--config", str(CONFIG)]
        for key, value in {"plc.endpoint": f"opc.tcp://127.0.0.1:{self.port}", "transport.url": self.udp_url,
                           "attestation.mode": "tpm2", "attestation.tcti": self.tpm.tcti,
                           "attestation.signing": "tpm-direct", "plc.security": "none",
                           "audit.directory": self.audit, "control.socket": self.control,
                           # about 1 MB of audit log per second at 1 kHz: segments rotate and are
                           # compressed during the soak (no retention: every record is counted after)
                           "audit.segment_max_mb": 8,
                           "metrics.port": 0,
                           # proofs off the fast path; keys and proofs off the tmpfs that fills up
                           **({"proof.policy": "one_in_n", "proof.n": self.proof_n, "proof.workers": 1,
                               "proof.queue": PROOF_QUEUE, "proof.directory": self.work / "proofs"}
                              if self.proof_n else {})}.items():
            args += ["--set", f"{key}={value}"]
        log = self.work / "sitsd.log"
        self.daemon = subprocess.Popen(args, stderr=open(log, "ab"), cwd=REPO)
        deadline = time.monotonic() + 60
        while True:
            try:
                if request(self.control, "status", timeout_s=1.0)["state"] == "running":
                    break
            except (ControlError, ValueError):
                pass
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"sitsd did not start; see {log}:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        self.incarnations.append({"pid": self.daemon.pid, "acknowledged": 0})

    def status(self) -> dict:
        s = request(self.control, "status", timeout_s=3.0)
        self.incarnations[-1]["acknowledged"] = max(self.incarnations[-1]["acknowledged"], s["counters"]["commands"])
        return s

    def wait_recovered(self, since: dict, timeout_s: float, also=None) -> float | None:
        """Seconds until the daemon runs, its audit backlog is empty and 50 more commands were acknowledged
        (and `also(status)` holds, when given)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            try:
                s = self.status()
                if (s["state"] == "running" and s.get("audit_backlog", 0) == 0
                        and s["counters"]["commands"] >= since["counters"]["commands"] + 50
                        and (also is None or also(s))):
                    return time.monotonic() - t0
            except ControlError:
                pass
            time.sleep(0.1)
        return None

    # -- faults ----------------------------------------------------------------------------------
    def inject(self, kind: str, hold_s: float) -> str:
        if kind == "kill9":
            self.status()
            self.daemon.send_signal(signal.SIGKILL)
            self.daemon.wait(10)
            time.sleep(hold_s / 2)
            self.start_daemon()
            return f"pid {self.incarnations[-2]['pid']} killed, {self.incarnations[-1]['pid']} started"
        if kind == "plc_disconnect":
            self.plc_stats.append(self.sim.ask("stats", "stats"))
            self.sim.close()
            time.sleep(hold_s)
            self.sim = self._start_sim()
            return f"PLC down {hold_s:.1f} s"
        if kind == "tpm_loss":
            self.tpm.stop()
            time.sleep(hold_s)
            self.tpm = Swtpm(self.work / "tpm").start()
            return f"TPM gone {hold_s:.1f} s"
        if kind == "prover_stall":
            return self.stall_prover(max(hold_s, PROVER_STALL_S))
        if kind == "burst_10x":
            flood = Simulator(self.udp_url, self.work / "device.pem", self.model_sha, seed=4,
                              rate_hz=self.rate_hz * 10, workdir=self.work, port=0,
                              extra_args=("--publisher-id", "8"), log_name="flood.log")
            time.sleep(hold_s)
            flood.close()
            return f"{self.rate_hz * 10:g} extra frames/s for {hold_s:.1f} s"
        if kind == "malformed":
            import random

            from plc.udp import UdpPublisher

            rng = random.Random(5)
            pub = UdpPublisher(self.udp_url)
            valid_prefix = bytes([0xF1, 0x21])  # a UADP version-1 header start, then garbage
            for i in range(500):
                junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 96)))
                pub.send(valid_prefix + junk if i % 2 else junk)
                if i % 50 == 49:
                    time.sleep(0.01)
            pub.close()
            time.sleep(hold_s / 2)
            return f"500 malformed datagrams, {self.status()['counters'].get('malformed', '?')} counted malformed"
        if kind == "disk_full":
            filler = self.disk / "filler"
            with open(filler, "wb", buffering=0) as fh:
                try:
                    while True:
                        fh.write(b"\0" * (1 << 16))
                except OSError:
                    pass
            time.sleep(hold_s)
            held = self.status().get("audit_held", 0)
            filler.unlink()
            return f"disk full {hold_s:.1f} s, {held} commands held"
        raise ValueError(kind)

    def prover_pids(self) -> list[int]:
        """The daemon's prover processes, from its status; only its own children are ever signalled."""
        pids = (self.status().get("proofs") or {}).get("worker_pids") or []
        return [pid for pid in pids if _parent_pid(pid) == self.daemon.pid]

    def wait_prover_working(self, timeout_s: float) -> dict:
        """Until the prover has produced a proof since this incarnation started (keys made or loaded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            proofs = self.status().get("proofs") or {}
            if proofs.get("proved", 0) > 0 and proofs.get("worker_pids"):
                return proofs
            if time.monotonic() > deadline:
                raise SystemExit(f"the daemon's prover made no proof within {timeout_s:.0f} s: {proofs}")
            time.sleep(0.2)

    def stall_prover(self, hold_s: float) -> str:
        pids = self.prover_pids()
        if not pids:
            raise SystemExit("prover_stall: the daemon reports no prover process")
        before = self.status()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            time.sleep(hold_s)
            states = "".join(_proc_state(pid) for pid in pids)  # T: stopped
            during = self.status()
            while (during["proofs"]["dropped"] == before["proofs"]["dropped"]
                   and time.monotonic() - t0 < PROVER_STALL_MAX_S):
                time.sleep(0.2)
                during = self.status()
            hold_s = time.monotonic() - t0
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        p0, p1 = before["proofs"], during["proofs"]
        self.stall = {"proved_at_continue": p1["proved"]}
        return (f"prover pid(s) {','.join(map(str, pids))} (state {states}) stopped {hold_s:.1f} s: commands "
                f"+{during['counters']['commands'] - before['counters']['commands']}, proofs offered "
                f"+{p1['offered'] - p0['offered']}, accepted "
                f"+{p1['accepted'] - p0['accepted']}, dropped (queue full) +{p1['dropped'] - p0['dropped']}, proved "
                f"+{p1['proved'] - p0['proved']}, queue {p1['queue_depth']}/{p1['queue_max']}")

    def close(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.status()
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(20)
        try:
            self.plc_stats.append(self.sim.ask("stats", "stats"))
        except Exception:  # noqa: BLE001 - a simulator that already stopped has nothing more to say
            pass
        self.sim.close()
        self.tpm.stop()

    def unmount(self) -> None:
        if self.root:
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)

    # -- the audit log after the run -------------------------------------------------------------
    def audit_result(self) -> tuple[bool, int, str]:
        try:
            segments = verify_directory(self.audit)
        except AuditError as exc:
            return False, -1, str(exc)
        acked_by_pid: dict[int, int] = {}
        for f, _ in segments:
            pid = (segment_header(f) or {}).get("pid")
            acked_by_pid[pid] = acked_by_pid.get(pid, 0) + sum(r["outcome"] == "acknowledged" for r in read_records(f))
        lost = sum(max(0, inc["acknowledged"] - acked_by_pid.get(inc["pid"], 0)) for inc in self.incarnations)
        return True, lost, f"{len(segments)} segments"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="length of the run (default 40)")
    ap.add_argument("--rate", type=float, default=1000.0, help="nominal frames per second (default 1000)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, audit log)")
    ap.add_argument("--proof-n", type=int, default=None, metavar="N",
                    help="prove one model command in N (default rate/2); 0: proofs off, no prover_stall fault")
    args = ap.parse_args(argv)
    if not shutil.which("swtpm"):
        raise SystemExit("bench/soak.py needs swtpm (make test installs it)")
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    work = Path(tempfile.mkdtemp(prefix="sits-soak-"))
    proof_n = max(1, round(args.rate / 2)) if args.proof_n is None else args.proof_n
    soak = Soak(work, args.rate, say, proof_n)
    faults = [f for f in FAULTS if (f != "disk_full" or soak.root) and (f != "prover_stall" or proof_n)]
    results: list[dict] = []
    t_start = time.monotonic()
    try:
        soak.start_daemon()
        slot = max(3.0, args.seconds / len(faults))
        rss_start = None
        for kind in faults:
            t_slot = time.monotonic()
            if kind == "prover_stall":  # the restarted daemon's prover must be working before it is stalled
                soak.wait_prover_working(timeout_s=120.0)
            before = soak.status()
            detail = soak.inject(kind, hold_s=min(2.0, slot / 3))
            # prover_stall is recovered when proofs are being produced again after SIGCONT
            also = _proved_more_than(soak.stall["proved_at_continue"]) if kind == "prover_stall" else None
            recovery = soak.wait_recovered(before, timeout_s=max(10.0, slot), also=also)
            results.append({"fault": kind, "recovered": recovery is not None,
                            "recovery_s": round(recovery, 2) if recovery is not None else None, "detail": detail,
                            "rss_mb": round(_rss_mb(soak.daemon.pid), 1)})
            say(f"{kind:15} {'recovered in %.2f s' % recovery if recovery is not None else 'NOT RECOVERED':22} {detail}")
            if kind == "kill9":  # the final incarnation: its memory is what must stay flat
                time.sleep(1.0)
                rss_start = _rss_mb(soak.daemon.pid)
            rest = slot - (time.monotonic() - t_slot)
            if rest > 0:
                time.sleep(rest)
        final = soak.status()
        rss_end = _rss_mb(soak.daemon.pid)
    finally:
        soak.close()
    chain_ok, lost, audit_detail = soak.audit_result()
    if args.keep and soak.root:  # the audit log lives on the tmpfs: keep a copy before it goes
        shutil.copytree(soak.audit, work / "audit-copy")
    soak.unmount()
    rejected = sum(s.get("rejected", 0) for s in soak.plc_stats)
    counters = final["counters"]
    drops = {"timestamp": counters.get("dropped_timestamp", 0), "constraint": counters.get("dropped_constraint", 0),
             "malformed": counters.get("malformed", 0), "expired": counters.get("expired", 0),
             "deadline_missed": counters.get("deadline_missed", 0), "sign_errors": counters.get("sign_errors", 0),
             "audit_held": final.get("audit_held", 0),
             "proof_queue_full": (final.get("proofs") or {}).get("dropped", 0)}
    summary = {
        "seconds": round(time.monotonic() - t_start, 1),
        "rate_hz": args.rate,
        "frames": counters.get("frames", 0),
        "commands": counters.get("commands", 0),
        "drops": drops,
        "faults_injected": len(results),
        "faults_recovered": sum(r["recovered"] for r in results),
        "faults": results,
        "skipped": ([] if soak.root else ["disk_full (needs root to mount a tmpfs)"])
                   + ([] if proof_n else ["prover_stall (--proof-n 0: proofs off)"]),
        "acknowledged_records_lost": lost,
        "audit_chain_valid": chain_ok,
        "audit": audit_detail,
        "plc_rejected": rejected,
        "alerts": final.get("alerts", {}),
        "proofs": {k: (final.get("proofs") or {}).get(k) for k in ("offered", "accepted", "dropped", "proved",
                                                                   "failed")},
        "rss_start_mb": round(rss_start, 1) if rss_start else None,
        "rss_end_mb": round(rss_end, 1),
        "rss_growth_mb": round(rss_end - rss_start, 1) if rss_start else None,
    }
    say(f"\n{summary['faults_recovered']}/{summary['faults_injected']} faults recovered, "
        f"{lost} acknowledged records lost, audit chain {'valid' if chain_ok else 'BROKEN'} ({audit_detail}), "
        f"RSS {summary['rss_start_mb']} -> {summary['rss_end_mb']} MB, PLC rejected {rejected}")
    if args.keep:
        say(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    # the acceptance, all of it: every fault injected (none skipped) and recovered, nothing acknowledged
    # lost, the chain valid, and the daemon's memory bounded (rss_growth_mb < 20)
    growth = summary.get("rss_growth_mb")
    ok = (summary["faults_recovered"] == summary["faults_injected"] and not summary["skipped"] and lost == 0
          and chain_ok and growth is not None and growth < 20)
    if not ok:
        say("soak FAILED its acceptance: " + "; ".join(why for cond, why in (
            (summary["faults_recovered"] != summary["faults_injected"], "a fault did not recover"),
            (bool(summary["skipped"]), f"faults skipped: {', '.join(summary['skipped'])} (run as root)"),
            (lost != 0, f"{lost} acknowledged records lost"), (not chain_ok, "audit chain broken"),
            (growth is None or growth >= 20, f"RSS growth {growth} MB (limit 20)")) if cond))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
