"""UADP directly over Ethernet (EtherType 0xB62C, opc.eth://<MAC>[:<VID>.<PCP>]), as TSN networks carry it.

Receiving uses an ETH_P_ALL packet socket with PACKET_AUXDATA: a socket bound to 0xB62C gets the
frame but never sees the VLAN tag (the kernel moves it into skb metadata), and the PCP is what a
TSN stream's priority is. RX stamps come from SO_TIMESTAMPING as for UDP: the NIC's hardware
stamp when it has a PHC, the kernel's software stamp otherwise. At open the NIC is asked to stamp
all received frames (`plc.timestamps.enable_hardware_rx_stamps`; `hw_stamps` says what happened),
and hardware stamps are converted from the PHC's TAI to UTC. Sending writes the 802.1Q tag
itself and sets SO_PRIORITY to the PCP, so no VLAN device is needed. Needs CAP_NET_RAW.

The link may go away under a running source: a packet socket reports ENETDOWN once when its
interface goes down and picks frames up again by itself when it comes back up. An interface that
was deleted and re-created (a re-plugged USB NIC, a re-created veth) has a new index the socket
knows nothing of: `_relink` binds to it again and re-adds the multicast membership.
"""
from __future__ import annotations

import errno
import re
import socket
import struct
import time
from dataclasses import dataclass

from .errors import TransportError, UadpDecodeError
from .frame import Frame
from .socket_source import UadpSocketSource, count_send_error
from .uadp import ETHERNET_MIN_PAYLOAD, FixedLayout, RawDoubleLayout, unpadded_length
from .timestamps import (RX_TIMESTAMPING_FLAGS, SO_TIMESTAMPING, TAI_UTC_OFFSET_S, enable_hardware_rx_stamps,
                         phc_utc_offset_ns, rx_stamp_from_cmsg)

ETH_P_ALL = 0x0003
ETH_P_UADP = 0xB62C
ETH_P_8021Q = 0x8100
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_MULTICAST = 0
PACKET_AUXDATA = 8
PACKET_OUTGOING = 4
TP_STATUS_VLAN_VALID = 1 << 4
_AUXDATA = struct.Struct("<IIIHHHH")  # struct tpacket_auxdata
SO_TXTIME = 61  # also the cmsg type SCM_TXTIME
SOF_TXTIME_REPORT_ERRORS = 1 << 1
_LAUNCH_QDISCS = ("etf", "taprio")  # qdiscs that hold a frame until its CLOCK_TAI launch time


@dataclass(frozen=True)
class EthAddress:
    mac: bytes
    vid: int | None
    pcp: int | None

    @property
    def mac_text(self) -> str:
        return "-".join(f"{b:02X}" for b in self.mac)


def parse_eth_url(url: str) -> EthAddress:
    """`opc.eth://01-00-5E-7F-00-01:100.5` -> MAC, VID 100, PCP 5 (VID and PCP optional)."""
    m = re.fullmatch(r"opc\.eth://((?:[0-9A-Fa-f]{2}-){5}[0-9A-Fa-f]{2})(?::(\d+)(?:\.(\d+))?)?", url)
    if not m:
        raise TransportError(f"{url!r}: expected opc.eth://<MAC with hyphens>[:<VID>[.<PCP>]], "
                             "e.g. opc.eth://01-00-5E-7F-00-01:100.5")
    vid = int(m.group(2)) if m.group(2) else None
    pcp = int(m.group(3)) if m.group(3) else None
    if vid is not None and not 0 <= vid <= 4094:
        raise TransportError(f"{url!r}: VLAN id {vid} is outside 0..4094")
    if pcp is not None and not 0 <= pcp <= 7:
        raise TransportError(f"{url!r}: priority code point {pcp} is outside 0..7")
    return EthAddress(bytes.fromhex(m.group(1).replace("-", "")), vid, pcp)


def _interface_mac(sock: socket.socket) -> bytes:
    return sock.getsockname()[4][:6]


def _ifindex(interface: str) -> int:
    try:
        return socket.if_nametoindex(interface)
    except OSError:  # Python raises it without an errno
        raise OSError(errno.ENODEV, f"no interface {interface!r} (yet)") from None


