"""The health watch after a swap, on the real loop and wasmtime: a trap anywhere in the first WATCH_FRAMES frames
rolls back however late the check looks; an update made inside another's watch leaves the last healthy set as the
rollback target; an update never builds on a set that is failing its watch; a model's preparation (its bound
proof) does not hold the swap lock, so a trapping set rolls back meanwhile; the automatic rollback never waits for
frames; a per-component rollback that would change nothing is refused."""
import shutil
import threading
import time

import pytest

from sitsd import hotswap
from sitsd.hotswap import WATCH_FRAMES, HotSwap, SwapRefused, SwapRefusedAfterRollback

from ..conftest import DEMO_MODEL
from .test_hotswap import host, model_variant, module_versions, with_modules  # noqa: F401 (host: a fixture)
from .test_loop import NOMINAL, frame
from .test_wasm import MISBEHAVE, UNREACHABLE, build_without_rate_limits

TRAP = list(NOMINAL)
TRAP[0] = UNREACHABLE  # misbehave.wat runs `unreachable` for this entry thickness


def misbehaving_pre(directory):
    """misbehave.wat under the pre module's file name (with its golden vectors): it passes its self-test and
    traps in the loop on the TRAP frame."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(MISBEHAVE, directory / "pre_filter.wat")
    shutil.copy(MISBEHAVE.with_name("misbehave.golden.json"), directory / "pre_filter.golden.json")
    return directory / "pre_filter.wat"


def watched_loop(host):
    loop, sent, verifier = build_without_rate_limits(deadline_ms=500.0)  # about counts, not time
    hs = with_modules(loop, host)
    hs.pickup_timeout_s = 0.01  # frames are stepped by the test, after the update returns
    return loop, sent, verifier, hs


def test_a_trap_late_in_the_watch_rolls_back_even_when_the_check_comes_after_the_window(host, tmp_path):
    """Housekeeping checks every 50 ms (~50 frames at 1 kHz): a trap on frame WATCH_FRAMES - 9 seen by a check at
    frame WATCH_FRAMES + 11 still rolls back, and the set is not settled as having passed its watch."""
    loop, sent, verifier, hs = watched_loop(host)
    first = loop.stage_set
    settled = []
    hs.on_settled = lambda st, why: settled.append((st.generation, why))
    hs.update_module(misbehaving_pre(tmp_path / "bad"))
    bad = loop.stage_set
    seq = 0
    for _ in range(WATCH_FRAMES - 10):
        seq += 1
        loop.step(frame(seq))
    assert hs.check_health() is None and bad.traps == 0
    seq += 1
    loop.step(frame(seq, TRAP))  # frame WATCH_FRAMES - 9 of the new set
    assert verifier.verify(sent[-1].envelope).command.failsafe
    for _ in range(20):
        seq += 1
        loop.step(frame(seq))
    assert bad.frames == WATCH_FRAMES + 11 and bad.traps == 1 and bad.watch_faults == 1
    back = hs.check_health()
    assert back is not None and back["action"] == "rollback", back
    assert f"1 module trap(s) in the first {WATCH_FRAMES} frames" in back["reason"]
    assert loop.stage_set is first and not hs.watching
    assert [g for g, _ in settled] == [first.generation], settled  # the faulty set was never persisted


def test_a_trap_after_the_watch_window_does_not_roll_back(host, tmp_path):
    loop, sent, verifier, hs = watched_loop(host)
    hs.update_module(misbehaving_pre(tmp_path / "bad"))
    swapped = loop.stage_set
    for seq in range(1, WATCH_FRAMES + 1):
        loop.step(frame(seq))
    loop.step(frame(WATCH_FRAMES + 1, TRAP))  # one frame past the window: the fail-safe and the alert only
    assert swapped.traps == 1 and swapped.watch_traps == 0
    assert hs.check_health() is None and loop.stage_set is swapped and not hs.watching


def test_a_second_update_inside_the_first_watch_rolls_back_to_the_last_healthy_set(host, tmp_path):
    """pre -> a module that traps (not yet triggered), then post -> v2 inside that watch; the trap comes on the
    post update's set: the automatic rollback goes to the set before both, not to the one with the bad pre."""
    loop, sent, verifier, hs = watched_loop(host)
    first = loop.stage_set
    hs.update_module(misbehaving_pre(tmp_path / "bad"))
    with_bad_pre = loop.stage_set
    post_v2 = module_versions(tmp_path / "post", "post_command", versions=(2,))[0]
    hs.update_module(post_v2)
    assert loop.stage_set.pre is with_bad_pre.pre and loop.stage_set.post.version == 2
    loop.step(frame(1, TRAP))
    back = hs.check_health()
    assert back is not None and back["generation"] == first.generation, back
    assert loop.stage_set is first and not hs.watching
    loop.step(frame(2, TRAP))  # the config's pre_filter does not trap on it
    assert first.traps == 0 and not verifier.verify(sent[-1].envelope).command.failsafe
    assert loop.alerts[-1][1] != "module"
    rollback_alerts = [a for a in loop.alerts if a[1] == "rollback"]
    assert len(rollback_alerts) == 1 and f"to generation {first.generation}" in rollback_alerts[0][2]


