#!/usr/bin/env python3
"""Soak under faults: a real sitsd against the PLC simulator, with faults injected one after another.

    python bench/soak.py [--seconds 40] [--rate 1000] [--json] [--signing tpm-session|tpm-direct]

The daemon runs as systemd/sitsd.service starts it (SCHED_FIFO 10 for its threads, reset on fork, on the
unit's CPUs 1-3 where the box has them; --no-unit-scheduling: an ordinary process), with timing.cycle_ms
1000/rate (1 ms at 1 kHz) and timing.deadline_ms DEADLINE_MS. It signs through swtpm: by default in the
production mode tpm-session (a session key bound to the TPM by a quote), or with --signing tpm-direct
(TPM2_Sign per command). It writes its audit log onto a small tmpfs (root only; without root the
disk-full fault is skipped and reported). Before the first fault the loop must deliver model commands at
all. Each fault is then injected, held and cleared, and the run waits for recovery, counted from the
clear: the daemon running, its audit backlog empty, and at least RECOVERY_MODEL_COMMANDS model commands
(not fail-safe ones: the PLC counts those apart) accepted by the PLC since the clear. A loop that sends
only its fail-safe command is not back. After the run the audit log must confirm each recovery: that
many acknowledged model records of that daemon incarnation between the clear and the moment recovery
was declared. The faults, in order:

  plc_disconnect  the PLC (simulator) stops and comes back on the same endpoint
  tpm_loss        swtpm stops and comes back with its state. tpm-direct: commands need the TPM, so sign
                  errors must show (nothing unsigned leaves). tpm-session: commands go on signed by the
                  session key (counted), the TPM is off the command path; the daemon's 2 s TPM probe must
                  report the outage, and recovery also needs it to reach the TPM again
  kill9           after several seconds of load, sitsd is killed with SIGKILL and restarted (as systemd
                  would); recovery is the new incarnation's, counted from the restart, and the PLC's own
                  watchdog must have taken the stand to its safe setpoint while no sitsd ran (its
                  `fallbacks` rose, and it accepted no command)
  prover_stall    the daemon's Groth16 prover processes are stopped (SIGSTOP) and continued (SIGCONT):
                  the loop keeps sending commands, proofs beyond the bounded queue are dropped and
                  counted; recovered also needs proofs being produced again
  burst_10x       the PLC publishes ten frames per cycle (`publish-factor 10`): ten times the nominal rate
                  through the loop (a second publisher's frames would be discarded at the source as
                  foreign, never reaching the gates)
  malformed       a burst of 500 malformed UADP datagrams on the frame stream
  disk_full       the audit file system fills up, then gets room again

frames, commands and drops are those of the final daemon incarnation (the one started by kill9).
command_mix covers the whole run, every incarnation: acknowledged model and fail-safe commands from the
audit log, deadline_missed and frames from each incarnation's last status; failsafe_ratio is fail-safe
over all acknowledged commands. It is reported, not judged: on a shared 2-core box it depends on what
else runs. acknowledged_records_lost counts, for each daemon incarnation, the commands its status
reported as acknowledged that have no acknowledged record in the audit log. rss_growth_mb compares the
final daemon's resident memory shortly after its start with the value at the end (the faults after the
restart all hit that incarnation); rss_incarnations gives the same for every incarnation (its first sample
a second after it delivered model commands, its last just before it was killed or at the end), and the
acceptance holds every incarnation's growth under the limit. RSS is the daemon's own: the prover processes
are separate.
The daemon proves one model command in rate/2 (--proof-n): two proofs a second at most, when every
frame gives a model command (fail-safe commands are never proven). One prover process makes ~10 a
second on an idle core, so that is a fifth of a core: on this 2-core box ten a second took a whole
core from the 1 kHz loop and its simulator. Its queue holds PROOF_QUEUE; the proving keys are made
before the run.
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

from attestation.session import TpmSessionSigner  # noqa: E402
from attestation.tpm import Swtpm, TpmSigner  # noqa: E402
from sitsd.audit import AuditError, read_records, segment_header, verify_directory  # noqa: E402
from sitsd.config import load_config  # noqa: E402
from sitsd.control import request  # noqa: E402
from plc.udp import private_multicast_url  # noqa: E402
from sitsd.demo import Simulator  # noqa: E402
from sitsd.errors import ControlError  # noqa: E402
from sitsd.model import model_sha256  # noqa: E402
from sitsd.prover import ensure_keys  # noqa: E402

CONFIG = REPO / "examples" / "rolling-mill.yaml"
# kill9 third: after several seconds of load, so the daemon it kills has been serving (and its PLC watchdog armed);
# prover_stall after it, since the final incarnation's prover is the one stalled
FAULTS = ("plc_disconnect", "tpm_loss", "kill9", "prover_stall", "burst_10x", "malformed", "disk_full")
RECOVERY_MODEL_COMMANDS = 50  # model commands (not fail-safe) the PLC accepted after the fault was cleared
WARMUP_S = 20.0  # before the first fault: the loop must deliver model commands at all
DEADLINE_MS = 8.0  # timing.deadline_ms; timing.cycle_ms follows the rate (1 ms at 1 kHz)
UNIT_FIFO_PRIORITY, UNIT_CPUS = 10, {1, 2, 3}  # systemd/sitsd.service: CPUSchedulingPriority, CPUAffinity
TPM_LOSS_MAX_S = 8.0  # tpm-session: the TPM stays away until the daemon's probe (every 2 s) has seen it gone
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


def _tpm_reachable(status: dict) -> bool:
    return bool((status.get("tpm") or {}).get("reachable"))


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses


def _parent_pid(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def _proc_state(pid: int) -> str:
    return _stat_fields(pid)[0]


def _unit_scheduling() -> list[str]:
    """The daemon's scheduling as systemd/sitsd.service sets it: SCHED_FIFO priority UNIT_FIFO_PRIORITY for every
    thread, reset on fork (the prover processes run as ordinary ones), on the unit's CPUAffinity (1-3) where this
    box has them. The simulator, swtpm and the prover stay ordinary processes. Needs root and util-linux's chrt
    and taskset; without them the daemon runs as an ordinary process (the JSON's timing.scheduling says which)."""
    if os.geteuid() != 0 or not (shutil.which("chrt") and shutil.which("taskset")):
        return []
    cpus = sorted(UNIT_CPUS & os.sched_getaffinity(0))
    pin = ["taskset", "--cpu-list", ",".join(map(str, cpus))] if cpus else []
    return pin + ["chrt", "--fifo", "--reset-on-fork", str(UNIT_FIFO_PRIORITY)]


class Soak:
    def __init__(self, work: Path, rate_hz: float, say, proof_n: int, timing: dict, overrides: dict,
                 signing: str = "tpm-session", unit_scheduling: bool = True) -> None:
        self.work, self.rate_hz, self.say, self.proof_n = work, rate_hz, say, proof_n
        self.timing, self.overrides, self.signing = timing, overrides, signing
        self.launch = _unit_scheduling() if unit_scheduling else []
        self.cfg = load_config(CONFIG)
        # the PLC accepts only commands signed for this model (the config names no hash: the artifact's own)
        self.model_sha = model_sha256(self.cfg)
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
        # what the PLC trusts: tpm-direct, the TPM signing key itself; tpm-session, the TPM's attestation key
        key = TpmSigner(self.tpm.tcti) if signing == "tpm-direct" else TpmSessionSigner(self.tpm.tcti)
        (work / "device.pem").write_bytes(key.public_key_pem() if signing == "tpm-direct"
                                          else key.device_public_key_pem())
        key.close()
        # the proving keys, made once before the run (a development setup, ~1-2 s) so that a kill -9 in the
        # first seconds never meets half-written keys; every incarnation's prover loads them
        if proof_n:
            ensure_keys(self.cfg, work / "proofs" / "keys")
        self.port = _free_tcp_port()
        self.udp_url = private_multicast_url()
        self.sim = self._start_sim()
        self.daemon: subprocess.Popen | None = None
        # per daemon incarnation: pid, the acknowledged count its status last reported, its last counters
        self.incarnations: list[dict] = []
        self.plc_stats: list[dict] = []
        self.stall: dict = {}
        # when the last fault was cleared (set by inject): monotonic, wall clock ns, the PLC's model commands then
        self.cleared = (time.monotonic(), time.time_ns(), 0)
        self.kill: dict = {}  # kill9: what the PLC did while no sitsd ran
        self.tpm_loss: dict = {}  # tpm_loss: what the fault did
        self.closed = False
        self.last_seen = ""  # what wait_recovered saw last (why a fault did not recover)

    # -- processes -----------------------------------------------------------------------------
    def _start_sim(self, **kw) -> Simulator:
        return Simulator(self.udp_url, self.work / "device.pem", self.model_sha, seed=3, rate_hz=self.rate_hz,
                         workdir=self.work, port=kw.pop("port", self.port), session=self.signing == "tpm-session",
                         **kw)

    def start_daemon(self) -> None:
        args = self.launch + [sys.executable, "-m", "sitsd", "--config", str(CONFIG)]
        for key, value in {"plc.endpoint": f"opc.tcp://127.0.0.1:{self.port}", "transport.url": self.udp_url,
                           "attestation.mode": "tpm2", "attestation.tcti": self.tpm.tcti,
                           "attestation.signing": self.signing, "plc.security": "none",
                           "timing.cycle_ms": self.timing["cycle_ms"], "timing.deadline_ms": self.timing["deadline_ms"],
                           "audit.directory": self.audit, "control.socket": self.control,
                           # about 1 MB of audit log per second at 1 kHz: segments rotate and are
                           # compressed during the soak (no retention: every record is counted after)
                           "audit.segment_max_mb": 8,
                           "metrics.port": 0,
                           # proofs off the fast path; keys and proofs off the tmpfs that fills up
                           **({"proof.policy": "one_in_n", "proof.n": self.proof_n, "proof.workers": 1,
                               "proof.queue": PROOF_QUEUE, "proof.directory": self.work / "proofs"}
                              if self.proof_n else {}), **self.overrides}.items():
            args += ["--set", f"{key}={value}"]
        log = self.work / "sitsd.log"
        self._clear()  # a start, or kill9's restart: it clears the fault
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
        self.incarnations.append({"pid": self.daemon.pid, "acknowledged": 0, "counters": {}})

    def status(self) -> dict:
        s = request(self.control, "status", timeout_s=3.0)
        inc = self.incarnations[-1]
        inc["acknowledged"] = max(inc["acknowledged"], s["counters"]["commands"])
        inc["counters"] = s["counters"]
        return s

    def plc_model_commands(self) -> int:
        """Model commands (not fail-safe) the PLC has accepted: its own count, since this simulator started."""
        st = self.sim.ask("stats", "stats")
        return st["accepted"] - st["failsafe_commands"]

    def wait_recovered(self, timeout_s: float, also=None) -> tuple[float, int] | None:
        """Wait until the control loop is back after the fault was cleared (self.cleared): the daemon runs, its
        audit backlog is empty, `also(status)` holds when given, and the PLC has accepted at least
        RECOVERY_MODEL_COMMANDS model commands since the clear. Fail-safe commands do not count: the PLC counts
        them apart (the envelope says which), so a loop that only sends its fail-safe is not back. The audit log
        confirms it after the run (acknowledged model records of this incarnation after the clear).
        Returns (seconds since the clear, model commands the PLC accepted since) or None."""
        t_clear, _, plc0 = self.cleared
        self.last_seen = "no status"
        while time.monotonic() - t_clear < timeout_s:
            try:
                s = self.status()
                model = self.plc_model_commands() - plc0
                self.last_seen = (f"state {s['state']}, audit backlog {s.get('audit_backlog', 0)}, {model} model "
                                  f"commands at the PLC since the clear")
                if (s["state"] == "running" and s.get("audit_backlog", 0) == 0 and (also is None or also(s))
                        and model >= RECOVERY_MODEL_COMMANDS):
                    return time.monotonic() - t_clear, model
            except ControlError:
                pass
            time.sleep(0.05)
        return None

    # -- faults ----------------------------------------------------------------------------------
    def _clear(self) -> None:
        """The fault is cleared now: recovery counts from here (and from the PLC's model commands so far)."""
        self.cleared = (time.monotonic(), time.time_ns(), self.plc_model_commands())

    def inject(self, kind: str, hold_s: float) -> str:
        """Inject the fault, hold it, clear it (self.cleared says when). Returns a line for the report."""
        if kind == "kill9":
            self.status()
            # kill right after the PLC accepted a command: it is then out of its fallback, so the dead time
            # must show as a new fallback (under load the PLC may already sit in one after a gap in commands)
            plc0 = self.sim.ask("stats", "stats")
            for _ in range(100):
                time.sleep(0.02)
                nxt = self.sim.ask("stats", "stats")
                if nxt["accepted"] > plc0["accepted"]:
                    break
                plc0 = nxt
            t_kill = time.monotonic()
            self.daemon.send_signal(signal.SIGKILL)
            self.daemon.wait(10)
            plc_dead = self.sim.ask("stats", "stats")
            time.sleep(hold_s / 2)
            # no sitsd for hold_s/2: the PLC's own watchdog (command_timeout_s, 0.1 s) must have taken the
            # stand to its safe setpoint (fallbacks counts each time it does), and no command reached it
            plc1 = self.sim.ask("stats", "stats")
            self.start_daemon()  # as systemd would; self.cleared is the restart
            self.kill = {"plc_fallbacks": plc1["fallbacks"] - plc0["fallbacks"],
                         "plc_accepted_while_dead": plc1["accepted"] - plc_dead["accepted"],
                         "down_s": round(time.monotonic() - t_kill, 2)}
            return (f"pid {self.incarnations[-2]['pid']} killed, {self.incarnations[-1]['pid']} running after "
                    f"{self.kill['down_s']:.1f} s; PLC fell back to its safe setpoint "
                    f"{self.kill['plc_fallbacks']}x meanwhile")
        if kind == "plc_disconnect":
            self.plc_stats.append(self.sim.ask("stats", "stats"))
            self.sim.close()
            time.sleep(hold_s)
            self.sim = self._start_sim()
            self._clear()
            return f"PLC down {hold_s:.1f} s"
        if kind == "tpm_loss":
            return self.lose_tpm(hold_s)
        if kind == "prover_stall":
            return self.stall_prover(max(hold_s, PROVER_STALL_S))
        if kind == "burst_10x":
            frames0 = self.status()["counters"]["frames"]
            self.sim.ask("publish-factor 10", "publish_factor")
            time.sleep(hold_s)
            self.sim.ask("publish-factor 1", "publish_factor")
            self._clear()
            return (f"{self.rate_hz * 10:g} frames/s for {hold_s:.1f} s: "
                    f"{self.status()['counters']['frames'] - frames0} reached the loop")
        if kind == "malformed":
            import random

            from plc.udp import UdpPublisher

            rng = random.Random(5)
            malformed0 = self.status()["counters"].get("malformed", 0)
            pub = UdpPublisher(self.udp_url)
            valid_prefix = bytes([0xF1, 0x21])  # a UADP version-1 header start, then garbage
            for i in range(500):
                junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 96)))
                pub.send(valid_prefix + junk if i % 2 else junk)
                if i % 50 == 49:
                    time.sleep(0.01)
            pub.close()
            self._clear()
            time.sleep(0.05)  # the last datagrams reach the loop (loopback) before they are counted
            counted = self.status()["counters"].get("malformed", 0) - malformed0
            return f"500 malformed datagrams, {counted} counted malformed"
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
            self._clear()
            return f"disk full {hold_s:.1f} s, {held} commands held"
        raise ValueError(kind)

    def lose_tpm(self, hold_s: float) -> str:
        """Stop swtpm, hold, start it again with its state. The fault must show: under tpm-direct every command
        needs TPM2_Sign, so signing fails (sign_errors rise, nothing unsigned leaves); under tpm-session commands
        go on signed by the session key, and the daemon's TPM probe (every 2 s) must report the outage
        (status tpm: reachable false, outages +1), so the hold lasts until it does (at most TPM_LOSS_MAX_S).
        self.tpm_loss says what was seen; recovery under tpm-session also needs the TPM reachable again."""
        before = self.status()
        plc0 = self.plc_model_commands()
        self.tpm.stop()
        t0 = time.monotonic()
        time.sleep(hold_s)
        during = self.status()
        while (self.signing == "tpm-session" and (during.get("tpm") or {}).get("reachable", True)
               and time.monotonic() - t0 < TPM_LOSS_MAX_S):
            time.sleep(0.2)
            during = self.status()
        held = time.monotonic() - t0
        plc1 = self.plc_model_commands()
        self.tpm = Swtpm(self.work / "tpm").start()
        self._clear()
        tpm0, tpm1 = before.get("tpm") or {}, during.get("tpm") or {}
        self.tpm_loss = {"sign_errors": during["counters"]["sign_errors"] - before["counters"]["sign_errors"],
                         "model_commands_during": plc1 - plc0, "held_s": round(held, 1)}
        if self.signing == "tpm-session":
            self.tpm_loss.update(outage_seen=tpm1.get("reachable") is False,
                                 outages_before=tpm0.get("outages", 0))
            return (f"TPM gone {held:.1f} s: probe saw it {'yes' if self.tpm_loss['outage_seen'] else 'NO'}, "
                    f"{plc1 - plc0} model commands reached the PLC meanwhile (signed by the session key)")
        return (f"TPM gone {held:.1f} s: {self.tpm_loss['sign_errors']} sign errors, {plc1 - plc0} model commands "
                f"reached the PLC meanwhile")

    def prover_pids(self) -> list[int]:
        """The daemon's prover processes, from its status; only its own children are ever signalled."""
        pids = (self.status().get("proofs") or {}).get("worker_pids") or []
        return [pid for pid in pids if _parent_pid(pid) == self.daemon.pid]

    def wait_prover_working(self, timeout_s: float) -> dict | None:
        """Until the prover has produced a proof since this incarnation started (keys made or loaded); None if
        it made none within timeout_s (it proves model commands only: a loop sending only fail-safes gives none)."""
        deadline = time.monotonic() + timeout_s
        while True:
            proofs = self.status().get("proofs") or {}
            if proofs.get("proved", 0) > 0 and proofs.get("worker_pids"):
                return proofs
            if time.monotonic() > deadline:
                return None
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
            self._clear()
        p0, p1 = before["proofs"], during["proofs"]
        self.stall = {"proved_at_continue": p1["proved"]}
        return (f"prover pid(s) {','.join(map(str, pids))} (state {states}) stopped {hold_s:.1f} s: commands "
                f"+{during['counters']['commands'] - before['counters']['commands']}, proofs offered "
                f"+{p1['offered'] - p0['offered']}, accepted "
                f"+{p1['accepted'] - p0['accepted']}, dropped (queue full) +{p1['dropped'] - p0['dropped']}, proved "
                f"+{p1['proved'] - p0['proved']}, queue {p1['queue_depth']}/{p1['queue_max']}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.daemon is not None and self.daemon.poll() is None:
            try:
                self.status()
            except (ControlError, ValueError):
                pass
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.say(f"sitsd (pid {self.daemon.pid}) did not stop within 20 s of SIGTERM: killed")
                self.daemon.kill()
                self.daemon.wait(10)
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
    def audit_result(self) -> tuple[bool, int, str, dict]:
        """(chain valid, acknowledged records lost, detail, acknowledged records by pid: a list of
        (ack_ns, failsafe) each)."""
        try:
            segments = verify_directory(self.audit)
        except AuditError as exc:
            return False, -1, str(exc), {}
        acked_by_pid: dict[int, list[tuple[int, bool]]] = {}
        for f, _ in segments:
            pid = (segment_header(f) or {}).get("pid")
            acked_by_pid.setdefault(pid, []).extend((r.get("ack_ns") or 0, bool(r.get("failsafe")))
                                                    for r in read_records(f) if r.get("outcome") == "acknowledged")
        lost = sum(max(0, inc["acknowledged"] - len(acked_by_pid.get(inc["pid"], ()))) for inc in self.incarnations)
        return True, lost, f"{len(segments)} segments", acked_by_pid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="length of the run (default 40)")
    ap.add_argument("--rate", type=float, default=1000.0, help="nominal frames per second (default 1000)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, audit log)")
    ap.add_argument("--proof-n", type=int, default=None, metavar="N",
                    help="prove one model command in N (default rate/2); 0: proofs off, no prover_stall fault")
    ap.add_argument("--deadline-ms", type=float, default=DEADLINE_MS,
                    help=f"timing.deadline_ms (default {DEADLINE_MS:g}); timing.cycle_ms is 1000/rate")
    ap.add_argument("--signing", choices=("tpm-session", "tpm-direct"), default="tpm-session",
                    help="attestation.signing (default tpm-session, the production mode: the TPM is off the command "
                    "path and tpm_loss is judged by the daemon's TPM probe; tpm-direct: TPM2_Sign per command, so TPM "
                    "loss stops commands, but at 1 kHz on 2 shared cores nearly every command is the fail-safe)")
    ap.add_argument("--no-unit-scheduling", dest="unit_scheduling", action="store_false",
                    help="run the daemon as an ordinary process (default: SCHED_FIFO and CPU affinity as "
                    "systemd/sitsd.service sets them)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more daemon config override (as sitsd --set), e.g. to compare settings")
    args = ap.parse_args(argv)
    if not shutil.which("swtpm"):
        raise SystemExit("bench/soak.py needs swtpm (make test installs it)")
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    work = Path(tempfile.mkdtemp(prefix="sits-soak-"))
    proof_n = max(1, round(args.rate / 2)) if args.proof_n is None else args.proof_n
    timing = {"cycle_ms": round(1000.0 / args.rate, 6), "deadline_ms": args.deadline_ms}
    overrides = dict(kv.split("=", 1) for kv in args.set)
    soak = Soak(work, args.rate, say, proof_n, timing, overrides, args.signing, args.unit_scheduling)
    faults = [f for f in FAULTS if (f != "disk_full" or soak.root) and (f != "prover_stall" or proof_n)]
    results: list[dict] = []
    t_start = time.monotonic()
    try:
        soak.start_daemon()
        # before any fault: does the loop deliver model commands at all? (else no recovery can be judged)
        warm = soak.wait_recovered(timeout_s=WARMUP_S)
        say(f"{'start':15} " + (f"{RECOVERY_MODEL_COMMANDS} model commands at the PLC {warm[0]:.2f} s after the "
                                f"daemon's start" if warm else f"NO {RECOVERY_MODEL_COMMANDS} model commands at the "
                                f"PLC within {WARMUP_S:g} s of the daemon's start: {soak.status()['counters']}"))
        slot = max(3.0, args.seconds / len(faults))
        rss_start = None
        rss_seen: dict[int, list[float]] = {}  # pid -> [first, last] RSS sample of that incarnation

        def sample_rss() -> None:
            pid = soak.daemon.pid
            try:
                mb = _rss_mb(pid)
            except OSError:  # the process is gone
                return
            rss_seen.setdefault(pid, [mb, mb])[1] = mb

        if warm:
            time.sleep(1.0)
            sample_rss()
        for kind in faults:
            t_slot = time.monotonic()
            if kind == "prover_stall" and soak.wait_prover_working(timeout_s=15.0) is None:
                # the restarted daemon's prover must be working before it is stalled
                results.append({"fault": kind, "recovered": False, "recovery_s": None, "model_commands": None,
                                "detail": "not injected", "why": "the daemon's prover made no proof within 15 s "
                                f"(proofs: {soak.status().get('proofs')})", "_window": None})
                say(f"{kind:15} {'NOT RECOVERED':22} {results[-1]['why']}")
                continue
            sample_rss()  # the last sample of an incarnation kill9 ends
            detail = soak.inject(kind, hold_s=min(2.0, slot / 3))
            # prover_stall is recovered when proofs are being produced again after SIGCONT; tpm_loss under
            # tpm-session when the daemon's probe reaches the TPM again
            also = (_proved_more_than(soak.stall["proved_at_continue"]) if kind == "prover_stall"
                    else _tpm_reachable if kind == "tpm_loss" and args.signing == "tpm-session" else None)
            recovery = soak.wait_recovered(timeout_s=max(10.0, slot), also=also)
            result = {"fault": kind, "recovered": recovery is not None,
                      "recovery_s": round(recovery[0], 2) if recovery is not None else None,
                      "model_commands": recovery[1] if recovery is not None else None, "detail": detail,
                      "rss_mb": round(_rss_mb(soak.daemon.pid), 1),
                      "_window": (soak.daemon.pid, soak.cleared[1], time.time_ns())}
            if recovery is None:
                result["why"] = f"not back within {max(10.0, slot):g} s of the clear: {soak.last_seen}"
            if kind == "kill9":  # recovered also means: the PLC's own watchdog took over while sitsd was dead
                result.update(soak.kill)
                if soak.kill["plc_fallbacks"] < 1:
                    result["recovered"] = False
                    result["why"] = "the PLC did not fall back to its safe setpoint while sitsd was dead"
            if kind == "tpm_loss":  # and the fault must have shown: sign errors, or the probe's outage
                result.update(soak.tpm_loss)
                if not (soak.tpm_loss.get("outage_seen") if args.signing == "tpm-session"
                        else soak.tpm_loss["sign_errors"] > 0):
                    result["recovered"] = False
                    result["why"] = "the TPM loss did not show in the daemon's status"
            results.append(result)
            say(f"{kind:15} {'recovered in %.2f s' % recovery[0] if recovery is not None else 'NOT RECOVERED':22} "
                f"{detail}")
            if kind == "kill9":  # the final incarnation: its memory is what must stay flat
                time.sleep(1.0)
                rss_start = _rss_mb(soak.daemon.pid)
            sample_rss()
            rest = slot - (time.monotonic() - t_slot)
            if rest > 0:
                time.sleep(rest)
        final = soak.status()
        rss_end = _rss_mb(soak.daemon.pid)
        sample_rss()
        soak.close()
        chain_ok, lost, audit_detail, acked = soak.audit_result()
        if args.keep and soak.root:  # the audit log lives on the tmpfs: keep a copy before it goes
            shutil.copytree(soak.audit, work / "audit-copy")
    finally:
        try:
            soak.close()
        finally:
            soak.unmount()
    # each recovery as the audit log tells it: acknowledged model (not fail-safe) records of that incarnation
    # between the clear and the moment recovery was declared; fewer than RECOVERY_MODEL_COMMANDS is no recovery
    for r in results:
        window = r.pop("_window")
        if window is None:
            continue
        pid, t0, t1 = window
        n = sum(1 for ack_ns, failsafe in acked.get(pid, ()) if not failsafe and t0 < ack_ns <= t1)
        r["model_commands_audited"] = n
        if r["recovered"] and n < RECOVERY_MODEL_COMMANDS:
            r["recovered"] = False
            r["why"] = f"the audit log holds {n} acknowledged model commands after the clear"
            say(f"{r['fault']:15} NOT RECOVERED after all: {r['why']}")
    rejected = sum(s.get("rejected", 0) for s in soak.plc_stats)
    reject_reasons: dict[str, int] = {}
    for st in soak.plc_stats:
        for reason, n in (st.get("reject_reasons") or {}).items():
            reject_reasons[reason] = reject_reasons.get(reason, 0) + n
    counters = final["counters"]
    drops = {"timestamp": counters.get("dropped_timestamp", 0), "constraint": counters.get("dropped_constraint", 0),
             "malformed": counters.get("malformed", 0), "expired": counters.get("expired", 0),
             "deadline_missed": counters.get("deadline_missed", 0), "sign_errors": counters.get("sign_errors", 0),
             "audit_held": final.get("audit_held", 0),
             "proof_queue_full": (final.get("proofs") or {}).get("dropped", 0)}
    # the whole run, every incarnation: acknowledged commands from the audit log, the rest from each one's last status
    model_acked = sum(not fs for recs in acked.values() for _, fs in recs)
    failsafe_acked = sum(fs for recs in acked.values() for _, fs in recs)
    total = {k: sum(inc["counters"].get(k, 0) for inc in soak.incarnations)
             for k in ("frames", "deadline_missed", "dropped_timestamp", "failsafe", "submitted")}
    failsafe_ratio = round(failsafe_acked / max(1, model_acked + failsafe_acked), 3)
    mix = {"frames": total["frames"], "model_commands": model_acked, "failsafe_commands": failsafe_acked,
           "failsafe_ratio": failsafe_ratio, "deadline_missed": total["deadline_missed"],
           "deadline_missed_per_frame": round(total["deadline_missed"] / max(1, total["frames"]), 3),
           "dropped_timestamp": total["dropped_timestamp"]}
    summary = {
        "seconds": round(time.monotonic() - t_start, 1),
        "rate_hz": args.rate,
        "timing": {**timing, "signing": args.signing, "scheduling": " ".join(soak.launch) or "ordinary",
                   **overrides},
        "frames": counters.get("frames", 0),
        "commands": counters.get("commands", 0),
        "drops": drops,
        "faults_injected": len(results),
        "faults_recovered": sum(r["recovered"] for r in results),
        "loop_started_s": round(warm[0], 2) if warm else None,
        "recovery_model_commands": RECOVERY_MODEL_COMMANDS,
        "faults": results,
        "skipped": ([] if soak.root else ["disk_full (needs root to mount a tmpfs)"])
                   + ([] if proof_n else ["prover_stall (--proof-n 0: proofs off)"]),
        "acknowledged_records_lost": lost,
        "audit_chain_valid": chain_ok,
        "audit": audit_detail,
        "failsafe_ratio": failsafe_ratio,
        "command_mix": mix,
        "plc_rejected": rejected,
        "plc_reject_reasons": reject_reasons,
        "alerts": final.get("alerts", {}),
        "proofs": {k: (final.get("proofs") or {}).get(k) for k in ("offered", "accepted", "dropped", "proved",
                                                                   "failed")},
        "rss_start_mb": round(rss_start, 1) if rss_start else None,
        "rss_end_mb": round(rss_end, 1),
        "rss_growth_mb": round(rss_end - rss_start, 1) if rss_start else None,
        "rss_incarnations": [{"pid": pid, "first_mb": round(a, 1), "last_mb": round(b, 1),
                              "growth_mb": round(b - a, 1)} for pid, (a, b) in rss_seen.items()],
    }
    say(f"\n{summary['faults_recovered']}/{summary['faults_injected']} faults recovered, "
        f"{lost} acknowledged records lost, audit chain {'valid' if chain_ok else 'BROKEN'} ({audit_detail}), "
        f"RSS {summary['rss_start_mb']} -> {summary['rss_end_mb']} MB, PLC rejected {rejected}")
    say("RSS per incarnation: " + ", ".join(f"pid {i['pid']} {i['first_mb']} -> {i['last_mb']} MB"
                                            for i in summary["rss_incarnations"]))
    say(f"acknowledged commands, all incarnations: {model_acked} model, {failsafe_acked} fail-safe "
        f"(fail-safe ratio {failsafe_ratio:.1%}); deadline_missed {total['deadline_missed']} of {total['frames']} "
        f"frames ({mix['deadline_missed_per_frame']:.1%}), timestamp drops {total['dropped_timestamp']} "
        f"(cycle_ms {timing['cycle_ms']:g}, deadline_ms {timing['deadline_ms']:g}, {args.signing})")
    if args.keep:
        say(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    # the acceptance, all of it: every fault injected (none skipped) and recovered, nothing acknowledged
    # lost, the chain valid, and the daemon's memory bounded (rss_growth_mb < 20)
    growth = summary.get("rss_growth_mb")
    worst = max((i["growth_mb"] for i in summary["rss_incarnations"]), default=None)
    ok = (summary["faults_recovered"] == summary["faults_injected"] and not summary["skipped"] and lost == 0
          and chain_ok and growth is not None and growth < 20 and worst is not None and worst < 20)
    if not ok:
        say("soak FAILED its acceptance: " + "; ".join(why for cond, why in (
            (summary["faults_recovered"] != summary["faults_injected"], "a fault did not recover"),
            (bool(summary["skipped"]), f"faults skipped: {', '.join(summary['skipped'])} (run as root)"),
            (lost != 0, f"{lost} acknowledged records lost"), (not chain_ok, "audit chain broken"),
            (growth is None or growth >= 20, f"RSS growth {growth} MB (limit 20)"),
            (worst is None or worst >= 20, f"RSS growth of an incarnation {worst} MB (limit 20)")) if cond))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
