"""Zero-downtime updates of the loop's stages: WASM modules, the model, and the config.

stage (verify signature and hash) -> prepare on a worker thread (compile or deserialize, instantiate, golden-vector
self-test; for a model: load through ep, and prove its output bounds inside the actuator limits in a child
process, ProofWorker, so that the proof's imports and numpy work never hold the loop's GIL) ->
swap: one reference assignment (`loop.stage_set = new`) that the loop reads once at the start of each
frame, so every frame runs on exactly one StageSet -> the previous set stays loaded for an instant
rollback. A trap, or an error-rate spike, in the frames right after a swap rolls back automatically.
Every swap and rollback is appended to the measurement log (`attestation.measurement`). A set that
survives its watch window, and the set a rollback leaves running, are handed to `on_settled`
(sitsd.persist: the daemon persists them, so a restart loads them again instead of the config's versions).

Invariant: only the loop thread calls into a StageSet's modules and model; other threads read its
counters (plain ints, torn reads are harmless) and assign `loop.stage_set`.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection  # imported here, not by the first swap next to the loop
from pathlib import Path

from ep.errors import ModelLoadError
from ep.session import ModelRunner

from .wasm import ModuleVersion, WasmError, WasmHost

POLICY_KEY_FILE = "device-policy.pub.pem"  # certify_session: the policy-bound device key a PLC may require
WATCH_FRAMES = 200  # frames after a swap during which a fault or an error spike rolls back
# A deadline trap can be the scheduler's doing (a preempted loop thread overruns a wall-clock limit on a
# busy box), so it takes this many to roll back; any other trap (fuel, out-of-bounds, unreachable, bad
# status) is the module's own fault and rolls back at once.
MAX_DEADLINE_TRAPS_IN_WATCH = 3


PREP_QUEUE_S = 45.0  # how long an update waits for another one's preparation before it is refused
KEPT_SETS = 8  # stage sets kept loaded for their counters (the running one and the rollback target always)
SWAP_THREADS = 2  # control-socket updates and rollbacks run on these (one prepares, one can roll back meanwhile)
MAX_SWAP_REQUESTS = 4  # updates/rollbacks in progress (running or queued) before another is refused at once
RETIRED_SETS_LISTED = 1000  # retired sets still listed (counters only, ~200 B each) in `sitsctl versions`


@contextlib.contextmanager
def _preparing():
    """While a preparation runs: the heap frozen first (`gc.freeze`, see freeze_heap), so a full collection
    that the preparation's allocations trigger does not hold the GIL for tens of ms.
    The GIL switch interval is the loop thread's to manage (sitsd.pipeline.GilPriority: 0.2 ms while it
    waits for a frame, the default while it runs one). Until 2026-12-02 this set 0.2 ms for the whole
    preparation, which also let the preparing thread take the GIL 0.2 ms into every frame (measured:
    bench/hotswap.py near-swap p99 2.5-3.5 ms with it, 1.5-2.2 ms without; docs/hotswap.md).
    The preparing thread keeps its priority. It used to run at nice 19, which was worse than nothing: a thread
    that holds the GIL, even for 0.2 ms of bytecode, and is then preempted by any nice-0 process keeps the
    SCHED_FIFO loop waiting until the scheduler gets back to it. Under two CPU hogs on the 2-core box,
    bench/hotswap.py lost 14708 of 184285 frames with nice 19 and 896 of 182154 without (docs/hotswap.md).
    The unit's syscall filter refuses setpriority anyway."""
    gc.freeze()
    yield


def freeze_heap(collect: bool = True) -> int:
    """Move every object the process holds now out of the cyclic collector's reach (`gc.freeze`): a full
    (generation 2) collection then walks only what was allocated since, instead of the daemon's ~90k startup
    objects, which took 40 ms with the GIL held on the 2-core box (measured: 0 ms after the freeze). Objects
    are still freed by reference counting; only cycles among frozen objects stay. `collect` first (at start,
    before the loop runs), so that no startup garbage is frozen. Returns the number of frozen objects."""
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@dataclass(eq=False, slots=True)
class StageSet:
    """What one frame runs through between the constraint gate and the safety envelope.
    `frames`, `traps`, `first_frame` are written by the loop thread only."""

    generation: int
    model: ModelRunner
    model_sha256: bytes
    model_path: str
    pre: ModuleVersion | None = None
    post: ModuleVersion | None = None
    frames: int = 0
    traps: int = 0
    faults: int = 0  # traps other than the wall-clock deadline
    # traps and faults within its first WATCH_FRAMES frames: what the health watch judges, however late its
    # check runs (housekeeping looks every 50 ms: ~50 frames at 1 kHz)
    watch_traps: int = 0
    watch_faults: int = 0
    first_frame: int = -1  # the loop's frame counter at this set's first frame (-1: not yet used)
    label: str = ""

    def describe(self) -> dict:
        return {"generation": self.generation, "label": self.label, "frames": self.frames, "traps": self.traps,
                "first_frame": self.first_frame, "model_sha256": self.model_sha256.hex(), "model": self.model_path,
                "pre": self.pre.describe() if self.pre else None, "post": self.post.describe() if self.post else None}


class SwapRefused(Exception):
    """An update that did not pass staging or preparation; the running set is untouched."""


class AutoRollbackRefused(SwapRefused):
    """The automatic rollback's target may not run (its model is not proven inside the running config's rules);
    the set that failed its watch keeps running, with a `rollback` alert that says so."""


class SwapRefusedAfterRollback(SwapRefused):
    """An update refused because the running set was failing its health watch: that set was rolled back first
    (so the running set did change, to the last set that passed its watch), and the update was not applied."""


@dataclass(slots=True)
class SwapRecord:
    action: str  # "update" or "rollback"
    component: str  # "module:pre", "module:post", "model", "set"
    name: str
    sha256: str
    generation: int
    previous_generation: int
    prepare_ms: float
    swap_frame: int  # the loop's frame counter at the new set's first frame (-1: no frame yet)
    reason: str = ""
    time_ns: int = field(default_factory=time.time_ns)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class _Watch:
    """A set in its health watch (its first WATCH_FRAMES frames): the loop's counters when it went live, and
    the set an automatic rollback returns to."""

    set: StageSet
    failsafe0: int
    frames0: int
    rejected0: int | None  # the PLC's refusals so far (None: not watched, e.g. a deploy's load)
    rebinds0: int | None  # failed session re-binds so far (None: not watched)
    # the last set that passed its watch (or the one running before the chain of updates that are all still
    # in theirs): a second update inside the first one's watch must not make the first one the fallback
    fallback: StageSet | None


