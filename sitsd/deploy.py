"""What a config deploys, as measurement events, and the check sitsd runs at boot with verify_on_boot.

The events are exactly those the daemon's own measurement log records at start (sitsd/hotswap.py
`attach`): the model (artifact SHA-256), the pre then the post WASM module (SHA-256 of the wasm bytes),
then the config file's bytes; so a boot can be compared event by event with the deployment.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import StartupError


def config_events(cfg, config_path: Path, config_bytes: bytes | None = None) -> list[tuple[str, str, str]]:
    """[(kind, name, sha256 hex)] for the model, modules (pre, post) and the config file (`config_bytes`: its bytes
    as already read, so the config measured is the one parsed), in measuring order.
    Raises ep's ModelLoadError for a model that does not load or verify, WasmError for a module."""
    from .model import model_event

    events = [("model", *model_event(cfg))]  # an artifact directory is verified file by file
    for stage in ("pre", "post"):
        for m in cfg.modules:
            if m.stage == stage:
                from .wasm.module import read_source

                events.append((f"module:{stage}", m.name, hashlib.sha256(read_source(Path(m.path))).hexdigest()))
    if config_bytes is None:
        config_bytes = Path(config_path).read_bytes()
    events.append(("config", Path(config_path).name, hashlib.sha256(config_bytes).hexdigest()))
    return events


def record_path(cfg) -> Path:
    from attestation.deploy import RECORD_FILE

    return Path(cfg.audit.directory) / RECORD_FILE


def check_on_boot(daemon) -> dict | None:
    """With attestation.verify_on_boot (or a staged record that asks for it): verify the daemon's
    measurements against the staged deployment before anything is signed for the PLC; StartupError if
    they do not verify. None when no verification is asked for."""
    from attestation.deploy import DeployError, load_record, verify_boot
    from attestation.tpm.policy import PolicyError, load_authority_public

    cfg = daemon.cfg
    path = record_path(cfg)
    if not cfg.attestation.verify_on_boot and not path.exists():
        return None
    try:
        record = load_record(path)
        if not cfg.attestation.verify_on_boot and not record.get("verify_on_boot"):
            return None
        a = cfg.attestation
        authority = load_authority_public(a.authority_key) if a.authority_key else None
        result = verify_boot(record, daemon.measurements, authority, a.ak_handle)
    except (DeployError, PolicyError) as exc:
        raise StartupError(f"verify-on-boot: {exc}\n  fix: deploy this config, model and modules with `sitsctl "
                           f"deploy --config FILE --verify-on-boot true` (record: {path}), or set "
                           "attestation.verify_on_boot: false (docs/deploy.md)") from exc
    daemon.log.info("deployment verified on boot", record=str(path), **result)
    return result


# --- loading a verified deployment into the running daemon -------------------------------------------
#
# Two phases, so that nothing `sitsctl deploy` could not verify keeps running:
#   deploy_verified  load what deploy checked (hot swap of the model and modules, live reload of the config),
#                    measure the approval, quote the measurement PCR with the deployer's nonce; answers with
#                    a token. A failure inside it undoes what it had applied, newest first, before it answers.
#   deploy_commit    the deployer verified the answer and staged the record: the load stays.
#   deploy_abort     the deployer could not verify it: the load is undone.
# A load neither committed nor aborted within `confirm_timeout_s` (request field, default 30 s) is undone by
# the daemon itself, so a deployer that crashes, hangs or loses the socket never leaves an unverified
# deployment running. Undoing = the hot swap's rollback of each swapped component (measured as
# `rollback:model`, `rollback:module:<stage>`) and the previous config's rules and path (measured as
# `rollback:config` with the bytes it was loaded from); the measurement log stays append-only.

DEFAULT_CONFIRM_TIMEOUT_S = 30.0
CONFIRM_TIMEOUT_RANGE_S = (0.5, 600.0)
CONFIG_KINDS = ("config", "rollback:config")  # events that name the config that runs
_FINISHED_KEPT = 16  # outcomes of the last confirmed/undone loads, for a late commit or abort


