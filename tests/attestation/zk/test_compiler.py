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

from .conftest import DEMO_CONTEXT, DEMO_INPUT, REPO

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
        w = demo_circuit.witness(x, [0])  # mill_mode 0 (stopped): no conditional constraint narrows the box
        got = demo_circuit.decode_outputs(demo_circuit.public_signals(w))[0]
        assert abs(got - ref) <= bound, (x, got, ref, bound)
        saturated += abs(ref) > 0.139
    assert saturated < len(xs)  # the comparison is not all clipped values


def test_demo_circuit_shape_and_public_signals(demo_circuit):
    r = demo_circuit.circuit.r1cs
    assert r.n_outputs == 1 and r.n_pub_inputs == 9 and r.n_prv_inputs == 0  # hash x2, 6 inputs, mill_mode
    assert 500 < demo_circuit.n_constraints < 2048 - 10  # one 2^11 domain
    w = demo_circuit.witness(DEMO_INPUT, DEMO_CONTEXT)
    pub = demo_circuit.public_signals(w)
    h = int(demo_circuit.chain.sha256, 16)
    assert (pub[1], pub[2]) == (h >> 128, h & ((1 << 128) - 1))
    assert demo_circuit.decode_inputs(pub) == pytest.approx(DEMO_INPUT, abs=1e-3)
    assert demo_circuit.linear_enforced == ("stand_reduces_thickness", "gap_below_exit_thickness",
                                            "force_in_band_under_agc", "threading_speed")
    assert demo_circuit.linear_skipped == ()
    assert "constraints" in demo_circuit.describe()


def test_witness_that_changes_the_output_violates_constraints(demo_circuit):
    w = demo_circuit.witness(DEMO_INPUT, DEMO_CONTEXT)
    for i in (1, 2, 5, len(w) - 1):  # output, hash half, an input, an internal wire
        bad = list(w)
        bad[i] = (bad[i] + 1) % R
        assert demo_circuit.circuit.r1cs.first_unsatisfied(bad) is not None


@pytest.mark.parametrize("i,value", [(0, 4.6), (3, 2999.0), (5, 3.51)])
def test_out_of_range_input_has_no_witness(demo_circuit, i, value):
    x = list(DEMO_INPUT)
    x[i] = value
    with pytest.raises(ZkError, match=demo_circuit.input_names[i]):
        demo_circuit.witness(x, DEMO_CONTEXT)


def test_linear_constraint_violation_has_no_witness(demo_circuit):
    x = list(DEMO_INPUT)
    x[0], x[1] = 3.6, 3.4  # exit thickness above entry - 0.3, both in range
    with pytest.raises(ZkError, match="stand_reduces_thickness"):
        demo_circuit.witness(x, DEMO_CONTEXT)


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


# -- conditional constraints (`when:`) and context signals -------------------------------------------

def test_demo_circuit_takes_mill_mode_as_a_public_context_signal(demo_circuit):
    assert demo_circuit.context_names == ("mill_mode",)
    assert demo_circuit.linear_conditional == ("force_in_band_under_agc", "threading_speed")
    assert set(demo_circuit.linear_enforced) >= {"stand_reduces_thickness", "force_in_band_under_agc"}
    assert not demo_circuit.linear_skipped
    pub = demo_circuit.public_signals(demo_circuit.witness(DEMO_INPUT, [2]))
    assert demo_circuit.decode_context(pub) == [2]
    assert demo_circuit.decode_inputs(pub) == pytest.approx(DEMO_INPUT, abs=1e-3)


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("force,speed", [(3500.0, 2.5), (13500.0, 1.8), (9000.0, 2.5), (9000.0, 1.8),
                                         (4000.0, 2.0), (13000.0, 2.0)])
