"""The model->circuit compiler: outputs equal onnxruntime's within the stated bound, ranges and
linear constraints are enforced, the model hash is bound, unsupported models are refused."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from attestation.zk import ZkError, compile_chain, load_onnx
from attestation.zk.field import R

from .conftest import DEMO_INPUT, REPO

DEMO_MODEL = REPO / "examples" / "models" / "rolling_mill.onnx"


def _admissible(rng, n):
    """Inputs inside the rolling-mill ranges that also satisfy its unconditional linear constraints."""
    out = []
    while len(out) < n:
        x = [rng.uniform(3.5, 4.5), rng.uniform(2.5, 3.5), rng.uniform(0.8, 3.0), rng.uniform(3000, 14000),
             rng.uniform(60, 180), rng.uniform(1.5, 3.5)]
        if x[1] - x[0] <= -0.3 and x[2] - x[1] <= 0.0:
            out.append(x)
    return out


def test_demo_circuit_matches_onnxruntime_within_bound(demo_circuit):
    sess = ort.InferenceSession(str(DEMO_MODEL))
    rng = np.random.default_rng(4)
    xs = _admissible(rng, 40) + [[4.5, 2.5, 0.8, 14000, 180, 3.5], [3.5, 2.5, 0.8, 3000, 60, 1.5],
                                 [4.5, 3.5 - 0.7, 2.8, 3000, 180, 1.5], DEMO_INPUT]
    bound = demo_circuit.error_bound[0]
    assert bound < 1e-3  # 1 um: far below the loop's ~1.3 um thickness error
    saturated = 0
    for x in xs:
        ref = float(sess.run(None, {"signals": np.array([x], dtype=np.float32)})[0][0, 0])
        w = demo_circuit.witness(x)
        got = demo_circuit.decode_outputs(demo_circuit.public_signals(w))[0]
        assert abs(got - ref) <= bound, (x, got, ref, bound)
        saturated += abs(ref) > 0.139
    assert saturated < len(xs)  # the comparison is not all clipped values


def test_demo_circuit_shape_and_public_signals(demo_circuit):
    r = demo_circuit.circuit.r1cs
    assert r.n_outputs == 1 and r.n_pub_inputs == 8 and r.n_prv_inputs == 0
    assert 500 < demo_circuit.n_constraints < 2048 - 10  # one 2^11 domain
    w = demo_circuit.witness(DEMO_INPUT)
    pub = demo_circuit.public_signals(w)
    h = int(demo_circuit.chain.sha256, 16)
    assert (pub[1], pub[2]) == (h >> 128, h & ((1 << 128) - 1))
    assert demo_circuit.decode_inputs(pub) == pytest.approx(DEMO_INPUT, abs=1e-3)
    assert demo_circuit.linear_enforced == ("stand_reduces_thickness", "gap_below_exit_thickness")
    assert set(demo_circuit.linear_skipped) == {"force_in_band_under_agc", "threading_speed"}
    assert "constraints" in demo_circuit.describe()


def test_witness_that_changes_the_output_violates_constraints(demo_circuit):
    w = demo_circuit.witness(DEMO_INPUT)
    for i in (1, 2, 5, len(w) - 1):  # output, hash half, an input, an internal wire
        bad = list(w)
        bad[i] = (bad[i] + 1) % R
        assert demo_circuit.circuit.r1cs.first_unsatisfied(bad) is not None


@pytest.mark.parametrize("i,value", [(0, 4.6), (3, 2999.0), (5, 3.51)])
def test_out_of_range_input_has_no_witness(demo_circuit, i, value):
    x = list(DEMO_INPUT)
    x[i] = value
    with pytest.raises(ZkError, match=demo_circuit.input_names[i]):
        demo_circuit.witness(x)


def test_linear_constraint_violation_has_no_witness(demo_circuit):
    x = list(DEMO_INPUT)
    x[0], x[1] = 3.6, 3.4  # exit thickness above entry - 0.3, both in range
    with pytest.raises(ZkError, match="stand_reduces_thickness"):
        demo_circuit.witness(x)


def _model(tmp_path, nodes, inits, n_in=3, n_out=2):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", n_in])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n_out])],
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return path


def test_matmul_add_relu_clip_model(tmp_path):
    rng = np.random.default_rng(0)
    inits = {"w1": rng.normal(size=(3, 5)), "b1": rng.normal(size=5), "w2": rng.normal(size=(5, 2)),
             "lo": np.array(-0.5), "hi": np.array(0.75)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["h3"]), helper.make_node("MatMul", ["h3", "w2"], ["h4"]),
             helper.make_node("Clip", ["h4", "lo", "hi"], ["y"])]
    path = _model(tmp_path, nodes, inits)
    chain = load_onnx(path)
    ranges = [(-2.0, 2.0), (0.0, 1.0), (-10.0, -5.0)]
    cm = compile_chain(chain, ["a", "b", "c"], ranges)
    sess = ort.InferenceSession(str(path))
    for _ in range(20):
        x = [rng.uniform(lo, hi) for lo, hi in ranges]
        ref = sess.run(None, {"x": np.array([x], dtype=np.float32)})[0][0]
        got = cm.decode_outputs(cm.public_signals(cm.witness(x)))
        assert np.all(np.abs(np.array(got) - ref) <= np.array(cm.error_bound)), (got, ref, cm.error_bound)


def test_unsupported_operator_refused_with_node_named(tmp_path):
    nodes = [helper.make_node("Tanh", ["x"], ["y"], name="head")]
    with pytest.raises(ZkError, match="head.*Tanh has no circuit"):
        load_onnx(_model(tmp_path, nodes, {}, 3, 3))


def test_unreadable_model_is_zkerror(tmp_path):
    (tmp_path / "x.onnx").write_bytes(b"not onnx")
    with pytest.raises(ZkError, match="x.onnx"):
        load_onnx(tmp_path / "x.onnx")
