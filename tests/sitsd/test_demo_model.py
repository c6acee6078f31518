"""The demo's model artifact: examples/compile-demo-model.sh compiles the example .onnx on first use into a
cache directory; the artifact verifies and loads as the daemon loads it, and the approval of the .onnx is
untouched (the example config keeps the .onnx)."""
import json

from ep.artifact import load_artifact
from ep.session import ModelRunner, sha256_file
from sitsd.config import load_config
from sitsd.demo_model import compiled_artifact

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG


def test_recipe_compiles_once_into_the_cache_and_the_artifact_loads(tmp_path):
    cfg = load_config(EXAMPLE_CONFIG)
    said = []
    artifact = compiled_artifact(EXAMPLE_CONFIG, cfg, said.append, cache=tmp_path)
    data, manifest = load_artifact(artifact)
    # FP32 weights in the verified container: FP8 costs this 3 kB model accuracy and saves nothing
    assert manifest.quantization == "none" and manifest.data["kv_cache_policy"] == "none"
    assert manifest.data["source"]["sha256"] == sha256_file(DEMO_MODEL).hex()
    # FP32 weights: the input normalisation (Sub, Div) is fused into the first Gemm
    fusion = next(p for p in manifest.data["passes"] if p["pass"] == "fuse_input_affine_into_gemm")
    assert fusion["fused"] == ["Sub/Div -> Gemm /net/net.0/Gemm"] and fusion["ops_after"] == fusion["ops_before"] - 2
    assert manifest.data["accuracy"]["max_abs_error"] < 1e-5
    runner = ModelRunner(artifact, len(cfg.model.inputs), len(cfg.model.outputs))
    assert runner.sha256.hex() == manifest.artifact_sha256 and not runner.ep.fp8_folded
    stamp = (artifact / "manifest.json").stat().st_mtime_ns
    assert compiled_artifact(EXAMPLE_CONFIG, cfg, said.append, cache=tmp_path) == artifact  # cached, not redone
    assert (artifact / "manifest.json").stat().st_mtime_ns == stamp
    assert "first run" in said[0] and "cached" in said[1]
    # the example config and its approval still name the .onnx, not the artifact
    approval = json.loads((EXAMPLE_CONFIG.parent / cfg.attestation.approval).read_text())
    assert approval["model_sha256"] == sha256_file(cfg.model.artifact).hex() != manifest.artifact_sha256
