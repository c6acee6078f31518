"""ep side by side in one run: per-call latency, peak RSS and artifact size; streaming per-token
latency and KV bytes per stream.

    python bench/ep.py [--json] [--calls N] [--quick]

Per call, one model, the same inputs, interleaved in rounds so load drift hits every variant:
  ORT FP32    `InferenceSession.run(None, {"x": x})` on the FP32 .onnx (the plain way to call ORT)
  torch eager the same weights in `torch.nn.Sequential`, `inference_mode`, one thread (only when
              torch is installed: it is not a dependency; `make train-model` installs it)
  ours        `ep.ModelRunner` on the FP8 artifact from `sitsctl compile --compute int8-blocks`
              (ep.Session: provider by policy, one thread, pre-bound IOBinding, arena off; the two
              256x256 FP8 layers re-quantized at load to int8 blocks run by MatMulNBits with int8
              activations, the small ones folded to FP32; `ep.lowering`)
  ours-fp32   the same FP8 weights compiled with the default `--compute fp32` (all folded to FP32)
  ours-int8   the int8 artifact (`--quantization int8`, quantize_dynamic)
The model is a 6-256-256-256-1 ReLU MLP (deterministic random weights), where weights dominate the
artifact; the demo model's artifact ratio is printed too (graph and scales dominate it). On this MLP
FP32 compute is bound by L2 bandwidth (each 256x256 GEMV streams 256 KiB of weights: ~2 us, ~125
GB/s); MatMulNBits 8-bit at accuracy_level 4 reads a quarter of the bytes and saves ~1 us per such
layer, while quantize_dynamic and static QDQ int8 are no faster at batch 1. The deployed demo model is measured too
("demo_model" in the JSON): ORT, ours and torch eager on the training script's own module. Peak RSS is
measured per variant in a child process (load + calls), since one process holds all three here.

Streaming: the ep.streaming transformer (2 layers, d_model 64, GQA 4 query / 2 KV heads).
  ours      `StreamPool.step`: in-place GQA, window = context c, 16-token pages, journal on. In steady
            state a step's past holds c..c+15 tokens (the window slides a page when full), so it
            attends to c+1..c+16 tokens, sawtooth.
  baseline  the same graph called the plain way: `sess.run` with past [.., P, ..] -> present
            [.., P+1, ..] (ORT allocates the present and copies the past into it). Its cache starts as a
            precomputed past of c tokens, grows by feeding present -> past for 16 steps, and is then
            trimmed back to the c-token past (outside the timing): every timed step attends with a past
            of c..c+15 tokens, as ours does, and the context never grows beyond that. `baseline_fixed`
            feeds the c-token past to every step and drops the present (exactly context c).
  Ours and both baselines are timed in 10 interleaved rounds (order reversed every other round).
Per-token latency at context 16, 256 and 2048. KV bytes in RAM for one stream after 1k, 10k and 100k
tokens: computed (`kv_bytes_per_stream`: ours' hot slot + warm arena, allocated once; baseline: the
nbytes of its float32 KV arrays, measured at 1k and 10k and computed for 100k from the per-token size)
and measured (`kv_measured_per_stream`, each part in a fresh process: ours: tracemalloc of what the pool
allocated through Python/numpy since before it was created, and RSS growth since it was created; baseline:
RSS growth since its session was created, up to 10k tokens; ORT allocates its outputs outside
tracemalloc's view, so traced bytes are not given for it). The last line with --json is one JSON object.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import onnxruntime as ort  # noqa: E402

from ep.session import ModelRunner  # noqa: E402

WIDTHS = (6, 256, 256, 256, 1)
DEMO_MODEL = REPO / "examples" / "models" / "rolling_mill.onnx"
DEMO_LO = np.array([3.5, 2.5, 0.8, 3000.0, 60.0, 1.5])
DEMO_HI = np.array([4.5, 3.5, 3.0, 14000.0, 180.0, 3.5])


def mlp_weights(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
             (rng.standard_normal(b) * 0.05).astype(np.float32)) for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]


def build_mlp(path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, x = [], [], "x"
    layers = mlp_weights()
    for i, (w, b) in enumerate(layers):
        inits += [numpy_helper.from_array(w.T.copy(), f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        y = f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"W{i}", f"b{i}"], [y], name=f"fc{i}", transB=1))
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [y], [y + "r"], name=f"relu{i}"))
            y += "r"
        x = y
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTHS[0]])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", WIDTHS[-1]])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    path.write_bytes(m.SerializeToString())


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def make_variant(name: str, fp32: Path, artifact: Path):
    """A zero-argument call running the model once on row `x` (set through the returned setter)."""
    x = np.zeros((1, WIDTHS[0]), np.float32)
    if name == "ort":
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
        sess = ort.InferenceSession(str(fp32), so, providers=["CPUExecutionProvider"])
        return x, (lambda: sess.run(None, {"x": x})[0])
    if name == "torch":
        import torch

        torch.set_num_threads(1)
        mods = []
        for i, (w, b) in enumerate(mlp_weights()):
            lin = torch.nn.Linear(w.shape[0], w.shape[1])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
            mods += [lin] + ([torch.nn.ReLU()] if i < len(WIDTHS) - 2 else [])
        model = torch.nn.Sequential(*mods).eval()

        def call():
            with torch.inference_mode():
                return model(torch.from_numpy(x)).numpy()
        return x, call
    suffix = {"ours": ".fp8-int8b", "ours-fp32": ".fp8", "ours-int8": ".int8"}[name]
    runner = ModelRunner(artifact.with_suffix(suffix), WIDTHS[0], WIDTHS[-1])
    return runner.input, runner.run


def demo_variants(artifact: Path, with_torch: bool) -> dict:
    """The deployed demo model (examples/models/rolling_mill.onnx, 6-16-16-1 ReLU, normalisation and
    clipped head) per call: ORT run on the .onnx, ours on its FP8 artifact, torch eager on the training
    script's own `GapModel` with the ONNX weights loaded (the module the model was exported from)."""
    from onnx import load, numpy_helper

    x = np.zeros((1, 6), np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    sess = ort.InferenceSession(str(DEMO_MODEL), so, providers=["CPUExecutionProvider"])
    out = {"ort": (x, lambda: sess.run(None, {"signals": x})[0])}
    runner = ModelRunner(artifact, 6, 1)
    out["ours"] = (runner.input, runner.run)
    if with_torch:
        import torch

        sys.path.insert(0, str(REPO / "examples"))
        from train_demo_model import GapModel

        inits = {t.name: numpy_helper.to_array(t) for t in load(str(DEMO_MODEL)).graph.initializer}
        model = GapModel(inits["mean"], inits["std"], 0.14).eval()
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in inits.items()})
        tx = np.zeros((1, 6), np.float32)

        def call():
            with torch.inference_mode():
                return model(torch.from_numpy(tx)).numpy()
        out["torch"] = (tx, call)
    return out


