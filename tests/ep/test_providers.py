"""ep.providers with a faked device list: which provider the "auto" and "cpu" policies choose when the
build reports an accelerator, and what reaches `SessionOptions.add_provider_for_devices`. No GPU needed:
`onnxruntime.get_ep_devices` (the function ep.providers calls) returns fake CUDA/TensorRT `OrtEpDevice`s
next to the real CPU one."""
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import pytest

from ep import Session, choose_provider
from ep.errors import ModelLoadError
from ep.providers import CPU, apply
from ep.session import ModelRunner

from ..conftest import DEMO_MODEL

CUDA, TRT = "CUDAExecutionProvider", "TensorrtExecutionProvider"


@dataclass(frozen=True)
class FakeHardware:
    type: str
    vendor: str
    vendor_id: int
    device_id: int


@dataclass(frozen=True)
class FakeEpDevice:
    ep_name: str
    device: FakeHardware
    ep_vendor: str = "NVIDIA"


def gpu(ep: str, device_id: int = 0x2335) -> FakeEpDevice:
    return FakeEpDevice(ep, FakeHardware("OrtHardwareDeviceType.GPU", "NVIDIA", 0x10DE, device_id))


class RecordingOptions:
    """Stands in for `ort.SessionOptions` where fake devices would not pass pybind's type check."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, dict]] = []

    def add_provider_for_devices(self, devices, options) -> None:
        self.calls.append((list(devices), dict(options)))


@pytest.fixture
def devices(monkeypatch):
    """Installs a device list: the real CPU device after the given fakes (so order is not what ranks)."""
    real = list(ort.get_ep_devices())
    assert [d.ep_name for d in real] == [CPU]

    def install(*fakes):
        listed = list(fakes) + real
        monkeypatch.setattr(ort, "get_ep_devices", lambda: listed)
        return real[0]
    return install


def test_auto_chooses_the_faked_cuda_device_and_passes_only_it(devices):
    cuda = gpu(CUDA)
    devices(cuda)
    choice = choose_provider("auto")
    assert (choice.provider, choice.via, choice.policy) == (CUDA, "device-api", "auto")
    assert choice.devices == ("GPU NVIDIA (vendor 0x10de, device 9013)",)
    assert choice.available == (CUDA, CPU)
    so = RecordingOptions()
    assert apply(choice, so, {"device_id": "0"}) is None  # the session options carry the EP, no providers=
    assert so.calls == [([cuda], {"device_id": "0"})]
    assert "CUDAExecutionProvider on GPU NVIDIA" in choice.describe()


def test_cpu_policy_ignores_the_faked_cuda_device(devices):
    cpu_device = devices(gpu(CUDA))
    choice = choose_provider("cpu")
    assert (choice.provider, choice.via, choice.available) == (CPU, "device-api", (CUDA, CPU))
    so = RecordingOptions()
    apply(choice, so)
    assert so.calls == [([cpu_device], {})]
    # the whole path with real session options: the real CPU device is attached, the session runs on it
    s = Session(DEMO_MODEL, policy="cpu")
    assert s.providers == [CPU] and set(s.placement) == {CPU}
    assert s.notes[0].startswith("provider: CPUExecutionProvider") and "available: CUDAExecutionProvider" in s.notes[0]


def test_auto_ranks_tensorrt_over_cuda_and_passes_every_device_of_that_ep(devices):
    trt0, trt1 = gpu(TRT, 1), gpu(TRT, 2)
    devices(gpu(CUDA, 1), trt0, gpu(CUDA, 2), trt1)
    choice = choose_provider("auto")
    assert choice.provider == TRT and len(choice.devices) == 2
    so = RecordingOptions()
    apply(choice, so)
    assert so.calls == [([trt0, trt1], {})]
    assert choose_provider(CUDA).provider == CUDA  # a name picks that EP
    with pytest.raises(ModelLoadError, match=r"'ROCMExecutionProvider'.*available: CUDAExecutionProvider, "
                                             r"TensorrtExecutionProvider, CPUExecutionProvider"):
        choose_provider("ROCMExecutionProvider")


def test_azure_is_never_chosen_and_auto_falls_to_cpu(devices):
    devices(FakeEpDevice("AzureExecutionProvider", FakeHardware("OrtHardwareDeviceType.CPU", "Microsoft", 0, 0)))
    assert choose_provider("auto").provider == CPU


def test_provider_list_fallback_with_a_faked_accelerator(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT, CUDA, CPU])
    choice = choose_provider("auto", use_device_api=False)
    assert (choice.provider, choice.via) == (TRT, "provider-list")
    assert apply(choice, ort.SessionOptions()) == [TRT, CPU]
    assert apply(choice, ort.SessionOptions(), {"trt_fp16_enable": "1"}) == [(TRT, {"trt_fp16_enable": "1"}), (CPU, {})]
    cpu = choose_provider("cpu", use_device_api=False)
    assert cpu.provider == CPU and apply(cpu, ort.SessionOptions()) == [CPU]


def test_session_auto_hands_the_cuda_device_to_the_session_options(devices, monkeypatch):
    """Session(policy="auto") end to end: the CUDA device reaches `add_provider_for_devices` (recorded on the real
    SessionOptions type; with nothing attached, ORT then runs the graph on its CPU EP), and the notes say CUDA."""
    cuda = gpu(CUDA)
    devices(cuda)
    calls = []
    monkeypatch.setattr(ort.SessionOptions, "add_provider_for_devices",
                        lambda self, devs, opts: calls.append((list(devs), dict(opts))))
    s = Session(DEMO_MODEL, policy="auto")
    assert calls == [([cuda], {})]
    assert s.choice.provider == CUDA and s.notes[0].startswith("provider: CUDAExecutionProvider on GPU NVIDIA")
    calls.clear()
    s = Session(DEMO_MODEL, policy="cpu")
    assert len(calls) == 1 and [d.ep_name for d in calls[0][0]] == [CPU]


def test_model_runner_defaults_to_the_cpu_policy(devices):
    """The daemon's model: without a policy (hot swap, persisted models), the CPU EP, even when an
    accelerator is listed."""
    devices(gpu(CUDA))
    runner = ModelRunner(DEMO_MODEL, 6, 1)
    assert runner.ep.choice.policy == "cpu" and runner.ep.choice.provider == CPU and runner.ep.providers == [CPU]
    runner.input[0] = np.array([4.0, 3.0, 1.5, 8000.0, 120.0, 2.5], np.float32)
    assert np.isfinite(runner.run()).all()
