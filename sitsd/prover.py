"""Groth16 proofs of commands, off the fast path: the circuit of a config's model, its keys on disk,
and the proof service the daemon feeds (a spawn process pool behind a bounded queue).

The loop thread only calls `ProofService.offer`, which decides by policy, copies the inputs and
puts them on a bounded queue without blocking; a full queue counts a drop. A feeder thread hands
jobs to worker processes, each of which compiles the circuit and loads the proving key once.
Proofs land as `<directory>/<proof_id>.proof.json` + `.public.json`; the proof id is derived from
the command's sequence number so the audit record can name it before the proof exists.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue as _queue
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from attestation.zk import (CompiledModel, ConditionSpec, ContextSpec, LinearSpec, ProvingKey, ZkError, compile_chain,
                            dev_setup, parse_onnx)
from attestation.zk.formats import r1cs_file, snarkjs_json, zkey
from ep.artifact import dequantized, resolve_model

from .config import Config

def circuit_for_config(cfg: Config, frac_bits: int = 12, guard_bits: int = 2) -> CompiledModel:
    """The circuit of the deployed model over the config's signal ranges and linear constraints.

    Ranges: each model input's signal min/max. Linear constraints with integer coefficients over
    model inputs are enforced, conditional ones too when every condition reads a model input or an
    integer signal (enum, bool, int, bits): such a signal that is not a model input becomes a public
    context signal of the circuit (`context_signals`). The rest are listed as not encoded (docs/zk.md).
    """
    data, digest, _ = resolve_model(cfg.model.artifact, cfg.model.sha256)
    # an FP8 artifact: its weights as the runtime folds them to FP32 at load (same bits, plain initializers)
    chain = parse_onnx(dequantized(data), digest.hex(), Path(cfg.model.artifact))
    by_name = {s.name: s for s in cfg.signals}
    ranges = []
    for name in cfg.model.inputs:
        s = by_name[name]
        if s.min is None or s.max is None:
            raise ZkError(f"signal {name} has no min/max; the circuit range-checks every model input", "config")
        ranges.append((float(s.min), float(s.max)))
    index = {n: i for i, n in enumerate(cfg.model.inputs)}
    context = context_signals(cfg)
    cindex = {c.name: i for i, c in enumerate(context)}
    linear = []
    for c in cfg.constraints:
        conds = c.conditions
        if any(k not in index for k in c.coefficients) or any(
                d.signal not in index and d.signal not in cindex for d in conds):
            linear.append(LinearSpec(c.name, {}, None, None))  # listed as not encoded
            continue
        when = tuple(ConditionSpec("input", index[d.signal], d.op, d.value) if d.signal in index
                     else ConditionSpec("context", cindex[d.signal], d.op, d.value) for d in conds)
        linear.append(LinearSpec(c.name, {index[k]: v for k, v in c.coefficients.items()}, c.min, c.max, when))
    return compile_chain(chain, cfg.model.inputs, ranges, linear, frac_bits, guard_bits, cfg.model.outputs,
                         context)


def context_signals(cfg: Config) -> list[ContextSpec]:
    """The integer signals, not model inputs, that the conditions of encodable constraints read, in
    config signal order: the circuit takes them as public signals after the model inputs."""
    inputs = set(cfg.model.inputs)
    wanted = set()
    for c in cfg.constraints:
        if c.conditions and all(k in inputs for k in c.coefficients):
            wanted |= {d.signal for d in c.conditions if d.signal not in inputs}
    out = []
    for s in cfg.signals:
        if s.name not in wanted:
            continue
        if s.type == "enum":
            vals = tuple(sorted({int(v) for v in s.values}))
            if any(float(v) != int(v) for v in s.values):
                continue
            out.append(ContextSpec(s.name, vals[0], vals[-1], vals))
        elif s.type in ("bool", "bits", "int"):
            lo, hi = s.lower, s.upper
            if float(lo).is_integer() and float(hi).is_integer():
                out.append(ContextSpec(s.name, int(lo), int(hi)))
    return out


def context_indices(cfg: Config) -> tuple[int, ...]:
    """Where the circuit's context signals sit in a frame's values (config signal order)."""
    order = {s.name: i for i, s in enumerate(cfg.signals)}
    return tuple(order[c.name] for c in context_signals(cfg))


def circuit_id(cm: CompiledModel) -> str:
    """SHA-256 of the circuit's .r1cs bytes: which keys belong to which circuit."""
    return hashlib.sha256(r1cs_file.dumps(cm.circuit.r1cs)).hexdigest()