def run_outputs(variants: dict, inputs: np.ndarray) -> dict[str, list[np.ndarray]]:
    """Each variant once per input row (the warm-up), its outputs kept for the error comparison."""
    outs: dict[str, list[np.ndarray]] = {}
    for n, (x, call) in variants.items():
        outs[n] = []
        for row in inputs:
            x[0] = row
            outs[n].append(np.array(call(), copy=True).reshape(-1))
    return outs


def time_interleaved(variants: dict, inputs: np.ndarray, calls: int) -> dict[str, list[int]]:
    """`calls` timed calls per variant in 20 rounds, the order reversed every other round, so load drift
    hits every variant alike; ns per call."""
    names = list(variants)
    times: dict[str, list[int]] = {n: [] for n in names}
    clock, per = time.perf_counter_ns, max(1, calls // 20)
    for r in range(20):
        for n in (names if r % 2 == 0 else names[::-1]):
            x, call = variants[n]
            t = times[n]
            for i in range(per):
                x[0] = inputs[i % len(inputs)]
                t0 = clock()
                call()
                t.append(clock() - t0)
    return times


def demo_per_call(artifact: Path, calls: int, with_torch: bool) -> tuple[dict, float]:
    variants = demo_variants(artifact, with_torch)
    inputs = np.random.default_rng(5).uniform(DEMO_LO, DEMO_HI, (512, 6)).astype(np.float32)
    outs = run_outputs(variants, inputs)
    if with_torch and not np.allclose(np.stack(outs["torch"]), np.stack(outs["ort"]), atol=1e-5):
        raise SystemExit("bench: the torch demo model disagrees with the ONNX one (weights not loaded?)")
    times = time_interleaved(variants, inputs, calls)
    err = float(np.abs(np.stack(outs["ours"]) - np.stack(outs["ort"])).max())
    return {n: stats(t) for n, t in times.items()}, err


def stats(ns: list[int]) -> dict:
    a = np.asarray(ns, np.float64) / 1e3
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


def per_call(fp32: Path, artifact: Path, calls: int, with_torch: bool) -> tuple[dict, float, int]:
    names = ["ort", "ours", "ours-fp32", "ours-int8"] + (["torch"] if with_torch else [])
    variants = {n: make_variant(n, fp32, artifact) for n in names}
    inputs = np.random.default_rng(1).standard_normal((512, WIDTHS[0])).astype(np.float32)
    outs = run_outputs(variants, inputs)  # warm-up, and the outputs for the error
    times = time_interleaved(variants, inputs, calls)
    ref = np.stack(outs["ort"])
    err = float(np.abs(np.stack(outs["ours"]) - ref).max())
    stats_err = {n: float(np.abs(np.stack(outs[n]) - ref).max()) for n in ("ours-fp32", "ours-int8")}
    torch_err = float(np.abs(np.stack(outs["torch"]) - ref).max()) if with_torch else None
    return {n: stats(t) for n, t in times.items()}, err, torch_err, stats_err


def child_rss(variant: str, fp32: Path, artifact: Path) -> float:
    """Peak RSS (MiB, VmHWM: getrusage's ru_maxrss keeps the parent's peak across fork+exec) of a fresh
    process that loads `variant` and runs 2000 calls."""
    code = (f"import sys; sys.argv = ['ep.py']; sys.path.insert(0, {str(REPO / 'bench')!r});"
            f"import importlib.util as u; s = u.spec_from_file_location('b', {str(Path(__file__))!r});"
            f"b = u.module_from_spec(s); s.loader.exec_module(b); from pathlib import Path;"
            f"x, call = b.make_variant({variant!r}, Path({str(fp32)!r}), Path({str(artifact)!r}))\n"
            f"for _ in range(2000): call()\n"
            f"print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    return int(out.stdout.strip().splitlines()[-1]) / 1024


# --- streaming ---------------------------------------------------------------------------------

def streaming_latency(contexts, steps: int, tmp: Path, rounds: int = 10) -> dict:
    """Per-token latency at each context c: ours (`StreamPool.step`, window c) and the plain-ORT baseline
    timed at fixed past lengths (c..c+15 cycled, as ours sees them, and exactly c), interleaved in rounds."""
    from ep.streaming import PoolConfig, StreamPool, StreamSpec, build_model, positional_encoding

    spec = StreamSpec()
    xs = np.random.default_rng(2).standard_normal((4096, spec.n_inputs)).astype(np.float32)
    out = {}
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    base = ort.InferenceSession(build_model(spec).SerializeToString(), so, providers=["CPUExecutionProvider"])
    L, H, D, page = spec.n_layers, spec.kv_heads, spec.head_dim, 16
    clock, per = time.perf_counter_ns, max(1, steps // rounds)
    for c in contexts:
        # the baseline's cache: a past of c tokens, made once. `baseline` grows it the plain way (present ->
        # past) for `page` steps and then trims it back to the c-token one (outside the timing): the same
        # c..c+page-1 sawtooth ours runs, with the past just written as in a real growing-KV loop.
        # `baseline_fixed` feeds the c-token past to every step and drops the present.
        rng = np.random.default_rng(3)
        past_c = {f"past_{k}_{i}": (rng.standard_normal((1, H, c, D)) * 0.5).astype(np.float32)
                  for i in range(L) for k in ("key", "value")}
        small = {n: {"seqlens_k": np.array([n], np.int32), "total_sequence_length": np.array(n + 1, np.int32),
                     "pe": positional_encoding([n], spec.d_model)[None]} for n in range(c, c + page)}
        presents = [(j, "past_" + o.name[len("present_"):]) for j, o in enumerate(base.get_outputs())
                    if o.name.startswith("present_")]
        grow = {"past": past_c, "n": c}

        def baseline_round(t: list, count: int, fixed: bool) -> None:
            for j in range(count):
                n = c if fixed else grow["n"]
                feed = {"frame": xs[j % 4096].reshape(1, 1, -1), **small[n], **(past_c if fixed else grow["past"])}
                t0 = clock()
                res = base.run(None, feed)
                t.append(clock() - t0)
                if not fixed:
                    if n + 1 < c + page:
                        grow["past"], grow["n"] = {name: res[i] for i, name in presents}, n + 1
                    else:
                        grow["past"], grow["n"] = past_c, c

        with StreamPool(tmp / f"lat{c}", spec, PoolConfig(window=c, page_tokens=page, hot_slots=1)) as pool:
            for i in range(c + 2 * page):  # fill the window past the first slide: steady state
                pool.step(0, xs[i % 4096])
            st, seen = pool.streams[0], []
            baseline_round([], 2 * page, False)  # warm-up
            baseline_round([], 10, True)
            t, tb, tf, k = [], [], [], c + 2 * page
            for r in range(rounds):
                parts = ("ours", "baseline", "fixed")
                for part in (parts if r % 2 == 0 else parts[::-1]):
                    if part == "ours":
                        for _ in range(per):
                            frame = xs[k % 4096]
                            k += 1
                            t0 = clock()
                            pool.step(0, frame)
                            t.append(clock() - t0)
                            seen.append(st.count - 1)  # the past this step attended with (after any slide)
                    elif part == "baseline":
                        baseline_round(tb, per, False)
                    else:
                        baseline_round(tf, per, True)
        out[c] = {"ours": stats(t), "baseline": stats(tb), "baseline_fixed": stats(tf),
                  "ours_past_tokens": [min(seen), max(seen)], "baseline_past_tokens": [c, c + page - 1]}
    return out


def rss_bytes() -> int:
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS"))) * 1024


def _baseline_step(sess, names, past: dict, xs, done: int, spec) -> None:
    """One token of the growing-KV baseline: `sess.run`, present -> past."""
    from ep.streaming import positional_encoding

    feed = {"frame": xs[done % 4096].reshape(1, 1, -1), "pe": positional_encoding([done], spec.d_model)[None],
            "seqlens_k": np.array([done], np.int32), "total_sequence_length": np.array(done + 1, np.int32), **past}
    res = sess.run(None, feed)
    for j, name in enumerate(names):
        if name.startswith("present_"):
            past["past_" + name[len("present_"):]] = res[j]


def _baseline_session(spec, model: bytes):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    past = {f"past_{k}_{i}": np.zeros((1, spec.kv_heads, 0, spec.head_dim), np.float32)
            for i in range(spec.n_layers) for k in ("key", "value")}
    return sess, [o.name for o in sess.get_outputs()], past


def kv_bytes(lengths: dict[str, int], baseline_measure_up_to: int, tmp: Path) -> tuple[dict, dict, dict]:
    """KV bytes per stream as computed: ours `kv_ram_bytes` (hot slot + warm arena), the baseline the nbytes
    of its KV arrays (up to `baseline_measure_up_to` tokens, then n x per-token bytes)."""
    from ep.streaming import PoolConfig, StreamPool, StreamSpec, build_model

    spec = StreamSpec()
    xs = np.random.default_rng(4).standard_normal((4096, spec.n_inputs)).astype(np.float32)
    ours, extra = {}, {}
    with StreamPool(tmp / "kv", spec, PoolConfig(hot_slots=1)) as pool:
        done = 0
        for label, n in sorted(lengths.items(), key=lambda kv: kv[1]):
            while done < n:
                pool.step(0, xs[done % 4096])
                done += 1
            ours[label] = pool.kv_ram_bytes(0)
            extra[label] = {"cold_file": pool.cold.file_bytes, "warm_used": pool.tiers.warm_used_bytes(0)}
        extra["config"] = pool.config
    sess, names, past = _baseline_session(spec, build_model(spec).SerializeToString())
    baseline, done = {}, 0
    for label, n in sorted(lengths.items(), key=lambda kv: kv[1]):
        if n > baseline_measure_up_to:
            baseline[label] = n * spec.kv_token_bytes()
            extra[f"baseline_{label}"] = "computed (n x per-token KV bytes)"
            continue
        while done < n:
            _baseline_step(sess, names, past, xs, done, spec)
            done += 1
        baseline[label] = sum(a.nbytes for a in past.values())
        extra[f"baseline_{label}"] = "measured"
    return ours, baseline, extra


def kv_memory_child(what: str, lengths: list[int], directory: Path) -> dict:
    """Run in a fresh process (`--kv-child WHAT`), so no earlier part of the bench lends it freed memory:
      ours-rss       RSS growth since the pool was created (after its warm-up), at each length
      ours-traced    tracemalloc: bytes the pool holds through Python/numpy allocations (hot slab, warm
                     arena, stream state, cold index, journal), counted from before it was created
      baseline-rss   RSS growth since the baseline's session was created (its KV arrays are ORT's
                     allocations, outside tracemalloc's view)"""
    from ep.streaming import PoolConfig, StreamPool, StreamSpec, build_model

    spec = StreamSpec()
    xs = np.random.default_rng(4).standard_normal((4096, spec.n_inputs)).astype(np.float32)
    model = build_model(spec).SerializeToString()  # made before any counting starts: graph bytes are not KV
    out: dict = {}
    gc.collect()
    if what == "baseline-rss":
        sess, names, past = _baseline_session(spec, model)
        gc.collect()
        rss0, done = rss_bytes(), 0
        for n in lengths:
            while done < n:
                _baseline_step(sess, names, past, xs, done, spec)
                done += 1
            gc.collect()
            out[str(n)] = {"rss_growth_bytes": rss_bytes() - rss0, "kv_array_bytes": sum(a.nbytes for a in past.values())}
        return out
    traced = what == "ours-traced"
    if traced:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0] if traced else rss_bytes()
    with StreamPool(directory, spec, PoolConfig(hot_slots=1), model=model) as pool:
        gc.collect()
        if traced:
            out["0"] = {"traced_bytes": tracemalloc.get_traced_memory()[0] - base}
        else:
            base = rss_bytes()
        done = 0
        for n in lengths:
            while done < n:
                pool.step(0, xs[done % 4096])
                done += 1
            gc.collect()
            out[str(n)] = ({"traced_bytes": tracemalloc.get_traced_memory()[0] - base} if traced
                           else {"rss_growth_bytes": rss_bytes() - base})
    return out


def kv_measured(lengths: dict[str, int], baseline_measure_up_to: int, tmp: Path) -> dict:
    """`kv_memory_child` for ours (RSS, tracemalloc) and the baseline, each in its own process; keyed by label."""
    result: dict = {"ours": {}, "baseline": {}}
    for what in ("ours-rss", "ours-traced", "baseline-rss"):
        ns = sorted(n for n in lengths.values() if what != "baseline-rss" or n <= baseline_measure_up_to)
        cmd = [sys.executable, str(Path(__file__)), "--kv-child", what, "--kv-lengths", ",".join(map(str, ns)),
               "--kv-dir", str(tmp / f"kvmem-{what}")]
        got = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
                         .stdout.strip().splitlines()[-1])
        side = result["baseline" if what.startswith("baseline") else "ours"]
        if "0" in got:
            side.setdefault("at_creation", {}).update(got.pop("0"))
        by_n = {str(n): label for label, n in lengths.items()}
        for n, v in got.items():
            side.setdefault(by_n[n], {}).update(v)
    for label, n in lengths.items():
        result["baseline"].setdefault(label, None)
    return result


def streaming_fp8_ratio(tmp: Path) -> float:
    """The streaming transformer through `sitsctl compile` (FP8-adaptive, `--kv-cache-policy tiered`,
    512 calibration frames as one stream): artifact bytes / its FP32 .onnx."""
    from onnx import save

    from ep.compile import compile_model
    from ep.streaming import build_model

    src = tmp / "stream.onnx"
    save(build_model(), str(src))
    np.save(tmp / "stream-frames.npy", np.random.default_rng(6).standard_normal((512, 6)).astype(np.float32))
    manifest = compile_model(src, tmp / "stream.artifact", calibration=tmp / "stream-frames.npy",
                             kv_cache_policy="tiered")
    return manifest["sizes"]["artifact_bytes"] / src.stat().st_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--calls", type=int, default=4000, help="timed calls per variant (per-call part)")
    ap.add_argument("--quick", action="store_true", help="300 instead of 1000 timed steps per context")
    ap.add_argument("--kv-child", choices=("ours-rss", "ours-traced", "baseline-rss"), help=argparse.SUPPRESS)
    ap.add_argument("--kv-lengths", default="", help=argparse.SUPPRESS)
    ap.add_argument("--kv-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.kv_child:  # one measured-memory part, in its own process (kv_measured)
        print(json.dumps(kv_memory_child(args.kv_child, [int(n) for n in args.kv_lengths.split(",")], args.kv_dir)))
        return 0
    from ep.compile import compile_model

    with_torch = torch_available()
    tmp = Path(tempfile.mkdtemp(prefix="sits-bench-ep-"))
    fp32 = tmp / "mlp.onnx"
    build_mlp(fp32)
    calib = np.random.default_rng(0).standard_normal((512, WIDTHS[0])).astype(np.float32)
    manifest = compile_model(fp32, tmp / "mlp.fp8-int8b", calibration=calib, compute="int8-blocks")
    fp32c = compile_model(fp32, tmp / "mlp.fp8", calibration=calib)
    art_bytes = manifest["sizes"]["artifact_bytes"]
    ratio = art_bytes / fp32.stat().st_size
    demo = compile_model(DEMO_MODEL, tmp / "demo.fp8",
                         calibration=np.random.default_rng(0).uniform(DEMO_LO, DEMO_HI, (256, 6)).astype(np.float32))
    demo_ratio = demo["sizes"]["artifact_bytes"] / DEMO_MODEL.stat().st_size

    int8 = compile_model(fp32, tmp / "mlp.int8", quantization="int8", calibration=calib)
    stream_ratio = streaming_fp8_ratio(tmp)
    lat, err, torch_err, other_err = per_call(fp32, tmp / "mlp.fp8", args.calls, with_torch)
    stated = manifest.accuracy["stated_max_abs_error"]
    if err > stated:
        print(f"bench: ours' error {err:.3g} exceeds the manifest's stated bound {stated:.3g}", file=sys.stderr)
    rss = {n: child_rss(n, fp32, tmp / "mlp.fp8") for n in lat}
    demo_lat, demo_err = demo_per_call(tmp / "demo.fp8", args.calls, with_torch)

    steps = 300 if args.quick else 1000
    stream = streaming_latency((16, 256, 2048), steps, tmp)
    lengths = {"1k": 1000, "10k": 10_000, "100k": 100_000}
    ours_kv, base_kv, kv_extra = kv_bytes(lengths, 10_000, tmp)
    kv_mem = kv_measured(lengths, 10_000, tmp)

    ort_p50, ours_p50 = lat["ort"]["p50"], lat["ours"]["p50"]
    print(f"ep bench  (onnxruntime {ort.__version__}, {os.cpu_count()} CPUs, 1 intra-op thread each)")
    print(f"per call, MLP {'-'.join(map(str, WIDTHS))}, batch 1, {args.calls} calls per variant, interleaved:")
    print(f"  {'variant':<44}{'p50 us':>9}{'p99 us':>9}{'peak RSS MiB':>14}")
    rows = [("ORT FP32 InferenceSession.run", "ort"), ("torch eager (1 thread)", "torch"),
            ("ours: ModelRunner, FP8 artifact, int8-blocks", "ours"),
            ("ours: ModelRunner, FP8 artifact, fp32 compute", "ours-fp32"),
            ("ours: ModelRunner, int8 artifact", "ours-int8")]
    for label, n in rows:
        if n in lat:
            print(f"  {label:<44}{lat[n]['p50']:>9.1f}{lat[n]['p99']:>9.1f}{rss[n]:>14.1f}")
        else:
            print(f"  {label:<44}{'n/a: torch is not installed (pip install torch==2.13.0)':>32}")
    print(f"  speedup vs ORT run (p50): {ort_p50 / ours_p50:.2f}x"
          + (f"   vs torch eager: {lat['torch']['p50'] / ours_p50:.2f}x" if with_torch else ""))
    print(f"  max |ours - ORT FP32| on 512 inputs: {err:.3g} (manifest states {stated:.3g} on its calibration "
          f"inputs: {'within' if err <= stated else 'OUTSIDE'})"
          + (f"; torch vs ORT {torch_err:.3g}" if with_torch else ""))
    fp32c_stated = fp32c.accuracy["stated_max_abs_error"]
    print(f"  fp32 compute (default): {lat['ours-fp32']['p50']:.1f} us, {ort_p50 / lat['ours-fp32']['p50']:.2f}x ORT"
          + (f", {lat['torch']['p50'] / lat['ours-fp32']['p50']:.2f}x torch" if with_torch else "")
          + f"; max error {other_err['ours-fp32']:.3g} (manifest states {fp32c_stated:.3g})")
    print(f"per call, the deployed demo model (6-16-16-1 + normalisation + clipped head), {args.calls} calls:")
    for label, n in (("ORT FP32 InferenceSession.run", "ort"), ("torch eager (GapModel, 1 thread)", "torch"),
                     ("ours: ep ModelRunner, FP8 artifact", "ours")):
        if n in demo_lat:
            print(f"  {label:<44}{demo_lat[n]['p50']:>9.1f}{demo_lat[n]['p99']:>9.1f}")
    print(f"  speedup vs ORT run (p50): {demo_lat['ort']['p50'] / demo_lat['ours']['p50']:.2f}x"
          + (f"   vs torch eager: {demo_lat['torch']['p50'] / demo_lat['ours']['p50']:.2f}x" if with_torch else "")
          + f"   max |ours - ORT FP32| {demo_err:.3g}")
    print(f"  artifact: FP8 {art_bytes} B vs FP32 .onnx {fp32.stat().st_size} B = {ratio:.3f}; demo model "
          f"(6-16-16-1): {demo['sizes']['artifact_bytes']} B vs {DEMO_MODEL.stat().st_size} B = {demo_ratio:.3f} "
          f"(graph and scales dominate)")
    print(f"  streaming transformer, `sitsctl compile` FP8 artifact (--kv-cache-policy tiered): "
          f"{stream_ratio:.3f} of its FP32 .onnx")
    print(f"  int8 artifact (ORT quantize_dynamic, VNNI kernels): {int8['sizes']['artifact_bytes']} B, "
          f"max |int8 - ORT FP32| {other_err['ours-int8']:.3g}")
    print("  FP8 on this CPU is storage only: ours re-quantizes the 256x256 layers to int8 blocks at load "
          "(int8 compute, --compute int8-blocks); the default folds all to FP32")
    print("streaming transformer, per token (T=1):")
    print(f"  {'context':>8}{'ours p50':>10}{'p99':>9}{'baseline p50':>14}{'p99':>9}{'fixed-c p50':>13}{'p99':>9}"
          f"{'ours/base':>11}")
    for c, r in stream.items():
        print(f"  {c:>8}{r['ours']['p50']:>10.1f}{r['ours']['p99']:>9.1f}{r['baseline']['p50']:>14.1f}"
              f"{r['baseline']['p99']:>9.1f}{r['baseline_fixed']['p50']:>13.1f}{r['baseline_fixed']['p99']:>9.1f}"
              f"{r['baseline']['p50'] / r['ours']['p50']:>10.2f}x")
    print("  (us; ours: window c, past c..c+15 tokens; baseline: sess.run on a precomputed past of c..c+15 tokens, "
          "fixed-c: of exactly c; no timed step grows the context)")
    cfg = kv_extra["config"]
    print(f"KV bytes in RAM per stream (ours: window {cfg.window} + page {cfg.page_tokens}, {cfg.warm_pages} warm "
          f"pages int8; attention sees the last {cfg.window + 1}..{cfg.capacity} tokens):")
    for label in lengths:
        print(f"  {label:>5} tokens: ours {ours_kv[label]:>9} B (cold file {kv_extra[label]['cold_file']} B on disk)"
              f"   baseline {base_kv[label]:>10} B ({kv_extra['baseline_' + label]})")
    print("  measured, each in a fresh process (ours traced: tracemalloc of the pool's Python/numpy allocations "
          "since before it was created; RSS: growth since the pool / the baseline's session was created):")
    print(f"  {'':>5}        ours traced {kv_mem['ours']['at_creation']['traced_bytes']:>9} B at creation")
    for label in lengths:
        o, b = kv_mem["ours"][label], kv_mem["baseline"][label]
        print(f"  {label:>5} tokens: ours traced {o['traced_bytes']:>9} B, RSS +{o['rss_growth_bytes']:>9} B"
              f"   baseline RSS " + (f"+{b['rss_growth_bytes']:>10} B" if b else "not measured"))
    if args.json:
        print(json.dumps({
            "ours_us": lat["ours"], "ort_us": lat["ort"], "torch_us": lat.get("torch"),
            "speedup_vs_ort": ort_p50 / ours_p50,
            "speedup_vs_torch": lat["torch"]["p50"] / ours_p50 if with_torch else None,
            "artifact_ratio": ratio, "max_abs_error": err, "stated_max_abs_error": stated,
            "error_within_stated": err <= stated,
            "ours_compute": "fp8 storage, int8-blocks compute (sitsctl compile --compute int8-blocks)",
            "ours_fp32_compute": {"us": lat["ours-fp32"],
                                  "speedup_vs_ort": ort_p50 / lat["ours-fp32"]["p50"],
                                  "speedup_vs_torch": (lat["torch"]["p50"] / lat["ours-fp32"]["p50"]
                                                       if with_torch else None),
                                  "max_abs_error": other_err["ours-fp32"],
                                  "stated_max_abs_error": fp32c_stated,
                                  "artifact_ratio": fp32c["sizes"]["artifact_bytes"] / fp32.stat().st_size},
            "kv_bytes_per_stream": ours_kv, "baseline_kv_bytes_per_stream": base_kv,
            "kv_measured_per_stream": kv_mem,
            "streaming_us": {str(c): r for c, r in stream.items()},
            "streaming_fp8_artifact_ratio": stream_ratio,
            "demo_model": {"ours_us": demo_lat["ours"], "ort_us": demo_lat["ort"], "torch_us": demo_lat.get("torch"),
                           "speedup_vs_ort": demo_lat["ort"]["p50"] / demo_lat["ours"]["p50"],
                           "speedup_vs_torch": (demo_lat["torch"]["p50"] / demo_lat["ours"]["p50"]
                                                if with_torch else None),
                           "max_abs_error": demo_err}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