class HotSwap:
    """Updates and rollbacks of a running ControlLoop's StageSet. `update_*` and `rollback` block for the
    preparation (call them on a worker thread, never on the loop or the I/O event loop); one at a time."""

    def __init__(self, loop, host: WasmHost | None, *, n_inputs: int, n_outputs: int, bounds_check=None,
                 measure=None, alerts=None, module_specs: dict | None = None, pickup_timeout_s: float = 2.0,
                 provider: str = "cpu", rejections=None, rebind_failures=None,
                 signatures=None, on_settled=None, pins=None, certified: tuple | None = None, rules=None) -> None:
        self.loop = loop
        # () -> the running config's rules a model's bound proof depends on (rules_of(cfg)), or None (no config:
        # every model counts as proven). A model runs only under rules it was proven for: `_proven` holds, per
        # model hash, the rules it was proven inside (at its update, by a reload's proof, or trusted at start)
        self.rules = rules
        self._proven: dict[bytes, list] = {}
        # measurement events of a rollback whose measurement failed (it went ahead): measured before anything else
        # at the next swap or health check, so the log catches up with what runs, in order
        self._owed: list[tuple[str, str, str]] = []
        # attestation.certify_session: the identity (stage_identity) of the set the TPM certified the session key
        # for; an update to any other set is refused (the session key would sign for what nobody approved)
        self.certified = certified
        # () -> {"model": sha256 | None, <module name>: sha256 | None}: the running config's pins (model.sha256,
        # modules[].sha256), read at each update so a reloaded config's pins apply
        self.pins = pins
        self.signatures = signatures  # sitsd.signatures.SignaturePolicy: the stage step's signature check
        self.host = host
        self.n_inputs, self.n_outputs = n_inputs, n_outputs
        self.provider = provider  # model.provider: a swapped-in model runs where the configured one does
        self.bounds_check = bounds_check  # model path -> (proven: bool, report: str)
        self.measure = measure  # (kind, name, sha256 hex) -> None
        # (StageSet, reason) -> None: a set that passed its watch window, or that a rollback made current;
        # called with the swap lock held, so what it records follows the order of the swaps
        self.on_settled = on_settled
        self.alerts = alerts
        self.module_specs = module_specs or {}  # name -> schema.Module (limits, stage)
        self.pickup_timeout_s = pickup_timeout_s
        self.rejections = rejections  # () -> commands the PLC refused so far (the daemon's count), or None
        # () -> session re-binds that failed so far (the PLC link's count: the PLC refused the credential that says
        # what runs now, and the session ended), or None
        self.rebind_failures = rebind_failures
        self.previous: StageSet | None = None  # the set before the last swap (`rollback` with no component)
        self._prior: dict[str, object] = {}  # per component, the version its last update replaced
        self.history: list[SwapRecord] = []
        # the sets kept loaded (the current one, the rollback targets, the recent ones) for per-version counters;
        # older ones are retired: their counters folded into `_retired`, their model and modules freed
        self.sets: list[StageSet] = [loop.stage_set]
        self._retired = {"frames": 0, "models": {}, "modules": {}, "sets": []}
        self._generation = loop.stage_set.generation
        # `_lock` guards the running set: a swap, a rollback, the health check's automatic rollback. `_prep_lock`
        # keeps preparations (compile, self-test, a model's bound proof: up to PROOF_TIMEOUT_S) to one at a time
        # without holding `_lock`, so a set that traps rolls back while a model is being proven
        self._lock = threading.Lock()
        self._prep_lock = threading.Lock()
        self._waiters_lock = threading.Lock()
        self._waiters: dict[threading.Event, int] = {}  # between_frames: threads waiting on each event
        self._watch: _Watch | None = None
        self._config_watch: tuple | None = None  # (Config put live by update --config, failsafe, frame, refused)
        # the set an automatic rollback left, why, and when (wall clock): `rollback` does not run it again
        # unless forced (after an automatic rollback the previous set is the one that faulted)
        self._auto_left: tuple[StageSet, str, int] | None = None
        self.swapped_ns = 0  # wall-clock time of the last swap (`_activate`)

    # -- preparation (worker thread) --------------------------------------------------------------
    def between_frames(self, timeout_s: float = 0.012) -> int:
        """Wait until the loop has just finished a frame (or `timeout_s`, when frames pause); returns the ns
        waited. A preparation step that holds the GIL then runs while the loop sleeps until its next frame."""
        t0 = time.perf_counter_ns()
        # a preparation (under _prep_lock) and a swap or rollback (under _lock) may wait at once: they share the
        # loop's one waiter slot, and the last of them to stop waiting empties it
        with self._waiters_lock:
            done = self.loop.frame_waiter
            if done is None or done.is_set():
                done = threading.Event()
                self.loop.frame_waiter = done
            self._waiters[done] = self._waiters.get(done, 0) + 1
        done.wait(timeout_s)
        with self._waiters_lock:
            left = self._waiters.pop(done) - 1
            if left:
                self._waiters[done] = left
            elif self.loop.frame_waiter is done:
                self.loop.frame_waiter = None
        return time.perf_counter_ns() - t0

    def _module_slot(self, path: Path, name: str | None) -> tuple[str, str]:
        cur = self.loop.stage_set
        loaded = {m.name: m for m in (cur.pre, cur.post) if m is not None}
        if name is None:
            by_file = [m for m in loaded.values() if m.path.name == path.name]
            if len(by_file) != 1:
                listing = ", ".join(f"{m.name} ({m.stage}, {m.path.name})" for m in loaded.values()) or "none"
                raise SwapRefused(f"cannot tell which module {path.name} replaces; pass --name (loaded: {listing})")
            name = by_file[0].name
        if name not in loaded:
            raise SwapRefused(f"no module named {name!r} in the loop (loaded: {', '.join(loaded) or 'none'}); "
                              "a new stage needs a config change and a restart")
        return name, loaded[name].stage

    def prepare_module(self, path: Path, name: str | None = None, expected_sha256: str | None = None) -> ModuleVersion:
        if self.host is None:
            raise SwapRefused("this daemon runs no WASM modules (no `modules:` in its config)")
        path = Path(path)
        name, stage = self._module_slot(path, name)
        spec = self.module_specs.get(name)
        limits = module_limits(spec) if spec is not None else None
        n = self.n_inputs if stage == "pre" else self.n_outputs
        signed = self._check_signature("module", path)
        if signed and path.suffix == ".wasm":  # the host must compile the very bytes whose signature was checked
            if expected_sha256 and expected_sha256 != signed:
                raise SwapRefused(f"module {path}: SHA-256 {signed} differs from the expected {expected_sha256}")
            expected_sha256 = signed
        try:  # a signed .wat: the file bytes the signature covered, read once (wasmtime parses those)
            return self.host.load(name, stage, path, n, n, expected_sha256=expected_sha256, limits=limits,
                                  between=self.between_frames, expected_file_sha256=signed)
        except WasmError as exc:
            raise SwapRefused(str(exc)) from None

    def prepare_model(self, path: Path, expected_sha256: str | None = None) -> tuple[ModelRunner, float, str]:
        t0 = time.perf_counter_ns()
        signed = self._check_signature("model", Path(path), expected_sha256)
        if signed and expected_sha256 and signed != expected_sha256:
            raise SwapRefused(f"model {path}: SHA-256 {signed} differs from the expected {expected_sha256}; refused")
        self.between_frames()  # session creation (a few ms, GIL released most of it) starts right after a frame
        try:  # the runner must load the very bytes whose signature was checked
            runner = ModelRunner(path, self.n_inputs, self.n_outputs, expected_sha256=signed or expected_sha256,
                                 policy=self.provider)
        except ModelLoadError as exc:
            raise SwapRefused(str(exc)) from None
        report = ""
        if self.bounds_check is not None:  # the daemon's runs in a child process (ModelBoundsCheck)
            rules = self._rules_now()  # read before the proof: a reload meanwhile makes the swap check it again
            proven, report = self.bounds_check(Path(path), runner.sha256.hex())  # the bytes loaded, no others
            if not proven:
                raise SwapRefused(f"model {path}: output bounds not proven inside the actuator limits; "
                                  f"refused\n{report}")
            self._mark_if_unchanged(runner.sha256, rules)
        return runner, (time.perf_counter_ns() - t0) / 1e6, report

    # -- which rules each model is proven inside ----------------------------------------------------
    def _rules_now(self):
        return self.rules() if self.rules is not None else None

    def mark_proven(self, model_sha256: bytes, rules) -> None:
        """The model with this hash is proven inside `rules` (rules_of(cfg)): its update's proof, a reload's
        proof of the running model, or the deployment's model trusted at start."""
        if rules is None:
            return
        known = self._proven.setdefault(bytes(model_sha256), [])
        if rules not in known:
            known.append(rules)
            del known[:-KEPT_SETS]  # the newest few

    def _mark_if_unchanged(self, model_sha256: bytes, rules) -> None:
        """Record a proof that read the running config itself: only when the rules objects are still the very ones
        read before it (no reload committed in between, whatever it changed), so the proof was of these rules."""
        now = self._rules_now()
        same = now is rules or (isinstance(now, tuple) and isinstance(rules, tuple) and len(now) == len(rules)
                                and all(a is b for a, b in zip(now, rules)))
        if same:
            self.mark_proven(model_sha256, rules)

    def proven_for(self, model_sha256: bytes, rules) -> bool:
        """Whether the model with this hash was proven inside `rules` (rules_of(cfg))."""
        return rules in self._proven.get(bytes(model_sha256), [])

    def proven_now(self, model_sha256: bytes) -> bool:
        """Whether the model with this hash is proven inside the running config's rules (always, without a
        bound check or a config: the benchmark's and unit tests' HotSwap)."""
        if self.bounds_check is None or self.rules is None:
            return True
        return self._rules_now() in self._proven.get(bytes(model_sha256), [])

    def _unproven(self, st: StageSet, what: str) -> str | None:
        """Why `st`'s model may not run under the running rules (None: it may)."""
        if self.proven_now(st.model_sha256):
            return None
        return (f"{what}'s model {Path(st.model_path).name} (sha256 {st.model_sha256.hex()[:16]}…) is not proven "
                "inside the running config's limits: the signals, constraints or safety limits changed since it "
                "ran")

    def _prove_for_rollback(self, component: str | None) -> str | None:
        """An operator's rollback to a model not proven for the running rules proves it first (off the swap
        lock, as an update's proof). Returns the report, None when no proof was needed."""
        with self._lock:
            if component is None:
                target = self.previous
                sha, path = (target.model_sha256, target.model_path) if target is not None else (None, None)
            elif component == "model" and self._prior.get("model") is not None:
                _, sha, path = self._prior["model"]
            else:
                return None
        if sha is None or self.proven_now(sha) or self.bounds_check is None:
            return None
        with self._preparation():
            rules = self._rules_now()
            proven, report = self.bounds_check(Path(path), sha.hex())
            if not proven:
                raise SwapRefused(f"rolling back would run model {Path(path).name} (sha256 {sha.hex()[:16]}…), which "
                                  "is not proven inside the running config's limits (they changed since it ran); "
                                  f"nothing changed\n{report}")
            self._mark_if_unchanged(sha, rules)
            return report

    def _check_signature(self, kind: str, path: Path, sha256: str | None = None) -> str | None:
        """Stage step: the candidate's signature when attestation.require_signatures asks for one. Returns
        the SHA-256 that was checked (None when none was), SwapRefused when missing or wrong."""
        if self.signatures is None or not self.signatures.requires(kind):
            return None
        from attestation.signatures import SignatureError

        from .signatures import file_sha256, model_sha256

        try:
            sha256 = sha256 or (model_sha256(path) if kind == "model" else file_sha256(path))
            self.signatures.check(kind, path, sha256)
        except SignatureError as exc:
            raise SwapRefused(f"signature check failed: {exc}") from None
        return sha256

    # -- the swap -----------------------------------------------------------------------------------
    def _activate(self, new: StageSet, action: str, component: str, name: str, sha: str, prepare_ms: float,
                  reason: str = "", watch_plc: bool = True, announce: str | None = None,
                  pickup: bool = True) -> SwapRecord:
        """`announce`: raise the update events (`_announce`) with this action text once the new set runs.
        `pickup`: wait (up to pickup_timeout_s) for the new set's first frame, so the record names it; the
        automatic rollback does not (it runs in the daemon's housekeeping, which must not wait on frames that
        may have stopped). Called with `_lock` held."""
        old = self.loop.stage_set
        watch = self._watch
        fallback = watch.fallback if watch is not None and watch.set is old and watch.fallback is not None else old
        # measured first, then run: the log and the PCR never lag behind what runs. An update whose measurement
        # fails is refused (nothing changed); a rollback goes ahead (it leaves a version that faulted or that the
        # operator wants gone), with an alert that the log still names the version it left
        unmeasured = None
        pending = self._events(new, old, action, component, name, sha)
        try:
            self._measure_owed()  # a rollback's events that could not be measured come first, in order
            while pending:
                self.measure(*pending[0])
                pending.pop(0)
        except Exception as exc:  # MeasurementError (TPM gone, PCR moved), OSError (disk full)
            if action == "update":
                raise SwapRefused(f"could not measure {component} {name} before running it ({exc!r}); nothing "
                                  "changed: the running version stays") from None
            unmeasured = exc
            self._owed.extend(pending)  # measured by the next swap or health check (every 50 ms) that can
        for m in (new.pre, new.post):  # a module coming back from the previous set restarts its state
            if m is not None and m is not old.pre and m is not old.post:
                m.instance.reset()
        new.first_frame = -1  # a set coming back by rollback reports the first frame of this activation
        self.loop.stage_set = new  # the swap: the loop reads this once at the start of each frame
        self.swapped_ns = time.time_ns()  # when the new set went live (the update events' time)
        self.previous = old
        if new not in self.sets:
            self.sets.append(new)
        self._watch = (_Watch(new, self.loop.counters.failsafe, self.loop.counters.frames,
                              self._rejected_now() if watch_plc else None,
                              self._rebind_failures_now() if watch_plc else None, fallback)
                       if action == "update" else None)
        deadline = time.monotonic() + (self.pickup_timeout_s if pickup else 0.0)
        while new.first_frame < 0 and time.monotonic() < deadline and self.loop.stage_set is new:
            self.between_frames(0.05)  # woken by the loop at a frame's end: no polling next to its frames
        if len(self.sets) > KEPT_SETS and pickup:  # freeing an ORT session or a wasm store holds the GIL: right
            self.between_frames(0.05)  # after a frame (the automatic rollback leaves it to the next swap)
            self._retire_old_sets()
        rec = SwapRecord(action, component, name, sha, new.generation, old.generation, round(prepare_ms, 3),
                         new.first_frame, reason)
        self.history.append(rec)
        if announce is not None:
            try:
                self._announce(old, new, announce)
            except Exception:  # an event that cannot be worded never turns a swap that happened into a failure
                pass
        if unmeasured is not None and self.alerts is not None:
            self.alerts.append((time.time_ns(), "rollback", f"rolled back to generation {new.generation} "
                                f"({new.label}), but measuring it failed ({unmeasured!r}): the measurement log and "
                                "PCR still name the version rolled back from until the TPM/disk works again; the "
                                "daemon retries every 50 ms and refuses updates meanwhile", 0, 0))
        return rec

    def _measure_owed(self) -> None:
        """Measure the events a rollback could not, oldest first; raises at the first that still fails."""
        while self._owed:
            self.measure(*self._owed[0])
            self._owed.pop(0)

    def _retry_owed(self) -> None:
        """From the health check: catch the measurement log up with what runs, once it can be written."""
        if not self._owed or not self._lock.acquire(blocking=False):
            return
        try:
            n = len(self._owed)
            try:
                self._measure_owed()
            except Exception:  # still failing: the alert raised at the rollback stands; tried again next time
                return
            if self.alerts is not None:
                self.alerts.append((time.time_ns(), "rollback", f"the measurement log caught up with what runs: "
                                    f"{n} rollback event(s) measured late", 0, 0))
        finally:
            self._lock.release()

    def _events(self, new: StageSet, old: StageSet, action: str, component: str, name: str, sha: str) -> list:
        """The measurement events of a swap from `old` to `new`: (kind, name, sha256 hex)."""
        if self.measure is None:
            return []
        if component != "set":
            return [(component if action == "update" else f"rollback:{component}", name, sha)]
        events = []  # a whole-set rollback: each component it changes, so the log names what runs
        if new.model_sha256 != old.model_sha256:
            events.append(("rollback:model", Path(new.model_path).name, new.model_sha256.hex()))
        for stage in ("pre", "post"):
            m, before = getattr(new, stage), getattr(old, stage)
            if m is not None and (before is None or m.sha256 != before.sha256 or m.name != before.name):
                events.append((f"rollback:module:{stage}", m.name, m.sha256))
        return events

    def _announce(self, old: StageSet, new: StageSet, action: str) -> None:
        """Fault attribution's update events: one `model_swap` / `module_swap` alert per component that `new` runs
        differently from `old`, stamped with the time the new set went live, naming what changed (old and new
        hash, module version, generations). Raised for updates and operator rollbacks once the set runs (on the
        worker thread that did the swap, never the loop's); an automatic rollback raises `rollback` instead."""
        if self.alerts is None or new is old:
            return
        t, gens = self.swapped_ns or time.time_ns(), f"generation {old.generation} -> {new.generation}"
        if new.model_sha256 != old.model_sha256 or new.model_path != old.model_path:
            self.alerts.append((t, "model_swap", f"model {Path(new.model_path).name}: sha256 "
                                f"{old.model_sha256.hex()} ({Path(old.model_path).name}) -> {new.model_sha256.hex()}, "
                                f"{gens} ({action})", 0, 0))
        for stage in ("pre", "post"):
            m, before = getattr(new, stage), getattr(old, stage)
            if m is None or m is before:
                continue
            was = f"v{before.version} sha256 {before.sha256}" if before is not None else "none"
            self.alerts.append((t, "module_swap", f"module {m.name} ({stage}) {m.path.name}: {was} -> v{m.version} "
                                f"sha256 {m.sha256}, {gens} ({action})", 0, 0))

    def _retire_old_sets(self) -> None:
        """Keep at most KEPT_SETS stage sets loaded: an older one that is neither running, nor the rollback target,
        nor being watched is dropped, its frame counts folded into `_retired`; a module or model no kept set and
        no per-component rollback (`_prior`) still names is freed with it (a real model is its size per swap)."""
        watch = self._watch
        pinned = {id(self.loop.stage_set), id(self.previous)}
        if watch is not None:  # the watched set and where its automatic rollback would go
            pinned |= {id(watch.set), id(watch.fallback)}
        while len(self.sets) > KEPT_SETS:
            victim = next((st for st in self.sets if id(st) not in pinned), None)
            if victim is None:
                return
            self.sets.remove(victim)
            r = self._retired
            r["frames"] += victim.frames
            sha = victim.model_sha256.hex()
            r["models"][sha] = r["models"].get(sha, 0) + victim.frames
            r["sets"] = (r["sets"] + [{"generation": victim.generation, "label": victim.label, "frames": victim.frames,
                                       "traps": victim.traps, "retired": True}])[-RETIRED_SETS_LISTED:]
            for m in (victim.pre, victim.post):
                self._fold_if_gone(m)

    def _referenced(self, m) -> bool:
        return (any(m is st.pre or m is st.post for st in self.sets)
                or any(m is v for v in self._prior.values()))

    def _fold_if_gone(self, m) -> None:
        """A module version no kept set and no per-component rollback names any more can never run again: its
        counters move to the retired summary (once) and the object is freed."""
        if m is None or self._referenced(m):
            return
        entry = self._retired["modules"].setdefault(f"{m.name}@{m.sha256[:12]}", {"frames": 0, "traps": 0,
                                                                                   "version": m.version, "stage": m.stage})
        entry["frames"] += m.frames
        entry["traps"] += m.traps

    def _set_prior(self, key: str, value) -> None:
        """`_prior[key] = value`; a module version the old entry alone kept is folded into the summary."""
        before = self._prior.get(key)
        self._prior[key] = value
        if key != "model" and before is not None and before is not value:
            self._fold_if_gone(before)

    def _next(self, **changes) -> StageSet:
        self._generation += 1
        cur = self.loop.stage_set
        base = dict(model=cur.model, model_sha256=cur.model_sha256, model_path=cur.model_path, pre=cur.pre,
                    post=cur.post)
        base.update(changes)
        # a set that comes back by rollback keeps its counters; a new set starts at zero
        return StageSet(self._generation, **base)

    def keep_fallback(self, label: str, **changes) -> StageSet:
        """At a start on persisted updates: the config's versions (loaded, self-tested, not running) become
        the set `rollback` returns to, per component too, and the running set is watched as a fresh swap
        is, so a persisted version that faults right after the restart rolls back to the config's."""
        with self._lock:
            cur = self.loop.stage_set
            fallback = self._next(label=label, **changes)
            self.mark_proven(fallback.model_sha256, self._rules_now())  # the config's own model, trusted at start
            self.previous = fallback
            if fallback.model is not cur.model:
                self._prior["model"] = (fallback.model, fallback.model_sha256, fallback.model_path)
            for m in (fallback.pre, fallback.post):
                if m is not None and m is not getattr(cur, m.stage):
                    self._set_prior(m.name, m)
            self._watch = _Watch(cur, self.loop.counters.failsafe, self.loop.counters.frames, self._rejected_now(),
                                 None, fallback)
            return fallback

    @contextlib.contextmanager
    def _preparation(self):
        """One preparation at a time (`_prep_lock`). Another update waits up to PREP_QUEUE_S for the one
        preparing, then is refused: a model's proof can take PROOF_TIMEOUT_S, and `sitsctl update` waits
        UPDATE_TIMEOUT_S (360 s) for its answer, which must cover this wait and its own proof."""
        if not self._prep_lock.acquire(timeout=PREP_QUEUE_S):
            raise SwapRefused(f"another update is still being prepared after {PREP_QUEUE_S:g} s (a model's bound "
                              "proof can take minutes); try again when it is done (`sitsctl versions` shows the "
                              "last swaps)")
        try:
            yield
        finally:
            self._prep_lock.release()

    def _check_pin(self, what: str, key: str, path: Path, sha256: str) -> None:
        """A config that pins a hash (model.sha256, modules[].sha256) allows only those bytes, hot swaps too."""
        pin = (self.pins() or {}).get(key) if self.pins is not None else None
        if pin and pin != sha256:
            field = "model.sha256" if key == "model" else f"the sha256 of module {key}"
            raise SwapRefused(f"{what} {path}: SHA-256 {sha256} is not {pin}, which the running config pins "
                              f"({field}); to change a pinned {what}, put the new hash in the config and deploy it "
                              f"(`sitsctl deploy`, which loads the config with its model and modules) or restart "
                              f"sitsd on it (`sitsctl update --config` cannot change the {'model' if key == 'model' else 'modules'} section)")

    def _check_certified(self, what: str, path: Path, identity: tuple) -> None:
        if self.certified is not None and identity != self.certified:
            raise SwapRefused(f"{what} {path}: attestation.certify_session is on, and the TPM certified this start's "
                              "session key for the approved model and modules only; an update to anything else would "
                              "be signed by that key. Approve the new version (sitsctl policy approve), deploy it "
                              "(sitsctl deploy) and restart sitsd, whose TPM then certifies a new session key")

    def update_module(self, path: Path, name: str | None = None, expected_sha256: str | None = None,
                      respect_pins: bool = True) -> dict:
        """`respect_pins` False only for `sitsctl deploy`, which checked the new config's pins before loading (its
        load is also not rolled back for PLC refusals: the deployer confirms it, and telling the PLC about a new
        model is part of the deployment)."""
        with self._preparation(), _preparing():
            version = self.prepare_module(path, name, expected_sha256)
            if version.cache_refused and self.alerts is not None:  # someone wrote into the cache: say so
                self.alerts.append((time.time_ns(), "wasm_cache", f"module {version.name} ({version.stage}, "
                                    f"{version.path.name}): its .cwasm cache entry was refused and the module "
                                    f"recompiled from its source: {version.cache_refused}", 0, 0))
            with self._lock:  # the swap: what runs now (a rollback may have run during the preparation)
                self._refuse_if_failing_watch()
                if respect_pins:
                    self._check_pin("module", version.name, path, version.sha256)
                self._check_certified("module", path, stage_identity(self.loop.stage_set, {version.stage: version}))
                old = getattr(self.loop.stage_set, version.stage)
                new = self._next(**{version.stage: version}, label=f"{version.name} v{version.version}")
                rec = self._activate(new, "update", f"module:{version.stage}", version.name, version.sha256,
                                     version.prepare_ms, watch_plc=respect_pins, announce="update")
                self._set_prior(version.name, old)  # only once it runs: a refused update leaves the rollback target
                return {**rec.as_dict(), "module": version.describe(), "origin": version.origin,
                        "previous": old.describe() if old else None}

    def update_model(self, path: Path, expected_sha256: str | None = None, respect_pins: bool = True) -> dict:
        if getattr(self.loop.stage_set.model, "kind", "mlp") == "streaming":
            # its state is the stream's KV cache, tied to these weights: a new model could not continue it
            raise SwapRefused("model hot swap is not supported for model.kind streaming (the stream's KV state "
                              "belongs to the running weights); change the config and restart sitsd")
        with self._preparation(), _preparing():
            runner, prepare_ms, report = self.prepare_model(path, expected_sha256)
            with self._lock:  # the swap: what runs now (a rollback may have run during the proof)
                self._refuse_if_failing_watch()
                if not self.proven_now(runner.sha256):  # a reload changed the limits during the proof
                    raise SwapRefused(f"model {path}: the config's signals, constraints or safety limits changed "
                                      "while it was being proven; nothing changed: send the update again to prove it "
                                      "inside the rules that run now")
                if respect_pins:
                    self._check_pin("model", "model", path, runner.sha256.hex())
                self._check_certified("model", path, stage_identity(self.loop.stage_set, model_sha256=runner.sha256))
                cur = self.loop.stage_set
                new = self._next(model=runner, model_sha256=runner.sha256, model_path=str(path),
                                 label=f"model {runner.sha256.hex()[:12]}")
                rec = self._activate(new, "update", "model", Path(path).name, runner.sha256.hex(), prepare_ms,
                                     watch_plc=respect_pins, announce="update")
                self._prior["model"] = (cur.model, cur.model_sha256, cur.model_path)  # only once it runs
                return {**rec.as_dict(), "bounds": report,
                        "previous": {"model": self.previous.model_path, "sha256": self.previous.model_sha256.hex()}}

    def rollback(self, component: str | None = None, reason: str = "operator request", force: bool = False) -> dict:
        """Back to the previous set (component None), or only its model / one of its modules. A whole-set
        rollback to the set an automatic rollback just left (it trapped, sent fail-safes, or the PLC refused it)
        is refused unless `force`. A model not proven inside the running config's rules (they changed since it
        ran) is proven first, and the rollback refused if it fails."""
        with self._lock:
            self._refuse_auto_left(component, force)  # before a proof that would be for nothing
        proof = self._prove_for_rollback(component)
        with self._lock:
            self._refuse_auto_left(component, force)
            out = self._rollback(component, reason, announce=True)
            self._settle(self.loop.stage_set, f"rollback of {out['component']} ({reason})")
            return {**out, "bounds": proof} if proof else out

    def _refuse_auto_left(self, component: str | None, force: bool) -> None:
        left = self._auto_left
        if component is None and not force and left is not None and self.previous is left[0]:
            st, why, at = left
            raise SwapRefused(
                f"the previous set, generation {st.generation} ({st.label}), is the one an automatic rollback "
                f"left at {time.strftime('%H:%M:%S', time.localtime(at / 1e9))}: {why}; rolling back to it "
                "would run it again. Fix the cause and `sitsctl update` it, or `sitsctl rollback --force` to run "
                "it anyway")

    def measure_owed(self) -> None:
        """Measure the events a rollback could not, before anything else is measured (a config, an approval);
        raises when the log still cannot be written."""
        with self._lock:
            self._measure_owed()

    def _settle(self, st: StageSet, reason: str) -> None:
        """Hand a set that is to stay to `on_settled` (persistence); its failure never undoes the swap."""
        if self.on_settled is None:
            return
        try:
            self.on_settled(st, reason)
        except Exception as exc:  # the set runs either way; say that it is not persisted
            if self.alerts is not None:
                self.alerts.append((time.time_ns(), "persisted_update", f"could not persist generation "
                                    f"{st.generation} ({st.label}): {exc!r}", 0, 0))

    def _rollback(self, component: str | None, reason: str, announce: bool = False) -> dict:
        """`announce`: an operator's rollback raises the update events; an automatic one raises `rollback`."""
        prev, cur = self.previous, self.loop.stage_set
        said = f"rollback: {reason}" if announce else None
        if prev is None:
            raise SwapRefused("nothing to roll back to: no update since the daemon started")
        if component is None:
            if (why := self._unproven(prev, f"the previous set, generation {prev.generation},")) is not None:
                raise SwapRefused(f"{why} (it changed again during this rollback's proof); nothing changed")
            return self._activate(prev, "rollback", "set", prev.label or f"generation {prev.generation}",
                                  prev.model_sha256.hex(), 0.0, reason, announce=said).as_dict()
        prior = self._prior.get(component)
        if prior is None:
            raise SwapRefused(f"nothing to roll back for {component!r}: it was not updated since the daemon started "
                              f"(updated: {', '.join(self._prior) or 'nothing'})")
        if component == "model":
            model, sha, path = prior
            if model is cur.model:
                raise SwapRefused(f"nothing to roll back for the model: the version it would return to ({Path(path).name} "
                                  f"sha256 {sha.hex()[:16]}…) is the one running (a whole-set rollback brought it "
                                  "back); `sitsctl versions` shows what runs")
            if not self.proven_now(sha):
                raise SwapRefused(f"the previous model {Path(path).name} (sha256 {sha.hex()[:16]}…) is not proven "
                                  "inside the running config's limits (they changed again during this rollback's "
                                  "proof); nothing changed")
            self._prior["model"] = (cur.model, cur.model_sha256, cur.model_path)  # rolling back again toggles
            new = self._next(model=model, model_sha256=sha, model_path=path, label=f"model {sha.hex()[:12]} (rollback)")
            return self._activate(new, "rollback", "model", Path(path).name, sha.hex(), 0.0, reason,
                                  announce=said).as_dict()
        mod = prior
        running = getattr(cur, mod.stage)
        if running is mod:
            raise SwapRefused(f"nothing to roll back for {component!r}: the version it would return to (v{mod.version} "
                              f"sha256 {mod.sha256[:16]}…) is the one running (a whole-set rollback brought it back); "
                              "`sitsctl versions` shows what runs")
        self._set_prior(component, running)
        new = self._next(**{mod.stage: mod}, label=f"{mod.name} v{mod.version} (rollback)")
        return self._activate(new, "rollback", f"module:{mod.stage}", mod.name, mod.sha256, 0.0, reason,
                              announce=said).as_dict()

    # -- automatic rollback (called periodically off the loop thread) ---------------------------------
    def _rejected_now(self) -> int:
        return self.rejections() if self.rejections is not None else 0

    def _rebind_failures_now(self) -> int:
        return self.rebind_failures() if self.rebind_failures is not None else 0

    @property
    def watching(self) -> bool:
        return self._watch is not None or self._config_watch is not None or bool(self._owed)

    def watch_config(self, installed) -> None:
        """Health-watch the config `update --config` just put live (`installed`, the Config object): the same
        error-spike rule as a module or model swap, judged by `config_health`."""
        c = self.loop.counters
        self._config_watch = (installed, c.failsafe, c.frames, self._rejected_now() if self.rejections else None,
                              self._rebind_failures_now() if self.rebind_failures else None)

    def config_health(self, running) -> str | None:
        """Why the config updated last must be rolled back, or None: more than half of at least 20 frames since
        it went live got the fail-safe, or the PLC refused more than half of their commands, within its first
        WATCH_FRAMES frames. `running`: the daemon's config now; once it is another one (a reload, a rollback)
        or the window passed, the watch ends. The caller rolls back (`rollback_config`)."""
        watch = self._config_watch
        if watch is None:
            return None
        installed, failsafe0, frames0, rejected0, rebinds0 = watch
        frames = self.loop.counters.frames - frames0
        failsafes = self.loop.counters.failsafe - failsafe0
        if running is not installed:
            self._config_watch = None
            return None
        reason = None
        if rebinds0 is not None and self._rebind_failures_now() > rebinds0:
            reason = ("the PLC refused the session credential that measures it (its re-bind failed and the session "
                      "ended: does the PLC pin the config?)")
        elif frames >= 20 and failsafes * 2 > frames:
            reason = f"fail-safe rate {failsafes}/{frames} frames after the config update"
        elif frames >= 20 and rejected0 is not None and (rejected := self._rejected_now() - rejected0) * 2 > frames:
            reason = (f"the PLC refused {rejected} of the commands of {frames} frames after the config update (does "
                      "it pin the config's hash?)")
        elif frames >= WATCH_FRAMES:
            self._config_watch = None  # passed its watch
            return None
        if reason is not None:
            self._config_watch = None
        return reason

    def _watch_reason(self, watch: _Watch) -> str:
        """Why the watched set must be rolled back ("" while it looks healthy): a module fault (or
        MAX_DEADLINE_TRAPS_IN_WATCH deadline traps) in its first WATCH_FRAMES frames, a failed session re-bind,
        more than half of at least 20 frames sent as fail-safes, or more than half refused by the PLC."""
        new = watch.set
        frames = self.loop.counters.frames - watch.frames0
        failsafes = self.loop.counters.failsafe - watch.failsafe0
        if new.watch_faults >= 1 or new.watch_traps >= MAX_DEADLINE_TRAPS_IN_WATCH:
            return (f"{new.watch_traps} module trap(s) in the first {min(new.frames, WATCH_FRAMES)} frames after "
                    "the swap")
        if watch.rebinds0 is not None and self._rebind_failures_now() > watch.rebinds0:
            return ("the PLC refused the session credential that measures it (its re-bind failed and the session "
                    "ended: does the PLC pin the modules, the model or the config?)")
        if frames >= 20 and failsafes * 2 > frames:
            return f"fail-safe rate {failsafes}/{frames} frames after the swap"
        if (frames >= 20 and self.rejections is not None and watch.rejected0 is not None
                and (rejected := self.rejections() - watch.rejected0) * 2 > frames):
            return (f"the PLC refused {rejected} of the commands of {frames} frames after the swap (does it pin "
                    "another model hash, or distrust what the new version sends?)")
        return ""

    def _auto_rollback(self, watch: _Watch, reason: str) -> dict:
        """Back from the watched set to its watch's fallback (the last set that passed its watch), without
        waiting for a frame; with `_lock` held. Returns the rollback record."""
        new = watch.set
        target = watch.fallback if watch.fallback is not None else self.previous
        if target is None or target is new:
            raise SwapRefused("nothing to roll back to")
        if (why := self._unproven(target, f"generation {target.generation}")) is not None:
            # a model outside the limits is worse than a faulting set, whose failures send the fail-safe: stay
            self._watch = None
            msg = (f"generation {new.generation} ({new.label}) failed its health watch ({reason}), but the automatic "
                   f"rollback to generation {target.generation} was refused: {why}. Generation {new.generation} "
                   "keeps running (its faults send the fail-safe command); `sitsctl rollback` proves the previous "
                   "model first, or `sitsctl update` a fixed version")
            if self.alerts is not None:
                self.alerts.append((time.time_ns(), "rollback", msg, 0, 0))
            raise AutoRollbackRefused(msg)
        rec = self._activate(target, "rollback", "set", target.label or f"generation {target.generation}",
                             target.model_sha256.hex(), 0.0, f"automatic: {reason}", pickup=False).as_dict()
        self._auto_left = (new, reason, time.time_ns())
        self._watch = None
        self._settle(self.loop.stage_set, f"automatic rollback of generation {new.generation}: {reason}")
        if self.alerts is not None:
            self.alerts.append((time.time_ns(), "rollback", f"rolled back generation {new.generation} ({new.label}) "
                                f"to generation {target.generation} ({target.label}): {reason}", 0, 0))
        return rec

    def _refuse_if_failing_watch(self) -> None:
        """Before an update swaps (with `_lock` held): a running set that fails its watch is rolled back first,
        and the update refused, so it never builds on a version that faulted (the health check runs every
        50 ms and may not have got to it)."""
        watch = self._watch
        if watch is None or watch.set is not self.loop.stage_set:
            return
        reason = self._watch_reason(watch)
        if not reason:
            if watch.set.frames >= WATCH_FRAMES:  # passed, the health check had not got to it: settle it now, so
                self._watch = None  # that it is this update's fallback and a restart's set
                self._settle(watch.set, f"generation {watch.set.generation} ({watch.set.label}) passed its health "
                             f"watch ({watch.set.frames} frames, {watch.set.traps} traps)")
            return
        new = watch.set
        try:
            self._auto_rollback(watch, reason)
        except AutoRollbackRefused:  # alerted; this update replaces the failing set (it is proven for what runs)
            return
        cur = self.loop.stage_set
        raise SwapRefusedAfterRollback(f"generation {new.generation} ({new.label}), which was running, failed its health watch "
                          f"({reason}) and was rolled back to generation {cur.generation} ({cur.label}); this update "
                          "was not applied: send it again to apply it to what runs now")

    def check_health(self) -> dict | None:
        """Rolls back when the set swapped in last trapped, or sent mostly fail-safes, within its first
        WATCH_FRAMES frames: to the last set that passed its watch (`_Watch.fallback`), so that an update made
        inside another's watch does not leave the faulty one as the target. Returns the rollback record, or
        None. Never waits for the swap lock (this runs in the daemon's housekeeping, which feeds the watchdog):
        a swap in progress holds it for milliseconds, a preparation does not hold it at all. Also measures the
        events of a rollback whose measurement had failed, once it can."""
        self._retry_owed()
        watch = self._watch
        if watch is None:
            return None
        new = watch.set
        if self.loop.stage_set is new and not self._watch_reason(watch) and new.frames < WATCH_FRAMES:
            return None  # healthy so far (read without the lock: nothing written here)
        if not self._lock.acquire(blocking=False):  # a swap is in progress: look again at the next check
            return None
        try:
            if self._watch is not watch:  # a swap replaced or ended it meanwhile
                return None
            if self.loop.stage_set is not new:  # no longer runs (cleared here, under the lock: never a newer watch)
                self._watch = None
                return None
            reason = self._watch_reason(watch)  # again under the lock: the counters moved meanwhile
            if not reason:
                if new.frames >= WATCH_FRAMES:
                    self._watch = None  # survived its watch window: from now on it is the set a restart should load
                    self._settle(new, f"generation {new.generation} ({new.label}) passed its health watch "
                                 f"({new.frames} frames, {new.traps} traps)")
                return None
            try:
                return self._auto_rollback(watch, reason)
            except AutoRollbackRefused:  # alerted, watch ended: the set keeps running
                return None
        finally:
            self._lock.release()

    def versions(self) -> dict:
        """Per-version frame counters: modules by (name, sha256), models by sha256, sets by generation. Read on
        the control socket's thread without the swap lock (a swap may hold it for seconds): a swap changing the
        dicts meanwhile makes it read them again."""
        for _ in range(8):
            try:
                return self._versions()
            except RuntimeError:  # "dictionary changed size during iteration": a swap in between
                time.sleep(0.001)
        if not self._lock.acquire(timeout=0.05):  # never long: this runs on the control socket's event loop
            raise SwapRefused("versions: a swap is changing the version lists right now; ask again")
        try:
            return self._versions()
        finally:
            self._lock.release()

    def _versions(self) -> dict:
        modules: dict[str, dict] = {k: dict(v) for k, v in self._retired["modules"].items()}
        models: dict[str, int] = dict(self._retired["models"])
        r = self._retired
        frames_in_sets = sum(s.frames for s in self.sets) + r["frames"]
        seen: set[int] = set()  # a version loaded twice is two objects with one key: count each object once
        prior_only = [v for k, v in self._prior.items() if k != "model" and v is not None]
        for s in self.sets:
            models[s.model_sha256.hex()] = models.get(s.model_sha256.hex(), 0) + s.frames
        for m in [m for s in self.sets for m in (s.pre, s.post)] + prior_only:
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                entry = modules.setdefault(f"{m.name}@{m.sha256[:12]}", {"frames": 0, "traps": 0,
                                                                         "version": m.version, "stage": m.stage})
                entry["frames"] += m.frames
                entry["traps"] += m.traps
        c = self.loop.counters  # read after the sets: at most the frame in flight is counted here and not there
        loop = {"frames": c.frames, "dropped_timestamp": c.dropped_timestamp,
                "dropped_constraint": c.dropped_constraint, "module_traps": c.module_traps,
                "frames_in_sets": frames_in_sets,
                "epoch_ticker": self.host.ticker if self.host is not None else None,
                "sign_path": getattr(self.loop.signer, "sign_path", None),
                "model_run_path": getattr(self.loop.stage_set.model, "run_path", None)}
        return {"loop": loop, "current": self.loop.stage_set.describe(), "generation": self.loop.stage_set.generation,
                "sets": r["sets"] + [{"generation": s.generation, "label": s.label, "frames": s.frames,
                                      "traps": s.traps} for s in self.sets], "modules": modules, "models": models,
                "history": [r.as_dict() for r in self.history[-20:]]}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- wiring into the daemon (kept here so daemon.py only calls these) ----------------------------------
