"""UADP over UDP (opc.udp://host:port): a receiving source with kernel RX timestamps and a publisher.

Multicast groups are joined on the configured interface address; unicast works too.
RX stamps come from SO_TIMESTAMPING: the NIC's hardware stamp when present, the kernel's
software stamp otherwise, and a user-space clock read only when the kernel gave none.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlparse

from .errors import TransportError
from .frame import Frame
from .socket_source import UadpSocketSource
from .timestamps import RX_TIMESTAMPING_FLAGS, SO_TIMESTAMPING, rx_stamp_from_cmsg
from .uadp import FixedLayout


def parse_udp_url(url: str) -> tuple[str, int]:
    """`opc.udp://239.0.0.1:4840` -> ("239.0.0.1", 4840), with a message that says what is wrong."""
    parsed = urlparse(url)
    if parsed.scheme != "opc.udp":
        raise TransportError(f"{url!r}: UADP over UDP needs an opc.udp:// URL, e.g. opc.udp://239.0.0.1:4840")
    if not parsed.hostname:
        raise TransportError(f"{url!r}: no host; write opc.udp://<IPv4 address>:<port>")
    try:
        ipaddress.IPv4Address(parsed.hostname)
    except ValueError:
        raise TransportError(f"{url!r}: host must be an IPv4 address (multicast 224.0.0.0/4 or unicast)") from None
    try:
        port = parsed.port or 4840
    except ValueError:
        raise TransportError(f"{url!r}: port is not a number in 1..65535") from None
    return parsed.hostname, port


class UdpFrameSource(UadpSocketSource):
    """Reads UADP messages of one fixed layout from a UDP socket on the calling thread."""

    def __init__(self, url: str, layout: FixedLayout, interface: str = "0.0.0.0",
                 publisher_id: int | None = None, writer_id: int | None = None) -> None:
        self.url = url
        host, port = parse_udp_url(url)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            is_multicast = ipaddress.IPv4Address(host).is_multicast
            sock.bind((host, port))
            if is_multicast:
                mreq = socket.inet_aton(host) + socket.inet_aton(interface)
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, RX_TIMESTAMPING_FLAGS)
        except OSError as exc:
            sock.close()
            raise TransportError(f"{url}: cannot open UDP receiver on interface {interface}: {exc}") from exc
        super().__init__(sock, layout, publisher_id, writer_id, buffer_size=65536)
        self.port = sock.getsockname()[1]

    def receive(self, timeout_s: float) -> Frame | None:
        """Next frame, or None after `timeout_s` without one. `Frame.values` is reused by the next call.

        Malformed messages and messages from other publishers are counted and skipped;
        nothing raises out of here except a closed socket.
        """
        self._sock.settimeout(timeout_s)
        while True:
            try:
                nbytes, ancdata, _flags, _addr = self._sock.recvmsg_into([self._buffer], 256)
            except (TimeoutError, BlockingIOError):
                return None
            rx_ns, source = rx_stamp_from_cmsg(ancdata)
            frame = self._frame(self._view[:nbytes], rx_ns, source)
            if frame is not None:
                return frame


class UdpPublisher:
    """Sends UADP messages to a UDP unicast or multicast address (the simulator's side)."""

    def __init__(self, url: str, interface: str = "127.0.0.1", ttl: int = 1) -> None:
        host, port = parse_udp_url(url)
        self.address = (host, port)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if ipaddress.IPv4Address(host).is_multicast:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0xA0)  # DSCP CS5: real-time control traffic
        self._sock = sock

    def send(self, payload: bytes) -> None:
        self._sock.sendto(payload, self.address)

    def close(self) -> None:
        self._sock.close()
