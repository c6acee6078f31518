"""Live config reload (SIGHUP, `sitsctl reload`): the rules change between two frames, nothing stops.

What may change live: signal ranges, rates, types and policies (same names in the same order),
constraints, timing limits, PTP policy, safety limits, logging level. Everything else (PLC, transport,
model, attestation, audit, control, runtime, metrics) needs a restart, and a reload that touches it
is refused with the list. A config that does not load is refused too; the running rules stay.

A change to the signals, constraints or safety limits is proven before it goes live, as `sitsctl check`
proves a config: the constraints must stay satisfiable and the model that runs now (the config's, or a
hot-swapped one) must stay proven inside the new actuator limits over the new admissible input box (its
manifest's certificate is replayed when it covers them, else the bounds are proven anew; a streaming
model's tanh head must fit the new limits). Otherwise the reload is refused with the report. The proof
takes a fraction of a second, so callers run `reload` off the I/O event loop.

The file is read once: its signature is checked (attestation.require_signatures all), it is parsed and (measured)
hashed from those same bytes, so what is measured is what runs.

Measured (`measure=True`: SIGHUP, `sitsctl reload`, `sitsctl update --config` and a live deploy): a config whose
bytes differ from the newest config event is extended into the measurement PCR as `config <name> <sha256>` after it
is proven and its rules objects are built, and before it goes live, as a hot swap is measured before it runs. A
measurement that fails refuses the reload (the running rules stay, nothing claims the new ones). Under tpm-session
the event makes the PLC link bind the session key again, so the PLC's credential names the config that runs
(sitsd/plc_link.py). `adopt_path` (update --config, deploy): the daemon's config_path becomes `path` under the
reload lock, with the rules; `expected_sha256` (deploy): the bytes read must be the ones the deployment checked.
"""
from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

from .config import Config, load_config, read_config_bytes
from .errors import ConfigError
from .gates import ConstraintGate, SafetyEnvelope

RESTART_SECTIONS = ("line", "model", "modules", "plc", "transport", "attestation", "audit", "control", "runtime",
                    "metrics", "proof")
LIVE_SECTIONS = ("signals", "constraints", "timing", "safety", "logging")
# the sections a model's bound proof depends on: a live change to them is proven for the running model first, and
# a model proven under other ones does not run (a hot swap or rollback to it proves it first: sitsd.hotswap)
PROVEN_SECTIONS = ("signals", "constraints", "safety")


def rules_of(cfg: Config) -> tuple:
    """What a model's bound proof is proven inside (compared with ==)."""
    return tuple(getattr(cfg, s) for s in PROVEN_SECTIONS)


class ReloadRefused(Exception):
    pass


def plan(old: Config, new: Config) -> list[str]:
    """The sections that change; raises ReloadRefused when one of them needs a restart."""
    needs_restart = [s for s in RESTART_SECTIONS if getattr(old, s) != getattr(new, s)]
    if old.signal_names != new.signal_names:
        needs_restart.append("signals (names or order: the frame layout)")
    o, n = old.timing.ptp, new.timing.ptp
    if (o.phc_timescale, o.utc_offset_s) != (n.phc_timescale, n.utc_offset_s):
        needs_restart.append("timing.ptp.phc_timescale/utc_offset_s (the transport converts hardware stamps with "
                             "them from its start)")
    if needs_restart:
        raise ReloadRefused(f"these changes need a restart: {', '.join(needs_restart)}")
    return [s for s in LIVE_SECTIONS if getattr(old, s) != getattr(new, s)]


def prove_live(daemon, new: Config, stage_set=None) -> str:
    """The running model (`stage_set`'s, default the running set's) under `new`'s rules: a short report, or
    ReloadRefused with the proof's report. The caller applies the rules only while that model still runs
    (`commit_proven`)."""
    loop = daemon.loop
    if loop is None:
        return "not running yet"
    stage_set = stage_set if stage_set is not None else loop.stage_set
    model = stage_set.model
    if getattr(model, "kind", "mlp") == "streaming":
        from .model import head_range

        rng = head_range(new, model.pool.model_bytes)
        by_output = {a.output: a for a in new.safety.actuators}
        for i, o in enumerate(new.model.outputs):
            if rng is None or rng[0][i] < by_output[o].min or rng[1][i] > by_output[o].max:
                got = "unbounded" if rng is None else f"[{rng[0][i]:g}, {rng[1][i]:g}]"
                raise ReloadRefused(f"the streaming model's output {o} is {got} by its head, not inside the new "
                                    f"actuator limits [{by_output[o].min:g}, {by_output[o].max:g}]")
        return "streaming head inside the new limits"
    from .hotswap import ModelBoundsCheck

    # in the ProofWorker child process, as for a model swap: the loop thread never waits behind the proof
    proven, report = ModelBoundsCheck(lambda: new)(Path(stage_set.model_path), model.sha256.hex())
    if not proven:
        raise ReloadRefused("the running model is not proven inside the new config's limits over its admissible "
                            f"inputs, so the new rules would not keep the line safe:\n{report}")
    return report.splitlines()[0] if report else "proven"


