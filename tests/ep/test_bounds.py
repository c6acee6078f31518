"""ep.bounds: IBP/CROWN soundness against onnxruntime on random small models, tightness,
branching (proofs and counter-regions), model/box validation and certificates."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ep.bounds import (BoundsError, Certificate, CertificateError, analyze, certify, crown_bounds,
                       ibp_bounds, load_graph, prove, verify_certificate)
from ep.bounds import activations as acts
from ep.bounds.analysis import prepare_box
from ep.bounds.empirical import sample_points
from ep.bounds.propagate import crown, error_scale, evaluate_all, ibp
from ep.bounds.rounding import float32_slack

from ..conftest import DEMO_MODEL

WIDE = ([3.5, 2.5, 0.8, 3000.0, 60.0, 1.5], [4.5, 3.5, 2.0, 14000.0, 180.0, 3.5])
TIGHT = ([3.9, 2.95, 1.3, 7000.0, 100.0, 2.5], [4.1, 3.05, 1.5, 9500.0, 140.0, 2.8])


# ---------------------------------------------------------------- model construction

class Net:
    """Builds small ONNX models node by node with onnx.helper."""

    def __init__(self, n_in: int, seed: int, opset: int = 17) -> None:
        self.rng = np.random.default_rng(seed)
        self.n_in, self.opset = n_in, opset
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, value, dtype=np.float32, via_node: bool = False) -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self.name("c")
        if via_node:  # a Constant node instead of an initializer
            self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr)))
        else:
            self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def weights(self, rows: int, cols: int) -> np.ndarray:
        return self.rng.normal(0.0, 1.5 / np.sqrt(cols), (rows, cols))

    def model(self, out: str, m: int, in_shape=None, out_shape=None, in_type=TensorProto.FLOAT):
        self.nodes.append(helper.make_node("Identity", [out], ["y"]))
        graph = helper.make_graph(
            self.nodes, "net",
            [helper.make_tensor_value_info("x", in_type, in_shape or ["batch", self.n_in])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or ["batch", m])], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8)


def affine(net: Net, x: str, k: int, w: int, style: str) -> tuple[str, int]:
    """One affine stage k -> w (or wider, for concat), in one of several ONNX spellings."""
    rng = net.rng
    if style == "gemm":
        W = net.weights(w, k)
        trans = int(rng.integers(2))
        alpha, beta = rng.choice([1.0, 0.5, -1.5]), rng.choice([1.0, 2.0])
        c = rng.normal(size=(w,) if rng.random() < 0.5 else (1, w)) / beta
        return net.op("Gemm", [x, net.const(W if trans else W.T), net.const(c)], transB=trans,
                      alpha=float(alpha), beta=float(beta)), w
    if style == "matmul":
        h = net.op("MatMul", [x, net.const(net.weights(w, k).T)])
        b = net.const(rng.normal(size=(w,) if rng.random() < 0.5 else (1, w)))
        return net.op("Add", [h, b] if rng.random() < 0.5 else [b, h]), w
    if style == "concat":
        a = max(1, w // 2)
        left = net.op("Gemm", [x, net.const(net.weights(a, k)), net.const(rng.normal(size=a))], transB=1)
        right = net.op("Gemm", [x, net.const(net.weights(w, k)), net.const(rng.normal(size=w))], transB=1)
        return net.op("Concat", [left, right], axis=int(rng.choice([1, -1]))), a + w
    if style == "sub2":  # difference of two input-dependent branches
        left = net.op("Gemm", [x, net.const(net.weights(w, k)), net.const(rng.normal(size=w))], transB=1)
        right = net.op("MatMul", [x, net.const(net.weights(w, k).T)])
        return net.op("Sub", [left, right]), w
    raise AssertionError(style)


def activation(net: Net, x: str, kind: str) -> str:
    rng = net.rng
    if kind == "LeakyRelu":
        return net.op("LeakyRelu", [x], alpha=float(rng.choice([0.01, 0.2])))
    if kind == "Clip":
        lo = float(rng.uniform(-2.0, 0.0))
        return net.op("Clip", [x, net.const(lo), net.const(lo + rng.uniform(0.1, 3.0))])
    if kind == "ClipMax":
        return net.op("Clip", [x, "", net.const(rng.uniform(-0.5, 1.0))])
    return net.op(kind, [x])


def build(n_in: int, layers: list, m: int, pre: bool, tail: str, seed: int):
    net = Net(n_in, seed)
    x, k = "x", n_in
    if pre:  # normalisation as torch exports it, constants with and without a batch axis
        mean = net.rng.normal(size=(n_in,) if net.rng.random() < 0.5 else (1, n_in))
        mean = net.const(mean, via_node=True)
        x = net.op("Sub", [x, mean] if net.rng.random() < 0.5 else [mean, x])
        x = net.op("Div", [x, net.const(net.rng.uniform(0.3, 2.0, size=n_in))])
        x = net.op("Mul", [net.const(net.rng.choice([-1.0, 2.0])), x])
    for style, w, kind in layers:
        if style == "reshape":  # [B, 2h] -> [B, 2, h] -> (x W) -> (C x) -> act -> flatten [B, 2w]
            h = net.op("Gemm", [x, net.const(net.weights(2 * w, k)), net.const(np.zeros(2 * w))], transB=1)
            if net.rng.random() < 0.5:  # a shape computed by constant nodes, folded at load
                shape = net.op("Concat", [net.const([0], np.int64, via_node=True), net.const([2, w], np.int64)], axis=0)
            else:
                shape = net.const([-1, 2, w], np.int64)
            h = net.op("Reshape", [h, shape])
            h = net.op("MatMul", [h, net.const(net.weights(w, w).T)])
            h = net.op("MatMul", [net.const(net.rng.normal(size=(2, 2))), h])
            x, k = net.op("Flatten", [activation(net, h, kind)], axis=1), 2 * w
            continue
        h, k = affine(net, x, k, w, style)
        x = activation(net, h, kind)
    y = net.op("Gemm", [x, net.const(net.weights(m, k)), net.const(net.rng.normal(size=m))], transB=1)
    if tail == "reshape":
        y = net.op("Reshape", [y, net.const([-1, m], np.int64)])
    elif tail == "flatten":
        y = net.op("Flatten", [y])
    return net.model(y, m)


def random_box(n: int, seed: int, flat_dim: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    center = rng.normal(0.0, 1.5, n)
    half = np.exp(rng.uniform(np.log(0.01), np.log(3.0), n))
    if flat_dim:
        half[rng.integers(n)] = 0.0
    return center - half, center + half


def ort_run(model, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.astype(np.float32)})[0].astype(np.float64)


def assert_sound(model, lower, upper, n_random: int = 2000, seed: int = 0):
    """Sampled + corner inputs: onnxruntime and the float64 reference lie inside IBP and CROWN
    bounds (every intermediate value too, for the reference), and inside CROWN's linear bounds."""
    graph = load_graph(model)
    lo, hi = prepare_box(graph, lower, upper)
    ibp_all = ibp(graph, lo[None], hi[None])
    crown_all, lin = crown(graph, lo[None], hi[None])
    x = sample_points(lo, hi, n_random, np.random.default_rng(seed)).astype(np.float64)
    values = evaluate_all(graph, x)
    got = ort_run(model, x)
    slack = float32_slack(error_scale(graph, ibp_all))[0]
    assert np.all(np.abs(got - values[-1]) <= slack), "graph reading differs from onnxruntime"
    for bounds in (ibp_all, crown_all):
        for v, (b_lo, b_hi) in enumerate(bounds):
            assert np.all(values[v] >= b_lo[0]) and np.all(values[v] <= b_hi[0]), f"value {v} escapes"
        assert np.all(got >= bounds[-1][0][0] - slack) and np.all(got <= bounds[-1][1][0] + slack)
    size = np.abs(x) @ np.abs(lin.lower_coef[0]).T + np.abs(lin.lower_const[0]) + 1.0
    assert np.all(x @ lin.lower_coef[0].T + lin.lower_const[0] <= values[-1] + 1e-8 * size)
    size = np.abs(x) @ np.abs(lin.upper_coef[0]).T + np.abs(lin.upper_const[0]) + 1.0
    assert np.all(x @ lin.upper_coef[0].T + lin.upper_const[0] >= values[-1] - 1e-8 * size)
    i_lo, i_hi = ibp_all[-1]
    c_lo, c_hi = crown_all[-1]
    assert np.all(c_hi - c_lo <= i_hi - i_lo)
    return float(np.sum(i_hi - i_lo)), float(np.sum(c_hi - c_lo))