class DeployRefused(Exception):
    """A load that failed; `restored` lists the components undone, `not_restored` those that could not be."""

    def __init__(self, reason: str, restored: list[str], not_restored: list[str]) -> None:
        super().__init__(reason)
        self.reason, self.restored, self.not_restored = reason, restored, not_restored

    def answer(self) -> str:
        first = self.reason.strip().splitlines()[0] if self.reason.strip() else "refused"
        if self.not_restored:
            return (f"refused, and the running configuration could NOT be fully restored (rolled back: "
                    f"{', '.join(self.restored) or 'nothing'}; not restored: {', '.join(self.not_restored)}): "
                    f"{first}")
        if self.restored:
            return f"refused, the running configuration was restored (rolled back: {', '.join(self.restored)}): {first}"
        return f"refused, the running configuration stays: {first}"


class _Step:
    """One change a load applied. `current` is what it made current (a model runner, a ModuleVersion, a
    Config): it is undone only while that is still what runs. `previous`, for the config: (Config, path,
    (name, sha256) of the config measurement it replaced)."""

    __slots__ = ("component", "current", "name", "previous")

    def __init__(self, component: str, current, name: str = "", previous: tuple | None = None) -> None:
        self.component, self.current, self.name, self.previous = component, current, name, previous


def _is_current(daemon, step: _Step) -> bool:
    if step.component == "config":
        return daemon.cfg is step.current
    st = daemon.loop.stage_set
    if step.component == "model":
        return st.model is step.current
    return getattr(st, step.component.split(":", 1)[1]) is step.current


def _restore_config(daemon, old_cfg, old_path, old_measured, proven_set=None) -> None:
    """The rules object that ran before (not the file re-read: deploying an edited config in place names
    the same path with new bytes), under the reload lock; measured as `rollback:config` before it goes live (a
    failed measurement raises with the newer rules still running and measured). Without a measurement of the old
    config (`old_measured` None: it ran before any config was measured), the event names the old file with the
    digest of its live sections (live_config_sha256): no file's SHA-256, so a PLC pinning a config refuses it rather
    than believe the newer config still runs. `proven_set`: the stage set whose model the old rules were just
    proven for; ReloadRefused (nothing changed) unless its model still runs (see reload.swap_locked)."""
    import threading

    from .reload import commit, prepare, swap_locked

    log = getattr(daemon, "measurements", None)
    with getattr(daemon, "_reload_lock", None) or threading.Lock():
        new = daemon.cfg
        prepared = prepare(daemon, old_cfg)
        with swap_locked(daemon, proven_set):
            if log is not None:
                event = old_measured if old_measured is not None else (
                    Path(old_path).name if old_path is not None else "config", live_config_sha256(old_cfg))
                log.record("rollback:config", *event)
            commit(daemon, prepared)
            daemon.config_path = old_path
    if new.logging != old_cfg.logging:
        from .log import configure

        configure(old_cfg.logging.level)


def _undo(daemon, steps: list[_Step], reason: str) -> tuple[list[str], list[str]]:
    """Undo `steps`, newest first; each rollback is measured (hot swap rollbacks, `rollback:config`) and
    logged. A component changed since the load (an operator's update, an automatic rollback, a reload) is
    left as it is and reported. Returns (restored, not_restored)."""
    import contextlib

    restored, not_restored = [], []
    why = f"deploy undone: {reason}"[:300]
    for step in reversed(steps):
        # a config step holds the reload lock from its check to its restore (no reload undone unseen)
        locked = (getattr(daemon, "_reload_lock", None) if step.component == "config" else None) \
            or contextlib.nullcontext()
        with locked:
            if not _is_current(daemon, step):
                daemon.log.warning("deploy undo: component changed since the deployment loaded it; left as it is",
                                   component=step.component, reason=reason)
                not_restored.append(f"{step.component} (changed since the load)")
                continue
            done = _undo_step(daemon, step, reason, why, not_restored)
        if done:
            restored.append(step.component)
    return restored, not_restored


