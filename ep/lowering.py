"""`int8-blocks` compute for FP8 artifacts: the FP8 weights of large layers are re-quantized at load to
int8 blocks and run by ONNX Runtime's `com.microsoft.MatMulNBits` (bits=8, accuracy_level=4: the
activation row is quantized to int8 per block and the dot products run on the CPU's int8 units, VNNI
on this machine). FP8 stays the storage format (the artifact file is unchanged); what changes is the
arithmetic, so it is a compile-time choice (`sitsctl compile --compute int8-blocks`), recorded in the
manifest (`runtime.compute`), and the manifest's accuracy report is measured through this lowering.

Why: at batch 1 an FP32 GEMV streams its whole weight matrix per call; for a 256x256 layer that is
256 KiB in ~2 us, this core's L2 bandwidth, and no FP32 kernel beats it. int8 weights are a quarter
of the bytes: the same layer takes ~1 us less in MatMulNBits. Below ~32k weights the kernel's fixed
cost (activation quantization, one more node) loses to FP32 (measured break-even between 128x128 and
256x256), so only layers with at least `MIN_WEIGHT_ELEMENTS` weights are lowered; the others keep
the FP8 -> FP32 fold at load.

The rewrite, per lowered layer (MatMul whose B is `DequantizeLinear(float8 initializer, scale [N],
axis=1)`, optionally followed by `Add` of a constant [N] bias that nothing else reads):
    w = float32(q) * scale                 (the bits ORT's fold and `ep.artifact.dequantized` give)
    per output column n and block b of `block_size` rows of K:
        s[n, b] = max|w[b, n]| / 127 (1 for an all-zero block),  i8 = clip(rint(w / s), -127, 127)
    MatMulNBits(A, uint8(i8 + 128) [N, blocks, block_size], s [N * blocks], bias) -> the layer output
The lowering is deterministic (numpy, no ORT), so compile's accuracy measurement and the daemon run
the same graph. Extra weight error over FP8's own: ~0.7 % relative (int8 per 128-block vs e4m3's
~2.5 %); plus the activation quantization of accuracy_level 4.

Not covered by `ep.bounds` or the proof circuit: both read the FP8 weights folded to FP32
(`ep.artifact.dequantized`) and assume FP32 arithmetic. An `int8-blocks` artifact therefore runs a
different arithmetic than they analyse; that is why it is not the compile default.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from .errors import ModelLoadError

INT8_BLOCKS = "int8-blocks"
COMPUTE_MODES = ("fp32", INT8_BLOCKS)
BLOCK_SIZE = 128
ACCURACY_LEVEL = 4
MIN_WEIGHT_ELEMENTS = 32768
MS_DOMAIN = "com.microsoft"
METADATA_KEY = "sits.compute"  # set in an int8-blocks artifact's graph, so tools reading the bytes alone see it
REFUSAL = ("this artifact is compiled with --compute int8-blocks: its large layers run as int8 blocks with int8 "
           "activations (ep.lowering), not the FP32 arithmetic of the folded weights; bounds certificates and "
           "proofs cover only FP32 compute (recompile with --compute fp32)")
_FP8_TYPES = (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2)


def _int8_blocks(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """w [K, N] float32 -> (uint8 [N, blocks, block_size] with zero point 128, float32 scales [N * blocks])."""
    k, n = w.shape
    blocks = -(-k // block_size)
    padded = np.zeros((blocks * block_size, n), np.float32)
    padded[:k] = w
    b = padded.T.reshape(n, blocks, block_size)
    amax = np.abs(b).max(axis=2)
    scale = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)  # amax/127 can underflow
    q = np.clip(np.rint(b / scale[..., None]), -127, 127).astype(np.int16)
    return (q + 128).astype(np.uint8), scale.reshape(-1)


def _dq_weights(g) -> dict[str, tuple[object, np.ndarray]]:
    """DequantizeLinear output name -> (node, folded float32 weight [K, N]) for FP8 weight DQs."""
    inits = {t.name: t for t in g.initializer}
    out = {}
    for node in g.node:
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        q_t, s_t = inits.get(node.input[0]), inits.get(node.input[1]) if len(node.input) > 1 else None
        if q_t is None or s_t is None or q_t.data_type not in _FP8_TYPES or len(q_t.dims) != 2:
            continue
        if len(node.input) > 2 and node.input[2]:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        scale = numpy_helper.to_array(s_t).astype(np.float32)
        if axis not in (1, -1) or scale.shape != (q_t.dims[1],):
            continue
        q = numpy_helper.to_array(q_t).astype(np.float32)
        out[node.output[0]] = (node, (q * scale[None, :]).astype(np.float32))
    return out


def plan(model: ModelProto, min_weight_elements: int = MIN_WEIGHT_ELEMENTS) -> list[dict]:
    """The layers `lower` would rewrite: [{"weight": FP8 initializer, "node": MatMul (name, or its output
    when unnamed; the key), "shape": [K, N], "bias": Add initializer or None}], in graph order."""
    g = model.graph
    dqs = _dq_weights(g)
    inits = {t.name: t for t in g.initializer}
    readers: dict[str, list] = {}
    for node in g.node:
        for i in node.input:
            readers.setdefault(i, []).append(node)
    graph_outputs = {o.name for o in g.output}
    layers = []
    for node in g.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.input[1] not in dqs:
            continue
        dq, w = dqs[node.input[1]]
        if w.size < min_weight_elements or node.input[0] in inits:
            continue
        bias = None
        nxt = readers.get(node.output[0], [])
        if len(nxt) == 1 and nxt[0].op_type == "Add" and node.output[0] not in graph_outputs:
            other = [i for i in nxt[0].input if i != node.output[0]]
            t = inits.get(other[0]) if len(other) == 1 else None
            if (t is not None and t.data_type == TensorProto.FLOAT
                    and list(t.dims) in ([w.shape[1]], [1, w.shape[1]])):
                bias = t.name
        layers.append({"weight": dq.input[0], "node": node.name or node.output[0], "shape": list(w.shape),
                       "bias": bias})
    return layers


def marked(model: ModelProto) -> str | None:
    """The compute mode recorded in the graph's metadata (`METADATA_KEY`), or None."""
    return next((p.value for p in model.metadata_props if p.key == METADATA_KEY), None)


