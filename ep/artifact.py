"""Model artifacts made by `sitsctl compile` (see `ep.compile`): verify and load.

An artifact is a directory with three files::

    model.onnx      the optimized graph *without* its initializers (a "skeleton"): not loadable on its
                    own; every initializer lives in the container
    weights.sitsw   the weight container (`ep.container`): every initializer of the compiled graph
                    (FP8 weights plus their FP32 scales, biases, other constants), zstd frames with a
                    SHA-256 per chunk
    manifest.json   format version, source model SHA-256, the SHA-256 of both files and of every
                    container chunk, inputs/outputs, quantization per layer, KV cache policy, operator
                    counts, accuracy report against the FP32 source, and `artifact_sha256`

**Artifact SHA-256** (what the daemon reports as the model hash and the TPM measures): SHA-256 of the
manifest's canonical JSON, i.e. `json.dumps(manifest_without_the_artifact_sha256_key, sort_keys=True,
separators=(",", ":"), ensure_ascii=True).encode()`. The manifest names the hash of every other
file and chunk, so this one hash binds the whole directory. `manifest.json` itself is written
indented for people and stores `artifact_sha256` for convenience; loading recomputes it.

Loading (`load_artifact`) verifies, in order: the manifest (format, recomputed artifact hash vs the
stored one and an optional expected one), `model.onnx` (SHA-256), the container (every chunk's header,
frame and raw SHA-256, then the chunk hashes and whole-file hash in the manifest), and then merges the
container's tensors into the skeleton's graph as initializers. The merge appends one more
`ModelProto.graph` field holding only `initializer` entries to the serialized skeleton (protobuf
merges repeated occurrences of an embedded message), so loading needs neither `onnx` nor `ml_dtypes`:
the TensorProtos are encoded here from the container's raw little-endian bytes.

FP8 is storage only: the FP8 weights feed `DequantizeLinear` (opset 21) -> `MatMul`, and
`ModelRunner` loads FP8 artifacts with `session.disable_quant_qdq=1`, so ONNX Runtime folds the
dequantization at load and runs FP32 GEMMs (FP32 speed and RAM, FP8 file size; the CPU has no FP8
arithmetic). Errors name the file or chunk at fault (`ArtifactError`, a `ModelLoadError`).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .container import DTYPES, ContainerError, read_container_entries
from .errors import ModelLoadError

FORMAT = "sits-model-artifact"
FORMAT_VERSION = 1
MODEL_FILE = "model.onnx"
CONTAINER_FILE = "weights.sitsw"
MANIFEST_FILE = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20
MAX_MODEL_BYTES = 1 << 30


class ArtifactError(ModelLoadError):
    """An artifact directory is incomplete, tampered with or inconsistent; the message names the file
    (and the chunk, for the container)."""


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


# Keys of manifest.json outside the artifact hash: the hash itself, and the bounds certificate that
# `sitsctl check` attaches after compiling (it names the model hash it is about, so it binds itself).
ANNOTATIONS = ("artifact_sha256", "bounds_certificate")


def artifact_sha256(manifest: dict) -> str:
    """The whole-artifact SHA-256 (hex): over the canonical JSON of the manifest without its annotations."""
    body = {k: v for k, v in manifest.items() if k not in ANNOTATIONS}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def read_certificate(directory: str | Path) -> dict | None:
    """The bounds certificate attached to an artifact's manifest, or None."""
    return _read_manifest(Path(directory)).get("bounds_certificate")


