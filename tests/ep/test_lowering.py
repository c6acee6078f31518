"""`--compute int8-blocks` (`ep.lowering`): FP8 storage, large layers re-quantized at load to int8 blocks
run by MatMulNBits; the accuracy report measured through the lowering; bounds and proofs refuse it."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ep.artifact import MANIFEST_FILE, dequantized, resolve_model
from ep.bounds import BoundsError
from ep.bounds.graph import load_graph
from ep.compile import CompileError, compile_model, main
from ep.errors import ModelLoadError
from ep.lowering import INT8_BLOCKS, _int8_blocks, lower, marked
from ep.session import ModelRunner, runtime_model, session_options

WIDTHS = (6, 256, 256, 1)  # one 256x256 layer: the only one at or above MIN_WEIGHT_ELEMENTS


def build_mlp(path):
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:])):
        w = (rng.standard_normal((b, a)) / np.sqrt(a)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"),
                  numpy_helper.from_array((rng.standard_normal(b) * 0.05).astype(np.float32), f"b{i}")]
        nodes.append(helper.make_node("Gemm", [x, f"W{i}", f"b{i}"], [f"h{i}"], name=f"fc{i}", transB=1))
        x = f"h{i}"
        if i < len(WIDTHS) - 2:
            nodes.append(helper.make_node("Relu", [x], [x + "r"], name=f"relu{i}"))
            x += "r"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTHS[0]])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", WIDTHS[-1]])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, path)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    base = tmp_path_factory.mktemp("lowering")
    build_mlp(base / "mlp.onnx")
    calib = np.random.default_rng(1).standard_normal((256, WIDTHS[0])).astype(np.float32)
    fp32c = compile_model(base / "mlp.onnx", base / "fp8", calibration=calib)
    int8b = compile_model(base / "mlp.onnx", base / "int8b", calibration=calib, compute=INT8_BLOCKS)
    return base, fp32c, int8b


def test_manifest_records_the_lowered_layers_and_the_file_is_the_fp8_one(compiled):
    base, fp32c, int8b = compiled
    compute = int8b["runtime"]["compute"]
    assert compute["mode"] == INT8_BLOCKS and compute["bits"] == 8 and compute["accuracy_level"] == 4
    assert [(lay["shape"], lay["bias"] is not None) for lay in compute["layers"]] == [([256, 256], True)]
    assert "compute" not in fp32c["runtime"]  # the default is unchanged
    assert int8b["quantization"] == fp32c["quantization"]  # same FP8 weights
    assert int8b["files"]["weights.sitsw"] == fp32c["files"]["weights.sitsw"]
    assert int8b["sizes"]["artifact_bytes"] - fp32c["sizes"]["artifact_bytes"] < 100  # the metadata entry
    on_disk = json.loads((base / "int8b" / MANIFEST_FILE).read_text())
    assert on_disk["runtime"]["compute"] == compute


def test_runner_runs_matmulnbits_and_stays_within_the_stated_error(compiled):
    base, _, int8b = compiled
    runner = ModelRunner(base / "int8b", WIDTHS[0], WIDTHS[-1])
    assert runner.run_path.startswith("ONNX Runtime C API"), runner.run_path  # the lowered bytes, MatMulNBits
    assert any("int8-blocks compute" in n for n in runner.ep.notes)
    assert any(n.startswith("MatMulNBits") for nodes in runner.ep.placement.values() for n in nodes)
    ref = ort.InferenceSession(str(base / "mlp.onnx"), providers=["CPUExecutionProvider"])
    # the graph compile measured: the runner's output bits equal a session on runtime_model()'s bytes
    data, _, manifest = resolve_model(base / "int8b")
    check = ort.InferenceSession(runtime_model(data, manifest), session_options(1, fp8_storage=True),
                                 providers=["CPUExecutionProvider"])
    errors = []
    for row in np.random.default_rng(7).standard_normal((200, WIDTHS[0])).astype(np.float32):
        runner.input[:] = row
        got = float(runner.run()[0, 0])
        assert got == float(check.run(None, {"x": row[None]})[0][0, 0])
        errors.append(abs(got - float(ref.run(None, {"x": row[None]})[0][0, 0])))
    assert max(errors) <= int8b.accuracy["stated_max_abs_error"]
    assert max(errors) > 0  # int8 arithmetic, not the FP32 fold


def test_bounds_and_proof_inputs_refuse_an_int8_blocks_artifact(compiled):
    base, _, _ = compiled
    data, _, manifest = resolve_model(base / "int8b")
    assert marked(onnx.load_from_string(data)) == INT8_BLOCKS
    with pytest.raises(ModelLoadError, match="int8-blocks"):
        dequantized(data)
    with pytest.raises(BoundsError, match="int8-blocks"):
        load_graph(data)
    plain, _, _ = resolve_model(base / "fp8")
    assert marked(onnx.load_from_string(plain)) is None
    dequantized(plain)  # the default artifact still folds


def test_lower_refuses_a_compute_entry_that_does_not_match_the_graph(compiled):
    base, _, int8b = compiled
    data, _, _ = resolve_model(base / "int8b")
    spec = json.loads(json.dumps(int8b["runtime"]["compute"]))
    spec["layers"][0]["node"] = "nope"
    with pytest.raises(ModelLoadError, match="do not match"):
        lower(data, spec)
    with pytest.raises(ModelLoadError, match="not known"):
        lower(data, {**spec, "mode": "int4"})


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_int8_blocks_takes_fp8_only(compiled, quantization, tmp_path):
    base, _, _ = compiled
    calib = np.zeros((16, WIDTHS[0]), np.float32)
    with pytest.raises(CompileError, match="fp8-adaptive"):
        compile_model(base / "mlp.onnx", tmp_path / "x", quantization=quantization, calibration=calib,
                      compute=INT8_BLOCKS)
    with pytest.raises(CompileError, match="compute 'fp16'"):
        compile_model(base / "mlp.onnx", tmp_path / "y", calibration=calib, compute="fp16")


def test_cli_compute_option(compiled, tmp_path, capsys):
    base, _, int8b = compiled
    np.save(tmp_path / "calib.npy", np.random.default_rng(1).standard_normal((256, WIDTHS[0])).astype(np.float32))
    rc = main([str(base / "mlp.onnx"), "--calibration", str(tmp_path / "calib.npy"), "--output",
               str(tmp_path / "art"), "--compute", "int8-blocks", "--quiet"])
    assert rc == 0
    assert "int8-blocks: 1 layer(s)" in capsys.readouterr().out
    assert json.loads((tmp_path / "art" / MANIFEST_FILE).read_text())["artifact_sha256"] == int8b.artifact_sha256


def test_int8_blocks_quantizer():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((300, 5)).astype(np.float32)  # K not a multiple of the block
    w[:, 2] = 0.0  # an all-zero column: scale 1, codes 128
    q, scale = _int8_blocks(w, 128)
    assert q.shape == (5, 3, 128) and q.dtype == np.uint8 and scale.shape == (15,)
    deq = ((q.astype(np.float32) - 128) * scale.reshape(5, 3, 1)).reshape(5, 384).T[:300]
    step = np.repeat(scale.reshape(5, 3).T, 128, axis=0)[:300]
    assert np.all(np.abs(deq - w) <= step / 2 * (1 + 1e-6))
    assert np.all(q[2] == 128) and np.all(q[:, 2, 300 - 256:] == 128)  # zero padding


def test_lower_handles_a_weight_shared_by_two_layers_without_bias():
    import ml_dtypes

    from ep.lowering import spec

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((256, 256)) / 16).astype(np.float32)
    scale = (np.abs(w).max(axis=0) / 448).astype(np.float32)
    q = (w / scale).astype(ml_dtypes.float8_e4m3fn)
    nodes = [helper.make_node("DequantizeLinear", ["Wq", "Ws"], ["W"], axis=1),
             helper.make_node("MatMul", ["x", "W"], ["h"], name="a"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W"], ["y"], name="b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
                          [numpy_helper.from_array(q, "Wq"), numpy_helper.from_array(scale, "Ws")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    compute = spec(m)
    assert [(lay["node"], lay["bias"]) for lay in compute["layers"]] == [("a", None), ("b", None)]
    lowered = onnx.load_from_string(lower(m.SerializeToString(), compute))
    assert [n.op_type for n in lowered.graph.node] == ["MatMulNBits", "Relu", "MatMulNBits"]
    assert {t.name for t in lowered.graph.initializer} == {"a.int8_blocks", "a.int8_block_scales",
                                                          "b.int8_blocks", "b.int8_block_scales"}
    x = rng.standard_normal((1, 256)).astype(np.float32)
    got = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    deq = q.astype(np.float32) * scale
    ref = np.maximum(x @ deq, 0) @ deq
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()
