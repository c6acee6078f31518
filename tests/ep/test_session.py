import numpy as np
import onnxruntime as ort
import pytest

from ep.errors import ModelLoadError
from ep.session import ModelRunner, sha256_file

from ..conftest import DEMO_MODEL


def test_prebound_run_matches_plain_session():
    runner = ModelRunner(DEMO_MODEL, 6, 1)
    plain = ort.InferenceSession(str(DEMO_MODEL), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = (np.array([4.0, 3.0, 1.4, 8000.0, 120.0, 2.6]) * rng.uniform(0.97, 1.03, 6)).astype(np.float32)[None]
        runner.input[:] = x
        got = runner.run().copy()
        want = plain.run(None, {"signals": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert runner.sha256 == sha256_file(DEMO_MODEL)


def test_model_size_stays_small():
    assert DEMO_MODEL.stat().st_size < 1_000_000


def test_wrong_signal_count_is_explained():
    with pytest.raises(ModelLoadError, match=r"declares \[batch, 5\]"):
        ModelRunner(DEMO_MODEL, 5, 1)


def test_not_onnx_and_missing(tmp_path):
    junk = tmp_path / "m.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="ONNX Runtime cannot load it"):
        ModelRunner(junk, 6, 1)
    with pytest.raises(ModelLoadError, match="file not found"):
        ModelRunner(tmp_path / "none.onnx", 6, 1)
