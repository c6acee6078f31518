"""Execution provider choice: ORT's device API where the build has it, a provider list otherwise.

`choose_provider(policy)` ranks what this ONNX Runtime build offers and returns a `ProviderChoice`;
`apply(choice, so)` configures `SessionOptions` for it. Policies:

    "auto"   the first of PREFERENCE present: TensorRT, CUDA (and the other accelerators ORT ships),
             CPU last. An accelerator EP takes the nodes it supports; ORT runs the rest on the CPU EP.
    "cpu"    the CPU EP only: the daemon's default on a control box (deterministic, no device copies).
             sitsd takes the policy from the config's `model.provider` ("cpu" by default, or "auto") and
             passes it to `ModelRunner`, whose own default is "cpu" too; the streaming model always runs
             on the CPU EP (`PoolConfig.policy`: its KV buffers are host memory, bound in place).
    a name   that EP (e.g. "CUDAExecutionProvider"); an error naming what is available when absent.

With the device API (ORT >= 1.22: `get_ep_devices`, `SessionOptions.add_provider_for_devices`), the
chosen EP is attached to its `OrtEpDevice`s. Builds without it get `providers=[name, "CPU..."]`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnxruntime as ort

from .errors import ModelLoadError

CPU = "CPUExecutionProvider"
PREFERENCE = ("NvTensorRTRTXExecutionProvider", "TensorrtExecutionProvider", "CUDAExecutionProvider",
              "MIGraphXExecutionProvider", "ROCMExecutionProvider", "DmlExecutionProvider",
              "OpenVINOExecutionProvider", "QNNExecutionProvider", "CoreMLExecutionProvider", CPU)
# Providers that are not compute devices for a local model (remote inference endpoints).
NOT_LOCAL = frozenset({"AzureExecutionProvider"})


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    provider: str
    via: str                       # "device-api" or "provider-list"
    policy: str
    devices: tuple[str, ...] = ()  # "CPU AMD (vendor 0x1022, device 0)" per OrtEpDevice used
    available: tuple[str, ...] = field(default=())
    _ep_devices: tuple = field(default=(), repr=False, compare=False)

    def describe(self) -> str:
        dev = f" on {', '.join(self.devices)}" if self.devices else ""
        return f"{self.provider}{dev} (policy {self.policy!r}, via {self.via}; available: {', '.join(self.available)})"


def has_device_api() -> bool:
    return hasattr(ort, "get_ep_devices") and hasattr(ort.SessionOptions, "add_provider_for_devices")


def _device_label(d) -> str:
    hw = d.device
    kind = str(hw.type).rsplit(".", 1)[-1]
    return f"{kind} {hw.vendor} (vendor 0x{hw.vendor_id:04x}, device {hw.device_id})"


def _pick(names: list[str], policy: str) -> str:
    local = [n for n in names if n not in NOT_LOCAL]
    if policy == "cpu":
        want = CPU
    elif policy == "auto":
        want = next((p for p in PREFERENCE if p in local), None)
        if want is None:  # an EP we do not rank (a plugin): still prefer it over nothing
            want = local[0] if local else CPU
    else:
        want = policy
    if want not in names:
        raise ModelLoadError(f"execution provider {want!r} (policy {policy!r}) is not in this ONNX Runtime build "
                             f"({ort.__version__}); available: {', '.join(names) or 'none'}. Install the "
                             f"onnxruntime package that ships it (e.g. onnxruntime-gpu) or use policy 'auto'/'cpu'")
    return want


def choose_provider(policy: str = "auto", *, use_device_api: bool | None = None) -> ProviderChoice:
    """The provider for `policy`; `use_device_api=False` forces the provider-list path (older builds)."""
    if use_device_api is None:
        use_device_api = has_device_api()
    if use_device_api:
        devices = list(ort.get_ep_devices())
        names = list(dict.fromkeys(d.ep_name for d in devices))
        if names:
            want = _pick(names, policy)
            chosen = tuple(d for d in devices if d.ep_name == want)
            return ProviderChoice(want, "device-api", policy, tuple(_device_label(d) for d in chosen),
                                  tuple(names), chosen)
    names = list(ort.get_available_providers())
    return ProviderChoice(_pick(names, policy), "provider-list", policy, (), tuple(names))


def apply(choice: ProviderChoice, so: ort.SessionOptions, options: dict[str, str] | None = None) -> list | None:
    """Configures `so` for `choice`; returns the `providers=` argument for `InferenceSession` (None with
    the device API, where the session options carry the EP)."""
    if choice.via == "device-api":
        so.add_provider_for_devices(list(choice._ep_devices), dict(options or {}))
        return None
    providers = [choice.provider] if choice.provider == CPU else [choice.provider, CPU]
    return providers if not options else [(p, options if p == choice.provider else {}) for p in providers]


def node_placement(session: ort.InferenceSession) -> dict[str, list[str]]:
    """Provider -> ["op_type name", ...] as ORT assigned them (needs the session config entry
    `session.record_ep_graph_assignment_info=1`; empty when the build cannot report it)."""
    getter = getattr(session, "get_provider_graph_assignment_info", None)
    if getter is None:
        return {}
    try:
        subgraphs = getter()
    except Exception:  # recording was not enabled, or the build lacks it
        return {}
    out: dict[str, list[str]] = {}
    for sg in subgraphs:
        out.setdefault(sg.ep_name, []).extend(f"{n.op_type} {n.name}" for n in sg.get_nodes())
    return out
