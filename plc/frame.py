"""The Frame contract: one sensor sample set as it arrived from a PLC."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class RxStampSource(IntEnum):
    """Where the receive timestamp came from."""

    HARDWARE = 2  # NIC PHC stamp (SO_TIMESTAMPING ts[2])
    SOFTWARE = 1  # kernel stamp taken when the packet entered the stack
    USER = 0  # taken in user space after recv (no kernel stamp available)


@dataclass(frozen=True, slots=True)
class Frame:
    publisher_id: int
    writer_id: int
    sequence_number: int
    sender_timestamp_ns: int  # CLOCK_REALTIME at the PLC when it sent the message
    rx_timestamp_ns: int  # CLOCK_REALTIME (or PHC) when it was received
    rx_stamp_source: RxStampSource
    values: np.ndarray  # float64, ordered as the config's signals
    vlan_pcp: int = -1  # -1: no VLAN tag seen