def module_limits(spec):
    from .wasm import Limits

    return Limits(spec.deadline_ms, spec.fuel, spec.memory_pages * 65536)


def load_config_modules(cfg) -> tuple[WasmHost | None, ModuleVersion | None, ModuleVersion | None]:
    """The config's pre and post modules, loaded and self-tested (WasmError says which and why)."""
    if not cfg.modules:
        return None, None, None
    host = WasmHost()
    loaded = {}
    try:
        for spec in cfg.modules:
            n = len(cfg.model.inputs) if spec.stage == "pre" else len(cfg.model.outputs)
            loaded[spec.stage] = host.load(spec.name, spec.stage, spec.path, n, n, expected_sha256=spec.sha256,
                                           limits=module_limits(spec))
    except WasmError:
        host.close()
        raise
    return host, loaded.get("pre"), loaded.get("post")


def _measurement_log(daemon):
    from attestation.measurement import MeasurementLog, TpmPcr

    cfg = daemon.cfg
    path = Path(cfg.audit.directory) / "measurements.jsonl"
    pcr = getattr(cfg.attestation, "measurement_pcr", 23)
    tpm = None
    signer = daemon.signer
    if cfg.attestation.mode == "tpm2" and hasattr(signer, "_lock"):
        # share the signer's ESAPI context and lock: a second connection to swtpm would wait forever
        opener = getattr(signer, "_open_esapi", None) or (lambda: signer._esapi)
        tpm = TpmPcr(opener, pcr, signer._lock)
        # every start measures from reset: the PCR then equals the replay of this start's log alone, whatever an
        # earlier incarnation (killed, restarted by systemd) or a deploy left in it, so verify-on-boot holds
        # across restarts (PCR 23 is resettable by anyone at locality 0 anyway: docs/deploy.md, Limits)
        tpm.reset()
    return MeasurementLog(path, pcr, tpm)


