"""Kernel RX timestamps (SO_TIMESTAMPING) for packet and datagram sockets.

Constants Python's socket module lacks, and the one rule for picking a stamp: the NIC's
hardware stamp (PHC, ts[2]) when present, the kernel's software stamp (ts[0]) otherwise, and a
user-space clock read only when the kernel gave none.
"""
from __future__ import annotations

import socket
import struct
import time

from .frame import RxStampSource

SO_TIMESTAMPING = 37
SOF_TIMESTAMPING_RX_HARDWARE = 1 << 2
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_RAW_HARDWARE = 1 << 6
RX_TIMESTAMPING_FLAGS = (SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RX_SOFTWARE
                         | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_RAW_HARDWARE)
_SCM_TIMESTAMPING = struct.Struct("<qqqqqq")  # struct scm_timestamping { struct timespec ts[3]; }


def rx_stamp_from_cmsg(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, RxStampSource]:
    """Pick the RX timestamp from recvmsg ancillary data: hardware first, then software."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= _SCM_TIMESTAMPING.size:
            sw_s, sw_ns, _, _, hw_s, hw_ns = _SCM_TIMESTAMPING.unpack_from(data)
            if hw_s or hw_ns:
                return hw_s * 1_000_000_000 + hw_ns, RxStampSource.HARDWARE
            if sw_s or sw_ns:
                return sw_s * 1_000_000_000 + sw_ns, RxStampSource.SOFTWARE
    return time.time_ns(), RxStampSource.USER
