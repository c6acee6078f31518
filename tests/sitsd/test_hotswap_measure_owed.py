"""A rollback goes ahead when its measurement fails (it leaves a version that faulted or that the operator wants
gone); its events are then owed: updates are refused until they are measured, and the health check measures them
as soon as the log can be written, so the log (and a compaction, which re-measures what the log says runs) names
what runs. On the real loop, wasmtime and a software-PCR measurement log whose writes fail while `broken` is set
(a full disk or a TPM that stopped answering, at the call the daemon makes)."""
import pytest

from attestation.measurement import MeasurementLog, measured_state, replay_file

from .test_hotswap import host, module_versions, with_modules  # noqa: F401 (host: a fixture)
from .test_loop import frame
from .test_wasm import build_without_rate_limits


class FlakyLog:
    def __init__(self, path):
        self.log, self.broken = MeasurementLog(path), False

    def record(self, kind, name, sha):
        if self.broken:
            raise OSError(28, "No space left on device")
        return self.log.record(kind, name, sha)


def test_an_unmeasured_rollback_is_measured_once_the_log_works_again(host, tmp_path):
    loop, sent, verifier = build_without_rate_limits(deadline_ms=500.0)
    hs = with_modules(loop, host)
    hs.pickup_timeout_s = 0.01
    log = FlakyLog(tmp_path / "measurements.jsonl")
    hs.measure = log.record
    st = loop.stage_set
    log.record("model", "m.onnx", st.model_sha256.hex())
    log.record("module:pre", st.pre.name, st.pre.sha256)
    v1, v2 = module_versions(tmp_path, "pre_filter")
    first_pre = st.pre
    hs.update_module(v2)
    assert measured_state((e.kind, e.name, e.sha256) for e in log.log.events).modules["pre"][1] != first_pre.sha256
    log.broken = True
    out = hs.rollback("pre_filter")  # goes ahead: the operator wants v2 gone
    assert out["action"] == "rollback" and loop.stage_set.pre is first_pre
    assert any("measuring it failed" in a[2] for a in loop.alerts if a[1] == "rollback")
    assert hs.watching  # the owed events keep the health check running
    with pytest.raises(Exception, match="could not measure"):  # an update would measure on top of a stale log
        hs.update_module(v1)
    hs.check_health()  # still broken: owed stays
    assert hs._owed
    log.broken = False
    loop.step(frame(1))
    hs.check_health()
    assert not hs._owed and not hs.watching
    state = measured_state((e.kind, e.name, e.sha256) for e in log.log.events)
    assert state.modules["pre"] == (first_pre.name, first_pre.sha256)  # the log names what runs
    assert log.log.events[-1].kind == "rollback:module:pre"
    assert replay_file(tmp_path / "measurements.jsonl") == log.log.value
    assert any("caught up" in a[2] for a in loop.alerts if a[1] == "rollback")