class ModelBoundsCheck:
    """The `sitsctl check` proof for a candidate model under the running config's constraints and actuator
    limits: path -> (proven, report). A certificate in the candidate's manifest is replayed; otherwise the
    bounds are proven anew. With `isolate` (the daemon's) the proof runs in the ProofWorker child process,
    so the loop thread never waits for the GIL behind it; where no child can be started it runs here, and
    the report says so. `start()` pre-warms the child."""

    def __init__(self, get_config, isolate: bool = True, worker: ProofWorker | None = None) -> None:
        self.get_config = get_config
        self.isolate = isolate
        self._worker = worker

    @property
    def worker(self) -> ProofWorker:
        return self._worker or proof_worker()

    def start(self) -> bool:
        return self.worker.start() if self.isolate else False

    def __call__(self, path: Path, expected_sha256: str | None = None) -> tuple[bool, str]:
        """`expected_sha256`: the hash of the model the daemon loaded; the proof reads the file once and
        refuses other bytes (see swap_bounds_check)."""
        cfg = self.get_config()
        note = ""
        if self.isolate:
            try:
                return self.worker.check(cfg, Path(path), expected_sha256)
            except ProofWorkerUnavailable as exc:
                note = f"(proved in the daemon process, next to the loop: {exc})\n"
            except RuntimeError as exc:
                return False, str(exc)
        from .check import swap_bounds_check

        proven, report = swap_bounds_check(cfg, Path(path), expected_sha256)
        return proven, note + report


