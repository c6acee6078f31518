"""Vendor PLC profiles: address parsers, NodeId mapping and status/diagnostic decoding, driven by data files."""
from .base import ADDRESS_KINDS, Address, AddressKind, PlcProfile, load_data
from .controllogix import LogixProfile
from .errors import ProfileError
from .events import SEVERITIES, PlcEvent, Severity
from .melsec_iq_r import MelsecProfile
from .registry import PROFILE_NAMES, get_profile
from .s7_1500 import S7Profile
from .simulator import SimulatorProfile

__all__ = ["ADDRESS_KINDS", "Address", "AddressKind", "PlcProfile", "load_data", "LogixProfile", "ProfileError",
           "SEVERITIES", "PlcEvent", "Severity", "MelsecProfile", "PROFILE_NAMES", "get_profile", "S7Profile",
           "SimulatorProfile"]