def mark(model: ModelProto, mode: str) -> None:
    """Records `mode` in the graph's metadata (compile, for int8-blocks artifacts)."""
    props = {p.key: p.value for p in model.metadata_props}
    props[METADATA_KEY] = mode
    helper.set_model_props(model, props)


def spec(model: ModelProto, min_weight_elements: int = MIN_WEIGHT_ELEMENTS) -> dict:
    """The manifest's `runtime.compute` entry for an `int8-blocks` artifact of `model` (its FP8 graph)."""
    return {"mode": INT8_BLOCKS, "op": f"{MS_DOMAIN}.MatMulNBits", "bits": 8, "block_size": BLOCK_SIZE,
            "accuracy_level": ACCURACY_LEVEL, "min_weight_elements": min_weight_elements,
            "weights": "int8 per block of block_size rows of K per output column, scale max|w|/127, "
                       "from the FP8 weights folded to FP32; activations int8 per block at run time",
            "layers": plan(model, min_weight_elements)}


def lower(model_bytes: bytes, compute: dict) -> bytes:
    """`model_bytes` (the merged FP8 graph) with the layers named in `compute["layers"]` rewritten to
    MatMulNBits. Refuses (ModelLoadError) when the graph does not hold exactly those layers."""
    if compute.get("mode") != INT8_BLOCKS:
        raise ModelLoadError(f"compute mode {compute.get('mode')!r} is not known to this runtime "
                             f"(knows {', '.join(COMPUTE_MODES)})")
    block_size, level = int(compute["block_size"]), int(compute["accuracy_level"])
    model = onnx.load_from_string(model_bytes)
    g = model.graph
    found = {lay["node"]: lay for lay in plan(model, int(compute["min_weight_elements"]))}
    wanted = {lay["node"]: lay for lay in compute["layers"]}
    if found != wanted:
        raise ModelLoadError("int8-blocks: the graph's FP8 layers do not match the manifest's runtime.compute "
                             f"layers (graph {sorted(found)}, manifest {sorted(wanted)})")
    if not wanted:
        return model_bytes
    dqs = _dq_weights(g)
    by_weight = {node.input[0]: (out, w) for out, (node, w) in dqs.items()}
    inits = {t.name: t for t in g.initializer}
    nodes = list(g.node)  # indexes, not object identity: protobuf wrappers are not stable objects
    drop, replace, new_inits = set(), {}, []
    for node_name, lay in wanted.items():
        dq_out, w = by_weight[lay["weight"]]
        i_mm = next(i for i, n in enumerate(nodes) if n.op_type == "MatMul" and n.input[1] == dq_out
                    and (n.name or n.output[0]) == node_name)
        mm = nodes[i_mm]
        q, scale = _int8_blocks(w, block_size)
        qn, sn = f"{node_name}.int8_blocks", f"{node_name}.int8_block_scales"
        new_inits += [numpy_helper.from_array(q, qn), numpy_helper.from_array(scale, sn)]
        inputs, out = [mm.input[0], qn, sn], mm.output[0]
        if lay["bias"] is not None:
            i_add = next(i for i, n in enumerate(nodes) if n.op_type == "Add" and mm.output[0] in n.input)
            b = numpy_helper.to_array(inits[lay["bias"]]).astype(np.float32).reshape(-1)
            bn = f"{node_name}.int8_blocks_bias"
            new_inits.append(numpy_helper.from_array(b, bn))
            inputs += ["", "", bn]
            out = nodes[i_add].output[0]
            drop.add(i_add)
        replace[i_mm] = helper.make_node("MatMulNBits", inputs, [out], name=f"{node_name}/int8_blocks",
                                         domain=MS_DOMAIN, K=w.shape[0], N=w.shape[1], bits=8,
                                         block_size=block_size, accuracy_level=level)
    kept_nodes = [replace.get(i, n) for i, n in enumerate(nodes) if i not in drop]
    while True:  # drop DequantizeLinear nodes (and so their FP8 initializers) nothing reads any more
        used = {i for n in kept_nodes for i in n.input} | {o.name for o in g.output}
        left = [n for n in kept_nodes if n.op_type != "DequantizeLinear" or any(o in used for o in n.output)]
        if len(left) == len(kept_nodes):
            break
        kept_nodes = left
    kept = [t for t in g.initializer if t.name in used]
    del g.node[:]
    g.node.extend(kept_nodes)
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return model.SerializeToString()


def describe(compute: dict) -> str:
    """One line for `Session.notes`."""
    shapes = ", ".join("x".join(map(str, lay["shape"])) for lay in compute["layers"]) or "none"
    return (f"int8-blocks compute: {len(compute['layers'])} FP8 layer(s) ({shapes}) re-quantized at load to "
            f"int8 blocks of {compute['block_size']} (MatMulNBits, accuracy_level {compute['accuracy_level']}: "
            f"int8 activations and dot products); smaller FP8 layers folded to FP32")