def model_bounds_check(get_config, isolate: bool = True) -> ModelBoundsCheck:
    return ModelBoundsCheck(get_config, isolate)


# -- the model's bound proof, in a child process -------------------------------------------------------
# A hot swap proves the candidate while the control loop runs on another thread of the same process. In
# that process the proof stalled the loop: the first one imports ep.bounds, onnx and onnx.reference's
# operator registry, and holds the GIL for up to ~50 ms at a time (measured next to a 1 ms ticking thread,
# docs/hotswap.md); later ones still for 2-4 ms (numpy on small arrays, between which the GIL is not
# released). A child process has its own GIL: the daemon only pickles the config (~5 kB) and waits on a pipe.
PROOF_TIMEOUT_S = 300.0
PROOF_WORKER_IDLE_S = 600.0  # an idle child exits (its ~175 MB back); the next model swap starts another


class ProofWorkerUnavailable(RuntimeError):
    """The child process could not be started, or died twice in a row (the caller may prove in-process)."""


class ProofWorker:
    """`swap_bounds_check` in a child process (`python -c`: its own interpreter and GIL), started by the
    first model swap (not at daemon start: ~0.7 s of imports and ~175 MB that most runs never need) and kept
    for the next ones until idle for PROOF_WORKER_IDLE_S. At start it imports the proof code and runs a tiny
    proof (onnx.reference's operator registry, numpy.random, z3), so only its first proof waits for that.
    One proof at a time (a lock); a child that died (or exited idle) is replaced and the proof retried once;
    one that takes longer than `timeout_s` is killed and the model refused. The child exits with the daemon
    (end of file on its request pipe); its stdout and stderr go to /dev/null (an error inside the proof
    comes back as text); it runs at nice 19 where allowed, in the daemon's session and process group (so
    that nice applies against the daemon's threads), ignoring SIGINT (the daemon handles a Ctrl-C)."""

    def __init__(self, timeout_s: float = PROOF_TIMEOUT_S, python: str | None = None) -> None:
        self.timeout_s = timeout_s
        self.python = python or sys.executable
        self._lock = threading.Lock()
        self._proc = None
        self._send = self._recv = None
        self.starts = 0  # child processes started (restarts included)
        self.proofs = 0
        self.last_error = ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self) -> bool:
        """Start the child now, so that it imports while the caller does other things; False when it cannot
        be started (`last_error` says why)."""
        with self._lock:
            return self._ensure()

    def _ensure(self) -> bool:
        if self._proc is not None and self._proc.poll() is None:
            return True
        self._discard()
        req_r, req_w = os.pipe()  # daemon -> child: ("check", config, path)
        rep_r, rep_w = os.pipe()  # child -> daemon: ("ok", (proven, report)) or ("error", text)
        root = str(Path(__file__).resolve().parents[1])  # where sitsd, ep and attestation are importable from
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        try:
            self._proc = subprocess.Popen(
                [self.python, "-c", "import sitsd.hotswap as h; h._proof_worker_main()", str(req_r), str(rep_w)],
                pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=env)
        except OSError as exc:
            os.close(req_w)
            os.close(rep_r)
            self.last_error = f"cannot start the proof worker: {exc}"
            return False
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._send, self._recv = Connection(req_w, readable=False), Connection(rep_r, writable=False)
        self.starts += 1
        return True

    def _discard(self) -> None:
        for conn in (self._send, self._recv):
            if conn is not None:
                conn.close()
        self._send = self._recv = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait()

    def check(self, cfg, candidate, expected_sha256: str | None = None) -> tuple[bool, str]:
        """`swap_bounds_check(cfg, candidate, expected_sha256)` in the child. Raises ProofWorkerUnavailable when no child
        could run it, RuntimeError with the child's text when the proof itself raised."""
        with self._lock:
            for attempt in range(2):
                if not self._ensure():
                    raise ProofWorkerUnavailable(self.last_error)
                try:
                    self._send.send(("check", cfg, os.path.abspath(candidate), expected_sha256))
                    if not self._recv.poll(self.timeout_s):
                        self._discard()
                        return False, (f"the bound proof of {candidate} did not finish within {self.timeout_s:g} s "
                                       "(stopped); prove it with `sitsctl check` and attach the certificate to the "
                                       "artifact, whose replay is fast")
                    status, value = self._recv.recv()
                except (EOFError, OSError) as exc:  # the child died (killed, out of memory): once more, fresh
                    code = self._proc.poll() if self._proc is not None else None
                    self.last_error = f"the proof worker died ({exc!r}, exit status {code})"
                    self._discard()
                    if attempt:
                        raise ProofWorkerUnavailable(self.last_error) from None
                    continue
                self.proofs += 1
                if status == "ok":
                    return value
                raise RuntimeError(f"the bound proof raised in the proof worker: {value}")
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._discard()


