"""A model runs only under config rules (signals, constraints, safety limits) it was proven inside. The rules
change live (reload, update --config); a model update proven under the old ones, and rollbacks to a model that ran
under the old ones, must be proven again. On the real loop, wasmtime and ONNX Runtime; the rules are an opaque value
here (`HotSwap.rules`), the proof the real in-process bound check where it must pass and a recording check that
refuses where the demo model (proven inside every limit the example config allows) cannot be made to fail."""
import hashlib
import threading
from types import SimpleNamespace

import pytest

from sitsd.config import load_config
from sitsd.hotswap import HotSwap, SwapRefused, model_bounds_check

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG
from .test_hotswap import host, model_variant, with_modules  # noqa: F401 (host: a fixture)
from .test_hotswap_watch import TRAP, misbehaving_pre
from .test_loop import frame
from .test_wasm import build_without_rate_limits


class Rules:
    """The running config's rules as HotSwap sees them, and a reload that proves the running model (as
    sitsd.reload.swap_locked marks it)."""

    def __init__(self, hs: HotSwap):
        self.hs, self.value = hs, "rules-1"
        hs.rules = lambda: self.value
        hs.mark_proven(hs.loop.stage_set.model_sha256, self.value)  # the deployment's model, as attach does

    def reload(self, value: str) -> None:
        with self.hs._lock:
            self.value = value
            self.hs.mark_proven(self.hs.loop.stage_set.model_sha256, value)


def swapper(host, check):
    loop, sent, verifier = build_without_rate_limits(deadline_ms=500.0)
    hs = with_modules(loop, host)
    hs.bounds_check = check
    hs.pickup_timeout_s = 0.01
    return loop, hs, Rules(hs)


def test_a_model_rollback_after_the_rules_changed_proves_the_old_model_first(host, tmp_path):
    cfg = load_config(EXAMPLE_CONFIG)
    real = model_bounds_check(lambda: cfg, isolate=False)  # the real proof, in this process
    calls = []

    def check(path, sha):
        calls.append(sha)
        return real(path, sha)

    loop, hs, rules = swapper(host, check)
    first = loop.stage_set.model_sha256
    hs.update_model(model_variant(tmp_path / "b.onnx"))
    assert len(calls) == 1 and hs.proven_now(loop.stage_set.model_sha256)
    rules.reload("rules-2")  # proves the running model (the variant) only
    assert not hs.proven_now(first)
    out = hs.rollback("model")
    assert calls[-1] == first.hex() and len(calls) == 2, calls  # proven before it ran again
    assert loop.stage_set.model_sha256 == first and "bounds" in out and hs.proven_now(first)
    hs.rollback("model")  # back to the variant: proven under rules-2 by the reload, no new proof
    assert len(calls) == 2


def test_a_rollback_to_a_model_that_fails_the_proof_is_refused_and_nothing_changes(host, tmp_path):
    refuse = set()

    def check(path, sha):
        return (sha not in refuse, "demo report: output 0 reaches 9.5, limit 9")

    loop, hs, rules = swapper(host, check)
    first = loop.stage_set.model_sha256
    hs.update_model(model_variant(tmp_path / "b.onnx"))
    running, pcr_events = loop.stage_set, len(hs.history)
    rules.reload("rules-2")
    refuse.add(first.hex())
    for component in ("model", None):
        with pytest.raises(SwapRefused, match="not proven inside the running config's limits") as e:
            hs.rollback(component)
        assert "output 0 reaches 9.5" in str(e.value)
        assert loop.stage_set is running and len(hs.history) == pcr_events


def test_a_model_update_proven_before_the_rules_changed_is_refused(host, tmp_path):
    """The reload lands while the update's proof runs: the update was proven inside rules that no longer run."""
    proving, go = threading.Event(), threading.Event()

    def check(path, sha):
        proving.set()
        go.wait(10)
        return True, "proven"

    loop, hs, rules = swapper(host, check)
    before = loop.stage_set
    out = {}

    def update():
        try:
            hs.update_model(model_variant(tmp_path / "b.onnx"))
        except SwapRefused as exc:
            out["refused"] = str(exc)

    t = threading.Thread(target=update)
    t.start()
    assert proving.wait(10)
    rules.reload("rules-2")  # under the swap lock, as a reload's commit is
    go.set()
    t.join(20)
    assert "changed while it was being proven" in out.get("refused", ""), out
    assert loop.stage_set is before
    # the proof read the config after the reload: it is recorded under neither rule set
    variant = hashlib.sha256((tmp_path / "b.onnx").read_bytes()).digest()
    assert not hs.proven_for(variant, "rules-1") and not hs.proven_for(variant, "rules-2")


def test_the_automatic_rollback_never_runs_a_model_unproven_for_the_running_rules(host, tmp_path):
    """model update (generation with the variant), rules change, then a module update inside the model's watch
    traps: the fallback is the set with the first model, not proven under the new rules. The set keeps running
    (its traps send the fail-safe) and a `rollback` alert says why."""
    loop, hs, rules = swapper(host, lambda path, sha: (True, "proven"))
    hs.update_model(model_variant(tmp_path / "b.onnx"))
    rules.reload("rules-2")
    hs.update_module(misbehaving_pre(tmp_path / "bad"))
    bad = loop.stage_set
    loop.step(frame(1, TRAP))
    assert bad.watch_traps == 1
    assert hs.check_health() is None
    assert loop.stage_set is bad and not hs.watching
    alert = [a for a in loop.alerts if a[1] == "rollback"][-1][2]
    assert "automatic rollback" in alert and "not proven inside the running config's limits" in alert, alert
    loop.step(frame(2))
    assert loop.stage_set is bad  # still runs; an operator's rollback would prove the old model first


