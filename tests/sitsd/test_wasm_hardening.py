"""The WASM host against what a module (or the model before it) can do to the daemon: grow tables without
bound, feed a NaN into its state, outlive its engine at interpreter exit; the parameter blocks of the demo
modules really used; the .cwasm cache after a crash in the middle of a write; the engine built from the very
settings the cache key covers."""
import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from sitsd.wasm import Limits, ModuleTrap, WasmError, WasmHost

from ..conftest import REPO
from .test_loop import NOMINAL, frame
from .test_wasm import MODULES, build_without_rate_limits, reference_post, reference_pre

HEADER_1_2 = r'"\01\00\00\00" "\01\00\00\00" "\02\00\00\00" "\00\00\00\00"'  # abi 1, n_in 1, n_out 2


@pytest.fixture
def host(tmp_path):
    h = WasmHost(tmp_path / "cache")
    yield h
    h.close()


def write_module(directory, stem, wat, steps, tolerance=0.0):
    (directory / f"{stem}.wat").write_text(wat)
    (directory / f"{stem}.golden.json").write_text(json.dumps({"steps": steps, "tolerance": tolerance}))
    return directory / f"{stem}.wat"


# --- tables -------------------------------------------------------------------------------------------------------

TABLE_GROWER = f'''(module
  (memory (export "memory") 1)
  (table $t 0 funcref)
  (data (i32.const 0) {HEADER_1_2})
  (func (export "version") (result i32) (i32.const 1))
  (func (export "selftest") (result i32) (i32.const 0))
  ;; grows its table by input[0] elements; outputs what table.grow returned and the table's size after
  (func (export "process") (result i32)
    (f64.store (i32.const 0xB00)
      (f64.convert_i32_s (table.grow $t (ref.null func) (i32.trunc_f64_s (f64.load (i32.const 0x900))))))
    (f64.store (i32.const 0xB08) (f64.convert_i32_u (table.size $t)))
    (i32.const 0)))'''


TABLE_LIMIT = 10_000  # Limits.table_elements, wasm_modules/ABI.md