class EthFrameSource(UadpSocketSource):
    """Reads UADP messages of one fixed layout from an interface, on the calling thread.

    `publisher_id`, `writer_group_id`, `writer_id`: as for `plc.udp.UdpFrameSource`.
    `hardware_stamps`: ask the NIC to stamp every received frame (SIOCSHWTSTAMP); refused or
    unsupported leaves software stamps, described in `hw_stamps.detail`. `phc_timescale` and
    `utc_offset_s`: the PHC's clock (tai under ptp4l, the default) and TAI - UTC, to turn a hardware
    stamp into the UTC the sender stamps with.
    """

    def __init__(self, url: str, interface: str, layout: FixedLayout | RawDoubleLayout,
                 publisher_id: int | str | None = None, writer_id: int | None = None, *,
                 writer_group_id: int | None = None, hardware_stamps: bool = True, phc_timescale: str = "tai",
                 utc_offset_s: int = TAI_UTC_OFFSET_S) -> None:
        self.address = parse_eth_url(url)
        self.interface = interface
        self._hw_offset_ns = phc_utc_offset_ns(phc_timescale, utc_offset_s)
        self._want_hw = hardware_stamps
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        except PermissionError as exc:
            raise TransportError(f"{url}: raw Ethernet needs CAP_NET_RAW (the unit grants it): {exc}") from exc
        try:
            sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, RX_TIMESTAMPING_FLAGS)
            self._ifindex, self._own_mac = self._attach(sock)
        except OSError as exc:
            sock.close()
            raise TransportError(f"{url}: cannot listen on interface {interface!r}: {exc}") from exc
        super().__init__(sock, layout, publisher_id, writer_id, buffer_size=9216, where=f"{url} on {interface}",
                         writer_group_id=writer_group_id)
        self.last_vid = -1
        self._wire_payload: memoryview | None = None  # the frame being decoded, when it may carry padding
        if hardware_stamps:
            self.hw_stamps = enable_hardware_rx_stamps(interface)

    def _attach(self, sock: socket.socket) -> tuple[int, bytes]:
        """Bind to the interface (by its current index) and ask it to accept our group address."""
        ifindex = _ifindex(self.interface)
        sock.bind((self.interface, ETH_P_ALL))
        if self.address.mac[0] & 1:  # a group address: ask the NIC to accept it
            mreq = struct.pack("iHH8s", ifindex, PACKET_MR_MULTICAST, 6, self.address.mac)
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        return ifindex, _interface_mac(sock)

    def _relink(self) -> bool:
        """The interface is back under a new index (deleted and re-created): bind to it again. A plain
        down/up keeps the index, and the kernel re-attaches the socket itself. A deleted device also
        unbinds the socket (its name reads empty), so an index the kernel happened to reuse is caught too."""
        if _ifindex(self.interface) == self._ifindex and self._sock.getsockname()[0] == self.interface:
            return False
        self._ifindex, self._own_mac = self._attach(self._sock)
        if self._want_hw:  # a new device starts with hardware stamping off
            self.hw_stamps = enable_hardware_rx_stamps(self.interface)
        return True

    def receive(self, timeout_s: float) -> Frame | None:
        """Next frame, or None after `timeout_s` without one. `Frame.values` is reused by the next call.

        Other traffic is skipped; malformed messages and other publishers' are counted; socket errors
        of a link that is down or congested are counted in `link_errors` and return None (see
        UadpSocketSource); only a socket that is itself broken raises TransportError.
        """
        flags = self.receive_flags(timeout_s)
        dst_want = self.address.mac
        while True:
            try:
                nbytes, ancdata, _flags, addr = self._sock.recvmsg_into([self._buffer], 512, flags)
                if self.after_wait is not None:
                    self.after_wait()
            except (TimeoutError, BlockingIOError):
                self._no_frame()
                return None
            except OSError as exc:  # link down, no buffers: counted, backed off; a broken socket raises
                self._socket_error(exc, timeout_s)
                self._no_frame()
                return None
            if addr[2] == PACKET_OUTGOING or nbytes < 14:
                continue
            buf = self._view
            if buf[0:6] != dst_want and buf[0:6] != self._own_mac:
                continue
            ethertype = (buf[12] << 8) | buf[13]
            start = 14
            tci = -1
            if ethertype == ETH_P_8021Q and nbytes >= 18:  # tag left in the frame (no offload)
                tci = (buf[14] << 8) | buf[15]
                ethertype = (buf[16] << 8) | buf[17]
                start = 18
            if ethertype != ETH_P_UADP:
                continue
            rx_ns, source = rx_stamp_from_cmsg(ancdata, self._hw_offset_ns)
            for level, kind, data in ancdata:
                if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= _AUXDATA.size:
                    status, _, _, _, _, vlan_tci, _ = _AUXDATA.unpack_from(data)
                    if status & TP_STATUS_VLAN_VALID:
                        tci = vlan_tci
            payload = buf[start:nbytes]
            # Ethernet padding. A payload of at most 46 bytes may be padded (the frame was the 60-byte minimum,
            # or 56 seen here when the kernel took its 802.1Q tag out): its true length is not on the wire.
            # The fast path knows its layout's size and reads just that; a message it refuses is measured by
            # `_fallback` from its own structure. Longer payloads are never padded and stay exact.
            self._wire_payload = payload if len(payload) <= ETHERNET_MIN_PAYLOAD else None
            if self._wire_payload is not None and len(payload) > self.layout.size:
                payload = payload[:self.layout.size]
            frame = self._frame(payload, rx_ns, source, tci >> 13 if tci >= 0 else -1)
            if frame is not None:
                self.last_vid = tci & 0x0FFF if tci >= 0 else -1
                return frame

    def _fallback(self, payload, refused: UadpDecodeError, rx_ns: int, source, vlan_pcp: int) -> Frame | None:
        """A message the fast path refused. From a minimum-size frame, the general decoder gets the message
        without its padding, wherever the message really ends (not the layout's size): `unpadded_length`
        finds the end from the Sizes array, or where the single DataSetMessage's fields end, and accepts
        only zero bytes after it. Such a frame is decoded twice (measured, then read), which a message of
        at most 46 bytes affords. A payload that does not parse even so goes on whole, and the base class
        counts it as foreign or malformed as usual."""
        wire = self._wire_payload
        if wire is not None:
            try:
                payload = wire[:unpadded_length(wire, self._raw_types)]
            except UadpDecodeError:
                payload = wire
        return super()._fallback(payload, refused, rx_ns, source, vlan_pcp)