def test_an_update_is_refused_while_the_running_set_fails_its_watch_and_that_set_rolls_back(host, tmp_path):
    """The health check runs every 50 ms; an update that comes first must not build on a set that trapped."""
    loop, sent, verifier, hs = watched_loop(host)
    first = loop.stage_set
    hs.update_module(misbehaving_pre(tmp_path / "bad"))
    loop.step(frame(1, TRAP))  # trapped; no health check yet
    post_v2 = module_versions(tmp_path / "post", "post_command", versions=(2,))[0]
    with pytest.raises(SwapRefusedAfterRollback, match=r"failed its health watch \(1 module trap.*rolled back to generation 0"
                                          r".*send it again"):
        hs.update_module(post_v2)
    assert loop.stage_set is first and loop.stage_set.post.version == 1
    rec = hs.update_module(post_v2)  # again: on the set that runs now
    assert loop.stage_set.pre is first.pre and loop.stage_set.post.version == 2 and rec["previous_generation"] == 0


def test_a_model_being_proven_does_not_hold_off_the_rollback_of_a_trapping_set(host, tmp_path):
    """The bound proof of a model can take minutes; it runs without the swap lock, so the health check rolls a
    trapping module set back meanwhile, and the model then swaps onto the set that runs by then."""
    loop, sent, verifier, hs = watched_loop(host)
    first = loop.stage_set
    proving, release = threading.Event(), threading.Event()

    def slow_proof(path, sha256):  # stands in for the proof worker's wait (ModelBoundsCheck's signature)
        proving.set()
        assert release.wait(60), "the test never released the proof"
        return True, "proven (test)"

    hs.bounds_check = slow_proof
    hs.update_module(misbehaving_pre(tmp_path / "bad"))
    result = {}
    worker = threading.Thread(target=lambda: result.update(hs.update_model(model_variant(tmp_path / "m.onnx"))))
    worker.start()
    try:
        assert proving.wait(60), "the model's preparation did not reach its proof"
        loop.step(frame(1, TRAP))
        back = hs.check_health()  # does not wait for the swap lock: it must be free during the proof
        assert back is not None and back["generation"] == first.generation, back
        assert loop.stage_set is first
    finally:
        release.set()
        worker.join(60)
    assert result and result["component"] == "model" and result["previous_generation"] == first.generation
    assert loop.stage_set.pre is first.pre and loop.stage_set.model is not first.model


def test_the_automatic_rollback_does_not_wait_for_frames(host, tmp_path):
    """It runs in the daemon's housekeeping (which feeds the watchdog): with frames stopped right after the
    trap it returns at once, its record saying no frame ran on the set yet; an operator's swap waits for one
    up to pickup_timeout_s."""
    loop, sent, verifier, hs = watched_loop(host)
    hs.update_module(misbehaving_pre(tmp_path / "bad"))
    loop.step(frame(1, TRAP))
    hs.pickup_timeout_s = 600.0  # if the rollback waited for a frame, this test would hang, not pass
    t0 = time.monotonic()
    back = hs.check_health()
    assert back is not None and back["swap_frame"] == -1
    assert time.monotonic() - t0 < 60