_worker: ProofWorker | None = None
_worker_lock = threading.Lock()


def proof_worker() -> ProofWorker:
    """This process's ProofWorker (one child, shared by hot swaps and anything else that proves off the loop)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = ProofWorker()
        return _worker


def _warm_up() -> None:
    """What a first proof imports and initialises lazily (onnx.reference's operator registry, numpy.random,
    the z3 context), on a 2 -> 1 ReLU net and a one-signal constraint set."""
    import numpy as np
    from onnx import TensorProto, helper

    from ep.bounds import prove

    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1], [1.0, -1.0])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "warm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    prove(model.SerializeToString(), np.zeros(2), np.ones(2), np.array([-2.0]), np.array([2.0]))
    import z3

    z3.Solver().check(z3.Real("x") > 0)


def _proof_worker_main() -> None:
    """The child's loop: `python -c "import sitsd.hotswap as h; h._proof_worker_main()" REQUEST_FD REPLY_FD`."""
    import signal
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(19)  # the loop's process keeps the CPU (refused under the unit's syscall filter: harmless)
    except OSError:
        pass
    requests, replies = Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False)
    try:
        _warm_up()
    except Exception:  # a check reports what is wrong; the worker stays up
        pass
    from .check import swap_bounds_check

    while True:
        try:
            if not requests.poll(PROOF_WORKER_IDLE_S):
                return  # idle: the daemon starts another when it needs one
            op, cfg, candidate, expected_sha256 = requests.recv()
        except (EOFError, OSError):  # the daemon exited or closed the worker
            return
        try:
            reply = ("ok", swap_bounds_check(cfg, Path(candidate), expected_sha256))
        except Exception as exc:
            reply = ("error", f"{exc!r}\n{traceback.format_exc(limit=8)}")
        try:
            replies.send(reply)
        except OSError:
            return


