"""Hot swap under a 1 kHz loop: latency away from vs near swaps, preparation time, frames lost, late frames.

    python bench/hotswap.py [--swaps 100] [--rate 1000] [--model-every 4] [--proof worker|in-process]
                            [--config PATH] [--max-age-ms MS] [--deadline-ms MS] [--baseline-s S]
                            [--realtime-priority N] [--json]

The real loop (gates, pre module, ORT model, post module, safety envelope, Ed25519 signing) runs on its
own thread at `--rate` frames per second, fed frames directly (no network), while a swapper thread
swaps every ~40-60 ms: every `--model-every`-th swap the model (alternating the demo model and a copy
with one more doc_string: other bytes, other SHA-256, same weights), with its bound proof as the daemon
runs it (in the proof worker process; `--proof in-process` runs it next to the loop, as before that
existed), the others the pre or the post module (alternating two versions of each, from the .cwasm
cache after the first load).
Frame i is due at start + i * period (its scheduled tick) and carries that time as its sender
timestamp (rx stamp 50 µs later, as a NIC stamps a packet on arrival however late the loop thread
wakes). Latency = from the scheduled tick to the signed command, in µs: a late wake-up, a wait for
the GIL after the sleep, and a frame queued behind a late one all count. A thread that falls behind
runs the frames that came due meanwhile back to back, as it would drain a socket.
The gates are the daemon's, from the config's timing section (--config, default examples/rolling-mill.yaml:
stale after 20 ms, fail-safe when the command would leave more than 8 ms after the PLC's send time);
--max-age-ms and --deadline-ms override them (before 2026-12-02 the benchmark fixed them at 5 and 8 ms).
frames_lost = frames without a model command: a fail-safe, or a frame the timestamp gate dropped as
stale when the loop reached it, as the daemon would. frames_over_5ms = commands more than 5 ms after the
tick (what a 5 ms staleness limit would drop).
The loop thread sleeps through sitsd._native.sleep_until, which reads the clock when the kernel wakes the
thread, before it takes the GIL back: kernel_wakeup_late_us and gil_wait_us split a late start into the
kernel's part (the hypervisor's, on a VM) and the wait for the GIL. Before the run, a thread at the same
priority that only sleeps to the same ticks measures the box's own floor (platform_baseline_wakeup_late_us).
slow_steps = frames whose own processing took over 2 ms, split by what the loop thread's counters
(getrusage RUSAGE_THREAD, its CPU clock) say happened meanwhile: switched out, on the CPU throughout, faulted.
late_frames = frames whose command was done more than one period after their scheduled tick (still
sent, and inside the 8 ms deadline unless also lost, but not within the loop's own period); counted
apart from frames_lost, which is about commands the PLC never gets.
"Near" a swap = frames due during its preparation or within 5 ms of it; model and module swaps are
also reported apart (`model_swaps`, `module_swaps`). "At" a swap (`latency_at_swap_us`,
`frames_lost_at_swap`) = frames due within 5 ms of an activation (the first frame on the new set).
The loop thread runs SCHED_FIFO as root (as `runtime.realtime_priority` runs the daemon's loop); with
`--realtime-priority 0` it competes with everything else on the box, and on a busy 2-core machine the
p99s are then dominated by the scheduler, near swaps or not.
Also printed side by side: one module call through the fast path vs wasmtime's `Func.__call__`, and the
first frames on a freshly swapped set.
The last line with --json is the issue's JSON summary.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from attestation.signers import SoftwareSigner  # noqa: E402
from ep.session import ModelRunner  # noqa: E402
from plc.frame import Frame, RxStampSource  # noqa: E402
from sitsd.config import load_config  # noqa: E402
from sitsd.gates import ConstraintGate, SafetyEnvelope, TimestampGate  # noqa: E402
from sitsd.hotswap import HotSwap, freeze_heap, model_bounds_check  # noqa: E402
from sitsd.pipeline import ControlLoop, Counters, GilPriority  # noqa: E402
from sitsd.stats import TimingRing  # noqa: E402
from sitsd.wasm import WasmHost  # noqa: E402

try:
    from sitsd._native import sleep_until  # noqa: E402
except ImportError:  # not built: time.sleep, and no split of a late wake-up into kernel and GIL
    sleep_until = None

CONFIG = REPO / "examples" / "rolling-mill.yaml"
MODULES = REPO / "wasm_modules"
NOMINAL = np.array([4.0, 3.0, 1.4, 8000.0, 120.0, 2.667, 2.0])
NEAR_NS = 5_000_000
SLOW_STEP_NS = 2_000_000
CLK_TCK = os.sysconf("SC_CLK_TCK")


class StealProbe:
    """What the hypervisor and the guest scheduler took from the loop thread, sampled after each frame (in its
    slack: no frame's latency includes it; ~6 µs): /proc/stat's per-CPU steal time (ticks of 1/CLK_TCK s: time
    a vCPU was runnable but the hypervisor ran something else) and the thread's own run delay from
    /proc/thread-self/schedstat (ns it was runnable but waited in the guest's run queue). Open it on the thread
    it measures. Absent files (no procfs) give None."""

    def __init__(self):
        try:
            self._stat = open("/proc/stat", "rb", buffering=0)
            self._sched = open("/proc/thread-self/schedstat", "rb", buffering=0)
        except OSError:
            self._stat = self._sched = None
        self.samples: list[tuple[bytes, bytes]] = []

    def sample(self) -> None:
        if self._stat is None:
            return
        self._stat.seek(0)
        self._sched.seek(0)
        self.samples.append((self._stat.read(4096), self._sched.read(128)))

    def close(self) -> None:
        for f in (self._stat, self._sched):
            if f is not None:
                f.close()

    @staticmethod
    def parse(sample: tuple[bytes, bytes]) -> tuple[int, int]:
        """(steal over all CPUs in ms, the thread's run delay in µs)"""
        stat, sched = sample
        steal = sum(int(line.split()[8]) for line in stat.split(b"\n")
                    if line.startswith(b"cpu") and line[3:4].isdigit())
        return steal * 1000 // CLK_TCK, int(sched.split()[1]) // 1000


def versions(workdir: Path, stem: str) -> list[Path]:
    """Two builds of a demo module that differ only in their `version` export."""
    src = (MODULES / f"{stem}.wat").read_text()
    out = []
    for v in (1, 2):
        d = workdir / stem / f"v{v}"
        d.mkdir(parents=True)
        (d / f"{stem}.wat").write_text(src.replace("(global $version i32 (i32.const 1))",
                                                   f"(global $version i32 (i32.const {v}))"))
        shutil.copy(MODULES / f"{stem}.golden.json", d)
        out.append(d / f"{stem}.wat")
    return out


def build_loop(host: WasmHost, max_age_ns: int | None = None, deadline_ns: int | None = None,
               config: Path = CONFIG):
    """The daemon's loop as sitsd.daemon builds it from `config` (its timing section: transit, future, age,
    deadline, consecutive drops), with `max_age_ns`/`deadline_ns` overriding the config's where given."""
    cfg = load_config(config)
    names = cfg.signal_names
    tm = cfg.timing
    if max_age_ns is None:
        max_age_ns = int(tm.max_age_ms * 1e6) if tm.max_age_ms else None
    deadline_ns = int(tm.deadline_ms * 1e6) if deadline_ns is None else deadline_ns
    sent: deque = deque()
    model = ModelRunner(cfg.model.artifact, len(cfg.model.inputs), len(cfg.model.outputs))
    pre = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
    post = host.load("post_command", "post", MODULES / "post_command.wat", 1, 1)
    loop = ControlLoop(
        source=None, timestamp_gate=TimestampGate(int(tm.max_transit_ms * 1e6), int(tm.max_future_ms * 1e6),
                                                  max_age_ns=max_age_ns, window=tm.replay_window),
        constraint_gate=ConstraintGate(cfg.signals, cfg.constraints), model=model,
        input_index=[names.index(n) for n in cfg.model.inputs],
        safety=SafetyEnvelope(cfg.safety.actuators, cfg.model.outputs), signer=SoftwareSigner(), submit=sent.append,
        target=cfg.plc.command_node, deadline_ns=deadline_ns, sign_budget_ns=100_000,
        max_consecutive_drops=tm.max_consecutive_drops,
        timings=TimingRing(4096), counters=Counters(), alerts=deque(maxlen=4096), pre=pre, post=post)
    return loop, sent, cfg


def model_variant(src: Path, dst: Path) -> Path:
    """The model with one more ModelProto.doc_string (field 6) appended: loadable, same weights, other bytes."""
    dst.write_bytes(src.read_bytes() + b"\x32\x07variant")
    return dst


def platform_wakeups(seconds: float, rate_hz: float, realtime_priority: int | None) -> dict | None:
    """The box's own floor, measured in the same run: a thread at the loop's priority that only sleeps to the
    same 1 kHz ticks (no loop, no swaps, no other Python thread), and how late the kernel wakes it."""
    if sleep_until is None or seconds <= 0:
        return None
    period = int(1e9 / rate_hz)
    late: list[int] = []

    def body():
        if realtime_priority:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(realtime_priority))
        t = time.perf_counter_ns() + period
        for _ in range(int(seconds * rate_hz)):
            late.append(sleep_until(t) - t)
            t = max(t + period, time.perf_counter_ns())

    th = threading.Thread(target=body, name="bench-baseline")
    th.start()
    th.join()
    a = np.array(late) / 1e3
    return {"ticks": len(a), **_pct(a), "over_4ms": int((a > 4000).sum())}


def call_overhead(host: WasmHost, n: int = 20000) -> dict:
    inst = host.load("post_command", "post", MODULES / "post_command.wat", 1, 1).instance
    out = {}
    for name, fn in (("fast_path", inst.process), ("func_call", inst.call_public)):
        t = np.full(n, np.nan)
        for i in range(n):
            t0 = time.perf_counter_ns()
            try:
                fn()
            except Exception:  # a call preempted past the module's wall-clock deadline traps: not timed
                continue
            t[i] = (time.perf_counter_ns() - t0) / 1e3
        out[name] = {"p50": float(np.nanmedian(t)), "p99": float(np.nanpercentile(t, 99))}
    return out


def run(swaps: int, rate_hz: float, realtime_priority: int | None = None, model_every: int = 4,
        proof: str = "worker", max_age_ms: float | None = None, deadline_ms: float | None = None,
        config: Path = CONFIG, baseline_s: float = 3.0) -> tuple[dict, dict]:
    baseline = platform_wakeups(baseline_s, rate_hz, realtime_priority)
    workdir = Path(tempfile.mkdtemp(prefix="sits-hotswap-"))
    host = WasmHost(workdir / "cache")
    try:
        loop, sent, cfg = build_loop(host, None if max_age_ms is None else int(max_age_ms * 1e6),
                                     None if deadline_ms is None else int(deadline_ms * 1e6), config)
        max_age_ms = loop.ts_gate.max_age_ns / 1e6 if loop.ts_gate.max_age_ns else None
        deadline_ms = loop.deadline_ns / 1e6
        bounds = model_bounds_check(lambda: cfg, isolate=proof == "worker")
        hs = HotSwap(loop, host, n_inputs=6, n_outputs=1, bounds_check=bounds)
        paths = {"pre": versions(workdir, "pre_filter"), "post": versions(workdir, "post_command")}
        models = [Path(cfg.model.artifact), model_variant(Path(cfg.model.artifact), workdir / "rolling_mill_b.onnx")]
        for p in paths["pre"] + paths["post"]:  # compile both versions once: swaps deserialize verified .cwasm
            stem = p.stem
            host.load(stem, "pre" if stem == "pre_filter" else "post", p, 6 if stem == "pre_filter" else 1,
                      6 if stem == "pre_filter" else 1)
        # no pre-warm: as in the daemon, the first model swap starts the proof worker (its warm-up shows in that
        # swap's prepare_ms, its spawn next to the running loop)
        overhead = call_overhead(host)
        freeze_heap()  # as sitsd.hotswap.attach does at the daemon's start, before its loop runs
        period_ns = int(1e9 / rate_hz)
        due, starts, done, step_us, gens = [], [], [], [], []
        woke: list[int] = []  # when the kernel woke the loop thread for the frame (0: it did not sleep for it)
        windows: list[tuple[int, int, str]] = []  # (from, to, "model" or "module")
        prepare_ms: dict[str, list[float]] = {"model": [], "module": []}
        work_ms: list[float] = []  # module preparation without the waits for frame boundaries
        stop = threading.Event()
        wall_offset = time.time_ns() - time.perf_counter_ns()

        slow: list[tuple[int, int, int, int]] = []  # steps over SLOW_STEP_NS: (wall, cpu, context switches, faults)
        getrusage, RUSAGE_THREAD, thread_time_ns = resource.getrusage, resource.RUSAGE_THREAD, time.thread_time_ns
        steal_probe: list[StealProbe | None] = [None]

        def loop_thread():
            if realtime_priority:  # as runtime.realtime_priority does for the daemon's loop thread
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(realtime_priority))
            probe = steal_probe[0] = StealProbe()  # opened on this thread: its schedstat is this thread's
            seq, t_first = 0, time.perf_counter_ns() + period_ns
            gil = GilPriority()  # as ControlLoop._run: 0.2 ms switch interval while waiting, the default while running
            while not stop.is_set():
                sched = t_first + seq * period_ns  # this frame's tick: the PLC sent it then
                delay = sched - time.perf_counter_ns()
                w = 0
                if delay > 0:
                    gil.waiting()
                    if sleep_until is not None:  # the GIL released, the kernel's wake-up time kept apart
                        w = sleep_until(sched)
                    else:
                        time.sleep(delay / 1e9)
                    gil.running()
                seq += 1
                sender = sched + wall_offset
                f = Frame(7, 1, seq & 0xFFFF or 1, sender, sender + 50_000, RxStampSource.SOFTWARE, NOMINAL)
                r0, c0 = getrusage(RUSAGE_THREAD), thread_time_ns()
                t0 = time.perf_counter_ns()
                loop.step(f)
                t1 = time.perf_counter_ns()
                if t1 - t0 > SLOW_STEP_NS:  # what the thread did meanwhile (its own counters: no other thread's)
                    r1 = getrusage(RUSAGE_THREAD)
                    slow.append((t1 - t0, thread_time_ns() - c0, r1.ru_nvcsw - r0.ru_nvcsw + r1.ru_nivcsw - r0.ru_nivcsw,
                                 r1.ru_minflt - r0.ru_minflt + r1.ru_majflt - r0.ru_majflt))
                due.append(sched)
                woke.append(w)
                starts.append(t0)
                done.append(t1)
                step_us.append((t1 - t0) / 1e3)
                gens.append(loop.last_generation)
                loop.frame_boundary()  # as the daemon's loop thread does before waiting for its next frame
                probe.sample()  # after the frame's command: in its slack
            gil.restore()
            probe.close()

        def swapper():
            rng = random.Random(1)
            time.sleep(0.2)
            n_module = 0
            for i in range(swaps):
                t0 = time.perf_counter_ns()
                if model_every and i % model_every == model_every - 1:
                    rec = hs.update_model(models[(len(prepare_ms["model"]) + 1) % 2])
                    kind = "model"
                else:
                    stage = "pre" if n_module % 2 == 0 else "post"
                    rec = hs.update_module(paths[stage][(n_module // 2 + 1) % 2])
                    work_ms.append(rec["module"]["work_ms"])
                    n_module += 1
                    kind = "module"
                t1 = time.perf_counter_ns()
                prepare_ms[kind].append(rec["prepare_ms"])
                windows.append((t0 - NEAR_NS, t1 + NEAR_NS, kind))
                time.sleep(rng.uniform(0.04, 0.06))
            time.sleep(0.2)

        t = threading.Thread(target=loop_thread, name="bench-loop")
        t.start()
        try:
            swapper()
        finally:
            stop.set()
            t.join()
        n = len(gens)
        due_a = np.array(due)
        lat = (np.array(done) - due_a) / 1e3  # from the scheduled tick to the signed command
        wake = (np.array(starts) - due_a) / 1e3  # how late the loop started the frame (the stall a swap causes)
        step_a = np.array(step_us)
        near = {k: np.zeros(n, dtype=bool) for k in ("model", "module")}
        for lo, hi, kind in windows:
            near[kind] |= (due_a >= lo) & (due_a <= hi)
        any_near = near["model"] | near["module"]
        commanded = {o.sender_timestamp_ns for o in sent if not o.failsafe}  # the frame's tick identifies it
        lost_mask = np.array([d + wall_offset not in commanded for d in due], dtype=bool)
        model_commands = n - int(lost_mask.sum())
        late = lat > period_ns / 1e3
        # a late start = the kernel waking the thread late (woke - tick) + the wait for the GIL (start - woke);
        # frames run back to back after a late one (woke 0) inherit the cause of the last frame that slept
        woke_a = np.array(woke)
        slept = woke_a > 0
        kernel_late = np.where(slept, (woke_a - due_a) / 1e3, np.nan)
        gil_wait = np.where(slept, (np.array(starts) - woke_a) / 1e3, np.nan)
        last_slept = np.maximum.accumulate(np.where(slept, np.arange(n), 0))
        over5 = lat > 5000.0
        stalled_kernel = np.nan_to_num(kernel_late[last_slept]) >= 4000.0  # its backlog began with a late wake-up
        stalled_gil = ~stalled_kernel & (np.nan_to_num(gil_wait[last_slept]) >= 4000.0)  # ... or a wait for the GIL
        slow_in_backlog = np.zeros(n, dtype=bool)  # ... or a frame of it (itself included) that took >= 4 ms to run
        longest = 0.0
        for i in range(n):
            longest = step_a[i] if slept[i] else max(longest, step_a[i])
            slow_in_backlog[i] = longest >= 4000.0
        stalled_step = ~stalled_kernel & ~stalled_gil & slow_in_backlog
        events, with_steal = _loss_events(steal_probe[0], lost_mask, last_slept, any_near, due_a, kernel_late,
                                          gil_wait, step_a)
        probe_total = _probe_delta(steal_probe[0], 0, n - 1)
        after_kernel_stall = over5 & stalled_kernel
        g = np.array(gens)
        first = np.r_[False, g[1:] != g[:-1]]
        second = np.r_[False, first[:-1]]

        def part(kind: str) -> dict:
            m = near[kind]
            out = {"swaps": len(prepare_ms[kind]), "near_frames": int(m.sum()),
                   "late_frames_near": int((late & m).sum()), "latency_near_us": _pct(lat[m]) if m.any() else None,
                   "loop_start_late_max_us": round(float(wake[m].max()), 1) if m.any() else None}
            if prepare_ms[kind]:
                out["prepare_ms"] = {"p50": round(float(np.median(prepare_ms[kind])), 3),
                                     "max": round(float(np.max(prepare_ms[kind])), 3)}
            out["frames_lost_near"] = int((lost_mask & m).sum())
            return out

        # frames due within NEAR_NS of an activation (the first frame on each new set: the instant of the swap),
        # as against "near" above, which spans the whole preparation as well
        at_swap = np.zeros(n, dtype=bool)
        for t_act in due_a[first]:
            at_swap |= np.abs(due_a - t_act) <= NEAR_NS
        all_prep = prepare_ms["model"] + prepare_ms["module"]
        summary = {
            "frames": n, "swaps": len(all_prep), "frames_lost": int(n - model_commands),
            "late_frames": int(late.sum()),
            "latency_away_us": _pct(lat[~any_near]), "latency_near_swap_us": _pct(lat[any_near]),
            "latency_at_swap_us": _pct(lat[at_swap]) if at_swap.any() else None,
            "frames_lost_at_swap": int((lost_mask & at_swap).sum()), "at_swap_frames": int(at_swap.sum()),
            # where the lost frames were, and what began their backlog (the last frame that slept before them)
            "frames_lost_split": {"near_swap": int((lost_mask & any_near).sum()),
                                  "away": int((lost_mask & ~any_near).sum()),
                                  "after_kernel_stall": int((lost_mask & stalled_kernel).sum()),
                                  "after_gil_wait": int((lost_mask & stalled_gil).sum()),
                                  "after_slow_step": int((lost_mask & stalled_step).sum()),
                                  "other": int((lost_mask & ~stalled_kernel & ~stalled_gil & ~stalled_step).sum()),
                                  "with_steal": with_steal},
            "loss_events": events,
            "steal_ms": probe_total[0] if probe_total else None,
            "loop_run_delay_ms": round(probe_total[1] / 1e3, 2) if probe_total else None,
            "prepare_ms": {"p50": round(float(np.median(all_prep)), 3), "max": round(float(np.max(all_prep)), 3)},
            "model_swaps": part("model"), "module_swaps": part("module"),
            "loop_start_late_max_us": {"away": round(float(wake[~any_near].max()), 1),
                                       "near_swap": round(float(wake[any_near].max()), 1)},
            "dropped_stale": loop.counters.dropped_timestamp, "proof": proof,
            "timing": {"config": str(config.relative_to(REPO) if config.is_relative_to(REPO) else config),
                       "max_age_ms": max_age_ms, "deadline_ms": deadline_ms},
            "frames_over_5ms": {"total": int(over5.sum()), "near_swap": int((over5 & any_near).sum()),
                                "away": int((over5 & ~any_near).sum()),
                                "after_kernel_stall": int(after_kernel_stall.sum())},
            "kernel_wakeup_late_us": _split(kernel_late, slept, any_near),
            "platform_baseline_wakeup_late_us": baseline,
            "gil_wait_us": _split(gil_wait, slept, any_near),
            "slow_steps": _slow_steps(slow),
            "definitions": {"latency": "scheduled tick to signed command",
                            "frames_lost": "no model command: a fail-safe (the command would have left after the "
                                           f"{deadline_ms:g} ms deadline, or any other reason), or dropped by the "
                                           "timestamp gate as older than "
                                           + (f"{max_age_ms:g} ms" if max_age_ms else "its age limit (none set)"),
                            "frames_lost_split": "lost frames near a swap (its preparation +- 5 ms) and away; and "
                                                 "by what began their backlog: the kernel waking the loop >= 4 ms "
                                                 "late, else a wait >= 4 ms for the GIL after the wake-up, else a frame "
                                                 "of the backlog that took >= 4 ms to run (see slow_steps), else other; "
                                                 "with_steal: lost frames whose backlog (from the end of the frame "
                                                 "before it to its last frame) saw hypervisor steal time on the box",
                            "loss_events": "one per backlog with lost frames: its first frame's time into the run, "
                                           "frames lost, near a swap or not, the kernel's late wake-up and the GIL "
                                           "wait that began it, its longest step, and over its span the steal time "
                                           "(/proc/stat, all vCPUs, 1/CLK_TCK s resolution) and the loop thread's "
                                           "run delay in the guest (/proc/thread-self/schedstat)",
                            "steal_ms": "hypervisor steal time on all vCPUs during the run (/proc/stat)",
                            "loop_run_delay_ms": "time the loop thread was runnable but waited in the guest's run "
                                                 "queue during the run",
                            "frames_over_5ms": "command more than 5 ms after the tick (lost under a 5 ms age "
                                               "limit); after_kernel_stall: its backlog began with the kernel "
                                               "waking the loop thread >= 4 ms late",
                            "kernel_wakeup_late_us": "the loop thread's sleep ended this long after the tick "
                                                     "(kernel/hypervisor), before it waited for the GIL",
                            "gil_wait_us": "from that wake-up to the loop holding the GIL",
                            "slow_steps": "frames whose own processing (gates to signed command) took over 2 ms: "
                                          "switched = the loop thread was switched out during it (it blocked, e.g. "
                                          "for the GIL, or was preempted inside the guest); on_cpu = no switch, no "
                                          "page fault, and its CPU clock ran >= 80% of the time (a stall the "
                                          "guest cannot see: the hypervisor's); faulted = page faults during it",
                            "platform_baseline_wakeup_late_us": "before the run, a thread at the loop's priority "
                                                                "that only sleeps to the same ticks: how late the "
                                                                "kernel wakes it (the box's floor)",
                            "late_frames": "command done more than one period after the scheduled tick; sent, "
                                           "not counted in frames_lost"},
        }
        listed = hs.versions()
        extra = {"near_frames": int(any_near.sum()), "sets": len(listed["sets"]), "sets_loaded": len(hs.sets),
                 "frames_in_sets": listed["loop"]["frames_in_sets"], "call_overhead_us": overhead,
                 "module_traps": loop.counters.module_traps, "failsafe": loop.counters.failsafe,
                 "first_frame_after_swap_us": _pct(step_a[first]), "second_frame_after_swap_us": _pct(step_a[second]),
                 "step_us": _pct(step_a), "work_ms_p50": float(np.median(work_ms)) if work_ms else 0.0,
                 "raw": {"due_ns": due_a, "start_ns": np.array(starts), "done_ns": np.array(done), "windows": windows, "woke_ns": woke_a, "lost": lost_mask}}
        return summary, extra
    finally:
        host.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _probe_delta(probe: StealProbe | None, i: int, j: int) -> tuple[int, int] | None:
    """(steal ms, run delay µs) from sample i to sample j (samples are taken after each frame)."""
    if probe is None or not probe.samples:
        return None
    a, b = StealProbe.parse(probe.samples[max(i, 0)]), StealProbe.parse(probe.samples[min(j, len(probe.samples) - 1)])
    return b[0] - a[0], b[1] - a[1]


def _loss_events(probe, lost, last_slept, near, due, kernel_late, gil_wait, step_us) -> tuple[list[dict], int | None]:
    """Lost frames grouped by the backlog they sit in (the frames since the last one the loop slept for)."""
    events, with_steal = [], 0
    onsets = sorted({int(last_slept[i]) for i in np.flatnonzero(lost)})
    for k in onsets:
        members = np.flatnonzero(last_slept == k)
        end = int(members[-1])
        d = _probe_delta(probe, k - 1, end)  # from the end of the frame before the backlog to its last frame
        n_lost = int(lost[members].sum())
        if d and d[0] > 0:
            with_steal += n_lost
        events.append({"at_s": round(float(due[k] - due[0]) / 1e9, 3), "frames": len(members), "lost": n_lost,
                       "near_swap": bool(near[members].any()),
                       "kernel_late_ms": round(float(np.nan_to_num(kernel_late[k])) / 1e3, 2),
                       "gil_wait_ms": round(float(np.nan_to_num(gil_wait[k])) / 1e3, 2),
                       "longest_step_ms": round(float(step_us[members].max()) / 1e3, 2),
                       "steal_ms": d[0] if d else None, "run_delay_ms": round(d[1] / 1e3, 2) if d else None})
    return events[:20], (with_steal if probe is not None and probe.samples else None)


def _slow_steps(slow: list[tuple[int, int, int, int]]) -> dict:
    switched = sum(1 for _, _, sw, _ in slow if sw)
    faulted = sum(1 for _, _, sw, f in slow if not sw and f)
    on_cpu = sum(1 for wall, cpu, sw, f in slow if not sw and not f and cpu >= 0.8 * wall)
    return {"over_2ms": len(slow), "switched": switched, "on_cpu": on_cpu, "faulted": faulted,
            "other": len(slow) - switched - faulted - on_cpu,
            "max_ms": round(max((w for w, *_ in slow), default=0) / 1e6, 2),
            "longest": [{"wall_ms": round(w / 1e6, 2), "cpu_ms": round(c / 1e6, 2), "switches": sw, "faults": f}
                        for w, c, sw, f in sorted(slow, reverse=True)[:10]]}


def _split(a: np.ndarray, valid: np.ndarray, near: np.ndarray) -> dict | None:
    if sleep_until is None:
        return None
    out = {}
    for key, m in (("away", valid & ~near), ("near_swap", valid & near)):
        if m.any():
            out[key] = {**_pct(a[m]), "over_4ms": int((a[m] > 4000).sum())}
    return out


def _pct(a: np.ndarray) -> dict:
    return {"p50": round(float(np.median(a)), 2), "p99": round(float(np.percentile(a, 99)), 2),
            "max": round(float(np.max(a)), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swaps", type=int, default=100)
    ap.add_argument("--rate", type=float, default=1000.0, help="loop frames per second (default 1000)")
    ap.add_argument("--model-every", type=int, default=4, metavar="K",
                    help="every K-th swap is a model swap (default 4; 0: modules only)")
    ap.add_argument("--proof", choices=("worker", "in-process"), default="worker",
                    help="where a model swap's bound proof runs: the proof worker process, as the daemon runs it "
                         "(default), or next to the loop in this process, as before the worker existed")
    ap.add_argument("--config", type=Path, default=CONFIG,
                    help="the daemon config whose timing section sets the gates (default examples/rolling-mill.yaml: "
                         "frames older than 20 ms are stale, a command later than 8 ms after the PLC's send time "
                         "is replaced by the fail-safe)")
    ap.add_argument("--max-age-ms", type=float, default=None,
                    help="override timing.max_age_ms: the timestamp gate drops frames older than this when the loop "
                         "reaches them (5 = a tight 1 kHz setting; frames_over_5ms shows what it would drop)")
    ap.add_argument("--deadline-ms", type=float, default=None, help="override timing.deadline_ms")
    ap.add_argument("--baseline-s", type=float, default=3.0,
                    help="seconds of the platform baseline before the run: a thread that only sleeps to the loop's "
                         "ticks, to tell the box's own late wake-ups from the loop's (default 3; 0 skips it)")
    ap.add_argument("--realtime-priority", type=int, default=40 if os.geteuid() == 0 else 0, metavar="N",
                    help="run the loop thread SCHED_FIFO at N, as runtime.realtime_priority does in production "
                         "(default 40 as root, else 0 = normal scheduling)")
    ap.add_argument("--json", action="store_true", help="end with the JSON summary line")
    args = ap.parse_args()
    s, x = run(args.swaps, args.rate, args.realtime_priority, args.model_every, args.proof, args.max_age_ms,
               args.deadline_ms, args.config.resolve(), args.baseline_s)
    a, n = s["latency_away_us"], s["latency_near_swap_us"]
    sched = f"SCHED_FIFO {args.realtime_priority}" if args.realtime_priority else "normal scheduling"
    ms, mo = s["model_swaps"], s["module_swaps"]
    print(f"hot swap under a {args.rate:g} Hz loop ({sched}): {s['frames']} frames, {s['swaps']} swaps "
          f"({ms['swaps']} model, proof {args.proof}; {mo['swaps']} module), {s['frames_lost']} frames lost "
          f"({s['dropped_stale']} stale), {s['late_frames']} late (> 1 period), {x['failsafe']} fail-safes, "
          f"{x['module_traps']} module traps")
    if s["frames_lost"]:
        f = s["frames_lost_split"]
        print(f"  frames lost: {f['near_swap']} near swaps, {f['away']} away; behind a kernel wake-up >= 4 ms late "
              f"{f['after_kernel_stall']}, behind a wait for the GIL >= 4 ms {f['after_gil_wait']}, behind a frame that "
              f"took >= 4 ms to run {f['after_slow_step']}, other {f['other']}"
              + (f"; {f['with_steal']} with hypervisor steal time in their backlog" if f["with_steal"] is not None else ""))
        for e in s["loss_events"]:
            print(f"    at {e['at_s']:.3f} s: {e['lost']} of {e['frames']} frames lost{' near a swap' if e['near_swap'] else ''}; "
                  f"woken {e['kernel_late_ms']:.1f} ms late, GIL wait {e['gil_wait_ms']:.1f} ms, longest step "
                  f"{e['longest_step_ms']:.1f} ms; steal {e['steal_ms']} ms, run delay {e['run_delay_ms']} ms")
    if s["steal_ms"] is not None:
        print(f"  hypervisor steal during the run: {s['steal_ms']} ms (all vCPUs); the loop thread waited "
              f"{s['loop_run_delay_ms']} ms in the guest's run queue")
    print(f"  every frame on one stage set: {x['frames_in_sets']} frames counted over {x['sets']} sets")
    print(f"  {'latency from tick (µs)':<28}{'p50':>10}{'p99':>10}{'max':>10}")
    print(f"  {'away from swaps':<28}{a['p50']:>10.1f}{a['p99']:>10.1f}{a['max']:>10.1f}")
    print(f"  {'near swaps (' + str(x['near_frames']) + ' frames)':<28}{n['p50']:>10.1f}{n['p99']:>10.1f}{n['max']:>10.1f}"
          f"   p99 ratio {n['p99'] / a['p99']:.2f} (acceptance <= 2)")
    t = s["latency_at_swap_us"]
    if t:
        head = f"at the swap ({s['at_swap_frames']})"
        print(f"  {head:<28}{t['p50']:>10.1f}{t['p99']:>10.1f}{t['max']:>10.1f}   p99 ratio {t['p99'] / a['p99']:.2f}; "
              f"{s['frames_lost_at_swap']} lost (frames due within 5 ms of an activation)")
    for label, part in (("near model swaps", ms), ("near module swaps", mo)):
        q = part["latency_near_us"]
        if q:
            head = f"{label} ({part['near_frames']})"
            print(f"  {head:<28}{q['p50']:>10.1f}{q['p99']:>10.1f}{q['max']:>10.1f}"
                  f"   {part['frames_lost_near']} lost, {part['late_frames_near']} late, loop started up to "
                  f"{part['loop_start_late_max_us']:.0f} µs after its tick")
    print(f"  loop started up to {s['loop_start_late_max_us']['away']:.0f} µs after its tick away from swaps")
    o5, tm = s["frames_over_5ms"], s["timing"]
    age = f"{tm['max_age_ms']:g} ms" if tm["max_age_ms"] else "none"
    print(f"  gates from {tm['config']}: stale after {age}, deadline {tm['deadline_ms']:g} ms; commands more than 5 ms "
          f"after the tick: {o5['total']} ({o5['near_swap']} near swaps, {o5['away']} away), "
          f"{o5['after_kernel_stall']} of them behind a kernel wake-up >= 4 ms late")
    for label, key in (("kernel wake-up late (µs)", "kernel_wakeup_late_us"), ("wait for the GIL (µs)", "gil_wait_us")):
        q = s[key]
        if q:
            parts = "; ".join(f"{k.replace('_', ' ')} p50 {v['p50']:.0f} p99 {v['p99']:.0f} max {v['max']:.0f} "
                              f"({v['over_4ms']} > 4 ms)" for k, v in q.items())
            print(f"  {label:<28}{parts}")
    b = s["platform_baseline_wakeup_late_us"]
    if b:
        print(f"  {'platform baseline (µs)':<28}a thread that only sleeps to the same ticks, before the run: woken late "
              f"p50 {b['p50']:.0f} p99 {b['p99']:.0f} max {b['max']:.0f} ({b['over_4ms']} of {b['ticks']} > 4 ms)")
    st = s["slow_steps"]
    print(f"  {'frames processed > 2 ms':<28}{st['over_2ms']} (longest {st['max_ms']:.1f} ms): {st['switched']} with the loop "
          f"thread switched out (blocked or preempted), {st['on_cpu']} on its CPU throughout (a stall the guest cannot "
          f"see), {st['faulted']} with page faults, {st['other']} other")
    if mo["swaps"]:
        print(f"  module swap preparation (verify .cwasm, instantiate, golden vectors): p50 "
              f"{mo['prepare_ms']['p50']:.2f} ms, max {mo['prepare_ms']['max']:.2f} ms wall time, of which work p50 "
              f"{x['work_ms_p50']:.2f} ms (the rest waits for frame boundaries)")
    if ms["swaps"]:
        print(f"  model swap preparation (ORT session, self-test, bound proof): p50 {ms['prepare_ms']['p50']:.1f} ms, "
              f"max {ms['prepare_ms']['max']:.1f} ms wall time")
    f, f2 = x["first_frame_after_swap_us"], x["second_frame_after_swap_us"]
    print(f"  {'step, first frame on a new set':<33}{f['p50']:>7.1f}{f['p99']:>10.1f}{f['max']:>10.1f}")
    print(f"  {'step, second frame on a new set':<33}{f2['p50']:>7.1f}{f2['p99']:>10.1f}{f2['max']:>10.1f}")
    o = x["call_overhead_us"]
    print(f"  one module call: fast path p50 {o['fast_path']['p50']:.2f} / p99 {o['fast_path']['p99']:.2f} µs vs "
          f"Func.__call__ p50 {o['func_call']['p50']:.2f} / p99 {o['func_call']['p99']:.2f} µs "
          f"({o['func_call']['p50'] / o['fast_path']['p50']:.1f}x)")
    if args.json:
        print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
