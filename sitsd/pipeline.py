"""The control loop: one frame walks the gates, the model, the safety envelope and the signer on
one dedicated thread, and the signed envelope is handed to the I/O thread for the OPC UA write.

The loop never logs, never awaits and allocates little: timings go into TimingRing, events into
a bounded deque (`alerts`) that the I/O thread drains. A frame whose deadline (PLC send time +
timing.deadline_ms) would be missed gets the fail-safe command instead of the model's.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from attestation.envelope import Command
from ep.session import ModelRunner
from plc.frame import Frame

from .gates.constraints import ConstraintGate
from .gates.safety import SafetyEnvelope
from .gates.timestamp import CLOCK, FUTURE, REASONS, STALE, TRANSIT, TimestampGate
from .hotswap import WATCH_FRAMES, StageSet
from .wasm import ModuleTrap
from .stats import STAGE_INDEX, TimingRing

_T = {name: STAGE_INDEX[name] for name in STAGE_INDEX}


@dataclass(slots=True)
class Outgoing:
    """One signed command on its way to the I/O thread."""

    row: int
    envelope: bytes
    sequence: int
    frame_sequence: int
    sender_timestamp_ns: int
    deadline_ns: int
    handoff_ns: int
    failsafe: bool
    values: tuple[float, ...]
    model_sha256: bytes = b""  # the model the command came from (the one in the envelope)
    inputs: bytes = b""  # the frame's signal values the gates passed: float64, config signal order (audit digest)


class Counters:
    """Plain ints written by the loop thread, read by the I/O thread (a torn read is harmless)."""

    __slots__ = ("frames", "dropped_timestamp", "dropped_constraint", "failsafe", "deadline_missed",
                 "sign_errors", "submitted", "commands", "expired", "write_errors", "heartbeat", "module_traps")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class FrameSource(Protocol):
    def receive(self, timeout_s: float) -> Frame | None: ...


LOOP_GIL_WAIT_S = 0.0002  # the switch interval while the loop thread waits for a frame (see GilPriority)
LOOP_GIL_RUN_S = 0.005  # while it runs one: CPython's default switch interval


class GilPriority:
    """The loop thread's precedence for the GIL, made from CPython's one knob: the switch interval.

    A thread that waits for the GIL asks its holder to drop it after one switch interval; the holder drops
    it at its next bytecode boundary and waits until the other thread has it. The interval is read by the
    waiting thread each time it starts waiting. So the loop thread sets it short (`wait_s`, 0.2 ms) before it
    blocks for its next frame: when the frame comes and a preparing thread holds the GIL, the loop gets it
    within 0.2 ms. It sets it back to the interpreter's default (`run_s`, 5 ms) as soon as it holds the GIL:
    a thread that starts waiting during the frame (the one it just took the GIL from) then waits for the end
    of the frame instead of taking the GIL back after 0.2 ms, in the middle of it.

    One short interval for the whole process during a preparation (what sitsd.hotswap did before) is
    symmetric: the preparing thread also took the GIL from the loop 0.2 ms into every frame. With the
    signature (attestation.fastsign) and the model run (ep.capi) keeping the GIL, a frame is one stretch of
    bytecode and C calls that only a forced switch can interrupt, and that is what `run_s` keeps away.
    Only the loop thread changes the interval (nothing else in sitsd does). While the loop waits (most of
    the time) the whole process runs at 0.2 ms: the other threads (asyncio, housekeeping, a preparation)
    then hand the GIL to each other more often among themselves, at a few µs each."""

    __slots__ = ("wait_s", "run_s", "_set")

    def __init__(self, wait_s: float = LOOP_GIL_WAIT_S, run_s: float = LOOP_GIL_RUN_S) -> None:
        self.wait_s = wait_s
        self.run_s = run_s  # a constant, not the current value: another GilPriority may have set wait_s just now
        self._set = sys.setswitchinterval

    def waiting(self) -> None:
        """Before the loop thread blocks for its next frame."""
        self._set(self.wait_s)

    def running(self) -> None:
        """As soon as the loop thread is back with its frame (it holds the GIL)."""
        self._set(self.run_s)

    def restore(self) -> None:
        """When the loop thread ends: the default again, unless something else has set its own meanwhile."""
        if abs(sys.getswitchinterval() - self.wait_s) < 1e-7:
            self._set(self.run_s)


class ControlLoop:
    def __init__(self, *, source: FrameSource, timestamp_gate: TimestampGate, constraint_gate: ConstraintGate,
                 model: ModelRunner, input_index: list[int], safety: SafetyEnvelope, signer,
                 submit: Callable[[Outgoing], None], target: str, deadline_ns: int, sign_budget_ns: int,
                 max_consecutive_drops: int, timings: TimingRing, counters: Counters,
                 alerts: deque, loop_cpu: int | None = None, realtime_priority: int | None = None,
                 clock_policy: str = "warn", pre=None, post=None) -> None:
        self.source = source
        self.ts_gate = timestamp_gate
        self.constraints = constraint_gate
        self.model = model
        self.input_index = np.asarray(input_index, dtype=np.intp)
        self.safety = safety
        self.signer = signer
        self.submit = submit
        self.target = target
        self.deadline_ns = deadline_ns
        self.sign_budget_ns = sign_budget_ns
        self.max_consecutive_drops = max_consecutive_drops
        self.timings = timings
        self.counters = counters
        self.alerts = alerts
        self._sign_alert: tuple[str, int] = ("", 0)  # the last `sign` alert's text and time (one per second)
        self.clock_policy = clock_policy
        self.loop_cpu = loop_cpu
        self.realtime_priority = realtime_priority
        self.model_sha256 = model.sha256
        # pre module -> model -> post module: swapped as one reference between frames (sitsd.hotswap)
        self.stage_set = StageSet(0, model, model.sha256, str(model.path), pre, post, label="startup")
        self.last_generation = -1  # the StageSet generation of the last frame that reached the model
        self.frame_waiter: threading.Event | None = None  # set (once) at the next frame boundary, then cleared
        self.sequence = 0
        self.last_rx_source = -1  # RxStampSource of the last frame, for status
        self.last_vlan_pcp = -1
        self._consecutive_drops = 0
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.crashed: BaseException | None = None
        self.observe: Callable | None = None  # observe(t_ns, values, command, failsafe): fault attribution's ring

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="sitsd-loop", daemon=True)
        self.thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout_s)

    def _apply_scheduling(self) -> None:
        """Pin and raise the loop thread (pid 0 = the calling thread on Linux); refusals become alerts."""
        if self.loop_cpu is not None:
            try:
                os.sched_setaffinity(0, {self.loop_cpu})
            except OSError as exc:
                self.alerts.append((time.time_ns(), "runtime", f"cannot pin loop to CPU {self.loop_cpu}: {exc} "
                                    "(under sitsd.service the unit's CPUAffinity= applies: its syscall filter "
                                    "keeps sched_setaffinity from the daemon)", 0, 0))
        if self.realtime_priority is not None:
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.realtime_priority))
            except OSError as exc:
                self.alerts.append((time.time_ns(), "runtime", f"SCHED_FIFO {self.realtime_priority} refused: {exc} "
                                    "(under sitsd.service the unit's CPUSchedulingPolicy=fifo applies to every "
                                    "thread: its syscall filter keeps sched_setscheduler from the daemon)", 0, 0))

    def _run(self) -> None:
        gil = GilPriority()
        if hasattr(self.source, "after_wait"):  # a socket source: back to the run interval before it parses
            self.source.after_wait = gil.running
        try:
            self._apply_scheduling()
            while not self._stop.is_set():
                gil.waiting()
                frame = self.source.receive(0.05)
                gil.running()
                self.counters.heartbeat += 1
                if frame is not None:
                    self.step(frame)
                if self.frame_waiter is not None:
                    self.frame_boundary()
        except BaseException as exc:  # reported by the I/O thread, which stops the daemon
            self.crashed = exc
            self.alerts.append((time.time_ns(), "loop_crashed", repr(exc), 0, 0))
        finally:
            gil.restore()

    def frame_boundary(self) -> None:
        """Called between frames, before the loop waits for the next one: wakes a hot-swap preparation
        waiting to run its next step in the loop's idle time (sitsd.hotswap.HotSwap.between_frames)."""
        waiter = self.frame_waiter
        if waiter is not None:
            self.frame_waiter = None
            waiter.set()

    def step(self, frame: Frame) -> None:
        """Run one frame through the loop (public for tests and the benchmark)."""
        # a config reload swaps these references between frames; one frame uses one set of rules
        gate, safety = self.constraints, self.safety
        st = self.stage_set  # likewise a hot swap: modules and model, read once per frame
        self.model_sha256 = st.model_sha256
        t_loop = time.time_ns()
        c, stages = self.counters, self.timings.stages
        row = self.timings.next_row()
        c.frames += 1
        self.last_rx_source = frame.rx_stamp_source
        self.last_vlan_pcp = frame.vlan_pcp
        stages[row, _T["transit"]] = (frame.rx_timestamp_ns - frame.sender_timestamp_ns) * 1e-3
        stages[row, _T["wakeup"]] = (t_loop - frame.rx_timestamp_ns) * 1e-3
        deadline = frame.sender_timestamp_ns + self.deadline_ns

        p0 = time.perf_counter_ns()
        reason = self.ts_gate.check(frame, t_loop)
        p1 = time.perf_counter_ns()
        stages[row, _T["timestamp_gate"]] = (p1 - p0) * 1e-3
        if reason:
            c.dropped_timestamp += 1
            self.alerts.append((t_loop, "timestamp", self._explain_drop(reason, frame, t_loop), frame.publisher_id,
                                frame.sequence_number))
            # the frame's own stamp is what the gate refused (a PLC clock jump puts it seconds off): the fail-safe
            # is committed to the safety envelope at our receive time, so the rate limit after recovery holds
            if reason == CLOCK and self.clock_policy == "failsafe":
                self._send(frame, row, safety.failsafe, True, deadline, "clock", frame.rx_timestamp_ns)
                return
            self._consecutive_drops += 1
            if self._consecutive_drops >= self.max_consecutive_drops:
                self._consecutive_drops = 0
                self._send(frame, row, safety.failsafe, True, deadline, "consecutive_drops", frame.rx_timestamp_ns)
            return

        if self.ts_gate.restarted:
            self.alerts.append((t_loop, "publisher_restart", "sequence number went back with a newer sender "
                                "timestamp: the publisher restarted", frame.publisher_id, frame.sequence_number))
        violated = gate.check(frame.values, frame.sender_timestamp_ns)
        p2 = time.perf_counter_ns()
        stages[row, _T["constraint_gate"]] = (p2 - p1) * 1e-3
        if gate.last_substituted:
            self.alerts.append((t_loop, "hold_last", f"invalid {', '.join(gate.last_substituted)}: "
                                "held the last accepted value", frame.publisher_id, frame.sequence_number))
            gate.last_substituted = []
        if violated >= 0:
            c.dropped_constraint += 1
            self.alerts.append((t_loop, "constraint", gate.describe(violated, frame.values),
                                frame.publisher_id, frame.sequence_number))
            if gate.policy(violated) == "drop":
                self._consecutive_drops += 1
                if self._consecutive_drops >= self.max_consecutive_drops:
                    self._consecutive_drops = 0
                    self._send(frame, row, safety.failsafe, True, deadline, "consecutive_drops")
                return
            self._send(frame, row, safety.failsafe, True, deadline, "constraint")
            return
        self._consecutive_drops = 0

        if st.first_frame < 0:
            st.first_frame = c.frames
        st.frames += 1
        self.last_generation = st.generation
        model, pre, post = st.model, st.pre, st.post
        running = pre
        try:
            if pre is None:
                model.input[0, :] = frame.values[self.input_index]
            else:
                pre.frames += 1
                pre.instance.input[:] = frame.values[self.input_index]
                pre.instance.process()
                model.input[0, :] = pre.instance.output
            proposed = model.run()[0]
            if post is not None:
                running = post
                post.frames += 1
                post.instance.input[:] = proposed
                post.instance.check_input()  # a model's NaN never reaches the module (nor its state)
                post.instance.process()
                proposed = post.instance.output
        except ModuleTrap as exc:  # the sandbox stopped it (or a NaN/inf came out or would go in: code "nonfinite"):
            # fail-safe, alert, the loop goes on
            st.traps += 1
            if exc.code != "deadline":  # not a preempted call: the module's own fault
                st.faults += 1
            if st.frames <= WATCH_FRAMES:  # in the set's health watch, whenever the check comes to look
                st.watch_traps += 1
                st.watch_faults += exc.code != "deadline"
            running.traps += 1
            c.module_traps += 1
            self.alerts.append((t_loop, "module", str(exc), frame.publisher_id, frame.sequence_number))
            self._send(frame, row, safety.failsafe, True, deadline, "module")
            return
        p3 = time.perf_counter_ns()
        stages[row, _T["model"]] = (p3 - p2) * 1e-3

        values = safety.apply(proposed, frame.sender_timestamp_ns)
        p4 = time.perf_counter_ns()
        stages[row, _T["safety"]] = (p4 - p3) * 1e-3
        if safety.violation:
            self.alerts.append((t_loop, "safety", safety.violation, frame.publisher_id, frame.sequence_number))
            if safety.wants_failsafe:
                self._send(frame, row, safety.failsafe, True, deadline, "safety")
                return
        if time.time_ns() + self.sign_budget_ns > deadline:
            c.deadline_missed += 1
            self.alerts.append((t_loop, "deadline", "model result would arrive after the deadline",
                                frame.publisher_id, frame.sequence_number))
            self._send(frame, row, safety.failsafe, True, deadline, "deadline")
            return
        self._send(frame, row, values, False, deadline, "")

    def _explain_drop(self, reason: int, frame: Frame, now_ns: int) -> str:
        """The alert text for a timestamp drop: the reason and the numbers behind it (off the happy path)."""
        g = self.ts_gate
        detail = {
            TRANSIT: f"{g.last_transit_ns / 1e6:.3f} ms in transit, limit {g.max_transit_ns / 1e6:g} ms",
            FUTURE: f"sender stamp {-g.last_transit_ns / 1e6:.3f} ms ahead of ours, tolerance {g.max_future_ns / 1e6:g} ms",
            STALE: f"{(now_ns - frame.sender_timestamp_ns) / 1e6:.3f} ms old at pickup",
        }.get(reason, f"sequence {frame.sequence_number} from writer {frame.writer_id}")
        return f"{REASONS[reason]}: {detail}"

    def _send(self, frame: Frame, row: int, values: np.ndarray, failsafe: bool, deadline: int, why: str,
              stamp_ns: int | None = None) -> None:
        """Sign and hand over one command; `stamp_ns` is the time the safety envelope's rate limit counts this
        command at (the frame's sender stamp unless given)."""
        c = self.counters
        self.sequence += 1
        out = tuple(values.tolist())
        if failsafe:  # the fail-safe is always safe to apply: it gets a fresh validity window, never expires
            deadline = time.time_ns() + self.deadline_ns
        cmd = Command(self.target, out, self.sequence, frame.sequence_number, time.time_ns(), deadline,
                      self.model_sha256, failsafe)
        p0 = time.perf_counter_ns()
        try:
            envelope = self.signer.sign_command(cmd)
        except Exception as exc:  # TPM gone, key refused: nothing unsigned ever leaves
            c.sign_errors += 1  # every refusal counted; the alert once a second per distinct cause, not per frame
            text, now = str(exc), time.monotonic_ns()
            if text != self._sign_alert[0] or now - self._sign_alert[1] >= 1_000_000_000:
                self._sign_alert = (text, now)
                self.alerts.append((time.time_ns(), "sign", text, frame.publisher_id, frame.sequence_number))
            return
        p1 = time.perf_counter_ns()
        self.timings.stages[row, _T["sign"]] = (p1 - p0) * 1e-3
        self.safety.commit(values, frame.sender_timestamp_ns if stamp_ns is None else stamp_ns)
        if self.observe is not None:
            self.observe(frame.sender_timestamp_ns, frame.values, values, failsafe)
        if failsafe:
            c.failsafe += 1
        c.submitted += 1
        self.submit(Outgoing(row, envelope, self.sequence, frame.sequence_number, frame.sender_timestamp_ns,
                             deadline, time.time_ns(), failsafe, out, cmd.model_sha256, frame.values.tobytes()))