def key_matches(pk: ProvingKey, cm: CompiledModel) -> bool:
    """Whether a proving key was made for this circuit (same sizes and the same A/B coefficients)."""
    r = cm.circuit.r1cs
    if (pk.n_vars, pk.n_public, pk.domain_size) != (r.n_wires, r.n_public, r.domain_size):
        return False
    expect = []
    for ci, (a, b, _c) in enumerate(r.constraints):
        expect += [(0, ci, s, k) for s, k in a.items()] + [(1, ci, s, k) for s, k in b.items()]
    expect += [(0, len(r.constraints) + s, s, 1) for s in range(r.n_public + 1)]
    return sorted(expect) == sorted(pk.coefs)


@dataclass(frozen=True, slots=True)
class KeyDir:
    """A directory with circuit.zkey, vk.json, circuit.r1cs and circuit.json (the metadata)."""

    path: Path

    def write(self, cm: CompiledModel, pk: ProvingKey, setup: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        zkey.write(self.path / "circuit.zkey", pk)
        snarkjs_json.dump(self.path / "vk.json", snarkjs_json.vk_to_json(pk.verifying_key()))
        r1cs_file.write(self.path / "circuit.r1cs", cm.circuit.r1cs)
        meta = {"circuit_sha256": circuit_id(cm), "model_sha256": cm.chain.sha256, "setup": setup,
                "constraints": cm.n_constraints, "public_signals": [*cm.circuit.output_names,
                                                                     *cm.circuit.input_names],
                "input_frac_bits": list(cm.plan.input_frac_bits), "output_scale_log2":
                    cm.plan.frac_bits + cm.plan.layers[-1].shift, "error_bound": list(cm.error_bound)}
        (self.path / "circuit.json").write_text(json.dumps(meta, indent=1) + "\n")

    def load(self, cm: CompiledModel) -> ProvingKey:
        f = self.path / "circuit.zkey"
        if not f.is_file():
            raise ZkError(f"no proving key at {f}; run `sitsctl zk-setup --config FILE --out {self.path}`")
        pk = zkey.read(f)
        if not key_matches(pk, cm):
            raise ZkError(f"{f} was made for another circuit (model or config ranges changed); run "
                          f"`sitsctl zk-setup` again")
        return pk


def ensure_keys(cfg: Config, directory: Path, cm: CompiledModel | None = None) -> tuple[CompiledModel, ProvingKey]:
    """The circuit and its proving key from `directory`, made by a dev setup if missing or stale."""
    cm = cm or circuit_for_config(cfg)
    kd = KeyDir(Path(directory))
    try:
        return cm, kd.load(cm)
    except ZkError:
        pk = dev_setup(cm.circuit.r1cs)
        kd.write(cm, pk, "development single-party setup (toxic waste discarded, not auditable)")
        return cm, pk


# ---- the proof service (daemon side) --------------------------------------------------------------

_WORKER: dict = {}  # per worker process: the compiled circuit and the prepared key, loaded once


def _worker_init(cfg: Config, keys: Path) -> None:
    import fcntl

    from attestation.zk import available_backends, prepare

    _die_with_parent()
    keys.mkdir(parents=True, exist_ok=True)
    with open(keys / ".lock", "w") as lock:  # one worker makes the development setup, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        cm, pk = ensure_keys(cfg, keys)
    _WORKER.update(cm=cm, key=prepare(pk, available_backends()[-1]))


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the daemon dies, even by kill -9 (PR_SET_PDEATHSIG); otherwise an
    orphaned prover keeps its memory until it next reads its job queue. The daemon's I/O thread, which
    started the workers, lives as long as the daemon."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's own shutdown is all there is
        return
    if os.getppid() == 1:  # the daemon died before the call above took effect
        os._exit(1)


def _worker_ready() -> str:
    return _WORKER["cm"].chain.sha256


def _write_atomic(path: Path, obj: object) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _worker_prove(proof_id: str, inputs: tuple[float, ...], model_sha256: str, directory: Path,
                  context: tuple[float, ...] = ()) -> dict:
    from attestation.zk import prove

    cm: CompiledModel = _WORKER["cm"]
    if model_sha256 != cm.chain.sha256:
        raise ZkError(f"the command came from model {model_sha256[:12]}..., the prover's circuit is for "
                      f"{cm.chain.sha256[:12]}... (model swapped); restart to prove the new model")
    t = time.perf_counter()
    w = cm.witness(inputs, context)
    proof = prove(_WORKER["key"], w)
    public = cm.public_signals(w)
    _write_atomic(directory / f"{proof_id}.public.json", snarkjs_json.public_to_json(public))
    _write_atomic(directory / f"{proof_id}.proof.json", snarkjs_json.proof_to_json(proof))
    return {"prove_s": round(time.perf_counter() - t, 4), "outputs": cm.decode_outputs(public)}


class ProofService:
    """Policy, bounded queue and process pool. `offer` is the only call made on the loop thread."""

    def __init__(self, cfg: Config, log=None) -> None:
        p = cfg.proof
        self.cfg, self.log, self.policy, self.n = cfg, log, p.policy, p.n
        self.directory = Path(p.directory or Path(cfg.audit.directory) / "proofs")
        self.keys = Path(p.keys or self.directory / "keys")
        self.workers = p.workers
        self._queue: _queue.Queue = _queue.Queue(maxsize=p.queue)
        self._slots = threading.Semaphore(p.workers)
        self._refs: dict[int, str] = {}  # sequence -> proof id, until the audit record takes it
        self._index_lock = threading.Lock()
        self._last_alert: object = None
        self._count = 0
        # offered = skipped (by policy) + accepted + dropped (queue full); accepted = proved + failed + cancelled
        # (queued when the daemon stopped) + queue depth + in flight. Each is written by one thread only.
        self.offered = self.skipped = self.accepted = self.dropped = self.proved = self.failed = 0
        self.circuit_model: bytes | None = None  # the model the circuit proves (attach_prover); others: skipped_model
        self.skipped_model = 0  # offers of commands from another model (after a hot swap), counted in `skipped` too
        self.submitted = self.cancelled = 0  # handed to a worker (feeder thread); discarded at shutdown
        self._pool: ProcessPoolExecutor | None = None
        self._feeder: threading.Thread | None = None
        # stall watch (`watch`, from the daemon's I/O thread): proof id -> when it went to a worker
        self.stall_after_s = p.stall_alert_s
        self._in_flight: dict[str, int] = {}
        self._ready_ns: int | None = None  # when the first worker had its keys: a proof cannot start before
        self._progress_ns = 0  # when a proof last finished (any outcome)
        self.stalled_since_ns: int | None = None  # monotonic; set while stalled
        self.stalls = 0

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"), initializer=_worker_init,
                                         initargs=(self.cfg, self.keys))
        for _ in range(self.workers):  # start the workers now: keys are made or loaded before the first command
            self._pool.submit(_worker_ready).add_done_callback(self._on_ready)
        self._feeder = threading.Thread(target=self._feed, name="sitsd-proof-feeder", daemon=True)
        self._feeder.start()

    def _on_ready(self, fut: Future) -> None:
        exc = fut.exception()
        if exc is not None:
            self._index({"event": "prover_failed", "error": str(exc)})
            return
        if self._ready_ns is None:
            self._ready_ns = time.monotonic_ns()
        if (self.keys / "vk.json").is_file() and not (self.directory / "vk.json").is_file():
            (self.directory / "vk.json").write_bytes((self.keys / "vk.json").read_bytes())

    # loop thread: no logging, no blocking, no allocation beyond the job tuple
    def offer(self, sequence: int, inputs, model_sha256: bytes, alerts, context: tuple = ()) -> str | None:
        self.offered += 1
        if self.circuit_model is not None and model_sha256 != self.circuit_model:
            # a hot swap changed the model: the circuit (and its keys) prove the model sitsd started with, so
            # every job would fail in the worker and the audit record would name a proof never made
            self.skipped_model += 1
            self.skipped += 1
            if self.skipped_model == 1:
                alerts.append((time.time_ns(), "prover", f"not proven: the running model {model_sha256.hex()[:12]}… "
                               f"is not the one the proof circuit was compiled for ({self.circuit_model.hex()[:12]}…, "
                               "hot swap); its commands go unproven until sitsd restarts with it", 0, sequence))
            return None
        if self.policy == "one_in_n":
            self._count += 1
            if self._count < self.n:
                self.skipped += 1
                return None
            self._count = 0
        elif self.policy == "on_alert":
            last = alerts[-1] if alerts else None
            if last is None or last is self._last_alert:
                self.skipped += 1
                return None
            self._last_alert = last
        proof_id = f"cmd-{sequence}"
        try:
            self._queue.put_nowait((proof_id, tuple(float(v) for v in inputs), model_sha256.hex(), context))
        except _queue.Full:
            self.dropped += 1
            return None
        self.accepted += 1
        if len(self._refs) > 4096:  # references the audit never took (command expired before the write)
            try:
                self._refs.pop(next(iter(self._refs)), None)
            except (RuntimeError, StopIteration):  # the I/O thread popped one meanwhile: nothing to trim
                pass
        self._refs[sequence] = proof_id
        return proof_id

    def reference(self, sequence: int) -> dict:
        """Fields for the command's audit record: the proof id and its files (paths as configured)."""
        proof_id = self._refs.pop(sequence, None)
        if proof_id is None:
            return {}
        return {"proof": {"id": proof_id, "proof": str(self.directory / f"{proof_id}.proof.json"),
                          "public": str(self.directory / f"{proof_id}.public.json"),
                          "vk": str(self.directory / "vk.json")}}

    def _feed(self) -> None:
        while True:
            job = self._queue.get()
            if job is None or self._pool is None:
                return
            self._slots.acquire()
            try:
                fut = self._pool.submit(_worker_prove, job[0], job[1], job[2], self.directory, job[3])
            except RuntimeError:  # pool shut down
                self._slots.release()
                self.cancelled += 1
                return
            self.submitted += 1
            self._in_flight[job[0]] = time.monotonic_ns()
            fut.add_done_callback(lambda f, job=job: self._done(job, f))

    def _done(self, job: tuple, fut: Future) -> None:
        self._slots.release()
        self._in_flight.pop(job[0], None)
        self._progress_ns = time.monotonic_ns()
        exc = fut.exception() if not fut.cancelled() else RuntimeError("cancelled at shutdown")
        if fut.cancelled():
            self.cancelled += 1
            self._index({"id": job[0], "status": "dropped", "error": str(exc)})
        elif exc is None:
            self.proved += 1
            self._index({"id": job[0], "status": "ok", **fut.result()})
        else:
            self.failed += 1
            self._index({"id": job[0], "status": "failed", "error": str(exc)})

    def _index(self, entry: dict) -> None:
        with self._index_lock:
            with open(self.directory / "index.jsonl", "a") as f:
                f.write(json.dumps({"t_ns": time.time_ns(), **entry}) + "\n")

    def watch(self, now_ns: int | None = None) -> tuple[str, str] | None:
        """Called every few seconds off the loop (the daemon's I/O thread). ("stalled", why) when a proof has
        been with a prover process for more than `proof.stall_alert_s` (counted from when the workers had
        their keys, at the earliest) and none finished meanwhile: the process is stopped, hung or starved.
        ("recovered", how) when proofs finish again after that. None otherwise. Commands never wait for
        proofs, so a stall only means commands go unproven: the queue fills and offers are dropped."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        try:
            oldest = min(self._in_flight.values(), default=None)
        except RuntimeError:  # the feeder added one meanwhile: judged at the next call
            return None
        if self.stalled_since_ns is not None:
            if self._progress_ns > self.stalled_since_ns:
                stalled_s = (now - self.stalled_since_ns) / 1e9
                self.stalled_since_ns = None
                return "recovered", f"proofs finish again, {stalled_s:.1f} s after the stall was reported"
            return None
        if oldest is None or self._ready_ns is None:
            return None
        waiting_s = (now - max(oldest, self._ready_ns, self._progress_ns)) / 1e9
        if waiting_s <= self.stall_after_s:
            return None
        self.stalled_since_ns, self.stalls = now, self.stalls + 1
        return "stalled", (f"no proof finished for {waiting_s:.0f} s with {len(self._in_flight)} in the prover "
                           f"processes (PIDs {', '.join(map(str, self.worker_pids())) or 'none alive'}): stopped, "
                           f"hung or starved of CPU; commands go on unproven, and offers are dropped while the "
                           f"queue ({self._queue.maxsize}) is full")

    def counters(self) -> dict:
        return {"offered": self.offered, "skipped": self.skipped, "accepted": self.accepted, "dropped": self.dropped,
                "proved": self.proved, "failed": self.failed, "cancelled": self.cancelled}

    def worker_pids(self) -> list[int]:
        """The prover processes' PIDs (e.g. to watch or stop them from outside: bench/soak.py)."""
        pool = self._pool
        procs = getattr(pool, "_processes", None) or {}  # ProcessPoolExecutor keeps {pid: process}
        return sorted(pid for pid, proc in list(procs.items()) if proc.is_alive())

    def status(self) -> dict:
        """Counters, queue depth and workers for `sitsctl status` and the metrics (any thread)."""
        in_flight = max(0, self.submitted - self.proved - self.failed - self.cancelled)
        return {"policy": self.policy, "n": self.n, "workers": self.workers, "worker_pids": self.worker_pids(),
                "queue_depth": self._queue.qsize(), "queue_max": self._queue.maxsize, "in_flight": in_flight,
                "stalled": self.stalled_since_ns is not None, "stalls": self.stalls, "skipped_model": self.skipped_model,
                "stall_alert_s": self.stall_after_s,
                **self.counters()}

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop taking jobs; proofs in flight finish, queued ones are dropped and listed in the index."""
        if self._pool is None:
            return
        while True:  # an audit record may already name these: the index says they were never made
            try:
                job = self._queue.get_nowait()
            except _queue.Empty:
                break
            if job is not None:
                self.cancelled += 1
                self._index({"id": job[0], "status": "dropped", "error": "daemon stopped before proving it"})
        self._queue.put(None)
        if self._feeder is not None:
            self._feeder.join(timeout_s)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None
        if self.log is not None:
            self.log.info("prover stopped", **self.counters())


def attach_prover(daemon) -> ProofService | None:
    """Called once the loop is built (after fault attribution, whose observer it chains to).

    The proof covers the model: its inputs are what the model actually saw this frame (after a pre
    module), read from the model's input buffer on the loop thread right after the model ran. Fail-safe
    commands did not come from the model and are never proven.
    """
    cfg = daemon.cfg
    if cfg.proof.policy == "off":
        return None
    service = ProofService(cfg, daemon.log)
    from .model import model_sha256

    service.circuit_model = bytes.fromhex(model_sha256(cfg))  # the circuit is compiled from the config's model
    service.start()
    loop = daemon.loop
    previous = loop.observe

    ctx_at = context_indices(cfg)  # the frame's values of the circuit's context signals (e.g. mill_mode)

    def observe(t_ns, frame_values, values, failsafe) -> None:
        if previous is not None:
            previous(t_ns, frame_values, values, failsafe)
        if not failsafe:
            st = loop.stage_set
            ctx = tuple(float(frame_values[i]) for i in ctx_at) if ctx_at else ()
            service.offer(loop.sequence, st.model.input[0], st.model_sha256, loop.alerts, ctx)

    loop.observe = observe
    daemon.log.info("proofs", policy=cfg.proof.policy, n=cfg.proof.n, workers=cfg.proof.workers,
                    directory=str(service.directory))
    return service


def audit_reference(daemon, sequence: int) -> dict:
    """The proof fields for a command's audit record ({} when proofs are off or this one is not proven)."""
    service = getattr(daemon, "prover", None)
    return service.reference(sequence) if service is not None else {}
