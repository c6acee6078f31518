"""The box's PTP synchronisation state, from linuxptp: `pmc` asks ptp4l over its UNIX socket.

Locked means: this port is a SLAVE of a present grandmaster with |master offset| within the limit,
or it is the MASTER/GRAND_MASTER itself (its clock is the reference). Anything else (LISTENING,
UNCALIBRATED, FAULTY, no ptp4l) is unsynchronised. Queried on the I/O thread; the timestamp gate
only reads the resulting flag.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PtpStatus:
    available: bool
    port_state: str = ""
    master_offset_ns: int | None = None
    gm_present: bool | None = None
    gm_identity: str = ""
    detail: str = ""

    def locked(self, max_offset_ns: int) -> bool:
        if not self.available:
            return False
        if self.port_state in ("MASTER", "GRAND_MASTER"):
            return True
        return (self.port_state == "SLAVE" and bool(self.gm_present) and self.master_offset_ns is not None
                and abs(self.master_offset_ns) <= max_offset_ns)

    def describe(self, max_offset_ns: int) -> str:
        if not self.available:
            return f"PTP state unavailable: {self.detail}"
        offset = "" if self.master_offset_ns is None else f", master offset {self.master_offset_ns} ns"
        verdict = "locked" if self.locked(max_offset_ns) else f"not locked (limit ±{max_offset_ns} ns)"
        return f"PTP port {self.port_state}, grandmaster {'present' if self.gm_present else 'absent'}{offset}: {verdict}"


def _field(text: str, name: str) -> str | None:
    m = re.search(rf"^\s*{name}\s+(\S+)", text, re.M)
    return m.group(1) if m else None


def parse_pmc(text: str) -> PtpStatus:
    """Parse `pmc ... 'GET TIME_STATUS_NP' 'GET PORT_DATA_SET'` output."""
    state = _field(text, "portState")
    offset = _field(text, "master_offset")
    gm = _field(text, "gmPresent")
    if state is None and offset is None:
        return PtpStatus(False, detail="pmc gave no TIME_STATUS_NP/PORT_DATA_SET response (is ptp4l running?)")
    try:
        offset_ns = int(offset) if offset is not None else None
    except ValueError:
        offset_ns = None
    return PtpStatus(True, state or "", offset_ns, None if gm is None else gm == "true", _field(text, "gmIdentity") or "")


def query_pmc(uds: Path, timeout_s: float = 2.0) -> PtpStatus:
    exe = shutil.which("pmc") or ("/usr/sbin/pmc" if Path("/usr/sbin/pmc").exists() else None)
    if exe is None:
        return PtpStatus(False, detail="pmc is not installed (Debian: linuxptp)")
    if not Path(uds).exists():
        return PtpStatus(False, detail=f"no ptp4l socket at {uds}")
    try:
        r = subprocess.run([exe, "-u", "-b", "0", "-s", str(uds), "GET TIME_STATUS_NP", "GET PORT_DATA_SET"],
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return PtpStatus(False, detail=f"pmc did not answer within {timeout_s} s")
    return parse_pmc(r.stdout)