def attach_certificate(directory: str | Path, certificate: dict) -> Path:
    """Store a bounds certificate in the artifact's manifest (atomically); the artifact hash is unchanged."""
    directory = Path(directory)
    data = _read_manifest(directory)
    before = artifact_sha256(data)
    data["bounds_certificate"] = certificate
    data["artifact_sha256"] = artifact_sha256(data)
    assert data["artifact_sha256"] == before  # the certificate is an annotation, never part of the identity
    target = directory / MANIFEST_FILE
    tmp = target.with_name(MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n")
    os.replace(tmp, target)
    return target


@dataclass
class Manifest:
    """The parsed `manifest.json` (`data`) with a few shortcuts."""

    data: dict
    timings: dict | None = None  # compile only; not part of the manifest or its hash

    @property
    def artifact_sha256(self) -> str:
        return artifact_sha256(self.data)

    @property
    def quantization(self) -> str:
        return self.data["quantization"]["mode"]

    @property
    def fp8(self) -> bool:
        return any(layer.get("format", "").startswith("float8") for layer in self.data["quantization"]["layers"])

    @property
    def compute(self) -> dict | None:
        """`runtime.compute` (`ep.lowering`): how the FP8 weights are computed at load; None means the
        default FP32 fold (older manifests have no such entry)."""
        return self.data.get("runtime", {}).get("compute")

    @property
    def accuracy(self) -> dict:
        return self.data["accuracy"]

    def __getitem__(self, key):
        return self.data[key]

    def to_json(self) -> str:
        """Indented JSON for the file, `artifact_sha256` filled in."""
        data = copy.deepcopy(self.data)
        data["artifact_sha256"] = artifact_sha256(data)
        return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n"


# --- protobuf encoding of TensorProto / GraphProto fields (onnx.proto, proto2) -------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def tensor_proto_bytes(name: str, onnx_type: int, dims: tuple[int, ...], raw: bytes) -> bytes:
    """A serialized onnx.TensorProto: dims (1), data_type (2), name (8), raw_data (9)."""
    out = b"".join(_varint(1 << 3) + _varint(d) for d in dims)
    out += _varint(2 << 3) + _varint(onnx_type)
    out += _len_field(8, name.encode())
    out += _len_field(9, raw)
    return out


def merge_initializers(skeleton: bytes, tensors: list[tuple[str, int, tuple[int, ...], bytes]]) -> bytes:
    """`skeleton` (a serialized ModelProto) with `tensors` added to its graph's initializers."""
    graph = b"".join(_len_field(5, tensor_proto_bytes(*t)) for t in tensors)  # GraphProto.initializer = 5
    return skeleton + _len_field(7, graph)  # ModelProto.graph = 7


# --- loading -----------------------------------------------------------------------------------

def is_artifact_dir(path: str | Path) -> bool:
    return Path(path).is_dir()


def _read_manifest(directory: Path) -> dict:
    mpath = directory / MANIFEST_FILE
    try:
        if mpath.stat().st_size > MAX_MANIFEST_BYTES:
            raise ArtifactError(f"artifact {directory}: {MANIFEST_FILE} is larger than {MAX_MANIFEST_BYTES} bytes")
        data = json.loads(mpath.read_bytes())
    except FileNotFoundError as exc:
        raise ArtifactError(f"artifact {directory}: {MANIFEST_FILE} not found (is this a directory made by "
                            f"`sitsctl compile`?)") from exc
    except OSError as exc:
        raise ArtifactError(f"artifact {directory}: cannot read {MANIFEST_FILE}: {exc}") from exc
    except ValueError as exc:
        raise ArtifactError(f"artifact {directory}: {MANIFEST_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ArtifactError(f"artifact {directory}: {MANIFEST_FILE} is not a {FORMAT} manifest")
    if data.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"artifact {directory}: {MANIFEST_FILE} has format_version "
                            f"{data.get('format_version')!r}, this loader reads {FORMAT_VERSION}")
    return data


def _file_entry(directory: Path, data: dict, name: str) -> dict:
    try:
        entry = data["files"][name]
        if not isinstance(entry["sha256"], str) or type(entry["bytes"]) is not int:
            raise TypeError
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"artifact {directory}: {MANIFEST_FILE} lacks the hash and size of {name}") from exc
    return entry