def _undo_step(daemon, step: _Step, reason: str, why: str, not_restored: list[str]) -> bool:
    """One step of `_undo`: True when it was rolled back (measured or not), else the reason in `not_restored`."""
    from .reload import prove_for_running

    try:
        if step.component == "config":
            # the running model may have changed since the load (an operator's update): the old rules must
            # hold for it, proven here (refused: reported as not restored) unless proven before
            proven_set, _ = prove_for_running(daemon, step.previous[0])
            _restore_config(daemon, *step.previous, proven_set)
        else:
            daemon.hotswap.rollback("model" if step.component == "model" else step.name, reason=why)
    except Exception as exc:  # a rollback's measurement can fail after the swap back: then it is restored
        if _is_current(daemon, step):
            daemon.log.error("deploy undo failed", component=step.component, reason=reason, error=repr(exc))
            not_restored.append(f"{step.component} ({str(exc).splitlines()[0] if str(exc) else repr(exc)})")
            return False
        daemon.log.error("deploy undo: rolled back but not measured", component=step.component, error=repr(exc))
    daemon.log.warning("deploy undone: rolled back", component=step.component, reason=reason)
    return True


def _load(daemon, req: dict) -> tuple[dict, list[_Step]]:
    """`_load_verified`, and on any failure the undo of what it had applied: DeployRefused."""
    steps: list[_Step] = []
    try:
        return _load_verified(daemon, req, steps), steps
    except Exception as exc:
        reason = str(exc) or repr(exc)
        restored, not_restored = [], []
        if steps:
            restored, not_restored = _undo(daemon, steps, f"the load failed: {reason.splitlines()[0]}")
        raise DeployRefused(reason, restored, not_restored) from exc


def live_config_sha256(cfg) -> str:
    """A digest of the running config's live-reloadable sections (what a reload or its undo changes)."""
    import json

    from .reload import LIVE_SECTIONS

    return hashlib.sha256(json.dumps(cfg.model_dump(include=set(LIVE_SECTIONS), mode="json"), sort_keys=True,
                                     default=str).encode()).hexdigest()


class _Pending:
    __slots__ = ("token", "steps", "timeout_s", "deadline", "timer")

    def __init__(self, token: str, steps: list[_Step], timeout_s: float) -> None:
        import time

        self.token, self.steps, self.timeout_s = token, steps, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.timer = None

    def describe(self) -> dict:
        import time

        return {"token": self.token[:8] + "…", "applied": [s.component for s in self.steps],
                "undo_in_s": round(max(0.0, self.deadline - time.monotonic()), 1)}


