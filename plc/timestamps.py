"""Kernel RX timestamps (SO_TIMESTAMPING) for packet and datagram sockets, and the NIC's side of them.

Constants Python's socket module lacks, and the one rule for picking a stamp: the NIC's
hardware stamp (PHC, ts[2]) when present, the kernel's software stamp (ts[0]) otherwise, and a
user-space clock read only when the kernel gave none.

Two things make a hardware stamp usable, and neither happens by itself:

- The NIC must be told to stamp received frames (SIOCSHWTSTAMP, rx_filter ALL). SO_TIMESTAMPING
  only asks the kernel to *report* hardware stamps; a NIC nobody configured stamps nothing, or only
  PTP event packets when ptp4l configured it. `enable_hardware_rx_stamps` checks the interface's
  setting (SIOCGHWTSTAMP) and turns RX stamping of all frames on when it is off (CAP_NET_ADMIN).
- The PHC's clock is not CLOCK_REALTIME. ptp4l steers it to the grandmaster's PTP timescale, which
  is TAI (37 s ahead of UTC since 2017), while the OPC UA sender stamp is UTC. A hardware stamp is
  therefore converted to UTC by subtracting the TAI-UTC offset (`phc_utc_offset_ns`) before it
  reaches the Frame; software stamps are CLOCK_REALTIME (UTC) already and are left alone.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import socket
import struct
import time
from dataclasses import dataclass

from .errors import TransportError
from .frame import RxStampSource

SO_TIMESTAMPING = 37
SOF_TIMESTAMPING_RX_HARDWARE = 1 << 2
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_RAW_HARDWARE = 1 << 6
RX_TIMESTAMPING_FLAGS = (SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RX_SOFTWARE
                         | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_RAW_HARDWARE)
_SCM_TIMESTAMPING = struct.Struct("<qqqqqq")  # struct scm_timestamping { struct timespec ts[3]; }

# <linux/sockios.h>, <linux/net_tstamp.h>
SIOCSHWTSTAMP = 0x89B0
SIOCGHWTSTAMP = 0x89B1
HWTSTAMP_FILTER_NONE = 0
HWTSTAMP_FILTER_ALL = 1
HWTSTAMP_FILTER_SOME = 2
_HWTSTAMP_CONFIG = struct.Struct("iii")  # struct hwtstamp_config { int flags, tx_type, rx_filter; }
_IFREQ_SIZE = 40  # sizeof(struct ifreq) on 64-bit Linux: 16 B name + 24 B union (ifr_data is a pointer)
_RX_FILTERS = ("none", "all", "some", "ptp-v1-l4-event", "ptp-v1-l4-sync", "ptp-v1-l4-delay-req",
               "ptp-v2-l4-event", "ptp-v2-l4-sync", "ptp-v2-l4-delay-req", "ptp-v2-l2-event", "ptp-v2-l2-sync",
               "ptp-v2-l2-delay-req", "ptp-v2-event", "ptp-v2-sync", "ptp-v2-delay-req", "ntp-all")

TAI_UTC_OFFSET_S = 37  # TAI - UTC since 2017-01-01 (IERS Bulletin C); pmc's currentUtcOffset says it live


def rx_filter_name(rx_filter: int | None) -> str:
    if rx_filter is None:
        return "unknown"
    return _RX_FILTERS[rx_filter] if 0 <= rx_filter < len(_RX_FILTERS) else f"filter {rx_filter}"


def phc_utc_offset_ns(phc_timescale: str = "tai", utc_offset_s: int = TAI_UTC_OFFSET_S) -> int:
    """What to subtract from a hardware (PHC) RX stamp to get UTC: the TAI-UTC offset for a PHC that
    ptp4l steers to the PTP timescale (TAI, the default of every PTP/gPTP profile), 0 for a PHC kept
    in UTC (ARB timescale, or phc2sys writing CLOCK_REALTIME into it)."""
    if phc_timescale == "tai":
        if not 0 <= utc_offset_s <= 100:
            raise TransportError(f"utc_offset_s {utc_offset_s}: TAI - UTC is {TAI_UTC_OFFSET_S} s since 2017 "
                                 "(pmc 'GET TIME_PROPERTIES_DATA_SET' shows currentUtcOffset)")
        return utc_offset_s * 1_000_000_000
    if phc_timescale == "utc":
        return 0
    raise TransportError(f"phc_timescale {phc_timescale!r}: use tai (ptp4l's PTP timescale, the usual case) or utc")


def rx_stamp_from_cmsg(ancdata: list[tuple[int, int, bytes]], hw_offset_ns: int = 0) -> tuple[int, RxStampSource]:
    """Pick the RX timestamp from recvmsg ancillary data: hardware first, then software.

    `hw_offset_ns` is subtracted from a hardware stamp only (see `phc_utc_offset_ns`): the PHC counts
    TAI, the kernel's software stamp is CLOCK_REALTIME, and the Frame carries UTC either way.
    """
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= _SCM_TIMESTAMPING.size:
            sw_s, sw_ns, _, _, hw_s, hw_ns = _SCM_TIMESTAMPING.unpack_from(data)
            if hw_s or hw_ns:
                return hw_s * 1_000_000_000 + hw_ns - hw_offset_ns, RxStampSource.HARDWARE
            if sw_s or sw_ns:
                return sw_s * 1_000_000_000 + sw_ns, RxStampSource.SOFTWARE
    return time.time_ns(), RxStampSource.USER


@dataclass(frozen=True)
class HwStampSetup:
    """What `enable_hardware_rx_stamps` found and did on one interface; `detail` is the sentence to log.

    action: "enabled" (we set rx_filter all), "already on" (another process did), "unavailable"
    (no driver support, no permission: software stamps), "ptp only" (the driver stamps only PTP
    packets in hardware), "not attempted" (no single interface to ask, or not wanted).
    """

    interface: str
    hardware: bool  # the NIC stamps every received frame
    action: str
    rx_filter_before: int | None = None
    rx_filter_after: int | None = None
    detail: str = ""


def _hwtstamp_ioctl(sock: socket.socket, interface: str, request: int,
                    config: tuple[int, int, int]) -> tuple[int, int, int]:
    """SIOC[GS]HWTSTAMP: struct ifreq's ifr_data points at a struct hwtstamp_config the kernel reads and
    writes back, so it lives in a ctypes buffer whose address goes into the ifreq."""
    buf = ctypes.create_string_buffer(_HWTSTAMP_CONFIG.pack(*config), _HWTSTAMP_CONFIG.size)
    ifreq = struct.pack("16sP", interface.encode()[:15], ctypes.addressof(buf)).ljust(_IFREQ_SIZE, b"\0")
    fcntl.ioctl(sock.fileno(), request, ifreq)
    return _HWTSTAMP_CONFIG.unpack(buf.raw[:_HWTSTAMP_CONFIG.size])


def _why(exc: OSError, request: str) -> str:
    if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOTTY):
        return f"the driver has no hardware timestamping ({request}: {exc.strerror})"
    if exc.errno == errno.EPERM:
        return (f"turning it on needs CAP_NET_ADMIN ({request}: {exc.strerror}); grant it, or let ptp4l enable "
                "it with `hwts_filter full` in ptp4l.conf")
    if exc.errno == errno.ERANGE:
        return f"the driver cannot stamp all received frames ({request}: {exc.strerror})"
    if exc.errno == errno.ENODEV:
        return f"no such interface ({request}: {exc.strerror})"
    return f"{request} refused: {exc.strerror or exc}"


def enable_hardware_rx_stamps(interface: str) -> HwStampSetup:
    """Make the NIC stamp every received frame, if it can; never raises for a NIC that cannot.

    Reads the current setting with SIOCGHWTSTAMP. rx_filter ALL: nothing to do (ptp4l with
    `hwts_filter full`, or a previous run). Anything else (NONE, or a PTP-only filter ptp4l asked
    for): SIOCSHWTSTAMP with rx_filter ALL and tx_type kept as it is, so ptp4l's TX stamps are not
    touched; ptp4l accepts ALL as a superset of its filter. Drivers that implement only the SET
    ioctl are tried too. The driver may answer with a narrower filter (PTP packets only): then UADP
    frames keep software stamps, and the result says so.
    """
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as exc:
        return HwStampSetup(interface, False, "unavailable",
                            detail=f"hardware stamps unavailable on {interface}: no socket to ask with ({exc}), "
                                   "using software stamps")
    with probe:
        flags, tx_type, before = 0, 0, None
        try:
            flags, tx_type, before = _hwtstamp_ioctl(probe, interface, SIOCGHWTSTAMP, (0, 0, 0))
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOTTY, errno.EINVAL):
                return HwStampSetup(interface, False, "unavailable",
                                    detail=f"hardware stamps unavailable on {interface}: {_why(exc, 'SIOCGHWTSTAMP')}, "
                                           "using software stamps")
        if before == HWTSTAMP_FILTER_ALL:
            return HwStampSetup(interface, True, "already on", before, before,
                                f"hardware RX stamps on {interface}: already on (rx_filter all, set by another "
                                "process such as ptp4l)")
        try:
            _, _, after = _hwtstamp_ioctl(probe, interface, SIOCSHWTSTAMP, (flags, tx_type, HWTSTAMP_FILTER_ALL))
        except OSError as exc:
            return HwStampSetup(interface, False, "unavailable", before, before,
                                f"hardware stamps unavailable on {interface}: {_why(exc, 'SIOCSHWTSTAMP')}, "
                                "using software stamps")
    if after == HWTSTAMP_FILTER_ALL:
        return HwStampSetup(interface, True, "enabled", before, after,
                            f"hardware RX stamps on {interface}: enabled (rx_filter {rx_filter_name(before)} -> all)")
    return HwStampSetup(interface, False, "ptp only", before, after,
                        f"hardware stamps unavailable on {interface}: the driver stamps only rx_filter "
                        f"{rx_filter_name(after)} in hardware, not UADP frames, using software stamps")
