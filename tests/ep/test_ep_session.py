"""ep.Session: provider choice (device API and the provider-list fallback), node placement, FP8 folding."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ep import Session, choose_provider
from ep.compile import compile_model
from ep.errors import ModelLoadError
from ep.providers import CPU, PREFERENCE, has_device_api

from ..conftest import DEMO_MODEL

LO = np.array([3.5, 2.5, 0.8, 3000.0, 60.0, 1.5])
HI = np.array([4.5, 3.5, 3.0, 14000.0, 180.0, 3.5])


@pytest.fixture(scope="module")
def fp8_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("sess") / "fp8"
    compile_model(DEMO_MODEL, out, calibration=np.random.default_rng(3).uniform(LO, HI, (64, 6)).astype(np.float32))
    return out


def frames(n, seed=0):
    return np.random.default_rng(seed).uniform(LO, HI, (n, 6)).astype(np.float32)


def test_auto_policy_ranks_what_this_build_has():
    choice = choose_provider("auto")
    available = [p for p in ort.get_available_providers() if p != "AzureExecutionProvider"]
    assert choice.provider == next(p for p in PREFERENCE if p in available)
    assert has_device_api() and choice.via == "device-api" and choice.devices  # ORT 1.32 has the device API
    assert choose_provider("cpu").provider == CPU


def test_device_api_and_provider_list_give_the_same_results():
    a = Session(DEMO_MODEL, use_device_api=True)
    b = Session(DEMO_MODEL, use_device_api=False)
    assert a.choice.via == "device-api" and b.choice.via == "provider-list"
    assert a.providers[0] == b.providers[0] == a.choice.provider
    x = frames(16)
    np.testing.assert_array_equal(a.run({"signals": x})[0], b.run({"signals": x})[0])


def test_unknown_provider_names_what_is_available():
    with pytest.raises(ModelLoadError, match=r"'NoSuchExecutionProvider'.*available: .*CPUExecutionProvider"):
        Session(DEMO_MODEL, policy="NoSuchExecutionProvider")


def test_placement_reports_every_node_and_one_thread_by_default():
    s = Session(DEMO_MODEL, policy="cpu")
    placed = [n.split(" ", 1)[1] for nodes in s.placement.values() for n in nodes]
    graph_nodes = [n.name for n in onnx.load(str(DEMO_MODEL)).graph.node if n.op_type != "Constant"]
    # fusions rename nodes (X -> X/MatMulAddFusion): every graph node is placed under its name or a fused one
    assert all(any(p == g or p.startswith(g + "/") for p in placed) for g in graph_nodes), (graph_nodes, placed)
    assert set(s.placement) == {CPU}
    assert s.session.get_session_options().intra_op_num_threads == 1
    assert "nodes: CPUExecutionProvider" in s.report()


def test_fp8_artifact_is_folded_to_fp32_at_load_and_says_so(fp8_artifact):
    folded = Session(fp8_artifact)
    assert folded.fp8_folded and any("folded to FP32 at load" in n and "storage only" in n for n in folded.notes)
    ops = {n.split(" ", 1)[0] for nodes in folded.placement.values() for n in nodes}
    assert "DequantizeLinear" not in ops  # folded into the weights
    unfolded = Session(fp8_artifact, fp8_storage=False)
    assert "DequantizeLinear" in {n.split(" ", 1)[0] for nodes in unfolded.placement.values() for n in nodes}
    x = frames(32, seed=4)
    np.testing.assert_allclose(folded.run({"signals": x})[0], unfolded.run({"signals": x})[0], rtol=1e-5, atol=1e-6)


def test_binding_shares_buffers_in_place():
    s = Session(DEMO_MODEL)
    x = np.zeros((1, 6), np.float32)
    y = np.zeros((1, 1), np.float32)
    b = s.bind({"signals": x}, {"command": y})
    for row in frames(5, seed=9):
        x[0] = row
        b.run()
        np.testing.assert_array_equal(y, s.run({"signals": x.copy()})[0])
    with pytest.raises(ModelLoadError, match="C-contiguous"):
        s.bind({"signals": np.zeros((1, 12), np.float32)[:, ::2]}, {"command": y})