def control_handlers(daemon) -> dict:
    """`deploy_verified`, `deploy_commit`, `deploy_abort` and `deploy_status` (see above). Loading and undoing
    run on a worker thread; one deployment at a time (a second is refused while one loads or awaits its
    confirmation)."""
    import asyncio
    import secrets
    from collections import OrderedDict

    state: dict = {"busy": None, "pending": None}
    finished: OrderedDict[str, dict] = OrderedDict()  # token -> outcome
    undoing: dict[str, asyncio.Task] = {}  # token -> the undo its timeout started

    def finish(token: str, outcome: dict) -> None:
        finished[token] = outcome
        while len(finished) > _FINISHED_KEPT:
            finished.popitem(last=False)

    def take(token) -> _Pending | None:
        p = state["pending"]
        if p is None or not isinstance(token, str) or not secrets.compare_digest(p.token, token):
            return None
        state["pending"] = None
        p.timer.cancel()
        return p

    async def undo(p: _Pending, reason: str) -> dict:
        state["busy"] = "undoing a deployment"
        try:
            restored, not_restored = await asyncio.to_thread(_undo, daemon, p.steps, reason)
        finally:
            state["busy"] = None
        outcome = {"undone": True, "reason": reason, "restored": restored, "not_restored": not_restored}
        finish(p.token, outcome)
        return outcome

    def expire(token: str) -> None:
        p = take(token)
        if p is None:
            return
        reason = f"not confirmed within {p.timeout_s:g} s"
        daemon.log.warning("deployment not confirmed by the deployer; undoing it", timeout_s=p.timeout_s,
                           applied=[s.component for s in p.steps])
        undoing[token] = task = asyncio.get_running_loop().create_task(undo(p, reason))
        task.add_done_callback(lambda _t: undoing.pop(token, None))

    async def deploy_verified(req: dict) -> dict:
        if daemon.hotswap is None or daemon.measurements is None:
            return {"ok": False, "error": "the daemon is not running its loop yet"}
        if state["busy"] or state["pending"] is not None:
            what = state["busy"] or f"a deployment awaits its confirmation ({state['pending'].describe()})"
            return {"ok": False, "error": f"refused, the running configuration stays: busy: {what}; try again "
                                          "when it is confirmed or undone"}
        try:
            timeout_s = float(req.get("confirm_timeout_s", DEFAULT_CONFIRM_TIMEOUT_S))
        except (TypeError, ValueError):
            return {"ok": False, "error": f"confirm_timeout_s {req.get('confirm_timeout_s')!r} is not a number"}
        lo, hi = CONFIRM_TIMEOUT_RANGE_S
        timeout_s = min(max(timeout_s, lo), hi)
        state["busy"] = "loading a deployment"
        try:
            answer, steps = await asyncio.to_thread(_load, daemon, req)
        except DeployRefused as exc:
            level = daemon.log.error if exc.not_restored or not exc.restored else daemon.log.warning
            level("deploy refused", error=exc.reason.splitlines()[0] if exc.reason else "", restored=exc.restored,
                  not_restored=exc.not_restored)
            return {"ok": False, "error": exc.answer(), "restored": exc.restored, "not_restored": exc.not_restored}
        finally:
            state["busy"] = None
        p = _Pending(secrets.token_hex(16), steps, timeout_s)
        p.timer = asyncio.get_running_loop().call_later(timeout_s, expire, p.token)
        state["pending"] = p
        return {**answer, "token": p.token, "confirm_timeout_s": timeout_s}

    def unknown(token) -> dict:
        done = finished.get(token) if isinstance(token, str) else None
        if done is not None and done.get("undone"):
            return {"ok": False, "error": f"this deployment was already undone ({done['reason']})", **done}
        if done is not None:
            return {"ok": False, "error": "this deployment was already confirmed", **done}
        return {"ok": False, "error": "no deployment awaits confirmation with this token"}

    async def deploy_commit(req: dict) -> dict:
        p = take(req.get("token"))
        if p is None:
            if isinstance(req.get("token"), str) and req["token"] in undoing:
                return {"ok": False, "error": "this deployment is being undone (not confirmed in time)"}
            return unknown(req.get("token"))
        applied = [s.component for s in p.steps]
        finish(p.token, {"committed": True, "applied": applied})
        daemon.log.info("deployment confirmed by the deployer", applied=applied)
        return {"committed": True, "applied": applied}

    async def deploy_abort(req: dict) -> dict:
        token = req.get("token")
        p = take(token)
        if p is None:
            if isinstance(token, str) and token in undoing:  # its timeout is undoing it now: that outcome
                return {"aborted": True, "already": True, **await asyncio.shield(undoing[token])}
            done = finished.get(token) if isinstance(token, str) else None
            if done is not None and done.get("undone"):
                return {"aborted": True, "already": True, **done}  # undone by its timeout already: same outcome
            return unknown(token)
        reason = str(req.get("reason") or "the deployer could not verify it")[:300]
        daemon.log.warning("deployment aborted by the deployer; undoing it", reason=reason,
                           applied=[s.component for s in p.steps])
        return {"aborted": True, **await undo(p, f"aborted by the deployer: {reason}")}

    def deploy_status(_req: dict) -> dict:
        p = state["pending"]
        return {"config_path": str(daemon.config_path) if daemon.config_path is not None else None,
                "live_config_sha256": live_config_sha256(daemon.cfg), "busy": state["busy"],
                "pending": p.describe() if p is not None else None}

    return {"deploy_verified": deploy_verified, "deploy_commit": deploy_commit, "deploy_abort": deploy_abort,
            "deploy_status": deploy_status}


