"""`sitsctl compile --kv-cache-policy {none,window,tiered}`: the policy and its parameters go into a
streaming artifact's manifest and the runtime reads them back; an MLP refuses window/tiered."""
import numpy as np
import onnx
import pytest

from ep.artifact import load_artifact
from ep.compile import CompileError, compile_model, main
from ep.streaming import PoolConfig, StreamingRunner, StreamSpec, build_model, head_range_of

from ..conftest import DEMO_MODEL

SPEC = StreamSpec(input_range=((0.0, 1.0),) * 6, output_range=((-0.15, 0.15),))


@pytest.fixture(scope="module")
def stream_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("stream")
    onnx.save(build_model(SPEC, seed=3), str(base / "stream.onnx"))
    frames = np.random.default_rng(5).random((96, 6)).astype(np.float32)
    np.save(base / "frames.npy", frames)
    return base, frames


@pytest.fixture(scope="module")
def tiered(stream_files):
    base, _ = stream_files
    manifest = compile_model(base / "stream.onnx", base / "tiered", quantization="fp8-adaptive",
                             calibration=base / "frames.npy", kv_cache_policy="tiered",
                             kv_params={"window": 32, "page_tokens": 8, "warm_codec": "float8e4m3fn",
                                        "warm_pages": 3, "cold_slots": 20})
    return base / "tiered", manifest


def test_mlp_refuses_window_and_tiered(tmp_path, capsys):
    calib = tmp_path / "c.npy"
    np.save(calib, np.random.default_rng(0).random((32, 6)).astype(np.float32))
    for policy in ("window", "tiered"):
        with pytest.raises(CompileError, match="an MLP takes --kv-cache-policy none"):
            compile_model(DEMO_MODEL, tmp_path / policy, calibration=calib, kv_cache_policy=policy)
        assert not (tmp_path / policy).exists()
    rc = main([str(DEMO_MODEL), "--kv-cache-policy", "tiered", "--calibration", str(calib), "--output",
               str(tmp_path / "cli")])
    assert rc == 1 and "has no KV cache" in capsys.readouterr().err
    with pytest.raises(CompileError, match="only apply with --kv-cache-policy window or tiered"):
        compile_model(DEMO_MODEL, tmp_path / "w", calibration=calib, kv_params={"window": 64})


def test_streaming_model_needs_a_kv_policy_and_valid_parameters(stream_files, tmp_path):
    base, _ = stream_files
    with pytest.raises(CompileError, match="needs a KV cache"):
        compile_model(base / "stream.onnx", tmp_path / "a", calibration=base / "frames.npy")
    with pytest.raises(CompileError, match="apply to --kv-cache-policy tiered"):
        compile_model(base / "stream.onnx", tmp_path / "b", calibration=base / "frames.npy",
                      kv_cache_policy="window", kv_params={"cold_slots": 4})
    with pytest.raises(CompileError, match="--warm-codec 'fp4'"):
        compile_model(base / "stream.onnx", tmp_path / "c", calibration=base / "frames.npy",
                      kv_cache_policy="tiered", kv_params={"warm_codec": "fp4"})
    with pytest.raises(CompileError, match="int8 .* not offered for streaming"):
        compile_model(base / "stream.onnx", tmp_path / "d", quantization="int8", calibration=base / "frames.npy",
                      kv_cache_policy="window")


def test_tiered_artifact_carries_the_policy_and_the_runtime_reads_it(tiered, stream_files, tmp_path):
    directory, manifest = tiered
    assert manifest.data["kv_cache_policy"] == {"policy": "tiered", "window": 32, "page_tokens": 8,
                                                "warm_codec": "float8e4m3fn", "warm_pages": 3, "cold_slots": 20}
    assert manifest.data["streaming"] == {"n_inputs": 6, "n_outputs": 1, "d_model": 64, "n_layers": 2,
                                          "kv_heads": 2, "head_dim": 16}
    acc = manifest.data["accuracy"]
    assert 0 < acc["max_abs_error"] <= acc["stated_max_abs_error"]
    runner = StreamingRunner.from_artifact(directory, tmp_path / "state", 6, 1)
    c = runner.pool.config
    assert (c.window, c.page_tokens, c.page_format, c.warm_pages, c.ring_pages, c.archive) == (
        32, 8, "float8e4m3fn", 3, 20, True)
    assert runner.sha256.hex() == manifest.artifact_sha256 and runner.ep.fp8_folded
    # the FP32 model with the same KV settings: before the first slide (capacity 40 tokens) both attend to
    # every token, as the compile-time accuracy run does, so the manifest's stated bound applies
    reference = StreamingRunner(tmp_path / "ref", 6, 1, spec=SPEC, seed=3,
                                config=PoolConfig(window=32, page_tokens=8, hot_slots=1))
    _, frames = stream_files
    errors = []
    for f in frames[:40]:
        runner.input[0], reference.input[0] = f, f
        errors.append(abs(float(runner.run()[0, 0]) - float(reference.run()[0, 0])))
    assert 0 < max(errors) <= acc["stated_max_abs_error"]
    for f in frames[40:]:  # slides: pages go to the warm arena, then to the cold file
        runner.input[0] = f
        runner.run()
    assert runner.pool.tiers.warm_indices(runner.stream)
    # the tanh head survives compilation: the output bound is read from the compiled graph
    lo, hi = head_range_of(load_artifact(directory)[0])
    assert -0.15 <= lo[0] < hi[0] <= 0.15
    runner.close()
    reference.close()


def test_window_policy_drops_pages_instead_of_archiving(stream_files, tmp_path):
    base, frames = stream_files
    rc = main([str(base / "stream.onnx"), "--quantization", "none", "--kv-cache-policy", "window", "--window", "16",
               "--page-tokens", "4", "--calibration", str(base / "frames.npy"), "--output", str(tmp_path / "w"),
               "--quiet"])
    assert rc == 0
    runner = StreamingRunner.from_artifact(tmp_path / "w", tmp_path / "state", 6, 1)
    assert runner.pool.config.archive is False and runner.kv_policy["policy"] == "window"
    for f in frames[:60]:
        runner.input[0] = f
        runner.run()
    assert runner.describe()["window_tokens"] <= 20 and runner.pool.tiers.warm_indices(runner.stream) == []
    runner.close()
    resumed = StreamingRunner.from_artifact(tmp_path / "w", tmp_path / "state", 6, 1)  # snapshots still resume
    assert resumed.position == 60
    resumed.close()