def test_the_deployment_model_counts_as_proven_and_no_config_means_no_rules(host):
    loop, sent, verifier = build_without_rate_limits(deadline_ms=500.0)
    hs = with_modules(loop, host)
    assert hs.proven_now(b"\0" * 32)  # no bound check and no rules: the benchmark's and unit tests' HotSwap
    hs.bounds_check = lambda path, sha: (True, "")
    Rules(hs)
    assert hs.proven_now(loop.stage_set.model_sha256) and not hs.proven_now(b"\0" * 32)
    assert DEMO_MODEL.exists()


def _configs():
    """The example config, and one whose actuator limits are 10% narrower (other proven rules)."""
    from sitsd.reload import rules_of

    cfg1 = load_config(EXAMPLE_CONFIG)
    acts = [dict(a.model_dump(), max=a.max * 0.9) for a in cfg1.safety.actuators]
    cfg2 = load_config(EXAMPLE_CONFIG, {"safety": {**cfg1.safety.model_dump(), "actuators": acts}})
    assert rules_of(cfg1) != rules_of(cfg2)
    return cfg1, cfg2


class _Log:
    def __getattr__(self, name):
        return lambda *a, **k: None


def _daemon(loop, hs, cfg):
    from sitsd.reload import rules_of

    daemon = SimpleNamespace(cfg=cfg, loop=loop, hotswap=hs, measurements=None, _reload_lock=threading.RLock(),
                             config_path=EXAMPLE_CONFIG, log=_Log())
    hs.rules = lambda: rules_of(daemon.cfg)
    hs.mark_proven(loop.stage_set.model_sha256, rules_of(cfg))
    return daemon


def test_rules_are_applied_only_while_the_model_they_were_proven_for_runs(host, tmp_path):
    """reload.swap_locked: a model swap between the proof and the commit refuses the new rules; a rollback's
    owed measurement goes before them, and while it cannot be written they are refused."""
    from sitsd.reload import ReloadRefused, rules_of, swap_locked

    cfg1, cfg2 = _configs()
    loop, hs, _ = swapper(host, lambda path, sha: (True, "proven"))
    daemon = _daemon(loop, hs, cfg1)
    proven_set = loop.stage_set  # the proof ran for this set's model ...
    hs.update_model(model_variant(tmp_path / "b.onnx"))  # ... then a model swap landed
    with pytest.raises(ReloadRefused, match="the model was swapped while the new rules were being proven"):
        with swap_locked(daemon, proven_set):
            daemon.cfg = cfg2
    assert daemon.cfg is cfg1
    with swap_locked(daemon, loop.stage_set):  # proven for the model that runs: applied and recorded
        daemon.cfg = cfg2
    assert hs.proven_for(loop.stage_set.model_sha256, rules_of(cfg2))
    events = []

    def measure(*event):
        if failing:
            raise OSError(28, "No space left on device")
        events.append(event)

    failing, hs.measure = True, measure
    hs._owed.append(("rollback:model", "a.onnx", "ab" * 32))
    with pytest.raises(ReloadRefused, match="lacks a rollback that could not be measured"):
        with swap_locked(daemon, None):
            daemon.cfg = cfg1
    assert daemon.cfg is cfg2
    failing = False
    with swap_locked(daemon, None):
        events.append(("config", "x", "y"))
    assert events == [("rollback:model", "a.onnx", "ab" * 32), ("config", "x", "y")] and not hs._owed


def test_a_deploy_undo_proves_the_old_rules_for_the_model_that_runs_now(host, tmp_path):
    """A deploy's live reload put rules cfg2 in; an operator then updated the model (proven under cfg2 only); the
    deploy is not confirmed and undone: cfg1 comes back only once the running model is proven inside it (the
    real proof, in the proof worker)."""
    from sitsd.deploy import _restore_config, _Step, _undo
    from sitsd.reload import rules_of

    cfg1, cfg2 = _configs()
    calls = []
    loop, hs, _ = swapper(host, lambda path, sha: (calls.append(sha) or True, "proven"))
    daemon = _daemon(loop, hs, cfg1)
    _restore_config(daemon, cfg2, EXAMPLE_CONFIG, None, None)  # the deploy's reload (its proof not the point here)
    step = _Step("config", daemon.cfg, previous=(cfg1, EXAMPLE_CONFIG, None))
    hs.update_model(model_variant(tmp_path / "b.onnx"))
    b = loop.stage_set.model_sha256
    assert not hs.proven_for(b, rules_of(cfg1))
    restored, not_restored = _undo(daemon, [step], "not confirmed")
    assert restored == ["config"] and not not_restored
    assert daemon.cfg is cfg1 and loop.stage_set.model_sha256 == b
    assert hs.proven_now(b) and hs.proven_for(b, rules_of(cfg1))  # proven by the undo, not assumed