def load_artifact(directory: str | Path, expected_sha256: str | None = None) -> tuple[bytes, Manifest]:
    """Verifies every hash of the artifact in `directory` and returns (ONNX model bytes with the
    weights merged in, ready for `ort.InferenceSession`, the manifest)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ArtifactError(f"artifact {directory}: not a directory")
    data = _read_manifest(directory)
    computed = artifact_sha256(data)
    stored = data.get("artifact_sha256")
    if stored is not None and stored != computed:
        raise ArtifactError(f"artifact {directory}: {MANIFEST_FILE} was changed after compile: its content "
                            f"hashes to {computed}, it records artifact_sha256 {stored}")
    if expected_sha256 is not None and expected_sha256.lower() != computed:
        raise ArtifactError(f"artifact {directory}: {MANIFEST_FILE} hashes to {computed}, expected "
                            f"{expected_sha256.lower()}")

    model_entry = _file_entry(directory, data, MODEL_FILE)
    mpath = directory / MODEL_FILE
    try:
        size = mpath.stat().st_size
        if size > MAX_MODEL_BYTES or size != model_entry["bytes"]:
            raise ArtifactError(f"artifact {directory}: {MODEL_FILE} is {size} bytes, the manifest says "
                                f"{model_entry['bytes']}: tampered or replaced")
        skeleton = mpath.read_bytes()
    except FileNotFoundError as exc:
        raise ArtifactError(f"artifact {directory}: {MODEL_FILE} not found") from exc
    except OSError as exc:
        raise ArtifactError(f"artifact {directory}: cannot read {MODEL_FILE}: {exc}") from exc
    if hashlib.sha256(skeleton).hexdigest() != model_entry["sha256"]:
        raise ArtifactError(f"artifact {directory}: {MODEL_FILE} does not match its SHA-256 in the manifest: "
                            f"tampered or replaced")

    cont_entry = _file_entry(directory, data, CONTAINER_FILE)
    cpath = directory / CONTAINER_FILE
    if not cpath.is_file():
        raise ArtifactError(f"artifact {directory}: {CONTAINER_FILE} not found")
    declared_raw = cont_entry.get("raw_bytes")
    max_raw = declared_raw if type(declared_raw) is int and declared_raw >= 0 else 1 << 34
    try:
        entries, info = read_container_entries(cpath, max_raw_bytes=max_raw)
    except ContainerError as exc:
        where = f"{CONTAINER_FILE} chunk {exc.chunk}" if exc.chunk is not None else CONTAINER_FILE
        raise ArtifactError(f"artifact {directory}: {where}: {exc}") from exc
    manifest_chunks = cont_entry.get("chunks")
    if not isinstance(manifest_chunks, list) or len(manifest_chunks) != len(info.chunks):
        raise ArtifactError(f"artifact {directory}: {CONTAINER_FILE} has {len(info.chunks)} chunks, the manifest "
                            f"lists {len(manifest_chunks) if isinstance(manifest_chunks, list) else 'none'}")
    for c, m in zip(info.chunks, manifest_chunks):
        if not isinstance(m, dict) or m.get("sha256") != c.sha256 or m.get("frame_sha256") != c.frame_sha256:
            raise ArtifactError(f"artifact {directory}: {CONTAINER_FILE} chunk {c.index} (bytes "
                                f"{c.byte_range[0]}..{c.byte_range[1]}, tensors: {', '.join(c.tensors)}) does not "
                                f"match its SHA-256 in the manifest: tampered or replaced")
    if info.sha256 != cont_entry["sha256"] or info.size != cont_entry["bytes"]:
        raise ArtifactError(f"artifact {directory}: {CONTAINER_FILE} does not match its SHA-256 in the manifest "
                            f"(chunks verify; header, index or trailer differ)")
    tensors = [(e.name, DTYPES[e.dtype][2], e.shape, raw) for e, raw in entries if e.dtype != "bytes"]
    return merge_initializers(skeleton, tensors), Manifest(data)


def resolve_model(path: str | Path, expected_sha256: str | None = None) -> tuple[bytes, bytes, Manifest | None]:
    """(ONNX bytes for onnxruntime or `ep.bounds`, SHA-256 digest, manifest or None) for a plain .onnx
    file (hash of its bytes) or an artifact directory (verified; the artifact SHA-256)."""
    path = Path(path)
    if path.is_dir():
        data, manifest = load_artifact(path, expected_sha256)
        return data, bytes.fromhex(manifest.artifact_sha256), manifest
    if not path.is_file():
        raise ModelLoadError(f"model {path}: file not found (set model.artifact in the config)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"model {path}: cannot read it: {exc}") from exc
    digest = hashlib.sha256(data).digest()
    if expected_sha256 is not None and digest.hex() != expected_sha256.lower():
        raise ModelLoadError(f"model {path}: SHA-256 {digest.hex()} differs from the expected {expected_sha256.lower()}")
    return data, digest, None


def read_manifest(directory: str | Path) -> Manifest:
    """The manifest alone (format checked, hashes not verified)."""
    return Manifest(_read_manifest(Path(directory)))


def dequantized(model_bytes: bytes) -> bytes:
    """The graph with every `DequantizeLinear` of constant weights folded into an FP32 initializer: what
    ORT computes at load with `session.disable_quant_qdq=1` (float32(q) * scale, one IEEE multiply per
    element, so the same bits). For tools that read the deployed weights as plain FP32 (the proof circuit).
    Graphs without such nodes come back unchanged. An `int8-blocks` artifact (`ep.lowering`) does not
    compute with these weights: ModelLoadError."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(model_bytes)
    from .lowering import REFUSAL, marked

    if marked(model) not in (None, "fp32"):
        raise ModelLoadError(f"model: {REFUSAL}")
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    folded, keep = {}, []
    for node in g.node:
        if node.op_type == "DequantizeLinear" and all(i in inits for i in node.input if i):
            q = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
            scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            has_zero = len(node.input) > 2 and node.input[2]
            zero = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32) if has_zero else 0
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if scale.ndim == 1 and q.ndim > 1:
                shape = [1] * q.ndim
                shape[axis % q.ndim] = scale.shape[0]
                scale = scale.reshape(shape)
                zero = zero.reshape(shape) if isinstance(zero, np.ndarray) else zero
            folded[node.output[0]] = ((q - zero) * scale).astype(np.float32)
        else:
            keep.append(node)
    if not folded:
        return model_bytes
    used = {i for n in keep for i in n.input} | {o.name for o in g.output}
    del g.node[:]
    g.node.extend(keep)
    old = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(old + [numpy_helper.from_array(v, k) for k, v in folded.items()])
    return model.SerializeToString()