def test_conditional_constraints_hold_exactly_when_their_condition_does(demo_circuit, mode, force, speed):
    """force_in_band_under_agc: 4000 <= force <= 13000 when mill_mode == 2; threading_speed: speed <= 2.0
    when mill_mode == 1. The circuit admits the inputs iff the config's own rules do."""
    x = list(DEMO_INPUT)
    x[3], x[5] = force, speed
    admissible = not (mode == 2 and not 4000.0 <= force <= 13000.0) and not (mode == 1 and speed > 2.0)
    if admissible:
        w = demo_circuit.witness(x, [mode])
        assert demo_circuit.circuit.r1cs.first_unsatisfied(w) is None
    else:
        with pytest.raises(ZkError, match="force_in_band_under_agc|threading_speed"):
            demo_circuit.witness(x, [mode])


def test_context_value_outside_its_enumeration_has_no_witness(demo_circuit):
    for bad in ([3], [-1], [1.5], []):
        with pytest.raises(ZkError, match="mill_mode|context"):
            demo_circuit.witness(DEMO_INPUT, bad)


def test_a_prover_cannot_flip_the_selector_of_a_true_condition(demo_circuit):
    """Honest witness for mode 0 with the force out of the AGC band, then claim mode 2 in the public signal
    and try every way of setting the wires: the selector (and so the band check) follows from mode."""
    x = list(DEMO_INPUT)
    x[3] = 3500.0
    w = demo_circuit.witness(x, [0])
    r1cs = demo_circuit.circuit.r1cs
    i_mode = 1 + r1cs.n_outputs + 2 + 6
    forged = list(w)
    forged[i_mode] = 2
    assert r1cs.first_unsatisfied(forged) is not None


def _three_input_chain(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return load_onnx(_model(tmp_path, nodes, {"w": np.array([[1.0], [0.5], [-0.25]])}, 3, 1))


@pytest.mark.parametrize("op,value", [("==", 1.0), ("!=", 1.0), ("<", 0.5), ("<=", 0.5), (">", 0.25), (">=", 0.25)])
def test_every_condition_operator_on_a_model_input_and_on_a_context_signal(tmp_path, op, value):
    """a + b <= 1 when (input c op value) and (context k op 2): compared with a direct evaluation over a grid."""
    import operator

    from attestation.zk import ConditionSpec, ContextSpec, LinearSpec

    ops = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge}
    chain = _three_input_chain(tmp_path)
    ctx = [ContextSpec("k", 0, 5)]
    spec = LinearSpec("sum_small", {0: 1.0, 1: 1.0}, None, 1.0,
                      (ConditionSpec("input", 2, op, value), ConditionSpec("context", 0, op, 2.0)))
    cm = compile_chain(chain, ["a", "b", "c"], [(0.0, 1.0), (0.0, 1.0), (0.0, 1.0)], [spec], context=ctx)
    assert cm.linear_enforced == ("sum_small",) and cm.linear_conditional == ("sum_small",)
    for a, b in ((0.25, 0.5), (0.75, 0.75)):
        for c in (0.0, 0.25, 0.5, 1.0):
            for k in range(6):
                holds = ops[op](c, value) and ops[op](k, 2.0)
                if holds and a + b > 1.0:
                    with pytest.raises(ZkError, match="sum_small"):
                        cm.witness([a, b, c], [k])
                else:
                    assert cm.circuit.r1cs.first_unsatisfied(cm.witness([a, b, c], [k])) is None


def test_conditional_constraints_are_listed_as_not_encoded_when_a_condition_reads_a_real_valued_non_input(tmp_path):
    from sitsd.config import load_config
    from sitsd.prover import circuit_for_config

    from ...conftest import example_config_data
    import yaml

    data = example_config_data()
    data["signals"].append({"name": "coolant_temp", "unit": "degC", "min": 10.0, "max": 60.0})
    data["constraints"].append({"name": "cool_force", "coefficients": {"rolling_force": 1.0}, "max": 12000.0,
                                "when": "coolant_temp > 45"})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    cm = circuit_for_config(load_config(path))
    assert "cool_force" in cm.linear_skipped and cm.context_names == ("mill_mode",)
