"""Profile lookup by the names the daemon config uses (`plc.profile`)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import PlcProfile
from .controllogix import LogixProfile
from .errors import ProfileError
from .melsec_iq_r import MelsecProfile
from .s7_1500 import S7Profile
from .simulator import SimulatorProfile

# Keys must match sitsd.config's Literal for plc.profile; a test pins the two together.
_FACTORIES: dict[str, Callable[..., Any]] = {
    "s7-1500": S7Profile,
    "controllogix": LogixProfile,
    "melsec-iq-r": MelsecProfile,
    "simulator": SimulatorProfile,
}
PROFILE_NAMES: tuple[str, ...] = tuple(sorted(_FACTORIES))


def get_profile(name: str, **options: Any) -> PlcProfile:
    """A fresh profile; `options` are its constructor settings (e.g. namespace_index, shortcut, prefix)."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ProfileError(f"unknown PLC profile {name!r}; known profiles: {', '.join(PROFILE_NAMES)}",
                           example="s7-1500")
    try:
        return factory(**options)
    except TypeError as exc:
        raise ProfileError(f"bad options {sorted(options)} for profile {name!r}: {exc}", profile=name) from exc