def test_a_component_rollback_that_would_change_nothing_is_refused(host, tmp_path):
    """After a whole-set rollback the module's prior version is the one running again: `rollback --module` says
    so instead of answering with a swap (and a measurement) that changes nothing."""
    loop, sent, verifier, hs = watched_loop(host)
    first = loop.stage_set
    v2 = module_versions(tmp_path, "post_command", versions=(2,))[0]
    hs.update_module(v2)
    hs.rollback()
    assert loop.stage_set is first
    history = len(hs.history)
    with pytest.raises(SwapRefused, match="nothing to roll back for 'post_command'.*is the one running"):
        hs.rollback("post_command")
    assert loop.stage_set is first and len(hs.history) == history


def test_a_model_rollback_that_would_change_nothing_is_refused(tmp_path):
    from .test_loop import build

    loop, sent, verifier = build()
    hs = HotSwap(loop, None, n_inputs=6, n_outputs=1)
    hs.pickup_timeout_s = 0.01
    first = loop.stage_set
    copy = tmp_path / "copy.onnx"
    shutil.copy(DEMO_MODEL, copy)
    hs.update_model(copy)
    hs.rollback()
    assert loop.stage_set is first
    with pytest.raises(SwapRefused, match="nothing to roll back for the model.*is the one running"):
        hs.rollback("model")


def test_a_preparation_and_a_swap_waiting_for_a_frame_boundary_both_wake_at_it(host):
    """With preparations outside the swap lock, a preparation step and a rollback can wait for the loop's idle
    time at once: they share its one waiter slot, and one frame boundary wakes both (not their timeouts)."""
    loop, sent, verifier, hs = watched_loop(host)
    waited = []
    threads = [threading.Thread(target=lambda: waited.append(hs.between_frames(30.0))) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(hs._waiters.values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(hs._waiters.values()) == 2 and len(hs._waiters) == 1  # both on one event
    loop.frame_boundary()
    for t in threads:
        t.join(60)
    assert len(waited) == 2 and max(waited) < 20e9, waited  # woken by the boundary, not after 30 s
    assert loop.frame_waiter is None and not hs._waiters


def test_a_set_past_its_window_that_the_check_has_not_reached_is_settled_and_becomes_the_fallback(host, tmp_path):
    """The health check may not have run since the set's 200th frame when the next update comes: that update
    settles it (persisted, as the check would have) and a fault of the new set rolls back to it, not further."""
    loop, sent, verifier, hs = watched_loop(host)
    settled = []
    hs.on_settled = lambda st, why: settled.append(st.generation)
    post_v2 = module_versions(tmp_path / "post", "post_command", versions=(2,))[0]
    hs.update_module(post_v2)
    passed = loop.stage_set
    for seq in range(1, WATCH_FRAMES + 31):
        loop.step(frame(seq))
    hs.update_module(misbehaving_pre(tmp_path / "bad"))  # no check_health in between
    assert settled == [passed.generation]
    loop.step(frame(WATCH_FRAMES + 31, TRAP))
    back = hs.check_health()
    assert back is not None and back["generation"] == passed.generation, back
    assert loop.stage_set is passed and loop.stage_set.post.version == 2


def test_the_health_check_never_clears_a_watch_without_the_swap_lock(host, tmp_path):
    """A swap in progress (holding the lock) has made another set run and is about to write that set's watch:
    the check must not clear a watch then (it would clear the new one), only look again later."""
    loop, sent, verifier, hs = watched_loop(host)
    first = loop.stage_set
    hs.update_module(misbehaving_pre(tmp_path / "bad"))
    watch = hs._watch
    with hs._lock:
        loop.stage_set = first  # what an activation does first, before it writes its own watch
        assert hs.check_health() is None
        assert hs._watch is watch
    assert hs.check_health() is None and hs._watch is None  # with the lock free: the stale watch ends


def test_an_update_waits_a_bounded_time_for_another_preparation_then_is_refused(host, tmp_path, monkeypatch):
    loop, sent, verifier, hs = watched_loop(host)
    monkeypatch.setattr(hotswap, "PREP_QUEUE_S", 0.2)
    post_v2 = module_versions(tmp_path / "post", "post_command", versions=(2,))[0]
    with hs._prep_lock:  # another update preparing (a model's proof)
        with pytest.raises(SwapRefused, match="another update is still being prepared after 0.2 s"):
            hs.update_module(post_v2)
    assert loop.stage_set.post.version == 1
    assert hs.update_module(post_v2)["generation"] == loop.stage_set.generation  # once it is done
