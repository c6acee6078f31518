"""ep.capi: the loop's model run through ONNX Runtime's C API, keeping the GIL."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ep import capi
from ep.errors import ModelLoadError
from ep.session import ModelRunner
from tests.gil import gil_handoffs

from ..conftest import DEMO_MODEL


@pytest.fixture(scope="module")
def runner():
    r = ModelRunner(DEMO_MODEL, 6, 1)
    assert r.run_path.startswith("ONNX Runtime C API"), r.run_path  # CI's wheel ships the library: no fallback
    return r


@settings(max_examples=80, deadline=None)
@given(x=arrays(np.float32, (6,), elements=st.floats(-1e4, 1e4, width=32)))
def test_the_c_api_run_gives_what_pybind_gives(runner, x):
    runner.input[0] = x
    got = runner.run().copy()
    want = runner.session.run([runner.output_name], {runner.input_name: x[None].copy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def wide_mlp(path, width: int = 768, layers: int = 3):
    """6 -> width -> (width x width) x layers -> 1, ReLU between: ~1 ms per run, long enough that the probe sees
    every GIL release (tests/gil.py)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    dims = [6] + [width] * (layers + 1) + [1]
    nodes, inits, x = [], [], "signals"
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        w = numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}")
        inits.append(w)
        y = f"h{i}" if i < len(dims) - 2 else "command"
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [y if i == len(dims) - 2 else f"m{i}"]))
        if i < len(dims) - 2:
            nodes.append(helper.make_node("Relu", [f"m{i}"], [y]))
        x = y
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("signals", TensorProto.FLOAT, ["n", 6])],
                              [helper.make_tensor_value_info("command", TensorProto.FLOAT, ["n", 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_c_api_run_keeps_the_gil_and_the_pybind_run_does_not(tmp_path):
    r = ModelRunner(wide_mlp(tmp_path / "wide.onnx"), 6, 1)
    assert r.run_path.startswith("ONNX Runtime C API"), r.run_path
    r.input[0] = [4.0, 3.0, 1.4, 8000.0, 120.0, 2.667]
    control = r.ep.bind({r.input_name: r.input}, {r.output_name: np.zeros_like(r.output)})
    released = gil_handoffs(control.run)  # the control: pybind's run_with_iobinding releases it
    kept = gil_handoffs(r.run)
    assert released >= 12, released
    assert kept <= 2, kept


def test_the_environment_switch_keeps_pybind(monkeypatch):
    monkeypatch.setenv(capi.ENV_DISABLE, "1")
    r = ModelRunner(DEMO_MODEL, 6, 1)
    assert r.run_path.startswith("pybind run_with_iobinding, GIL released") and capi.ENV_DISABLE in r.run_path
    r.input[0] = [4.0, 3.0, 1.4, 8000.0, 120.0, 2.667]
    want = r.session.run([r.output_name], {r.input_name: r.input.copy()})[0]
    np.testing.assert_allclose(r.run(), want, rtol=1e-6)


def test_a_library_that_does_not_load_leaves_the_pybind_path(monkeypatch, tmp_path):
    bogus = tmp_path / "libonnxruntime.so.0.0.0"
    bogus.write_bytes(b"not an ELF file")
    monkeypatch.setattr(capi, "_api", None)
    monkeypatch.setattr(capi, "_api_error", "")
    monkeypatch.setattr(capi, "library_path", lambda: str(bogus))
    r = ModelRunner(DEMO_MODEL, 6, 1)
    assert "GIL released" in r.run_path and str(bogus) in r.run_path
    r.input[0] = [4.0, 3.0, 1.4, 8000.0, 120.0, 2.667]
    want = r.session.run([r.output_name], {r.input_name: r.input.copy()})[0]
    np.testing.assert_allclose(r.run(), want, rtol=1e-6)


def test_ort_errors_come_back_with_ort_s_message():
    s = capi.CpuSession(DEMO_MODEL.read_bytes())
    assert (s.n_inputs, s.n_outputs) == (1, 1)
    with pytest.raises(capi.CApiError, match="float32"):
        s.bind("signals", np.zeros((1, 6)), "command", np.zeros((1, 1), np.float32))
    run = s.bind("signals", np.zeros((1, 5), np.float32), "command", np.zeros((1, 1), np.float32))
    with pytest.raises(capi.CApiError, match=r"^Run: .*(dimension|[Ss]hape|Invalid)"):
        run()
    with pytest.raises(capi.CApiError, match="CreateSessionFromArray"):
        capi.CpuSession(b"this is not an ONNX model")
    s.close()
    s.close()
    with pytest.raises(capi.CApiError, match="closed"):  # a bound run after close: an error, never freed memory
        run()
    with pytest.raises(capi.CApiError, match="closed"):
        s.bind("signals", np.zeros((1, 6), np.float32), "command", np.zeros((1, 1), np.float32))


def test_a_bound_run_keeps_its_session_alive():
    import gc

    out = np.zeros((1, 1), np.float32)
    run = capi.CpuSession(DEMO_MODEL.read_bytes()).bind("signals", np.ones((1, 6), np.float32), "command", out)
    gc.collect()  # the session object has no other reference: the closure must hold it
    run()
    assert np.isfinite(out).all() and out[0, 0] != 0.0


def test_the_runner_keeps_one_session_and_makes_the_pybind_one_again_only_when_asked(tmp_path):
    """Each ORT session holds its own copy of the weights: with the C session running the frames, the pybind
    one (the self-test's reference) is freed; `session` makes it again from the file, verified again."""
    import shutil

    path = shutil.copy(wide_mlp(tmp_path / "wide.onnx"), tmp_path / "m.onnx")
    r = ModelRunner(path, 6, 1)
    assert r.ep.pybind_released and r.ep._session is None and r._binding is None
    assert r.ep.providers == ["CPUExecutionProvider"]
    r.input[0] = [4.0, 3.0, 1.4, 8000.0, 120.0, 2.667]
    got = r.run().copy()
    want = r.session.run([r.output_name], {r.input_name: r.input.copy()})[0]  # made again on first use
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert r.ep._session is not None
    # a file whose bytes changed after the load is not what runs: refused, not loaded
    r2 = ModelRunner(path, 6, 1)
    wide_mlp(tmp_path / "other.onnx", width=64)
    shutil.copy(tmp_path / "other.onnx", path)
    with pytest.raises(ModelLoadError, match="SHA-256"):
        r2.session
    r2.input[0] = r.input[0]
    np.testing.assert_allclose(r2.run(), got, rtol=1e-5, atol=1e-6)  # the loaded model still runs


def test_pybind_is_kept_when_it_runs_the_frames(monkeypatch):
    monkeypatch.setenv(capi.ENV_DISABLE, "1")
    r = ModelRunner(DEMO_MODEL, 6, 1)
    assert not r.ep.pybind_released and r.ep._session is not None and r._binding is not None
