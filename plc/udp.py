"""UADP over UDP (opc.udp://host:port): a receiving source with kernel RX timestamps and a publisher.

Multicast groups are joined on the configured interface address; unicast works too.
RX stamps come from SO_TIMESTAMPING: the NIC's hardware stamp when present (converted from the
PHC's TAI to UTC), the kernel's software stamp otherwise, and a user-space clock read only when
the kernel gave none. At open, the NIC that owns the interface address is asked to stamp all
received frames (`hw_stamps` says what happened).

Group membership survives a link going down and up (the kernel re-announces it). It does not
survive the interface being deleted and re-created: the membership points at the old index. A
source without frames for a second checks which interface owns its address now and re-joins the
group there when that changed.
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import socket
import struct
import time
from urllib.parse import urlparse

from .errors import TransportError
from .frame import Frame
from .socket_source import UadpSocketSource, count_send_error
from .timestamps import (RX_TIMESTAMPING_FLAGS, SO_TIMESTAMPING, TAI_UTC_OFFSET_S, HwStampSetup,
                         enable_hardware_rx_stamps, phc_utc_offset_ns, rx_stamp_from_cmsg)
from .uadp import FixedLayout, RawDoubleLayout

SIOCGIFADDR = 0x8915


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


def private_multicast_url(bind_ip: str = "127.0.0.1") -> str:
    """An opc.udp URL on a random group of the administratively scoped block (239.255.0.0/16, RFC 2365) and a
    UDP port free on `bind_ip` now: a demo, test or benchmark run that does not hear another running beside it.
    The port is free when asked, not reserved: bind it soon."""
    import random

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((bind_ip, 0))
        port = s.getsockname()[1]
    return f"opc.udp://239.255.{random.randint(1, 254)}.{random.randint(1, 254)}:{port}"


def interface_of_address(address: str) -> tuple[str, int] | None:
    """(name, index) of the interface whose primary IPv4 address is `address`, or None."""
    try:
        want = socket.inet_aton(address)
    except OSError:
        return None  # not an address: the membership setsockopt reports it
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for index, name in socket.if_nameindex():
            try:
                ifreq = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("16s24x", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if ifreq[20:24] == want:  # struct ifreq: name[16], sockaddr_in (family, port, addr)
                return name, index
    return None


class UdpFrameSource(UadpSocketSource):
    """Reads UADP messages of one fixed layout from a UDP socket on the calling thread.

    `publisher_id`, `writer_group_id`, `writer_id`: messages naming others are skipped and counted in
    `foreign` (None: not checked); what the layout refuses may still be decoded (see UadpSocketSource).
    `hardware_stamps`, `phc_timescale`, `utc_offset_s`: as for `plc.eth.EthFrameSource`; the NIC is
    the one that owns `interface` (an address; 0.0.0.0 names no NIC, so nothing is attempted).
    """

    def __init__(self, url: str, layout: FixedLayout | RawDoubleLayout, interface: str = "0.0.0.0",
                 publisher_id: int | str | None = None, writer_id: int | None = None, *,
                 writer_group_id: int | None = None, hardware_stamps: bool = True, phc_timescale: str = "tai",
                 utc_offset_s: int = TAI_UTC_OFFSET_S) -> None:
        self.url = url
        self.interface = interface
        host, port = parse_udp_url(url)
        self._group = host if ipaddress.IPv4Address(host).is_multicast else None
        self._hw_offset_ns = phc_utc_offset_ns(phc_timescale, utc_offset_s)
        nic = interface_of_address(interface) if interface != "0.0.0.0" else None
        self._ifindex = nic[1] if nic else 0  # 0: membership by address only, not tracked
        self._rejoined_at = 0  # link_errors when the group was last re-joined (untracked interface)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            if self._group:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, self._mreq(self._ifindex))
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, RX_TIMESTAMPING_FLAGS)
        except OSError as exc:
            sock.close()
            raise TransportError(f"{url}: cannot open UDP receiver on interface {interface}: {exc}") from exc
        super().__init__(sock, layout, publisher_id, writer_id, buffer_size=65536, where=f"{url} on {interface}",
                         writer_group_id=writer_group_id)
        self.port = sock.getsockname()[1]
        if hardware_stamps and nic:
            self.hw_stamps = enable_hardware_rx_stamps(nic[0])
        elif hardware_stamps:
            self.hw_stamps = HwStampSetup(interface, False, "not attempted", detail=(
                f"hardware stamps not attempted: no single NIC owns {interface}; set transport.interface to the "
                "address of the NIC that faces the PLC; using software stamps"))

    def _mreq(self, ifindex: int) -> bytes:
        """struct ip_mreqn (group, interface address, index): with the index the kernel keys the membership
        on that device, so it can be dropped again after the device is gone."""
        return socket.inet_aton(self._group) + socket.inet_aton(self.interface) + struct.pack("i", ifindex)

    def _relink(self) -> bool:
        """Re-join the group when the interface address moved to a new device (deleted and re-created),
        or, for an address no interface tracking covers, once after each burst of link errors."""
        if not self._group:
            return False
        if self._ifindex:
            nic = interface_of_address(self.interface)
            if nic is None:
                raise OSError(errno.EADDRNOTAVAIL, f"no interface has the address {self.interface} (yet)")
            if nic[1] == self._ifindex:
                return False
            old, new = self._ifindex, nic[1]
        else:
            if not self.link_down or self._rejoined_at == self.link_errors:
                return False
            old = new = 0
        try:
            self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_DROP_MEMBERSHIP, self._mreq(old))
        except OSError:
            pass  # already gone with the old device
        self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, self._mreq(new))
        self._ifindex = new
        self._rejoined_at = self.link_errors
        if new and self.hw_stamps.action != "not attempted":  # a new device starts with stamping off
            nic = interface_of_address(self.interface)
            if nic:
                self.hw_stamps = enable_hardware_rx_stamps(nic[0])
        return True

    def receive(self, timeout_s: float) -> Frame | None:
        """Next frame, or None after `timeout_s` without one. `Frame.values` is reused by the next call.

        Malformed messages and messages from other publishers are counted and skipped; socket errors
        of a link that is down or congested are counted in `link_errors` and return None (see
        UadpSocketSource); only a socket that is itself broken raises TransportError.
        """
        flags = self.receive_flags(timeout_s)
        while True:
            try:
                nbytes, ancdata, _flags, _addr = self._sock.recvmsg_into([self._buffer], 256, flags)
                if self.after_wait is not None:
                    self.after_wait()
            except (TimeoutError, BlockingIOError):
                self._no_frame()
                return None
            except OSError as exc:
                self._socket_error(exc, timeout_s)
                self._no_frame()
                return None
            rx_ns, source = rx_stamp_from_cmsg(ancdata, self._hw_offset_ns)
            frame = self._frame(self._view[:nbytes], rx_ns, source)
            if frame is not None:
                return frame


class UdpPublisher:
    """Sends UADP messages to a UDP unicast or multicast address (the simulator's side).

    A send the link loses (ENETDOWN, ENETUNREACH, ENOBUFS, ...) is counted in `send_errors` and
    the publisher goes on, as a PLC does through a link flap. The multicast interface is set again
    after such an error: the kernel keeps it as a device index, which a re-created device changes.
    """

    def __init__(self, url: str, interface: str = "127.0.0.1", ttl: int = 1) -> None:
        host, port = parse_udp_url(url)
        self.url, self.interface = url, interface
        self.address = (host, port)
        self.send_errors = 0
        self.last_send_error: OSError | None = None
        self._multicast = ipaddress.IPv4Address(host).is_multicast
        self._next_reset = 0.0
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if self._multicast:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0xA0)  # DSCP CS5: real-time control traffic
        self._sock = sock

    def send(self, payload: bytes) -> bool:
        """Send one message; False if the link lost it (counted in `send_errors`)."""
        try:
            self._sock.sendto(payload, self.address)
            return True
        except OSError as exc:
            count_send_error(self, exc, f"{self.url}: sending from {self.interface}")
            now = time.monotonic()
            if self._multicast and now >= self._next_reset:  # twice a second at most
                self._next_reset = now + 0.5
                try:
                    self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(self.interface))
                except OSError:
                    pass  # the address is not back yet
            return False

    def close(self) -> None:
        self._sock.close()