def certify_session(daemon, log) -> tuple:
    """attestation.certify_session: the policy-bound device key certifies the session key while the measurement
    PCR holds the model and modules just measured; the TPM refuses unless they are the approved ones, and then
    sitsd does not start. The certification is sent to the PLC only while that model and those modules run."""
    from attestation.errors import AttestationError
    from attestation.tpm.policy import Approval, PolicyError, load_authority_public

    from .errors import StartupError

    a, signer, st = daemon.cfg.attestation, daemon.signer, daemon.loop.stage_set
    fixes = {
        "refused": "approve this model and these modules (sitsctl policy approve --config FILE) and set "
                   "attestation.approval to it, or set attestation.certify_session: false (docs/deploy.md)",
        "key": f"the key at attestation.device_key_handle 0x{a.device_key_handle:08x} belongs to another authority "
               "(or is a password key like tpm-direct's): re-provision it for attestation.authority_key "
               "(tpm2_evictcontrol, then sitsctl deploy) or set device_key_handle to a free persistent handle",
        "tpm": "check attestation.tcti and that the TPM is reachable and not in lockout (docs/deploy.md)"}
    default_fix = ("check attestation.approval and attestation.authority_key: the approval must be signed by that "
                   "authority for attestation.measurement_pcr (sitsctl policy approve)")
    if not hasattr(signer, "certify") or log.tpm is None:
        raise StartupError(f"attestation.certify_session needs the tpm-session signer on a TPM, not {signer.kind}")
    try:
        authority = load_authority_public(a.authority_key)
        approval = Approval.load(a.approval)
        approval.verify(authority)
        if approval.pcr != log.pcr:
            raise PolicyError(f"the approval is for PCR {approval.pcr}, attestation.measurement_pcr is {log.pcr}",
                              "pcr")
        cert = signer.certify(approval, authority)
    except PolicyError as exc:
        what = ("the TPM refused to certify the session key" if exc.code == "refused"
                else "cannot certify the session key")
        raise StartupError(f"attestation.certify_session: {what}: {exc.reason}\n  fix: "
                           f"{fixes.get(exc.code, default_fix)}") from exc
    except AttestationError as exc:
        raise StartupError(f"attestation.certify_session: {exc}\n  fix: {fixes['tpm']}") from exc
    certified = stage_identity(st)
    signer.certification_active = lambda: stage_identity(daemon.loop.stage_set) == certified
    (Path(daemon.cfg.audit.directory) / POLICY_KEY_FILE).write_bytes(cert.device_public_pem)
    daemon.log.info("session key certified by the TPM", device_key=f"0x{a.device_key_handle:08x}",
                    approved_pcr_value=cert.approved_pcr_value.hex(), created=signer.device_key_created,
                    device_key_file=str(Path(daemon.cfg.audit.directory) / POLICY_KEY_FILE))
    return certified


def stage_identity(st, modules: dict | None = None, model_sha256: bytes | None = None) -> tuple:
    """What the TPM certifies a session key for: the model's hash and each module's stage and hash (of `st`,
    with `modules` {stage: version} and `model_sha256` replaced when given)."""
    stages = {"pre": st.pre, "post": st.post, **(modules or {})}
    return (bytes(model_sha256 if model_sha256 is not None else st.model_sha256),
            *((m.stage, m.sha256) for m in (stages["pre"], stages["post"]) if m is not None))