def test_table_growth_past_the_limit_returns_minus_one_and_the_table_stays_bounded(host, tmp_path):
    limit = TABLE_LIMIT
    # golden vectors on the canary: 400,000 elements at once are refused (-1, size 0); 1,000 are granted
    src = write_module(tmp_path, "grower", TABLE_GROWER, [
        {"in": [400_000.0], "out": [-1.0, 0.0]}, {"in": [1000.0], "out": [0.0, 1000.0]}])
    v = host.load("grower", "pre", src, 1, 2)
    inst = v.instance  # warmed with step 0: the table is still empty
    results = []
    for _ in range(3 * limit // 1000):  # 1,000 more each call, three times as many calls as the limit allows
        inst.input[0] = 1000.0
        inst.process()
        results.append(int(inst.output[0]))
        assert inst.output[1] <= limit
    assert results[:limit // 1000] == list(range(0, limit, 1000))  # granted up to the limit, then refused
    assert set(results[limit // 1000:]) == {-1} and inst.output[1] == limit
    assert Limits().table_elements == limit


def test_a_module_declaring_a_table_past_the_limit_is_refused_at_load(host, tmp_path):
    wat = TABLE_GROWER.replace("(table $t 0 funcref)", f"(table $t {TABLE_LIMIT + 1} funcref)")
    src = write_module(tmp_path, "big_table", wat, [{"in": [0.0], "out": [0.0, 10_001.0]}])
    with pytest.raises(WasmError, match="cannot instantiate.*table"):
        host.load("big_table", "pre", src, 1, 2)


# --- non-finite values --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stem,stage,n", [("pre_filter", "pre", 6), ("post_command", "post", 1)])
def test_a_nan_input_gives_a_nonfinite_trap_once_and_the_module_goes_on(host, stem, stage, n):
    inst = host.load(stem, stage, MODULES / f"{stem}.wat", n, n).instance
    x = np.asarray(NOMINAL[:n] if n == 6 else [0.01])
    inst.input[:] = x
    inst.process()
    bad = x.copy()
    bad[-1] = np.nan
    inst.input[:] = bad
    with pytest.raises(ModuleTrap, match="non-finite output") as err:
        inst.process()
    assert err.value.code == "nonfinite" and inst._header[3] == 1  # the host resets the state, as after a trap
    inst.input[:] = x
    inst.process()  # the filter restarted at the input: no NaN left in the state
    assert np.array_equal(inst.output, x)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_the_demo_modules_keep_their_state_through_a_nonfinite_input(host, bad):
    """Even where nothing reset them (the host does), the modules never take a NaN or an infinity into their
    state: they output NaN for that call and go on from the state before it."""
    post = host.load("post_command", "post", MODULES / "post_command.wat", 1, 1).instance
    for x, want in ((0.0, 0.0), (0.2, 0.05)):
        post.input[0] = x
        post.process()
        assert post.output[0] == pytest.approx(want)
    post.input[0] = bad
    with pytest.raises(ModuleTrap) as err:
        post.process()
    assert err.value.code == "nonfinite" and np.isnan(post.output[0])
    post._header[3] = 0  # undo the host's reset: what does the module itself carry on with?
    post.input[0] = 0.2
    post.process()
    assert post.output[0] == pytest.approx(0.1)  # 0.05 + max_step: the rate shaping went on from 0.05

    pre = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6).instance
    x = np.asarray(NOMINAL[:6])
    pre.input[:] = x
    pre.process()
    y = x.copy()
    y[3] = bad  # force: alpha 0.5
    pre.input[:] = y
    with pytest.raises(ModuleTrap):
        pre.process()
    assert np.isnan(pre.output[3]) and np.array_equal(np.delete(pre.output, 3), np.delete(x, 3))
    pre._header[3] = 0
    z = x.copy()
    z[3] += 100.0
    pre.input[:] = z
    pre.process()
    assert pre.output[3] == pytest.approx(x[3] + 50.0)  # the low-pass went on from x[3]


def test_a_nonfinite_post_input_is_refused_before_the_call(host):
    inst = host.load("post_command", "post", MODULES / "post_command.wat", 1, 1).instance
    inst.input[0] = 0.02
    inst.process()
    inst.input[0] = np.nan
    with pytest.raises(ModuleTrap, match="non-finite input") as err:
        inst.check_input()
    assert err.value.code == "nonfinite"
    inst.input[0] = 0.03
    inst.check_input()  # finite: nothing to say


def test_one_nan_from_the_model_fails_safe_for_that_frame_only(host):
    """The reviewer's case: the model returns NaN on one frame. That frame gets the fail-safe command and a
    `module` alert; the post module never sees the NaN, and every later frame gets the model's command again."""
    loop, sent, verifier = build_without_rate_limits(deadline_ms=500.0)
    pre = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
    post = host.load("post_command", "post", MODULES / "post_command.wat", 1, 1)
    loop.stage_set.pre, loop.stage_set.post = pre, post
    model, calls = loop.stage_set.model, []
    run = model.run

    def run_nan_once():
        calls.append(1)
        out = run()
        return np.full_like(out, np.nan) if len(calls) == 3 else out

    model.run = run_nan_once
    for k in range(1, 9):
        loop.step(frame(k))
    envs = [verifier.verify(o.envelope).command for o in sent]
    assert [e.failsafe for e in envs] == [False, False, True, False, False, False, False, False]
    assert all(np.isfinite(e.values).all() for e in envs)
    assert loop.counters.module_traps == 1 and post.traps == 1 and pre.traps == 0
    alerts = [a for a in loop.alerts if a[1] == "module"]
    assert len(alerts) == 1 and "non-finite input" in alerts[0][2]
    assert loop.stage_set.faults == 1  # a fault of the running set (its model), not a preempted call


# --- the epoch ticker and interpreter exit ------------------------------------------------------------------------

EXIT_WITH_AN_OPEN_HOST = '''
import sys
from sitsd.wasm import WasmHost
host = WasmHost(sys.argv[1], native_ticker=True)
finalizer = getattr(host._ticker, "_finalizer", None)
if sys.argv[2] == "no-atexit" and finalizer is not None:  # only the native Ticker's reference to the engine protects it
    finalizer.atexit = False
def fail(h):
    raise RuntimeError("an uncaught exception with the WasmHost open")
fail(host)
'''


@pytest.mark.parametrize("mode", ["atexit", "no-atexit"])
def test_an_uncaught_exception_with_an_open_host_exits_1_not_sigsegv(tmp_path, mode):
    """At exit the interpreter freed wasmtime's Engine (Engine.__del__) while the native ticker thread still
    incremented its epoch through the raw pointer: SIGSEGV (rc -11) every time. Now the Ticker holds the engine
    until it is joined, and the host's ticker stops at exit before the interpreter tears objects down."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_WITH_AN_OPEN_HOST)
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), mode], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
        assert "RuntimeError: an uncaught exception with the WasmHost open" in proc.stderr


def test_the_native_ticker_holds_its_engine_until_joined_and_ticks_a_period_apart():
    from sitsd import _native
    from sitsd.wasm.engine import EpochTicker, make_engine

    engine = make_engine()
    ticker = EpochTicker(engine, 0.0002, native=True)
    assert ticker._ticker.owner is engine
    while ticker.ticks < 20:
        time.sleep(0.001)
    ticker.close()
    # the shortest wake-to-wake time between two ticks, measured by the thread: never below the period, however
    # late a wake-up was (the old schedule caught up after one: the next tick came early)
    assert ticker._ticker.min_gap_ns >= 200_000
    assert ticker._ticker.owner is None  # dropped once the thread was joined
    # the schedule itself: a period after the later of (scheduled, done)
    assert _native.next_wake(1_000_000, 1_000_000 + 150_000, 200_000) == 1_350_000  # late: from when it was done
    assert _native.next_wake(1_000_000, 999_000, 200_000) == 1_200_000


# --- parameter blocks ---------------------------------------------------------------------------------------------

PRE_PARAMS = {0x100: [2.0, 0.5, 1000.0, 0.001, 3.0, -1.5],  # scale
              0x300: [0.1, -2.0, 5.0, 100.0, -7.0, 0.25],  # offset
              0x500: [1.0, 0.3, 0.7, 0.5, 0.9, 0.2]}  # alpha
POST_PARAMS = {0x100: [0.8], 0x300: [0.01], 0x500: [0.03]}  # gain, offset, max_step


def outputs_with_parameters(inst, params, inputs):
    """The module's outputs for `inputs` from a fresh state, with its parameter block rewritten to `params`."""
    for offset, values in params.items():
        inst.memory[offset:offset + 8 * len(values)].view(np.float64)[:] = values
    assert inst.selftest() == 0  # the parameters are valid ones
    inst.reset()
    out = []
    for x in inputs:
        inst.input[:] = x
        inst.process()
        out.append(inst.output.copy())
    return np.asarray(out)


def with_parameters_matches_reference(host, src):
    golden = json.loads(src.with_name(src.stem + ".golden.json").read_text())
    inputs = [s["in"] for s in golden["steps"]]
    if golden["n_in"] == 6:
        inst = host.load("pre_filter", "pre", src, 6, 6).instance
        want = reference_pre(inputs, *(np.asarray(PRE_PARAMS[k]) for k in (0x100, 0x300, 0x500)))
        got = outputs_with_parameters(inst, PRE_PARAMS, inputs)
    else:
        inst = host.load("post_command", "post", src, 1, 1).instance
        want = reference_post(inputs, *(np.asarray(POST_PARAMS[k]) for k in (0x100, 0x300, 0x500)))
        got = outputs_with_parameters(inst, POST_PARAMS, inputs)
    return np.allclose(got, want, rtol=1e-12, atol=1e-12)


SCALE_OFFSET = ("(local.set $u (f64.add (f64.mul (f64.load offset=0x100 (local.get $o)) (f64.load offset=0x900 "
                "(local.get $o)))\n                               (f64.load offset=0x300 (local.get $o))))")
MUTANTS = {  # what /tmp/review_wasm/p1.py showed passing the golden vectors (all with scale/gain 1, offset 0)
    "pre_filter-ignores-scale-and-offset": ("pre_filter", SCALE_OFFSET, "(local.set $u (f64.load offset=0x900 (local.get $o)))"),
    "post_command-ignores-gain-and-offset": ("post_command", SCALE_OFFSET,
                                             "(local.set $u (f64.load offset=0x900 (local.get $o)))"),
    "pre_filter-ignores-offset": ("pre_filter", SCALE_OFFSET, SCALE_OFFSET.replace(
        "(f64.load offset=0x300 (local.get $o))", "(f64.const 0)")),
    "post_command-hard-codes-max_step": ("post_command", "(local.set $s (f64.load offset=0x500 (local.get $o)))",
                                         "(local.set $s (f64.const 0.05))"),
}


@pytest.mark.parametrize("stem", ["pre_filter", "post_command"])
def test_the_demo_modules_follow_the_reference_with_nontrivial_parameters(host, stem):
    assert with_parameters_matches_reference(host, MODULES / f"{stem}.wat")


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_module_ignoring_its_parameters_passes_the_golden_vectors_but_not_the_parameter_check(host, tmp_path,
                                                                                                 mutant):
    stem, old, new = MUTANTS[mutant]
    src = (MODULES / f"{stem}.wat").read_text()
    assert old in src
    (tmp_path / f"{stem}.wat").write_text(src.replace(old, new))
    shutil.copy(MODULES / f"{stem}.golden.json", tmp_path)
    # loads: its golden vectors use scale/gain 1 and offset 0, where the mutant computes the same
    assert not with_parameters_matches_reference(host, tmp_path / f"{stem}.wat")


# --- the .cwasm cache after a crash -------------------------------------------------------------------------------

def test_cwasm_code_without_its_record_is_an_ordinary_miss(host):
    v = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
    code_path, meta_path = host.cache.paths(v.sha256)
    meta_path.unlink()  # as a crash between the two writes left it
    again = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
    assert again.origin == "compiled" and again.cache_refused is None  # recompiled, no tampering reported
    assert meta_path.is_file() and host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6).origin == \
        "cwasm cache"


def test_a_crash_before_the_record_is_written_leaves_a_miss_not_a_tamper_alert(host, monkeypatch):
    import hashlib
    import os

    from sitsd.wasm import cache, read_source

    src = MODULES / "post_command.wat"
    code_path, meta_path = host.cache.paths(hashlib.sha256(read_source(src)).hexdigest())
    done, replace = [], os.replace

    def crash_at_the_record(src, dst):
        if str(dst).endswith(".json"):
            raise OSError(28, "No space left on device")  # the process died here, as far as the disk is concerned
        done.append(str(dst))
        replace(src, dst)

    monkeypatch.setattr(cache.os, "replace", crash_at_the_record)
    crashed = host.load("post_command", "post", src, 1, 1)  # the first load writes the entry: code, then record
    monkeypatch.undo()
    assert done == [str(code_path)] and code_path.is_file() and not meta_path.exists()
    assert "not cached" in crashed.origin
    assert not list(code_path.parent.glob("*.tmp*"))  # the record's temporary file went with the failed write
    after = host.load("post_command", "post", src, 1, 1)
    assert after.origin == "compiled" and after.cache_refused is None
    assert host.load("post_command", "post", src, 1, 1).origin == "cwasm cache"  # the entry is whole now


# --- the engine settings ------------------------------------------------------------------------------------------

def test_the_engine_is_built_from_the_settings_the_cache_key_covers(monkeypatch):
    import wasmtime

    from sitsd.wasm import engine

    store = wasmtime.Store(engine.make_engine())
    store.set_fuel(5)  # consume_fuel, from ENGINE_SETTINGS
    assert store.get_fuel() == 5
    before = engine.engine_fingerprint()
    monkeypatch.setitem(engine.ENGINE_SETTINGS, "consume_fuel", False)
    assert engine.engine_fingerprint() != before  # the cache key follows the dict ...
    with pytest.raises(wasmtime.WasmtimeError, match="fuel"):
        wasmtime.Store(engine.make_engine()).set_fuel(5)  # ... and so does the engine
    monkeypatch.setitem(engine.ENGINE_SETTINGS, "consume_fuell", True)
    with pytest.raises(RuntimeError, match="no setting 'consume_fuell'"):
        engine.make_engine()