def qdisc_kinds(interface: str) -> list[str]:
    """The queueing disciplines on an interface, from `tc -j qdisc show` (empty if tc is missing)."""
    import json
    import subprocess

    try:
        r = subprocess.run(["tc", "-j", "qdisc", "show", "dev", interface], capture_output=True, text=True, timeout=5)
        return [q.get("kind", "") for q in json.loads(r.stdout or "[]")]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def enable_launch_time(sock: socket.socket, interface: str) -> tuple[bool, str]:
    """Ask for SO_TXTIME (CLOCK_TAI) and say whether launch times will really be honoured, and if not why."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TXTIME, struct.pack("iI", time.CLOCK_TAI, SOF_TXTIME_REPORT_ERRORS))
    except OSError as exc:
        return False, f"the kernel refuses SO_TXTIME ({exc.strerror}): frames leave when they are sent"
    kinds = qdisc_kinds(interface)
    if any(k in _LAUNCH_QDISCS for k in kinds):
        return True, f"SO_TXTIME with {'/'.join(kinds)} on {interface}: launch times are honoured"
    return False, (f"SO_TXTIME accepted, but {interface} has no etf/taprio qdisc ({'/'.join(kinds) or 'none'}): "
                   f"launch times would be ignored, frames leave when sent; add one with `tc qdisc replace dev "
                   f"{interface} root etf clockid CLOCK_TAI delta 150000`")


class EthPublisher:
    """Sends UADP payloads as Ethernet frames with an optional 802.1Q tag (the simulator's side).

    With `launch_offset_ns`, each frame carries an SO_TXTIME launch time (CLOCK_TAI now + offset)
    when the interface can honour it; `launch_time_status` says what was detected.
    """

    def __init__(self, url: str, interface: str, launch_offset_ns: int | None = None) -> None:
        self.address = parse_eth_url(url)
        self.url, self.interface = url, interface
        self.send_errors = 0  # frames lost to a link that was down or congested (counted, not raised)
        self.last_send_error: OSError | None = None
        self._next_rebind = 0.0
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_UADP))
            sock.bind((interface, 0))
        except OSError as exc:
            raise TransportError(f"{url}: cannot send on interface {interface!r}: {exc}") from exc
        if self.address.pcp is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, self.address.pcp)
        self._sock = sock
        self._header = self._frame_header()
        self.launch_time = False
        self.launch_time_status = "not requested"
        self._launch_offset_ns = launch_offset_ns
        if launch_offset_ns is not None:
            self.launch_time, self.launch_time_status = enable_launch_time(sock, interface)

    def _frame_header(self) -> bytes:
        a = self.address
        header = a.mac + _interface_mac(self._sock)
        if a.vid is not None or a.pcp is not None:
            header += struct.pack("!HH", ETH_P_8021Q, ((a.pcp or 0) << 13) | (a.vid or 0))
        return header + struct.pack("!H", ETH_P_UADP)

    def send(self, payload: bytes) -> bool:
        """Send one frame; False if the link lost it (down: ENETDOWN, congested: ENOBUFS, gone: ENXIO),
        which is counted in `send_errors`, as a PLC keeps publishing through a link flap."""
        frame = self._header + payload
        if len(frame) < 60:
            frame += bytes(60 - len(frame))
        try:
            if self.launch_time:
                launch = time.clock_gettime_ns(time.CLOCK_TAI) + self._launch_offset_ns
                self._sock.sendmsg([frame], [(socket.SOL_SOCKET, SO_TXTIME, struct.pack("Q", launch))])
            else:
                self._sock.send(frame)
            return True
        except OSError as exc:
            count_send_error(self, exc, f"{self.url}: sending on {self.interface}")
            if exc.errno in (errno.ENXIO, errno.ENODEV):
                self._rebind()
            return False

    def _rebind(self) -> None:
        """ENXIO: the interface was deleted; once one of that name exists again, bind to it (twice a second
        at most, the publisher's tick must not wait on it)."""
        now = time.monotonic()
        if now < self._next_rebind:
            return
        self._next_rebind = now + 0.5
        try:
            self._sock.bind((self.interface, 0))
        except OSError:
            return  # not back yet
        self._header = self._frame_header()  # a new device, maybe a new source MAC

    def close(self) -> None:
        self._sock.close()
