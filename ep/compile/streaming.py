"""`sitsctl compile` for streaming models (`ep.streaming`): the KV cache policy and its parameters, and
running calibration and accuracy frames through the graph as one stream (token by token, KV grown by
ORT's GroupQueryAttention), since a streaming model's output depends on the frames before it.

A model is *streaming* when it has the streaming graph's inputs: `frame`, `pe`, `seqlens_k`,
`total_sequence_length` and `past_key_i`/`past_value_i` per layer. Policies:

- `none`: no KV cache (MLPs). A streaming model cannot run without one: refused.
- `window`: the hot sliding window only; a page that slides out is dropped (snapshots of the window
  still go to the cold file, so a stream resumes and recovers).
- `tiered`: hot window, warm pages (`warm_codec`, zstd), cold slots in a file (`cold_slots` per stream).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, TensorProto, helper

from ..errors import CompileError
from ..session import session_options

KV_CACHE_POLICIES = ("none", "window", "tiered")
WARM_CODECS = ("int8", "float8e4m3fn")
STREAM_INPUTS = ("frame", "pe", "seqlens_k", "total_sequence_length")


@dataclass(frozen=True, slots=True)
class KvSettings:
    """What the manifest's `kv_cache_policy` holds for a streaming artifact (the runtime reads it back)."""
    policy: str
    window: int = 256
    page_tokens: int = 16
    warm_codec: str = "int8"
    warm_pages: int = 8
    cold_slots: int = 256

    def to_json(self) -> dict:
        return asdict(self)


def is_streaming(model: ModelProto) -> bool:
    names = {i.name for i in model.graph.input}
    return all(n in names for n in STREAM_INPUTS) and "past_key_0" in names


def kv_settings(policy: str, streaming: bool, model_name: str, window: int | None = None,
                page_tokens: int | None = None, warm_codec: str | None = None, warm_pages: int | None = None,
                cold_slots: int | None = None) -> KvSettings | None:
    """Checks the policy against the model; None for `none`. CompileError says what does not fit."""
    if policy not in KV_CACHE_POLICIES:
        raise CompileError(f"kv-cache-policy {policy!r}: choose one of {', '.join(KV_CACHE_POLICIES)}")
    given = {k: v for k, v in dict(window=window, page_tokens=page_tokens, warm_codec=warm_codec,
                                   warm_pages=warm_pages, cold_slots=cold_slots).items() if v is not None}
    if policy == "none":
        if streaming:
            raise CompileError(f"model {model_name} is a streaming model (KV inputs past_key_*/past_value_*): it "
                               f"needs a KV cache; use --kv-cache-policy window or tiered")
        if given:
            raise CompileError(f"--{'/--'.join(k.replace('_', '-') for k in given)} only apply with "
                               f"--kv-cache-policy window or tiered")
        return None
    if not streaming:
        raise CompileError(f"--kv-cache-policy {policy}: model {model_name} has no KV cache (it is not a streaming "
                           f"model: no GroupQueryAttention past_key_*/past_value_* inputs); an MLP takes "
                           f"--kv-cache-policy none")
    if policy == "window" and any(k in given for k in ("warm_codec", "warm_pages", "cold_slots")):
        raise CompileError("--warm-codec/--warm-pages/--cold-slots apply to --kv-cache-policy tiered; the window "
                           "policy keeps no archive")
    s = KvSettings(policy, **given)
    for name in ("window", "page_tokens", "warm_pages", "cold_slots"):
        if getattr(s, name) < 1:
            raise CompileError(f"--{name.replace('_', '-')} must be >= 1, not {getattr(s, name)}")
    if s.warm_codec not in WARM_CODECS:
        raise CompileError(f"--warm-codec {s.warm_codec!r}: choose one of {', '.join(WARM_CODECS)}")
    return s


def stream_shape(model: ModelProto) -> dict:
    """n_inputs, n_outputs, d_model, layers, kv_heads, head_dim read from the graph's inputs/outputs."""
    def dims(vi):
        return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]

    ins = {i.name: dims(i) for i in model.graph.input}
    layers = sum(1 for n in ins if n.startswith("past_key_"))
    action = next(o for o in model.graph.output if o.name == "action")
    return {"n_inputs": ins["frame"][-1], "n_outputs": dims(action)[-1], "d_model": ins["pe"][-1],
            "n_layers": layers, "kv_heads": ins["past_key_0"][1], "head_dim": ins["past_key_0"][3]}


def _pe(position: int, d_model: int) -> np.ndarray:
    inv = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2) / d_model)
    out = np.empty((1, 1, d_model), np.float32)
    out[0, 0, 0::2] = np.sin(position * inv)
    out[0, 0, 1::2] = np.cos(position * inv)
    return out


def run_stream(model_bytes: bytes, frames: np.ndarray, fp8: bool = False, extra: list[str] = ()) -> dict:
    """Runs `frames` [N, n_inputs] as one stream (all tokens visible) with plain `session.run`; returns
    {"action": [N, n_outputs], name: [N, width] for each name in `extra` (intermediate tensors)}."""
    shape = stream_shape(_load(model_bytes))
    if extra:
        m = _load(model_bytes)
        known = {o.name for o in m.graph.output}
        m.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                              for n in extra if n not in known)
        model_bytes = m.SerializeToString()
    sess = ort.InferenceSession(model_bytes, session_options(1, fp8_storage=fp8), providers=["CPUExecutionProvider"])
    n = frames.shape[0]
    kv_names = [f"past_{k}_{i}" for i in range(shape["n_layers"]) for k in ("key", "value")]
    kv = {name: np.zeros((1, shape["kv_heads"], n, shape["head_dim"]), np.float32) for name in kv_names}
    out_names = ["action", *[f"present_{k}_{i}" for i in range(shape["n_layers"]) for k in ("key", "value")], *extra]
    got = {name: [] for name in ("action", *extra)}
    for t in range(n):
        feeds = {"frame": frames[t].reshape(1, 1, -1).astype(np.float32), "pe": _pe(t, shape["d_model"]),
                 "seqlens_k": np.array([t], np.int32), "total_sequence_length": np.array(t + 1, np.int32), **kv}
        res = dict(zip(out_names, sess.run(out_names, feeds)))
        for name in kv_names:
            kv[name] = res[name.replace("past", "present")]
        for name in got:
            v = np.asarray(res[name], np.float32)
            got[name].append(v.reshape(-1, v.shape[-1]))
    return {name: np.concatenate(v) for name, v in got.items()}


def split(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stream keeps its order: the first 75% calibrate, the last 25% are held out."""
    n_held = max(1, data.shape[0] // 4)
    return data[:-n_held], data[-n_held:]


def _load(model_bytes: bytes) -> ModelProto:
    m = ModelProto()
    m.ParseFromString(model_bytes)
    return m