def prepare(daemon, new: Config) -> tuple:
    """Build the new rules' objects (what can fail: before anything is measured or swapped)."""
    return new, ConstraintGate(new.signals, new.constraints), SafetyEnvelope(new.safety.actuators, new.model.outputs)


def apply(daemon, new: Config) -> None:
    """Swap the rules in the running loop (reference assignments the loop picks up at the next frame)."""
    commit(daemon, prepare(daemon, new))


@contextlib.contextmanager
def swap_locked(daemon, proven_set=None):
    """Hold the hot swap's lock (no model swap or rollback meanwhile) around applying proven rules; with
    `proven_set` (the stage set whose model `prove_live` proved), refuse unless its model still runs, and after the
    block record that model as proven inside the rules that run (a rollback to another model proves it first)."""
    hs = getattr(daemon, "hotswap", None)
    hs = hs if hasattr(hs, "mark_proven") else None  # a daemon without hot swap (tools, tests) has no swaps to stop
    with (hs._lock if hs is not None else contextlib.nullcontext()):
        if hs is not None:
            try:  # a rollback's events that could not be measured go first: the log stays in the order things ran
                hs._measure_owed()
            except Exception as exc:
                raise ReloadRefused(f"the measurement log still lacks a rollback that could not be measured ({exc!r}); "
                                    "nothing changed: try again once the TPM/disk works") from None
        loop = daemon.loop
        if proven_set is not None and loop is not None and loop.stage_set.model_sha256 != proven_set.model_sha256:
            raise ReloadRefused("the model was swapped while the new rules were being proven for the one that ran "
                                "(sha256 " + proven_set.model_sha256.hex()[:16] + "…); nothing changed: reload "
                                "again to prove them for the model that runs now")
        yield
        if hs is not None and proven_set is not None:  # proven just now (unproven rules never mark anything)
            hs.mark_proven(proven_set.model_sha256, rules_of(daemon.cfg))


def prove_for_running(daemon, new: Config) -> tuple:
    """Before `new`'s rules go live where nothing else proved them (a deploy's undo): (the stage set whose model
    is proven inside them, a report), or (None, None) when they are the running rules. A model already proven
    inside them (HotSwap.proven_for) is not proven again. ReloadRefused when the proof fails."""
    if daemon.loop is None or rules_of(daemon.cfg) == rules_of(new):
        return None, None
    st = daemon.loop.stage_set
    hs = getattr(daemon, "hotswap", None)
    if hasattr(hs, "proven_for") and hs.proven_for(st.model_sha256, rules_of(new)):
        return st, "proven inside these rules before"
    return st, prove_live(daemon, new, st)


def commit(daemon, prepared: tuple) -> None:
    """Swap in rules built by `prepare`: carries the rate and safety references over, then reference assignments
    the loop picks up at the next frame."""
    new, gate, safety = prepared
    loop = daemon.loop
    old_gate = loop.constraints
    gate._prev[:] = old_gate._prev  # rates keep their reference frame
    gate._prev_ns, gate._has_prev = old_gate._prev_ns, old_gate._has_prev
    safety.last[:] = loop.safety.last
    safety._last_ns = loop.safety._last_ns
    t = new.timing
    ts = loop.ts_gate
    ts.max_transit_ns = int(t.max_transit_ms * 1e6)
    ts.max_future_ns = int(t.max_future_ms * 1e6)
    ts.max_age_ns = int(t.max_age_ms * 1e6) if t.max_age_ms else None
    ts.require_hardware_stamps = t.require_hardware_stamps
    if t.replay_window != ts.window:
        ts.window, ts._window_mask = t.replay_window, (1 << t.replay_window) - 1
    loop.deadline_ns = int(t.deadline_ms * 1e6)
    loop.max_consecutive_drops = t.max_consecutive_drops
    loop.clock_policy = t.ptp.policy
    loop.constraints, loop.safety = gate, safety
    daemon.cfg = new