# ---------------------------------------------------------------- relaxations

@pytest.mark.parametrize("act", [acts.Relu(), acts.LeakyRelu(0.1), acts.LeakyRelu(-0.5), acts.Clip(-1.0, 2.0),
                                 acts.Clip(-np.inf, 0.5), acts.Clip(1.0, -1.0), acts.Sigmoid(), acts.Tanh()],
                         ids=lambda a: a.name)
def test_relaxations_bound_the_function_on_each_interval(act):
    rng = np.random.default_rng(3)
    a = rng.normal(0, 3, 400) * rng.choice([0.01, 1.0, 10.0, 100.0], 400)
    b = a + np.abs(rng.normal(0, 3, 400)) * rng.choice([0.0, 1e-9, 0.1, 1.0, 30.0], 400)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    lo[:4], hi[:4] = [-3.0, 0.0, 2.0, -800.0], [3.0, 0.0, 2.0, 900.0]  # symmetric, points, huge
    r = act.relax(lo, hi)
    i_lo, i_hi = act.interval(lo, hi)
    t = np.linspace(0.0, 1.0, 301)[:, None]
    x = lo + t * (hi - lo)
    f = act(x)
    assert np.all(r.lower_slope * x + r.lower_offset <= f)
    assert np.all(r.upper_slope * x + r.upper_offset >= f)
    assert np.all((i_lo <= f) & (f <= i_hi))


