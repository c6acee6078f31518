"""The streaming sequence model: a small causal transformer whose tokens are sensor frames.

`build_model(spec, seed)` writes the ONNX graph with `onnx.helper` (no binaries in the repository);
weights are deterministic random (a fixed seed), scaled so activations stay O(1). `reference_step`
is the same network in numpy (float64) with an explicit softmax attention, used by the tests to
check ORT's `com.microsoft.GroupQueryAttention`.

One token = one frame of `n_inputs` signals. Per layer (pre-LayerNorm)::

    x = frame @ W_in + b_in + pe(position)          pe: sinusoidal, computed by the runner
    a = GQA(LN(x) @ Wq, LN(x) @ Wk, LN(x) @ Wv, past_key_i, past_value_i, seqlens_k, total_len)
    x = x + a @ Wo + bo
    x = x + Gelu(LN(x) @ W1 + b1) @ W2 + b2
    out = LN(x) @ W_head + b_head

Graph inputs: `frame` [1, T, n_inputs], `pe` [1, T, d_model], `seqlens_k` [1] int32 (= tokens in the
buffer after this step - 1), `total_sequence_length` [] int32 (= tokens after this step), and per layer
`past_key_i` / `past_value_i` [1, kv_heads, capacity, head_dim]. Outputs `action` [1, T, n_outputs]
and `present_key_i` / `present_value_i`. Bound to the *same* buffer as past and present, GQA appends
the new keys/values in place (ORT shares the buffer when the two pointers are equal). The position
is absolute and enters through `pe` only, so keys already in the buffer do not depend on where in
the buffer they sit: the runner can slide the window by moving rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

OPSET = 21
MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True, slots=True)
class StreamSpec:
    n_inputs: int = 6
    n_outputs: int = 1
    d_model: int = 64
    n_heads: int = 4
    kv_heads: int = 2
    n_layers: int = 2
    d_ff: int = 256
    # per input (low, high): the graph maps each signal to [-1, 1] first (raw sensor units differ by 10^4)
    input_range: tuple[tuple[float, float], ...] | None = None
    # per output (low, high): a saturating head, out = mid + half * tanh(z), so every output stays inside
    # (low, high) for any input and any context (what `sitsctl check` can state for this model); None:
    # a linear head
    output_range: tuple[tuple[float, float], ...] | None = None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def input_affine(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(center, 1/half-width) of the input normalization, or None."""
        if self.input_range is None:
            return None
        lo, hi = np.array(self.input_range, np.float64).T
        return (hi + lo) / 2, 2 / (hi - lo)

    def output_affine(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(mid, half) of the tanh head, float32 as in the graph, or None. `half` is shrunk by 2^-12 so
        that mid + half rounded in float32 never lands outside (low, high)."""
        if self.output_range is None:
            return None
        lo, hi = np.array(self.output_range, np.float64).T
        return ((hi + lo) / 2).astype(np.float32), ((hi - lo) / 2 * (1 - 2.0 ** -12)).astype(np.float32)

    def kv_token_bytes(self, itemsize: int = 4) -> int:
        """Bytes of keys + values of one token over all layers."""
        return self.n_layers * 2 * self.kv_heads * self.head_dim * itemsize


def weights(spec: StreamSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random weights (float32), named as in the graph."""
    rng = np.random.default_rng(seed)
    d, f, kvd = spec.d_model, spec.d_ff, spec.kv_heads * spec.head_dim

    def mat(k, n):
        return (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)

    def vec(n, s=0.02):
        return (rng.standard_normal(n) * s).astype(np.float32)

    w = {"W_in": mat(spec.n_inputs, d), "b_in": vec(d)}
    for i in range(spec.n_layers):
        w |= {f"ln1_g{i}": 1 + vec(d, 0.05), f"ln1_b{i}": vec(d), f"Wq{i}": mat(d, d), f"Wk{i}": mat(d, kvd),
              f"Wv{i}": mat(d, kvd), f"Wo{i}": mat(d, d), f"bo{i}": vec(d), f"ln2_g{i}": 1 + vec(d, 0.05),
              f"ln2_b{i}": vec(d), f"W1{i}": mat(d, f), f"b1{i}": vec(f), f"W2{i}": mat(f, d), f"b2{i}": vec(d)}
    w |= {"lnf_g": 1 + vec(d, 0.05), "lnf_b": vec(d), "W_head": mat(d, spec.n_outputs), "b_head": vec(spec.n_outputs)}
    return w


def build_model(spec: StreamSpec = StreamSpec(), seed: int = 0, capacity: int | str = "C"):
    """The ONNX ModelProto (opset 21 + com.microsoft 1). `capacity` is the KV buffer length (an int,
    or a symbolic dimension name: the runner picks it when it binds the buffers)."""
    from onnx import TensorProto, helper, numpy_helper

    w = weights(spec, seed)
    f32 = TensorProto.FLOAT
    kv_shape = [1, spec.kv_heads, capacity, spec.head_dim]
    inputs = [helper.make_tensor_value_info("frame", f32, [1, "T", spec.n_inputs]),
              helper.make_tensor_value_info("pe", f32, [1, "T", spec.d_model]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("action", f32, [1, "T", spec.n_outputs])]
    nodes = []

    def node(op, ins, outs, domain="", **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=outs[0] + "/" + op, domain=domain, **attrs))
        return outs[0]

    def linear(x, wn, bn, out):
        y = node("MatMul", [x, wn], [out + "_mm"])
        return node("Add", [y, bn], [out]) if bn else y

    frame = "frame"
    extra = []
    if spec.input_affine() is not None:
        center, scale = spec.input_affine()
        extra += [numpy_helper.from_array(center.astype(np.float32), "in_center"),
                  numpy_helper.from_array(scale.astype(np.float32), "in_scale")]
        frame = node("Mul", [node("Sub", ["frame", "in_center"], ["frame_c"]), "in_scale"], ["frame_n"])
    x = node("Add", [linear(frame, "W_in", "b_in", "x_in"), "pe"], ["x0"])
    for i in range(spec.n_layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{i}", f32, kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present_{kind}_{i}", f32, kv_shape))
        a = node("LayerNormalization", [x, f"ln1_g{i}", f"ln1_b{i}"], [f"ln1_{i}"], axis=-1, epsilon=1e-5)
        q = node("MatMul", [a, f"Wq{i}"], [f"q{i}"])
        k = node("MatMul", [a, f"Wk{i}"], [f"k{i}"])
        v = node("MatMul", [a, f"Wv{i}"], [f"v{i}"])
        att = node("GroupQueryAttention", [q, k, v, f"past_key_{i}", f"past_value_{i}", "seqlens_k",
                                           "total_sequence_length"],
                   [f"att{i}", f"present_key_{i}", f"present_value_{i}"], domain=MS_DOMAIN,
                   num_heads=spec.n_heads, kv_num_heads=spec.kv_heads)
        x = node("Add", [x, linear(att, f"Wo{i}", f"bo{i}", f"o{i}")], [f"x{i}_a"])
        m = node("LayerNormalization", [x, f"ln2_g{i}", f"ln2_b{i}"], [f"ln2_{i}"], axis=-1, epsilon=1e-5)
        h = node("Gelu", [linear(m, f"W1{i}", f"b1{i}", f"h{i}")], [f"g{i}"])
        x = node("Add", [x, linear(h, f"W2{i}", f"b2{i}", f"f{i}")], [f"x{i}_f"])
    y = node("LayerNormalization", [x, "lnf_g", "lnf_b"], ["lnf"], axis=-1, epsilon=1e-5)
    if spec.output_affine() is None:
        node("Add", [node("MatMul", [y, "W_head"], ["head_mm"]), "b_head"], ["action"])
    else:
        mid, half = spec.output_affine()
        extra += [numpy_helper.from_array(mid, "out_mid"), numpy_helper.from_array(half, "out_half")]
        z = node("Add", [node("MatMul", [y, "W_head"], ["head_mm"]), "b_head"], ["head_z"])
        t = node("Mul", [node("Tanh", [z], ["head_tanh"]), "out_half"], ["head_scaled"])
        node("Add", [t, "out_mid"], ["action"])
    graph = helper.make_graph(nodes, "sits_stream", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in w.items()] + extra)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="sits2026 ep.streaming")
    model.ir_version = 10
    return model


