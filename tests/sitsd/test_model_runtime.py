"""Where the daemon's model runs: `model.provider` (cpu by default, or auto) reaches the execution provider
choice, and the choice, the placement and the session's notes are logged at startup and shown by
`sitsctl status` (`model_runtime`). An accelerator is faked in the device list ep.providers reads
(`onnxruntime.get_ep_devices`), so no GPU is needed."""
import json
import signal
import subprocess
from dataclasses import dataclass

import onnxruntime as ort
import pytest

from ep.providers import CPU
from sitsd.config import load_config
from sitsd.control import request
from sitsd.errors import ConfigError
from sitsd.model import build_model, runtime_report

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_ready

CUDA = "CUDAExecutionProvider"
STREAMING_CONFIG = REPO / "examples" / "rolling-mill-streaming.yaml"


@dataclass(frozen=True)
class FakeHardware:
    type: str = "OrtHardwareDeviceType.GPU"
    vendor: str = "NVIDIA"
    vendor_id: int = 0x10DE
    device_id: int = 0x2335


@dataclass(frozen=True)
class FakeEpDevice:
    ep_name: str = CUDA
    device: FakeHardware = FakeHardware()
    ep_vendor: str = "NVIDIA"


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CUDA device listed before the real CPU one; `add_provider_for_devices` recorded (a fake device does not
    pass pybind's type check, and with nothing attached ORT runs the graph on its CPU EP)."""
    cuda = FakeEpDevice()
    listed = [cuda] + list(ort.get_ep_devices())
    monkeypatch.setattr(ort, "get_ep_devices", lambda: listed)
    calls = []
    monkeypatch.setattr(ort.SessionOptions, "add_provider_for_devices",
                        lambda self, devs, opts: calls.append([d.ep_name for d in devs]))
    return calls


def test_model_provider_is_cpu_by_default_and_takes_auto():
    assert load_config(EXAMPLE_CONFIG).model.provider == "cpu"
    assert load_config(EXAMPLE_CONFIG, {"model.provider": "auto"}).model.provider == "auto"
    with pytest.raises(ConfigError, match="model.provider"):
        load_config(EXAMPLE_CONFIG, {"model.provider": "cuda"})


def test_streaming_model_refuses_provider_auto():
    assert load_config(STREAMING_CONFIG).model.provider == "cpu"
    with pytest.raises(ConfigError, match="model.provider: auto only applies to kind: mlp"):
        load_config(STREAMING_CONFIG, {"model.provider": "auto"})


def test_provider_cpu_keeps_the_model_on_the_cpu_ep_with_an_accelerator_listed(fake_cuda):
    runner = build_model(load_config(EXAMPLE_CONFIG))
    assert fake_cuda == [[CPU]]
    rt = runtime_report(runner)
    assert (rt["policy"], rt["provider"], rt["via"], rt["providers"]) == ("cpu", CPU, "device-api", [CPU])
    assert rt["available"] == [CUDA, CPU] and rt["cpu_fallback_nodes"] == []
    assert set(rt["placement"]) == {CPU} and rt["placement"][CPU] >= 1
    assert rt["notes"][0].startswith("provider: CPUExecutionProvider") and rt["notes"] == runner.ep.notes
    json.dumps(rt)  # goes into the log and the control socket's answer as it is


def test_provider_auto_chooses_the_faked_cuda_device(fake_cuda):
    runner = build_model(load_config(EXAMPLE_CONFIG, {"model.provider": "auto"}))
    assert fake_cuda == [[CUDA]]  # the CUDA device, not the CPU one, went to the session options
    rt = runtime_report(runner)
    assert (rt["policy"], rt["provider"]) == ("auto", CUDA)
    assert rt["devices"] == ["GPU NVIDIA (vendor 0x10de, device 9013)"]
    # nothing was really attached, so ORT placed every node on its CPU EP: reported as the CPU fallback
    assert rt["providers"] == [CPU] and len(rt["cpu_fallback_nodes"]) == rt["placement"][CPU] >= 1
    assert rt["notes"][0].startswith("provider: CUDAExecutionProvider on GPU NVIDIA")


def test_a_hot_swapped_model_keeps_the_configured_provider(fake_cuda, tmp_path):
    """model.provider auto holds for the model a hot swap brings in, not only for the one loaded at start."""
    import shutil

    from sitsd.hotswap import HotSwap

    from ..conftest import DEMO_MODEL
    from .test_loop import build

    loop, _, _ = build()
    cfg = load_config(EXAMPLE_CONFIG, {"model.provider": "auto"})
    hs = HotSwap(loop, None, n_inputs=len(cfg.model.inputs), n_outputs=len(cfg.model.outputs),
                 provider=cfg.model.provider)
    copy = tmp_path / "copy.onnx"
    shutil.copy(DEMO_MODEL, copy)
    hs.update_model(copy)
    assert fake_cuda[-1] == [CUDA]  # the swapped-in session's choice (the loop's first model was built on cpu)
    assert runtime_report(loop.stage_set.model)["policy"] == "auto"


def test_streaming_runner_reports_its_cpu_session(tmp_path):
    runner = build_model(load_config(STREAMING_CONFIG, {"audit.directory": str(tmp_path / "audit"),
                                                        "model.streaming.window": 32}))
    try:
        rt = runtime_report(runner)
        assert (rt["policy"], rt["provider"], rt["providers"]) == ("cpu", CPU, [CPU])
        assert rt["placement"][CPU] > 10 and rt["notes"][0].startswith("provider: CPUExecutionProvider")
    finally:
        runner.close()
    assert runtime_report(object()) is None


def test_daemon_logs_and_shows_the_model_runtime(plcsim, tmp_path):
    audit, control, log = tmp_path / "audit", tmp_path / "c.sock", tmp_path / "sitsd.log"
    endpoint, udp_url, _ = plcsim(audit / "signer.pub.pem")
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__mode="software", plc__security="none", audit__directory=audit,
                                       control__socket=control), stderr=open(log, "wb"), cwd=REPO)
    try:
        wait_ready(proc, log)
        status = request(control, "status")
        rt = status["model_runtime"]
        assert (rt["policy"], rt["provider"], rt["providers"]) == ("cpu", CPU, [CPU])
        assert set(rt["placement"]) == {CPU} and rt["notes"][0].startswith("provider: CPUExecutionProvider")
        logged = [json.loads(line[line.index("{"):]) for line in log.read_text().splitlines()
                  if '"model runtime"' in line]
        assert len(logged) == 1
        assert {k: logged[0][k] for k in rt} == rt
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
