"""The PLC side: the Frame contract, the UADP codec, UDP transport, OPC UA command writer, simulator."""
from .errors import CommandWriteError, PlcError, TransportError, UadpDecodeError
from .frame import Frame, RxStampSource
from .uadp import FixedLayout, UadpMessage
from .udp import UdpFrameSource, UdpPublisher, parse_udp_url

__all__ = ["CommandWriteError", "PlcError", "TransportError", "UadpDecodeError", "Frame", "RxStampSource",
           "FixedLayout", "UadpMessage", "UdpFrameSource", "UdpPublisher", "parse_udp_url"]
