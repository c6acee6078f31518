"""A measured config reload (sitsd/reload.py) reads the file once and measures it before it goes live; `sitsctl update
--config` goes through the same path (measured first, config_path set with the rules), and so does the undo of a
config (sitsd/deploy.py _restore_config). A stand-in daemon (no loop thread, no PLC): what is checked is the order of
reading, measuring and swapping."""
from __future__ import annotations

import asyncio
import builtins
import hashlib
import io
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from attestation.measurement import MeasurementError, MeasurementLog
from sitsd.config import load_config
from sitsd.gates import ConstraintGate, SafetyEnvelope

from ..conftest import example_config_data


class _Quiet:
    def __getattr__(self, _name):
        return lambda *a, **k: None


def write(path: Path, drops: int) -> bytes:
    data = example_config_data()
    data["timing"]["max_consecutive_drops"] = drops
    path.write_text(yaml.safe_dump(data))
    return path.read_bytes()


def stand_in(tmp_path: Path, config: Path):
    cfg = load_config(config)
    loop = SimpleNamespace(constraints=ConstraintGate(cfg.signals, cfg.constraints),
                           safety=SafetyEnvelope(cfg.safety.actuators, cfg.model.outputs),
                           ts_gate=SimpleNamespace(window=cfg.timing.replay_window), deadline_ns=0,
                           max_consecutive_drops=cfg.timing.max_consecutive_drops, clock_policy=None)
    log = MeasurementLog(tmp_path / "measurements.jsonl")
    log.record("config", config.name, hashlib.sha256(config.read_bytes()).hexdigest())
    return SimpleNamespace(cfg=cfg, loop=loop, notifier=_Quiet(), log=_Quiet(), reloads=0, measurements=log,
                           status_line=lambda: "", _reload_lock=threading.RLock(), config_path=config,
                           config_overrides={}, hotswap=SimpleNamespace(watch_config=lambda cfg: None),
                           previous_config=None, _alert=lambda *a: None)


def configs(log) -> list[tuple[str, str, str]]:
    return [(e.kind, e.name, e.sha256) for e in log.events if "config" in e.kind]


def test_the_bytes_measured_are_the_bytes_parsed(tmp_path, monkeypatch):
    """The file is replaced between two reads of one reload: the measurement still names the bytes that run."""
    from sitsd.reload import reload

    config = tmp_path / "rolling-mill.yaml"
    write(config, 3)
    daemon = stand_in(tmp_path, config)
    first = write(config, 4)
    other = tmp_path / "other.yaml"
    write(other, 5)
    real_open, reads = builtins.open, []

    def swapping_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file) == config and not set(mode) & set("wax+"):
            reads.append(mode)
            if len(reads) == 2:  # someone replaces the file after the first read
                with real_open(config, "wb") as fh:
                    fh.write(other.read_bytes())
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", swapping_open)
    monkeypatch.setattr(io, "open", swapping_open)
    out = reload(daemon, config, measure=True)
    monkeypatch.undo()
    assert out["reloaded"] and len(reads) == 1, (out, reads)
    assert daemon.cfg.timing.max_consecutive_drops == 4 == daemon.loop.max_consecutive_drops
    assert out["sha256"] == out["measured"]["sha256"] == hashlib.sha256(first).hexdigest()
    assert configs(daemon.measurements)[-1][2] == hashlib.sha256(first).hexdigest()


def _fail_record(log):
    def record(*_a, **_k):
        raise MeasurementError("TPM2_PCR_Extend of PCR 23 failed: the TPM does not answer")

    log.record = record


def test_update_config_is_measured_before_it_goes_live(tmp_path):
    """`sitsctl update --config`: a failed measurement refuses the update with nothing changed (the running rules,
    config_path and the log stay); a measured one runs with config_path set and exactly one config event."""
    from sitsd.hotswap import control_handlers

    config = tmp_path / "rolling-mill.yaml"
    write(config, 3)
    daemon = stand_in(tmp_path, config)
    before_cfg, events_before = daemon.cfg, list(daemon.measurements.events)
    new = tmp_path / "rolling-mill-v2.yaml"
    new_bytes = write(new, 6)
    update = control_handlers(daemon)["update"]
    real_record = daemon.measurements.record
    _fail_record(daemon.measurements)
    out = asyncio.run(update({"config": str(new)}))
    assert out["ok"] is False and "could not measure the config" in out["error"], out
    assert daemon.cfg is before_cfg and daemon.loop.max_consecutive_drops == 3 and daemon.config_path == config
    assert daemon.measurements.events == events_before and daemon.previous_config is None

    daemon.measurements.record = real_record
    out = asyncio.run(update({"config": str(new)}))
    assert out["updated"] and out["sha256"] == hashlib.sha256(new_bytes).hexdigest(), out
    assert daemon.cfg.timing.max_consecutive_drops == 6 and daemon.config_path == new
    assert configs(daemon.measurements)[1:] == [("config", new.name, out["sha256"])]  # measured once
    assert daemon.previous_config[1] == config


def test_a_config_undo_is_measured_before_the_old_rules_run(tmp_path):
    from sitsd.deploy import _restore_config, live_config_sha256

    config = tmp_path / "rolling-mill.yaml"
    write(config, 3)
    daemon = stand_in(tmp_path, config)
    old_cfg = daemon.cfg
    from sitsd.reload import reload

    new = tmp_path / "rolling-mill-v2.yaml"
    write(new, 7)
    assert reload(daemon, new, measure=True, adopt_path=True)["reloaded"] and daemon.config_path == new
    newer_cfg, events_before = daemon.cfg, list(daemon.measurements.events)
    real_record = daemon.measurements.record
    _fail_record(daemon.measurements)
    with pytest.raises(MeasurementError):
        _restore_config(daemon, old_cfg, config, configs(daemon.measurements)[0][1:])
    # not measured, so not restored: the newer rules still run and are what the log says
    assert daemon.cfg is newer_cfg and daemon.config_path == new and daemon.measurements.events == events_before
    daemon.measurements.record = real_record
    _restore_config(daemon, old_cfg, config, configs(daemon.measurements)[0][1:])
    assert daemon.cfg is old_cfg and daemon.config_path == config
    assert configs(daemon.measurements)[-1] == ("rollback:config", *configs(daemon.measurements)[0][1:])
    # an old config that was never measured: the rollback is still measured (no file digest: its live sections')
    _restore_config(daemon, newer_cfg, new, None)
    assert configs(daemon.measurements)[-1] == ("rollback:config", new.name, live_config_sha256(newer_cfg))


def test_reload_plan_refuses_what_only_a_restart_applies():
    """proof (the prover is built at start) and the hardware-stamp conversion (the transport's, from its start)
    cannot change live: a reload that touches them is refused with the list, not reported as applied."""
    from sitsd.config import load_config
    from sitsd.reload import ReloadRefused, plan

    from ..conftest import EXAMPLE_CONFIG

    base = load_config(EXAMPLE_CONFIG)
    assert plan(base, load_config(EXAMPLE_CONFIG, {"timing.ptp": {"policy": "drop"}})) == ["timing"]
    with pytest.raises(ReloadRefused, match="proof"):
        plan(base, load_config(EXAMPLE_CONFIG, {"proof.policy": "off" if base.proof.policy != "off" else "every"}))
    with pytest.raises(ReloadRefused, match="phc_timescale"):
        plan(base, load_config(EXAMPLE_CONFIG, {"timing.ptp": {"phc_timescale": "utc"}}))