def test_tanh_relaxation_follows_crown_shapes():
    t = acts.Tanh()
    r = t.relax(np.array([-2.0, 0.5, -1.0]), np.array([-0.5, 2.0, 1.5]))
    chord = (np.tanh(-0.5) - np.tanh(-2.0)) / 1.5
    assert r.upper_slope[0] == pytest.approx(chord)              # convex side: chord above
    assert r.upper_offset[0] == pytest.approx(np.tanh(-0.5) + 0.5 * chord, abs=1e-8)
    assert r.lower_slope[1] == pytest.approx((np.tanh(2.0) - np.tanh(0.5)) / 1.5)  # concave: chord below
    # mixed signs: the upper line passes (nearly) through (l, tanh(l)) and touches tanh beyond 0
    assert r.upper_slope[2] * -1.0 + r.upper_offset[2] == pytest.approx(np.tanh(-1.0), abs=1e-6)


# ---------------------------------------------------------------- soundness on random models

layer = st.tuples(st.sampled_from(["gemm", "matmul", "concat", "sub2", "reshape"]), st.integers(1, 5),
                  st.sampled_from(["Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "ClipMax"]))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n_in=st.integers(1, 4), layers=st.lists(layer, min_size=1, max_size=3), m=st.integers(1, 3),
       pre=st.booleans(), tail=st.sampled_from(["none", "reshape", "flatten"]), flat=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_random_models_stay_inside_ibp_and_crown_bounds(n_in, layers, m, pre, tail, flat, seed):
    model = build(n_in, layers, m, pre, tail, seed)
    lo, hi = random_box(n_in, seed, flat)
    assert_sound(model, lo, hi, n_random=1500, seed=seed)


def test_clip_attributes_of_old_opsets():
    net = Net(3, 5, opset=10)
    h = net.op("Gemm", ["x", net.const(net.weights(4, 3)), net.const(np.zeros(4))], transB=1)
    h = net.op("Clip", [h], min=-0.3, max=0.4)
    w2 = net.weights(2, 4)
    model = net.model(net.op("Gemm", [h, net.const(w2), net.const(np.ones(2))], transB=1), 2)
    assert_sound(model, [-1, -1, -1], [1, 2, 0.5])
    i_lo, i_hi = ibp_bounds(model, [-1, -1, -1], [1, 2, 0.5])
    assert np.all(i_hi - i_lo <= 0.7 * np.abs(w2).sum(1) + 1e-6)  # each hidden value spans at most 0.7


def deep_tanh(seed: int = 11, n_in: int = 3, width: int = 16, depth: int = 4):
    net = Net(n_in, seed)
    x, k = "x", n_in
    for _ in range(depth):
        x = net.op("Tanh", [net.op("Gemm", [x, net.const(net.weights(width, k)),
                                            net.const(net.rng.normal(size=width) * 0.3)], transB=1)])
        k = width
    return net.model(net.op("Gemm", [x, net.const(net.weights(1, k)), net.const([0.0])], transB=1), 1)


def test_crown_is_strictly_tighter_than_ibp_on_a_deeper_net():
    ibp_w, crown_w = assert_sound(deep_tanh(), [-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    assert crown_w < 0.8 * ibp_w


# ---------------------------------------------------------------- demo model

@pytest.mark.parametrize("box", [WIDE, TIGHT], ids=["config-ranges", "realistic"])
def test_demo_model_bounds_are_sound_and_crown_is_tighter(box):
    a = analyze(DEMO_MODEL, *box)
    assert a.crown_width <= a.ibp_width  # the clip head can saturate both at ±0.14
    head_free = analyze(without_output_head(onnx.load(DEMO_MODEL)), *box)
    assert head_free.crown_width < head_free.ibp_width
    assert np.all(a.crown_lower >= a.ibp_lower) and np.all(a.crown_upper <= a.ibp_upper)
    assert_sound(onnx.load(DEMO_MODEL), *box, n_random=3000)
    c_lo, c_hi = crown_bounds(DEMO_MODEL, *box)
    assert np.array_equal(c_lo, a.crown_lower) and np.array_equal(c_hi, a.crown_upper)


def test_demo_model_is_proven_inside_the_actuator_limits_on_config_ranges():
    """The demo model's output head is 0.14 * clip(., -1, 1): the ±0.15 mm actuator limits hold by construction,
    and the analysis proves it on the graph without needing a single split."""
    res = prove(DEMO_MODEL, *WIDE, -0.15, 0.15, max_splits=32, samples=1000)
    assert res.proven and res.splits == 0 and res.counterexample is None
    assert -0.15 < res.lower[0] < res.upper[0] < 0.15
    assert res.empirical.sampled_lower[0] >= res.lower[0] and res.empirical.sampled_upper[0] <= res.upper[0]


def without_output_head(model: onnx.ModelProto) -> onnx.ModelProto:
    """The demo model with its bounding head (clip, formerly tanh) removed: output = 0.14 * net(x), unbounded."""
    g = model.graph
    tanh = [n for n in g.node if n.op_type in ("Tanh", "Clip")][-1]
    for node in g.node:
        for i, name in enumerate(node.input):
            if name == tanh.output[0]:
                node.input[i] = tanh.input[0]
    g.node.remove(tanh)
    return model


def test_unbounded_variant_breaks_the_limits_with_a_real_counterexample():
    model = without_output_head(onnx.load(DEMO_MODEL))
    res = prove(model, *WIDE, -0.15, 0.15, max_splits=32, samples=1000)
    assert not res.proven
    w = res.counterexample
    assert w is not None and w.violation > 0
    assert np.all(w.input >= res.box_lower) and np.all(w.input <= res.box_upper)
    again = ort_run(model, w.input[None])[0]
    assert again[0] == pytest.approx(w.output[0], abs=1e-6)
    assert not -0.15 <= again[0] <= 0.15
    assert res.lower[0] <= again[0] <= res.upper[0]


def test_branching_proves_what_ibp_and_crown_cannot_on_the_unbounded_variant():
    model = without_output_head(onnx.load(DEMO_MODEL))
    a = analyze(model, *TIGHT)
    sampled_max = prove(model, *TIGHT, None, None, samples=2000).empirical.sampled_upper[0]
    limit = sampled_max + 0.5 * (a.crown_upper[0] - sampled_max)
    res = prove(model, *TIGHT, None, limit, max_splits=256, samples=1000)
    assert res.ibp_upper[0] > limit and res.crown_upper[0] > limit  # neither proves it alone
    assert res.proven and res.method == "crown+split" and 0 < res.splits <= 256
    assert res.upper[0] <= limit and res.width < res.crown_width < res.ibp_width
    assert res.empirical.sampled_upper[0] <= res.upper[0]


# ---------------------------------------------------------------- branching on a constructed net

def two_input_net():
    return deep_tanh(seed=4, n_in=2, width=12, depth=2)


def test_branching_proves_a_limit_between_the_true_max_and_crown():
    model = two_input_net()
    box = ([-2.0, -2.0], [2.0, 2.0])
    a = analyze(model, *box)
    grid = np.stack(np.meshgrid(np.linspace(-2, 2, 201), np.linspace(-2, 2, 201)), -1).reshape(-1, 2)
    true_max = ort_run(model, grid).max()
    limit = true_max + 0.25 * (a.crown_upper[0] - true_max)
    assert a.crown_upper[0] > limit
    res = prove(model, *box, None, limit, max_splits=400, samples=500)
    assert res.proven and res.splits > 0 and res.upper[0] <= limit
    assert res.proven_fraction == 1.0 and res.open_region is None and res.counterexample is None


def test_false_limit_yields_counterexample_and_failing_sub_box():
    model = two_input_net()
    box = ([-2.0, -2.0], [2.0, 2.0])
    true_max = ort_run(model, sample_points(np.array(box[0]), np.array(box[1]), 4000,
                                            np.random.default_rng(0))).max()
    limit = true_max - 0.05
    res = prove(model, *box, None, limit, max_splits=64, samples=500, keep_splitting=True)
    assert not res.proven
    assert res.counterexample.side == "upper" and res.counterexample.output[0] > limit
    r = res.open_region
    assert r.side == "upper" and r.bound > limit and r.limit == limit
    assert np.all(r.lower >= res.box_lower) and np.all(r.upper <= res.box_upper)
    assert np.prod(r.upper - r.lower) < np.prod(res.box_upper - res.box_lower)  # a real sub-box
    assert 0.0 <= res.proven_fraction < 1.0


def test_exhausted_budget_reports_the_open_box_without_counterexample():
    model = two_input_net()
    box = ([-2.0, -2.0], [2.0, 2.0])
    a = analyze(model, *box)
    grid = np.stack(np.meshgrid(np.linspace(-2, 2, 201), np.linspace(-2, 2, 201)), -1).reshape(-1, 2)
    limit = 0.5 * (ort_run(model, grid).max() + a.crown_upper[0])  # true, but CROWN alone misses it
    res = prove(model, *box, None, limit, max_splits=0, samples=200)
    assert not res.proven and res.splits == 0 and res.counterexample is None
    assert res.closest.violation < 0
    r = res.open_region
    assert r.side == "upper" and r.bound == a.crown_upper[0] and r.limit == limit
    assert np.array_equal(r.lower, res.box_lower) and np.array_equal(r.upper, res.box_upper)


# ---------------------------------------------------------------- rejected models and boxes

def small(net_ops, n_in=2, **model_kw):
    net = Net(n_in, 0)
    return net.model(net_ops(net), model_kw.pop("m", 2), **model_kw)


def test_unsupported_op_is_named():
    model = small(lambda net: net.op("Sin", [net.op("MatMul", ["x", net.const(np.eye(2))])]))
    with pytest.raises(BoundsError, match=r"sin\d+.*'Sin' is not supported.*supported: .*Gemm.*Tanh"):
        load_graph(model)


@pytest.mark.parametrize("ops, match", [
    (lambda net: net.op("Mul", ["x", "x"]), "Mul of two input-dependent"),
    (lambda net: net.op("Div", [net.const(1.0), "x"]), "division of a constant"),
    (lambda net: net.op("Gemm", ["x", net.const(np.eye(2))], transA=1), "transA"),
    (lambda net: net.op("Reshape", ["x", net.const([2, -1], np.int64)]), "batch axis"),
    (lambda net: net.op("Flatten", ["x"], axis=0), "axis=0"),
    (lambda net: net.op("Add", ["x", net.const(np.ones((3, 2)))]), "broadcast over the batch"),
    (lambda net: net.op("Clip", ["x", "x"]), "Clip bounds must be constants"),
], ids=["mul-vars", "div-by-var", "transA", "reshape-batch", "flatten-0", "batch-broadcast", "clip-var"])
def test_non_affine_or_batch_mixing_uses_are_rejected(ops, match):
    with pytest.raises(BoundsError, match=match):
        load_graph(small(ops))


def test_bad_shapes_are_rejected():
    ident = lambda net: net.op("Identity", ["x"])  # noqa: E731
    with pytest.raises(BoundsError, match=r"expected \[batch, n\]"):
        load_graph(small(ident, in_shape=["batch", 2, 1]))
    with pytest.raises(BoundsError, match=r"expected \[batch, n\]"):
        load_graph(small(ident, in_shape=[4, 2]))
    with pytest.raises(BoundsError, match="expected FLOAT"):
        load_graph(small(ident, in_type=TensorProto.DOUBLE))
    with pytest.raises(BoundsError, match=r"declared \[batch, 3\] but computes \[batch, 2\]"):
        load_graph(small(ident, m=3))
    with pytest.raises(BoundsError, match=r"computes \[batch, 2, 1\]"):
        load_graph(small(lambda net: net.op("Reshape", ["x", net.const([0, 2, 1], np.int64)])))
    with pytest.raises(BoundsError, match="not an ONNX file"):
        load_graph(b"junk")
    model = small(ident)
    with pytest.raises(BoundsError, match="has 2"):
        analyze(model, [0, 0, 0], [1, 1, 1])
    with pytest.raises(BoundsError, match="empty"):
        analyze(model, [0, 2], [1, 1])
    with pytest.raises(BoundsError, match="finite"):
        analyze(model, [0, -np.inf], [1, 1])


def test_fixed_batch_of_one_and_constant_output():
    model = small(lambda net: net.op("Relu", [net.op("Gemm", ["x", net.const(np.ones((2, 1)))])]),
                  m=1, in_shape=[1, 2], out_shape=[1, 1])
    res = prove(model, [-1.0, -1.0], [1.0, 0.5], 0.0, 1.5 + 1e-6, samples=50)  # the max, 1.5, is attained
    assert res.proven and res.upper[0] == pytest.approx(1.5) and res.empirical.sampled_upper[0] == 1.5
    exact = prove(model, [-1.0, -1.0], [1.0, 0.5], 0.0, 1.5, max_splits=4, samples=50)
    assert not exact.proven and exact.counterexample is None  # outward rounding: never claims a tight max
    const = small(lambda net: net.op("Add", [net.const([[1.0, 2.0]]), net.const([0.5, 0.5])]))
    a = analyze(const, [0.0, 0.0], [1.0, 1.0])
    assert np.allclose(a.crown_lower, [1.5, 2.5]) and np.allclose(a.crown_upper, [1.5, 2.5])


def test_identity_model_bounds_are_the_box():
    a = analyze(small(lambda net: net.op("Identity", ["x"])), [-1.0, 0.25], [2.0, 0.75])
    assert np.allclose(a.crown_lower, [-1.0, 0.25]) and np.allclose(a.crown_upper, [2.0, 0.75])
    assert np.all(a.crown_lower <= [-1.0, 0.25]) and np.all(a.crown_upper >= [2.0, 0.75])


# ---------------------------------------------------------------- certificates

def _unbounded_file(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(without_output_head(onnx.load(DEMO_MODEL)), path)
    return path


def test_certificate_round_trip_and_verification(tmp_path):
    path = _unbounded_file(tmp_path)
    cert = certify(path, *TIGHT, -0.8, 0.6, max_splits=256, samples=500)
    assert cert.method == "crown+split" and cert.splits > 0
    assert cert.crown_width < cert.ibp_width and cert.width < cert.crown_width
    again = Certificate.from_json(cert.to_json())
    assert again == cert
    v = verify_certificate(path, again)
    assert v.upper[0] <= 0.6 and v.lower[0] >= -0.8 and v.leaves == cert.splits + 1

    edited = Certificate.from_json(cert.to_json())
    edited.output_upper = [0.3]  # tighter than what the analysis can show
    with pytest.raises(CertificateError, match="no longer hold"):
        verify_certificate(path, edited)

    data = json.loads(cert.to_json())
    data["input_upper"][0] = 4.5  # a wider box than was analysed
    with pytest.raises(CertificateError, match="hash"):
        Certificate.from_json(json.dumps(data))


def test_certificate_rejects_a_modified_model(tmp_path):
    path = _unbounded_file(tmp_path)
    cert = certify(path, *TIGHT, -0.74, 0.74, samples=300)  # between CROWN (0.73) and IBP (0.76)
    assert cert.method == "crown" and cert.splits == 0
    model = onnx.load(path)
    last = next(t for t in model.graph.initializer if t.name == "net.4.weight")
    last.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(last) * 3.0, last.name))
    onnx.save(model, path)
    with pytest.raises(CertificateError, match="SHA-256"):
        verify_certificate(path, cert)
    cert.model_sha256 = hashlib.sha256(path.read_bytes()).hexdigest()  # even if someone re-hashes it
    with pytest.raises(CertificateError, match="no longer hold"):
        verify_certificate(path, cert)


def test_certify_refuses_a_false_limit(tmp_path):
    with pytest.raises(BoundsError, match="counterexample"):
        certify(_unbounded_file(tmp_path), *WIDE, -0.15, 0.15, max_splits=8, samples=200)


def test_certificate_carries_the_constraint_hash_and_refuses_others(tmp_path):
    """constraints_sha256 is recorded, survives the JSON, and verify_certificate given the running
    constraint hash refuses a certificate for another set (naming both hashes) or one without a hash."""
    from ep.bounds.certificate import check_constraints_hash

    path = _unbounded_file(tmp_path)
    mine, other = hashlib.sha256(b"these constraints").hexdigest(), hashlib.sha256(b"others").hexdigest()
    cert = certify(path, *TIGHT, -0.74, 0.74, samples=300, constraints_sha256=mine)
    again = Certificate.from_json(cert.to_json())
    assert again.constraints_sha256 == mine and again == cert
    verify_certificate(path, again, constraints_sha256=mine)
    check_constraints_hash(again, mine.upper())  # hex case does not matter
    with pytest.raises(CertificateError, match="other constraints") as err:
        verify_certificate(path, again, constraints_sha256=other)
    assert mine in str(err.value) and other in str(err.value) and "sitsctl check" in str(err.value)

    data = json.loads(cert.to_json())
    del data["constraints_sha256"]  # written before certificates carried the hash: still readable
    old = Certificate.from_json(json.dumps(data))
    assert old.constraints_sha256 == ""
    verify_certificate(path, old)  # without a running hash to compare, the bounds still verify
    with pytest.raises(CertificateError, match="predates constraint hashing.*sitsctl check"):
        verify_certificate(path, old, constraints_sha256=mine)

    data["constraints_sha256"] = "not a hash"
    with pytest.raises(CertificateError, match="constraints_sha256"):
        Certificate.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="constraints_sha256"):
        certify(path, *TIGHT, -0.74, 0.74, samples=300, constraints_sha256="xyz")
