"""The streaming transformer and its stream pool: GQA against numpy attention, the sliding window,
suspend/resume bit-exactness, recovery after a real crash (SIGKILL), RAM with 1,000 streams."""
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ep.kv.codec import PageCodec
from ep.streaming import (PoolConfig, ReferenceStream, StreamingRunner, StreamPool, StreamSpec,
                          reference_attention)

from ..conftest import REPO

SPEC = StreamSpec()
SMALL = PoolConfig(window=24, page_tokens=8, hot_slots=2, warm_pages=2, ring_pages=8)


def frames(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, SPEC.n_inputs)).astype(np.float32)


def test_gqa_equals_numpy_attention_over_an_in_place_buffer():
    heads, kv_heads, hd, cap, past = 4, 2, 16, 40, 29
    f32 = TensorProto.FLOAT
    kv = [1, kv_heads, cap, hd]
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sl", "tl"], ["o", "k_out", "v_out"],
                            domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads)
    g = helper.make_graph([node], "gqa", [
        helper.make_tensor_value_info("q", f32, [1, 1, heads * hd]),
        helper.make_tensor_value_info("k", f32, [1, 1, kv_heads * hd]),
        helper.make_tensor_value_info("v", f32, [1, 1, kv_heads * hd]),
        helper.make_tensor_value_info("pk", f32, kv), helper.make_tensor_value_info("pv", f32, kv),
        helper.make_tensor_value_info("sl", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("tl", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("o", f32, [1, 1, heads * hd]),
         helper.make_tensor_value_info("k_out", f32, kv), helper.make_tensor_value_info("v_out", f32, kv)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    keys = rng.standard_normal(kv).astype(np.float32)
    values = rng.standard_normal(kv).astype(np.float32)
    q, k, v = (rng.standard_normal((1, 1, n * hd)).astype(np.float32) for n in (heads, kv_heads, kv_heads))
    io = sess.io_binding()
    ov_k, ov_v = ort.OrtValue.ortvalue_from_numpy(keys), ort.OrtValue.ortvalue_from_numpy(values)
    out = np.zeros((1, 1, heads * hd), np.float32)
    for name, a in (("q", q), ("k", k), ("v", v), ("sl", np.array([past], np.int32)),
                    ("tl", np.array(past + 1, np.int32))):
        io.bind_cpu_input(name, a)
    io.bind_ortvalue_input("pk", ov_k), io.bind_ortvalue_input("pv", ov_v)
    io.bind_ortvalue_output("k_out", ov_k), io.bind_ortvalue_output("v_out", ov_v)
    io.bind_ortvalue_output("o", ort.OrtValue.ortvalue_from_numpy(out))
    untouched = keys[:, :, past + 1:].copy()
    sess.run_with_iobinding(io)
    # appended in place at position `past`, the rest of the buffer untouched
    np.testing.assert_array_equal(keys[0, :, past], k.reshape(kv_heads, hd))
    np.testing.assert_array_equal(values[0, :, past], v.reshape(kv_heads, hd))
    np.testing.assert_array_equal(keys[:, :, past + 1:], untouched)
    want = reference_attention(q.astype(np.float64), keys[0, :, :past + 1].astype(np.float64),
                               values[0, :, :past + 1].astype(np.float64), heads)
    np.testing.assert_allclose(out.reshape(-1), want, rtol=1e-5, atol=1e-6)


def test_model_matches_the_numpy_reference_through_window_slides(tmp_path):
    ref = ReferenceStream(SPEC)
    with StreamPool(tmp_path, SPEC, SMALL) as pool:
        visible, worst = 0, 0.0
        for f in frames(3 * SMALL.capacity):
            visible = visible - SMALL.page_tokens if visible == SMALL.capacity else visible
            visible += 1  # what attention sees, this token included: a sawtooth window
            want = ref.step(f, visible=visible)
            worst = max(worst, float(np.abs(pool.step(1, f) - want).max()))
        assert pool.tiers.stats["archived"] > 3
    assert worst < 1e-5, worst


@pytest.mark.parametrize("fmt, rel_step", [("int8", 1 / 254), ("float8e4m3fn", 1 / 16)])
def test_evicted_pages_round_trip_through_warm_and_cold(tmp_path, fmt, rel_step):
    cfg = PoolConfig(window=24, page_tokens=8, hot_slots=1, warm_pages=2, ring_pages=16, page_format=fmt)
    with StreamPool(tmp_path, SPEC, cfg) as pool:
        evicted = {}
        for f in frames(120, seed=8):
            st = pool.streams.get(1)
            if st is not None and st.count == cfg.capacity:  # this step slides: remember the oldest page
                evicted[(st.position - st.count) // cfg.page_tokens] = pool.window(1)[:, :, :, :cfg.page_tokens]
            pool.step(1, f)
        where = {}
        for k, want in evicted.items():
            got, where[k] = pool.tiers.page(1, k)
            amax = np.abs(want).max(axis=(3, 4), keepdims=True)
            # int8: half a step of amax/127; fp8 e4m3: 2^-4 relative, plus its smallest subnormal step
            bound = amax / 254 if fmt == "int8" else np.abs(want) * rel_step + amax / 448 * 2.0 ** -9
            assert np.all(np.abs(got - want) <= bound * (1 + 1e-5) + 1e-7), (fmt, k)
        assert set(where.values()) == {"warm", "cold"} and len(evicted) >= 8


def test_suspend_resume_is_bit_exact(tmp_path):
    xs = frames(200, seed=1)
    with StreamPool(tmp_path / "a", SPEC, SMALL) as alone:
        expected = np.stack([alone.step(0, f).copy() for f in xs])
        window = alone.window(0)
    # the same stream interleaved with 5 others on 2 hot slots: suspended and resumed over and over
    cfg = PoolConfig(window=24, page_tokens=8, hot_slots=2, warm_pages=2, ring_pages=8)
    others = frames(200 * 5, seed=2).reshape(200, 5, -1)
    with StreamPool(tmp_path / "b", SPEC, cfg) as pool:
        got = []
        for i, f in enumerate(xs):
            got.append(pool.step(0, f).copy())
            for s in range(5):
                pool.step(10 + s, others[i, s])
        assert pool.cold.has_snapshot(0)  # it was parked at least once
        np.testing.assert_array_equal(np.stack(got), expected)
        np.testing.assert_array_equal(pool.window(0), window)


def test_per_token_path_never_decodes_archived_pages(tmp_path, monkeypatch):
    def refuse(self, blob):
        raise AssertionError("an archived page was decoded on the per-token path")

    monkeypatch.setattr(PageCodec, "decode", refuse)
    with StreamPool(tmp_path, SPEC, SMALL) as pool:
        for i, f in enumerate(frames(400, seed=3)):
            pool.step(i % 3, f)  # slides, suspends and resumes included
        assert pool.tiers.stats["to_cold"] > 0


CRASH = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {repo!r})
    from ep.streaming import PoolConfig, StreamPool, StreamSpec
    xs = np.load({frames!r})
    pool = StreamPool({state!r}, StreamSpec(), PoolConfig(**{cfg!r}))
    for i in range({n}):
        pool.step(i % 3, xs[i])
        if i == {checkpoint_at}:
            pool.checkpoint()
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush: a crash
""")


def test_state_is_recovered_exactly_after_a_crash(tmp_path):
    n, crash_after = 360, 250
    xs = frames(n, seed=4)
    np.save(tmp_path / "frames.npy", xs)
    cfg = dict(window=24, page_tokens=8, hot_slots=2, warm_pages=2, ring_pages=8)
    script = CRASH.format(repo=str(REPO), frames=str(tmp_path / "frames.npy"), state=str(tmp_path / "state"),
                          cfg=cfg, n=crash_after, checkpoint_at=120)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    with StreamPool(tmp_path / "ref", SPEC, PoolConfig(**cfg)) as ref:
        expected = [ref.step(i % 3, xs[i]).copy() for i in range(n)]
        ref_windows = {s: ref.window(s) for s in range(3)}
    with StreamPool(tmp_path / "state", SPEC, PoolConfig(**cfg)) as pool:
        assert set(pool.recovered) == {0, 1, 2} and sum(pool.recovered.values()) > 0
        assert sum(st.position for st in pool.streams.values()) == crash_after
        got = [pool.step(i % 3, xs[i]).copy() for i in range(crash_after, n)]
        np.testing.assert_array_equal(np.stack(got), np.stack(expected[crash_after:]))
        for s in range(3):
            np.testing.assert_array_equal(pool.window(s), ref_windows[s])


def test_ram_stays_bounded_with_1000_streams(tmp_path):
    """Allocated bytes (tracemalloc sees numpy and Python allocations), not time."""
    cfg = PoolConfig(window=16, page_tokens=8, hot_slots=16, warm_pages=2, ring_pages=4, journal=False)
    xs = frames(64, seed=6)
    with StreamPool(tmp_path, SPEC, cfg) as pool:
        tracemalloc.start()
        try:
            def burst(tokens):
                for s in range(1000):
                    for i in range(tokens):
                        pool.step(s, xs[i % 64])
                return tracemalloc.get_traced_memory()[0]

            base = tracemalloc.get_traced_memory()[0]
            burst(24)                # every stream slid, archived and was parked
            after_72 = burst(48)     # windows full, rings and snapshots at their size
            after_120 = burst(48)    # 48 more tokens per stream
        finally:
            tracemalloc.stop()
        state = pool.state_bytes()
        assert len(pool.streams) == 1000 and all(st.position == 120 for st in pool.streams.values())
        # parked streams hold no KV in RAM: the hot slots and warm arenas, allocated up front, are all there is
        held = [pool.kv_ram_bytes(s) for s in pool.streams]
        assert sum(1 for h in held if h) <= cfg.hot_slots
        assert sum(held) <= pool.hot.nbytes + state["warm"] + cfg.hot_slots * 64
        # 48 more tokens on each of 1000 streams: a full KV cache would grow by 1000 * 48 tokens
        full_kv_growth = 1000 * 48 * SPEC.kv_token_bytes()
        assert after_120 - after_72 < full_kv_growth / 100, (after_72 - base, after_120 - base)
        # the whole state per stream (metadata, cold index, warm pages) stays small
        assert (after_120 - base) / 1000 < 2048, (after_120 - base) / 1000


def test_streaming_runner_has_the_model_interface_and_survives_a_restart(tmp_path):
    xs = frames(60, seed=7)
    with StreamPool(tmp_path / "ref", SPEC, PoolConfig(hot_slots=1)) as ref:
        expected = [ref.step(0, f).copy() for f in xs]
    r = StreamingRunner(tmp_path / "s", 6, 1)
    assert r.input.shape == (1, 6) and r.output.shape == (1, 1) and len(r.sha256) == 32
    for f in xs[:40]:
        r.input[0, :] = f
        out = r.run()[0]
    np.testing.assert_array_equal(out, expected[39][0:1])
    r.close()  # a restart without checkpoint: the journal carries the 40 frames
    r = StreamingRunner(tmp_path / "s", 6, 1)
    for i, f in enumerate(xs[40:], 40):
        r.input[0, :] = f
        np.testing.assert_array_equal(r.run()[0], expected[i])
    r.close()
    with pytest.raises(Exception, match="declares 5 and 1"):
        StreamingRunner(tmp_path / "t", 5, 1, spec=SPEC)