def positional_encoding(positions: np.ndarray, d_model: int, out: np.ndarray | None = None) -> np.ndarray:
    """Sinusoidal encoding [len(positions), d_model] (float32): sin on even, cos on odd columns."""
    positions = np.asarray(positions, dtype=np.float64).reshape(-1, 1)
    inv = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2) / d_model)
    ang = positions * inv
    if out is None:
        out = np.empty((positions.shape[0], d_model), dtype=np.float32)
    out[:, 0::2] = np.sin(ang)
    out[:, 1::2] = np.cos(ang)
    return out


# --- numpy reference (float64) ------------------------------------------------------------------

def _ln(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def _gelu(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))


def reference_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, n_heads: int) -> np.ndarray:
    """Softmax attention of one query token over `keys`/`values` [kv_heads, n, head_dim] (all visible),
    query heads grouped onto kv heads as GQA does (head h reads kv head h // (n_heads / kv_heads))."""
    kv_heads, _, hd = keys.shape
    q = q.reshape(n_heads, hd)
    group = n_heads // kv_heads
    out = np.empty((n_heads, hd))
    for h in range(n_heads):
        k, v = keys[h // group], values[h // group]
        s = k @ q[h] / math.sqrt(hd)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v
    return out.reshape(-1)


class ReferenceStream:
    """The model in numpy float64 with a sliding window of `window` tokens: what attention sees at
    each step is the last `visible(step)` keys/values, given by the caller."""

    def __init__(self, spec: StreamSpec, seed: int = 0) -> None:
        self.spec = spec
        self.w = {k: v.astype(np.float64) for k, v in weights(spec, seed).items()}
        self.keys = [[] for _ in range(spec.n_layers)]
        self.values = [[] for _ in range(spec.n_layers)]
        self.position = 0

    def step(self, frame: np.ndarray, visible: int | None = None) -> np.ndarray:
        """One token; attention covers the last `visible` tokens including this one (all when None)."""
        s, w = self.spec, self.w
        pe = positional_encoding([self.position], s.d_model)[0].astype(np.float64)
        x = np.asarray(frame, np.float64)
        if s.input_affine() is not None:
            center, scale = s.input_affine()
            x = (x - center) * scale
        x = x @ w["W_in"] + w["b_in"] + pe
        for i in range(s.n_layers):
            a = _ln(x, w[f"ln1_g{i}"], w[f"ln1_b{i}"])
            q, k, v = a @ w[f"Wq{i}"], a @ w[f"Wk{i}"], a @ w[f"Wv{i}"]
            self.keys[i].append(k.reshape(s.kv_heads, s.head_dim))
            self.values[i].append(v.reshape(s.kv_heads, s.head_dim))
            n = len(self.keys[i]) if visible is None else visible
            ks = np.stack(self.keys[i][-n:], axis=1)
            vs = np.stack(self.values[i][-n:], axis=1)
            att = reference_attention(q, ks, vs, s.n_heads)
            x = x + att @ w[f"Wo{i}"] + w[f"bo{i}"]
            m = _ln(x, w[f"ln2_g{i}"], w[f"ln2_b{i}"])
            x = x + _gelu(m @ w[f"W1{i}"] + w[f"b1{i}"]) @ w[f"W2{i}"] + w[f"b2{i}"]
        self.position += 1
        z = _ln(x, w["lnf_g"], w["lnf_b"]) @ w["W_head"] + w["b_head"]
        if s.output_affine() is None:
            return z
        mid, half = s.output_affine()
        return mid.astype(np.float64) + half.astype(np.float64) * np.tanh(z)


def head_range_of(model_bytes: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """The output range a streaming graph's tanh head guarantees, (low, high) per output as float32
    computes mid -/+ half; None when the graph does not end in that head (action = Tanh(z) * half + mid)."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load_from_string(model_bytes).graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    add = producer.get("action")
    if add is None or add.op_type != "Add" or list(add.input)[1:] != ["out_mid"]:
        return None
    mul = producer.get(add.input[0])
    if mul is None or mul.op_type != "Mul" or list(mul.input)[1:] != ["out_half"] or "out_mid" not in inits:
        return None
    tanh = producer.get(mul.input[0])
    if tanh is None or tanh.op_type != "Tanh" or "out_half" not in inits:
        return None
    mid = numpy_helper.to_array(inits["out_mid"]).astype(np.float32)
    half = np.abs(numpy_helper.to_array(inits["out_half"]).astype(np.float32))
    return (mid - half).astype(np.float64), (mid + half).astype(np.float64)