def attach(daemon) -> HotSwap:
    """The daemon's HotSwap, with the startup deployment measured (model, modules, config). The model and
    modules measured are the loop's, so a set loaded from persisted updates (sitsd.persist) is measured as
    what it is, followed by a `persisted` event with the state file's SHA-256 that says where it came from."""
    from attestation.errors import AttestationError

    from .errors import StartupError

    cfg, loop = daemon.cfg, daemon.loop
    try:
        log = _measurement_log(daemon)
    except (AttestationError, OSError) as exc:
        raise StartupError(f"measurement log: {exc}\n  fix: check attestation.tcti and attestation.measurement_pcr, "
                           "and that audit.directory is writable") from exc
    daemon.measurements = log
    st = loop.stage_set
    log.record("model", Path(st.model_path).name, st.model_sha256.hex())
    for m in (st.pre, st.post):
        if m is not None:
            log.record(f"module:{m.stage}", m.name, m.sha256)
    # now, while the PCR holds exactly the approved part; then only that set may run (updates to others refused)
    certified = certify_session(daemon, log) if cfg.attestation.certify_session else None
    persistence = getattr(daemon, "persistence", None)
    if daemon.config_path is not None:
        # the bytes the persisted state is compared with, hashed once at start (file_sha256 if not yet)
        config_sha = getattr(persistence, "config_sha256", None) or file_sha256(daemon.config_path)
        log.record("config", Path(daemon.config_path).name, config_sha)
    if persistence is not None and persistence.restored is not None:
        from .persist import STATE_FILE

        log.record("persisted", STATE_FILE, persistence.restored.raw_sha256)
    freeze_heap()  # the startup heap, before the loop runs: no 40 ms full collection next to it later (_preparing)
    from .reload import rules_of

    hs = HotSwap(loop, daemon.wasm, n_inputs=len(cfg.model.inputs), n_outputs=len(cfg.model.outputs),
                   bounds_check=model_bounds_check(lambda: daemon.cfg), measure=log.record, alerts=daemon.alerts,
                   module_specs={m.name: m for m in cfg.modules}, provider=cfg.model.provider,
                   rejections=lambda: daemon.plc_rejected,
                   rebind_failures=lambda: daemon.link.rebind_failures if daemon.link is not None else 0,
                   signatures=__import__("sitsd.signatures").signatures.SignaturePolicy.from_config(cfg),
                   on_settled=persistence.settled if persistence is not None else None,
                   pins=lambda: {"model": daemon.cfg.model.sha256, **{m.name: m.sha256 for m in daemon.cfg.modules}},
                   certified=certified, rules=lambda: rules_of(daemon.cfg))
    hs.mark_proven(st.model_sha256, rules_of(cfg))  # the deployment's (or a persisted set's, proven at its load)
    return hs


def _config_measured(daemon) -> tuple[str, str] | None:
    """(name, sha256) of the measurement event that names the config running now, None without a log."""
    from .deploy import CONFIG_KINDS

    log = getattr(daemon, "measurements", None)
    if log is None:
        return None
    last = next((e for e in reversed(log.events) if e.kind in CONFIG_KINDS), None)
    return (last.name, last.sha256) if last is not None else None


def rollback_config(daemon) -> dict:
    """Back to the rules that ran before the last `update --config` (the Config object as it was loaded,
    not its file re-read), proven against the running model first when the rules differ; measured as
    `rollback:config`. Rolling back again returns to the newer config."""
    import threading

    from .deploy import _restore_config
    from .reload import PROVEN_SECTIONS, ReloadRefused, plan, prove_live

    # the reload lock from the check to the restore (reentrant: _restore_config takes it again): a SIGHUP or
    # reload in between is not silently undone
    with getattr(daemon, "_reload_lock", None) or threading.RLock():
        prev = getattr(daemon, "previous_config", None)
        if prev is None:
            raise SwapRefused("no config update to roll back: `sitsctl update --config` keeps the config it "
                              "replaced (a restart, SIGHUP or `sitsctl reload` does not)")
        old_cfg, old_path, old_measured, installed = prev
        if daemon.cfg is not installed:
            raise SwapRefused("the config changed since the last `update --config` (SIGHUP, `sitsctl reload` or a "
                              "deploy): rolling back would skip that change; `sitsctl update --config` the one wanted")
        current = (daemon.cfg, daemon.config_path, _config_measured(daemon))
        changed = plan(daemon.cfg, old_cfg)
        proof = proven_set = None
        if set(PROVEN_SECTIONS) & set(changed):
            proven_set = daemon.loop.stage_set if daemon.loop is not None else None
            try:  # the model may have been swapped since that config ran: its rules must hold for this one
                proof = prove_live(daemon, old_cfg, proven_set)
            except ReloadRefused as exc:
                raise SwapRefused(f"the previous config's rules are not proven for the running model: {exc}") from None
        try:
            _restore_config(daemon, old_cfg, old_path, old_measured, proven_set)
        except ReloadRefused as exc:  # a model swap during the proof
            raise SwapRefused(str(exc)) from None
        daemon.previous_config = (*current, daemon.cfg)
    name, sha = old_measured if old_measured is not None else (Path(old_path).name, None)
    return {"component": "config", "name": name, "sha256": sha, "changed": changed, "proof": proof,
            "config": str(old_path)}


def control_handlers(daemon) -> dict:
    """`update`, `rollback` and `versions` for the control socket. The first two are coroutines that run
    the preparation on a worker thread, so the I/O event loop keeps writing PLC commands meanwhile: threads of
    their own (SWAP_THREADS), not asyncio's default pool, which the daemon's housekeeping needs every 50 ms; at
    most MAX_SWAP_REQUESTS in progress, more are refused at once."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    executor = ThreadPoolExecutor(max_workers=SWAP_THREADS, thread_name_prefix="sitsd-swap")
    inflight = [0]

    def _update(req: dict) -> dict:
        hs = daemon.hotswap
        t0 = time.perf_counter_ns()
        if req.get("module"):
            out = hs.update_module(Path(req["module"]), req.get("name"), req.get("sha256"))
        elif req.get("model"):
            out = hs.update_model(Path(req["model"]), req.get("sha256"))
        elif req.get("config"):
            import threading

            from .reload import reload

            path = Path(req["config"])
            with getattr(daemon, "_reload_lock", None) or threading.RLock():  # snapshot, reload, keep: one step
                before = (daemon.cfg, daemon.config_path, _config_measured(daemon))
                # measured before it goes live, from the bytes that run (read once); config_path set with the
                # rules, under the reload lock: a refused or unmeasured config changes nothing
                out = reload(daemon, path, daemon.config_overrides, measure=True, adopt_path=True,
                             expected_sha256=req.get("sha256"))  # `update --config FILE --sha256 H`: those bytes only
                if not out.get("reloaded"):
                    raise SwapRefused(out.get("error", "config refused"))
                daemon.previous_config = (*before, daemon.cfg)  # for `sitsctl rollback --config`
                hs.watch_config(daemon.cfg)  # an error spike in its first frames rolls it back (housekeeping)
            out = {**out, "component": "config", "name": path.name, "sha256": out["sha256"]}
        else:
            raise SwapRefused("update needs one of module, model, config")
        out["total_ms"] = round((time.perf_counter_ns() - t0) / 1e6, 3)
        out["pcr"] = daemon.measurements.value.hex() if daemon.measurements is not None else None
        daemon.log.info("hot swap", **{k: v for k, v in out.items() if k in (
            "component", "name", "sha256", "generation", "previous_generation", "prepare_ms", "swap_frame")})
        return {"updated": True, **out}

    def _rollback(req: dict) -> dict:
        if req.get("config"):
            out = rollback_config(daemon)
            daemon.log.warning("rollback", **{k: v for k, v in out.items() if k != "proof"})
            return {"rolled_back": True, **out, "pcr": daemon.measurements.value.hex() if daemon.measurements else None}
        component = req.get("module") or ("model" if req.get("model") else None)
        out = daemon.hotswap.rollback(component, force=bool(req.get("force")))
        daemon.log.warning("rollback", **out)
        return {"rolled_back": True, **out, "pcr": daemon.measurements.value.hex() if daemon.measurements else None}

    async def run(fn, req: dict) -> dict:
        if daemon.hotswap is None:
            return {"ok": False, "error": "hot swap is not available before the loop runs"}
        if inflight[0] >= MAX_SWAP_REQUESTS:
            return {"ok": False, "error": f"refused, the running version stays: {inflight[0]} updates or rollbacks "
                                          "are in progress already; try again when they are done (`sitsctl versions`)"}
        inflight[0] += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, fn, req)
        except SwapRefusedAfterRollback as exc:  # the running set did change: it was rolled back
            daemon.log.error("update refused; the running set failed its health watch and was rolled back",
                             error=str(exc).splitlines()[0])
            return {"ok": False, "error": f"refused; the running set was rolled back first: {exc}"}
        except SwapRefused as exc:
            daemon.log.error("update refused; the running version stays", error=str(exc).splitlines()[0])
            return {"ok": False, "error": f"refused, the running version stays: {exc}"}
        except Exception as exc:  # anything else: answer and keep serving, the running set is untouched
            daemon.log.error("update failed; the running version stays", error=repr(exc))
            return {"ok": False, "error": f"failed, the running version stays: {exc!r}"}
        finally:
            inflight[0] -= 1

    async def update(req: dict) -> dict:
        out = await run(_update, req)
        if not out.get("updated"):  # refused or failed: one alert update_refused (the running version stays)
            what = next((f"{k} {Path(str(req[k])).name}" for k in ("module", "model", "config") if req.get(k)),
                        "update")
            reason = (str(out.get("error") or "refused").splitlines() or ["refused"])[0]  # a bounds report follows
            daemon._alert("update_refused", f"{what}: {reason[:500]}")
        return out

    async def rollback(req: dict) -> dict:
        return await run(_rollback, req)

    def versions(_req: dict) -> dict:
        if not daemon.hotswap:
            return {}
        out = daemon.hotswap.versions()
        if getattr(daemon, "persistence", None) is not None:  # config, persisted, or not persisted
            out.update(daemon.persistence.describe(daemon.loop.stage_set))
        return out

    return {"update": update, "rollback": rollback, "versions": versions}