def reload(daemon, path: Path, overrides: dict | None = None, *, measure: bool = False, adopt_path: bool = False,
           expected_sha256: str | None = None) -> dict:
    """Read once, check, build, measure and apply; tells systemd RELOADING=1 ... READY=1 around it. Returns the
    outcome ({"reloaded": True, "changed", "sha256" (of the bytes that run), "measured" when measured} or
    {"reloaded": False, "error"}). One at a time (SIGHUP, `sitsctl reload`, `update --config` and a live deploy all
    come here). `measure`: extend the config into the daemon's measurement log before it goes live; `adopt_path`:
    set daemon.config_path to `path` with the rules; `expected_sha256`: refuse other bytes (see the module
    docstring)."""
    import threading

    lock = getattr(daemon, "_reload_lock", None) or threading.Lock()
    with lock:
        return _reload(daemon, path, overrides, measure, adopt_path, expected_sha256)


class _Unmeasured(Exception):
    pass


def _measure_config(daemon, path: Path, sha: str) -> dict:
    """Record `config <name> <sha>` (`sha`: of the bytes read once, that run) unless the newest config event already
    names these bytes. Returns what was measured ({} when nothing was); _Unmeasured when the measurement fails."""
    from attestation.measurement import CONFIG_KINDS

    log = getattr(daemon, "measurements", None)
    if log is None:
        return {}
    last = next((e for e in reversed(log.events) if e.kind in CONFIG_KINDS), None)
    if last is not None and (last.name, last.sha256) == (Path(path).name, sha):
        return {}
    try:
        event = log.record("config", Path(path).name, sha)
    except Exception as exc:  # MeasurementError (TPM gone, PCR moved), OSError (disk full)
        raise _Unmeasured(f"could not measure the config into PCR {log.pcr} ({exc}); nothing changed") from None
    return {"measured": {"pcr": log.pcr, "sha256": sha, "value": event.pcr_after}}


def _reload(daemon, path: Path, overrides: dict | None = None, measure: bool = False, adopt_path: bool = False,
            expected_sha256: str | None = None) -> dict:
    daemon.notifier.send(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
    from attestation.signatures import SignatureError

    from .signatures import SignaturePolicy

    path = Path(path)
    try:
        data = read_config_bytes(path)  # once: the signature, the parse and the measurement are of these bytes
        sha = hashlib.sha256(data).hexdigest()
        if expected_sha256 is not None and sha != expected_sha256:
            raise ReloadRefused(f"{path}: SHA-256 {sha} is not the expected {expected_sha256} (the file changed "
                                "since it was checked, or the hash given is another file's: `sha256sum` it)")
        # attestation.require_signatures all: the running policy decides (attestation needs a restart)
        SignaturePolicy.from_config(daemon.cfg).check("config", path, sha)
        new = load_config(path, overrides, data=data)
        changed = plan(daemon.cfg, new)
        proven_set = None
        if set(PROVEN_SECTIONS) & set(changed):
            proven_set = daemon.loop.stage_set if daemon.loop is not None else None
            proof = prove_live(daemon, new, proven_set)
            daemon.log.info("reload proven", changed=changed, proof=proof)
        prepared = prepare(daemon, new)  # built before the measurement: what fails here leaves nothing measured
        with swap_locked(daemon, proven_set):  # no model swap between the proof's model and these rules going live
            measured = _measure_config(daemon, path, sha) if measure else {}
            commit(daemon, prepared)
            if adopt_path:
                daemon.config_path = path
    except (ConfigError, ReloadRefused, SignatureError, _Unmeasured) as exc:
        reason = str(exc)
        daemon.log.error("config reload refused; the running configuration stays", error=reason, config=str(path))
        daemon.notifier.send(f"READY=1\nSTATUS=reload refused: {reason.splitlines()[0][:200]}")
        return {"reloaded": False, "error": reason}
    if "logging" in changed:
        from .log import configure

        configure(new.logging.level)
    daemon.reloads += 1
    daemon.log.info("config reloaded", config=str(path), changed=changed, **measured)
    daemon.notifier.send(f"READY=1\nSTATUS={daemon.status_line()}")
    return {"reloaded": True, "changed": changed, "sha256": sha, **measured}