def _load_verified(daemon, req: dict, steps: list[_Step]) -> dict:
    """Load a checked deployment; each change is appended to `steps` as soon as it runs (also when the call
    that made it raised afterwards), so the caller can undo exactly what was applied."""
    from dataclasses import asdict

    from attestation.deploy import split_events

    from .config import load_config, read_config_bytes
    from .hotswap import SwapRefused
    from .reload import plan, reload

    path = Path(req["config"])
    nonce = bytes.fromhex(req["nonce"])
    data = read_config_bytes(path)  # once: parsed, measured and (reload) checked to be these bytes
    cfg = load_config(path, daemon.config_overrides, data=data)  # the daemon's own overrides, as at its start
    events = config_events(cfg, path, data)
    approved, _ = split_events(events)
    if approved != [tuple(e) for e in req["approved_events"]]:
        raise SwapRefused("the model or modules changed between `sitsctl deploy`'s checks and loading them")
    plan(daemon.cfg, cfg)  # ReloadRefused now, before anything is swapped, if the config needs a restart
    st = daemon.loop.stage_set
    running = {m.stage: m for m in (st.pre, st.post) if m is not None}
    wanted = {kind.split(":", 1)[1]: (name, sha) for kind, name, sha in approved if kind.startswith("module:")}
    if set(running) != set(wanted):
        raise SwapRefused(f"modules {sorted(running)} run, the config has {sorted(wanted)}: restart sitsd")
    if events[0][2] != st.model_sha256.hex():
        before = daemon.loop.stage_set.model
        try:
            daemon.hotswap.update_model(Path(cfg.model.artifact), events[0][2], respect_pins=False)  # new config's
        finally:  # a step only for what this deploy put live (not an automatic rollback meanwhile)
            now = daemon.loop.stage_set
            if now.model is not before and now.model_sha256.hex() == events[0][2]:
                steps.append(_Step("model", now.model))
    for stage, (name, sha) in wanted.items():
        if (running[stage].name, running[stage].sha256) != (name, sha):
            spec = next(m for m in cfg.modules if m.stage == stage)
            before = getattr(daemon.loop.stage_set, stage)
            try:
                daemon.hotswap.update_module(Path(spec.path), spec.name, sha, respect_pins=False)
            finally:
                now = getattr(daemon.loop.stage_set, stage)
                if now is not before and now is not None and now.sha256 == sha:  # this deploy's, not a rollback's
                    steps.append(_Step(f"module:{stage}", now, name=now.name))
    log = daemon.measurements
    config_sha = events[-1][2]
    last_config = next((e for e in reversed(log.events) if e.kind in CONFIG_KINDS), None)
    if last_config is None or (last_config.name, last_config.sha256) != (path.name, config_sha):
        old_cfg, old_path = daemon.cfg, daemon.config_path
        try:  # measured before it goes live, and only the bytes checked above (the file could change meanwhile)
            out = reload(daemon, path, daemon.config_overrides, measure=True, adopt_path=True,
                         expected_sha256=config_sha)
        finally:
            if daemon.cfg is not old_cfg:
                steps.append(_Step("config", daemon.cfg, previous=(
                    old_cfg, old_path, (last_config.name, last_config.sha256) if last_config else None)))
        if not out.get("reloaded"):
            raise SwapRefused(out.get("error", "config refused"))
    applied = [s.component for s in steps]
    daemon.hotswap.measure_owed()  # a rollback's events still owed go before the approval (the quote covers them)
    log.record("approval", req["approval_name"], req["approval_sha256"])
    answer = {"applied": applied, "mode": log.mode, "pcr": log.pcr, "initial": log.initial.hex(),
              "events": [asdict(e) for e in log.events], "boot_events": [list(e) for e in events], "quote": None}
    if log.tpm is not None:
        q, ak_pem = log.tpm.quote(daemon.cfg.attestation.ak_handle, nonce)
        answer["quote"] = {"attest": q.attest.hex(), "signature": q.signature.hex()}
        answer["ak_public_pem"] = ak_pem.decode()
    daemon.log.info("deployment loaded; awaiting the deployer's confirmation", applied=applied, pcr=log.pcr,
                    value=log.value.hex())
    return answer
