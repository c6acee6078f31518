"""What a config deploys, as measurement events, and the check sitsd runs at boot with verify_on_boot.

The events are exactly those the daemon's own measurement log records at start (sitsd/hotswap.py
`attach`): the model (artifact SHA-256), the pre then the post WASM module (SHA-256 of the wasm bytes),
then the config file's bytes; so a boot can be compared event by event with the deployment.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import StartupError


def config_events(cfg, config_path: Path) -> list[tuple[str, str, str]]:
    """[(kind, name, sha256 hex)] for the model, modules (pre, post) and the config file, in measuring order.
    Raises ep's ModelLoadError for a model that does not load or verify, WasmError for a module."""
    from .model import model_event

    events = [("model", *model_event(cfg))]  # an artifact directory is verified file by file
    for stage in ("pre", "post"):
        for m in cfg.modules:
            if m.stage == stage:
                from .wasm.module import read_source

                events.append((f"module:{stage}", m.name, hashlib.sha256(read_source(Path(m.path))).hexdigest()))
    events.append(("config", Path(config_path).name, hashlib.sha256(Path(config_path).read_bytes()).hexdigest()))
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


# --- loading a verified deployment into the running daemon (control command `deploy_verified`) ------

def control_handlers(daemon) -> dict:
    """`deploy_verified`: load what `sitsctl deploy` checked into the running daemon (hot swap of the model
    and modules, live reload of the config), measure the approval, quote the measurement PCR with the
    deployer's nonce. Runs on a worker thread; on refusal the running configuration stays."""
    import asyncio

    async def deploy_verified(req: dict) -> dict:
        if daemon.hotswap is None or daemon.measurements is None:
            return {"ok": False, "error": "the daemon is not running its loop yet"}
        try:
            return await asyncio.to_thread(_load_verified, daemon, req)
        except Exception as exc:  # anything: answer, keep serving; what ran before still runs
            daemon.log.error("deploy refused; the running configuration stays", error=str(exc).splitlines()[0])
            return {"ok": False, "error": f"refused, the running configuration stays: {exc}"}

    return {"deploy_verified": deploy_verified}


def _load_verified(daemon, req: dict) -> dict:
    from dataclasses import asdict

    from attestation.deploy import split_events

    from .config import load_config
    from .hotswap import SwapRefused
    from .reload import plan, reload

    path = Path(req["config"])
    nonce = bytes.fromhex(req["nonce"])
    cfg = load_config(path, daemon.config_overrides)  # the daemon's own overrides, as at its start
    events = config_events(cfg, path)
    approved, _ = split_events(events)
    if approved != [tuple(e) for e in req["approved_events"]]:
        raise SwapRefused("the model or modules changed between `sitsctl deploy`'s checks and loading them")
    plan(daemon.cfg, cfg)  # ReloadRefused now, before anything is swapped, if the config needs a restart
    st = daemon.loop.stage_set
    running = {m.stage: m for m in (st.pre, st.post) if m is not None}
    wanted = {kind.split(":", 1)[1]: (name, sha) for kind, name, sha in approved if kind.startswith("module:")}
    if set(running) != set(wanted):
        raise SwapRefused(f"modules {sorted(running)} run, the config has {sorted(wanted)}: restart sitsd")
    applied = []
    if events[0][2] != st.model_sha256.hex():
        daemon.hotswap.update_model(Path(cfg.model.artifact), events[0][2], respect_pins=False)  # new config's
        applied.append("model")
    for stage, (name, sha) in wanted.items():
        if (running[stage].name, running[stage].sha256) != (name, sha):
            spec = next(m for m in cfg.modules if m.stage == stage)
            daemon.hotswap.update_module(Path(spec.path), spec.name, sha, respect_pins=False)
            applied.append(f"module:{stage}")
    log = daemon.measurements
    config_sha = events[-1][2]
    last_config = next((e for e in reversed(log.events) if e.kind == "config"), None)
    if last_config is None or (last_config.name, last_config.sha256) != (path.name, config_sha):
        out = reload(daemon, path, daemon.config_overrides)
        if not out.get("reloaded"):
            raise SwapRefused(out.get("error", "config refused"))
        daemon.config_path = path
        log.record("config", path.name, config_sha)
        applied.append("config")
    log.record("approval", req["approval_name"], req["approval_sha256"])
    answer = {"applied": applied, "mode": log.mode, "pcr": log.pcr, "initial": log.initial.hex(),
              "events": [asdict(e) for e in log.events], "boot_events": [list(e) for e in events], "quote": None}
    if log.tpm is not None:
        q, ak_pem = log.tpm.quote(daemon.cfg.attestation.ak_handle, nonce)
        answer["quote"] = {"attest": q.attest.hex(), "signature": q.signature.hex()}
        answer["ak_public_pem"] = ak_pem.decode()
    daemon.log.info("deployment loaded", applied=applied, pcr=log.pcr, value=log.value.hex())
    return answer
