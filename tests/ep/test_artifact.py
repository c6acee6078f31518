import hashlib
import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from ep.artifact import (CONTAINER_FILE, MANIFEST_FILE, MODEL_FILE, ArtifactError, load_artifact,
                         merge_initializers, tensor_proto_bytes)
from ep.compile import compile_model
from ep.container import read_container, write_container
from ep.errors import ModelLoadError
from ep.session import ModelRunner

from ..conftest import DEMO_MODEL

LO = np.array([3.5, 2.5, 0.8, 3000.0, 60.0, 1.5])
HI = np.array([4.5, 3.5, 3.0, 14000.0, 180.0, 3.5])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The demo model, fp8-adaptive, with 128-byte chunks so the container has several."""
    out = tmp_path_factory.mktemp("art") / "fp8"
    calib = np.random.default_rng(7).uniform(LO, HI, (128, 6)).astype(np.float32)
    manifest = compile_model(DEMO_MODEL, out, calibration=calib, chunk_size=128)
    assert len(manifest["files"][CONTAINER_FILE]["chunks"]) >= 4
    return out, manifest


@pytest.fixture
def art(compiled, tmp_path):
    dst = tmp_path / "a"
    shutil.copytree(compiled[0], dst)
    return dst


def test_hash_is_the_canonical_manifest_hash(art, compiled):
    data, manifest = load_artifact(art)
    body = json.loads((art / MANIFEST_FILE).read_text())
    stored = body.pop("artifact_sha256")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    assert hashlib.sha256(canonical).hexdigest() == stored == manifest.artifact_sha256
    assert ModelRunner(art, 6, 1).sha256 == bytes.fromhex(stored)
    assert load_artifact(art, expected_sha256=stored.upper())[1].artifact_sha256 == stored
    x = np.array([[4.0, 3.0, 1.4, 8000.0, 120.0, 2.6]], np.float32)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(DEMO_MODEL), providers=["CPUExecutionProvider"]).run(None, {"signals": x})[0]
    assert abs(sess.run(None, {"signals": x})[0] - ref).max() <= manifest.accuracy["stated_max_abs_error"]


def test_merged_initializers_match_the_container(art):
    data, _ = load_artifact(art)
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model)
    tensors = read_container(art / CONTAINER_FILE)
    merged = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert merged.keys() == tensors.keys()
    for name, value in tensors.items():
        assert merged[name].dtype == value.dtype and merged[name].shape == value.shape
        assert merged[name].tobytes() == value.tobytes()
    t = onnx.TensorProto()
    t.ParseFromString(tensor_proto_bytes("w", 1, (2, 0, 3), b""))
    assert (t.name, list(t.dims), t.data_type) == ("w", [2, 0, 3], 1)
    assert merge_initializers(b"", []) == b"\x3a\x00"


def test_tampered_model_onnx_is_named(art):
    raw = bytearray((art / MODEL_FILE).read_bytes())
    raw[len(raw) // 2] ^= 0x01
    (art / MODEL_FILE).write_bytes(raw)
    with pytest.raises(ArtifactError, match=r"model\.onnx does not match its SHA-256"):
        load_artifact(art)
    with pytest.raises(ModelLoadError, match=r"model\.onnx"):
        ModelRunner(art, 6, 1)


def test_tampered_container_chunk_is_named(art, compiled):
    chunks = compiled[1]["files"][CONTAINER_FILE]["chunks"]
    lo, hi = chunks[2]["byte_range"]
    raw = bytearray((art / CONTAINER_FILE).read_bytes())
    raw[(lo + hi) // 2] ^= 0x40
    (art / CONTAINER_FILE).write_bytes(raw)
    with pytest.raises(ArtifactError, match=rf"weights\.sitsw chunk 2: .*chunk 2 \(bytes {lo}\.\.{hi}"):
        ModelRunner(art, 6, 1)


def test_consistently_rewritten_container_is_caught_by_the_manifest(art):
    tensors = read_container(art / CONTAINER_FILE)
    name = next(k for k, v in tensors.items() if k.endswith(".scale"))
    tensors[name] = tensors[name] * np.float32(2.0)
    write_container(art / CONTAINER_FILE, tensors, chunk_size=128)  # valid container, other weights
    with pytest.raises(ArtifactError, match=r"weights\.sitsw chunk \d+ .*does not match its SHA-256 in the manifest"):
        load_artifact(art)


def test_edited_manifest_and_pins(art):
    body = json.loads((art / MANIFEST_FILE).read_text())
    original = body["artifact_sha256"]
    with pytest.raises(ArtifactError, match="expected"):
        load_artifact(art, expected_sha256="00" * 32)
    body["accuracy"]["max_abs_error"] = 0.0
    (art / MANIFEST_FILE).write_text(json.dumps(body))
    with pytest.raises(ArtifactError, match=r"manifest\.json was changed after compile"):
        load_artifact(art)
    body.pop("artifact_sha256")  # recomputed hash: loads, but the artifact hash differs (what the TPM measures)
    (art / MANIFEST_FILE).write_text(json.dumps(body))
    assert load_artifact(art)[1].artifact_sha256 != original
    with pytest.raises(ArtifactError, match="expected"):
        ModelRunner(art, 6, 1, expected_sha256=original)
    body["files"][MODEL_FILE]["sha256"] = "0" * 64
    (art / MANIFEST_FILE).write_text(json.dumps(body))
    with pytest.raises(ArtifactError, match=r"model\.onnx"):
        load_artifact(art)


@pytest.mark.parametrize("victim, message", [(MANIFEST_FILE, "manifest.json not found"),
                                             (MODEL_FILE, "model.onnx not found"),
                                             (CONTAINER_FILE, "weights.sitsw not found")])
def test_missing_files_are_named(art, victim, message):
    (art / victim).unlink()
    with pytest.raises(ArtifactError, match=message.replace(".", r"\.")):
        ModelRunner(art, 6, 1)


def test_not_an_artifact(tmp_path):
    (tmp_path / MANIFEST_FILE).write_text("{\"format\": \"other\"}")
    with pytest.raises(ArtifactError, match="not a sits-model-artifact manifest"):
        load_artifact(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text("{")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        load_artifact(tmp_path)
    with pytest.raises(ArtifactError, match="not a directory"):
        load_artifact(tmp_path / "nothing")


def test_dequantized_graph_gives_the_bits_the_folding_session_gives(compiled):
    """`ep.artifact.dequantized` (what the proof circuit reads) against ORT's own fold at load."""
    from ep.artifact import dequantized
    from ep.session import session_options

    data, manifest = load_artifact(compiled[0])
    assert manifest.fp8
    plain = dequantized(data)
    ops = {n.op_type for n in onnx.load_from_string(plain).graph.node}
    assert "DequantizeLinear" not in ops
    assert "DequantizeLinear" in {n.op_type for n in onnx.load_from_string(data).graph.node}
    folded = ort.InferenceSession(data, session_options(1, fp8_storage=True), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(plain, session_options(1), providers=["CPUExecutionProvider"])
    name = folded.get_inputs()[0].name
    for x in np.random.default_rng(3).uniform(LO, HI, (64, 1, 6)).astype(np.float32):
        np.testing.assert_array_equal(folded.run(None, {name: x})[0], ours.run(None, {name: x})[0])
    assert dequantized(plain) == plain  # nothing left to fold
