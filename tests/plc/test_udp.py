import socket
import struct
import time

import pytest

from plc.errors import TransportError
from plc.frame import RxStampSource
from plc.uadp import FixedLayout, UadpMessage
from plc.timestamps import SO_TIMESTAMPING, rx_stamp_from_cmsg
from plc.udp import parse_udp_url

from ..conftest import udp_loopback


def test_multicast_loopback_frames_carry_kernel_rx_stamps():
    layout = FixedLayout(3)
    source, pub = udp_loopback(layout, publisher_id=7, writer_id=1)
    try:
        sent = []
        for seq in range(1, 6):
            t = time.time_ns()
            sent.append(t)
            pub.send(layout.encode(UadpMessage(7, 1, 1, seq, seq, t, (seq, 2.0 * seq, -1.0))))
        sources = []
        for seq in range(1, 6):
            frame = source.receive(2.0)
            assert frame is not None
            assert frame.sequence_number == seq
            assert frame.values.tolist() == [seq, 2.0 * seq, -1.0]
            # the kernel turns RX stamping on from a workqueue: the very first packets after the
            # setsockopt may still arrive unstamped and fall back to the user-space clock
            assert frame.rx_stamp_source in (RxStampSource.SOFTWARE, RxStampSource.USER)
            sources.append(frame.rx_stamp_source)
            # RX stamp is after the send stamp (100 ns resolution on the wire) and within a second
            assert sent[seq - 1] // 100 * 100 <= frame.rx_timestamp_ns < sent[seq - 1] + 1_000_000_000
        time.sleep(0.05)
        t = time.time_ns()
        pub.send(layout.encode(UadpMessage(7, 1, 1, 6, 6, t, (6.0, 12.0, -1.0))))
        assert source.receive(2.0).rx_stamp_source == RxStampSource.SOFTWARE  # stamping is on by now
    finally:
        source.close()
        pub.close()


def test_malformed_and_foreign_messages_are_counted_and_skipped():
    layout = FixedLayout(2)
    source, pub = udp_loopback(layout, publisher_id=7, writer_id=1)
    try:
        pub.send(b"\x00garbage")
        pub.send(layout.encode(UadpMessage(8, 1, 1, 1, 1, time.time_ns(), (0.0, 0.0))))  # other publisher
        pub.send(layout.encode(UadpMessage(7, 1, 1, 9, 9, time.time_ns(), (1.0, 1.0))))
        frame = source.receive(2.0)
        assert frame is not None and frame.sequence_number == 9
        assert source.malformed == 1 and source.foreign == 1
        assert "UADP decode error at byte" in str(source.last_error)
        assert source.receive(0.05) is None
    finally:
        source.close()
        pub.close()


def test_hardware_stamp_is_preferred_over_software():
    """NICs with a PHC fill ts[2]; this VM has none, so the cmsg bytes are synthetic."""
    sw = (1_700_000_000, 5)
    hw = (1_700_000_000, 7)
    data = struct.pack("<qqqqqq", *sw, 0, 0, *hw)
    assert rx_stamp_from_cmsg([(socket.SOL_SOCKET, SO_TIMESTAMPING, data)]) == (
        1_700_000_000_000_000_007, RxStampSource.HARDWARE)
    data = struct.pack("<qqqqqq", *sw, 0, 0, 0, 0)
    assert rx_stamp_from_cmsg([(socket.SOL_SOCKET, SO_TIMESTAMPING, data)]) == (
        1_700_000_000_000_000_005, RxStampSource.SOFTWARE)
    before = time.time_ns()
    stamp, source = rx_stamp_from_cmsg([])
    assert source == RxStampSource.USER and stamp >= before


@pytest.mark.parametrize("url,message", [
    ("udp://239.0.0.1:4840", "needs an opc.udp:// URL"),
    ("opc.udp://plc.local:4840", "IPv4 address"),
    ("opc.udp://239.0.0.1:99999", "port"),
    ("opc.udp://:4840", "no host"),
])
def test_bad_urls_say_what_is_wrong(url, message):
    with pytest.raises(TransportError, match=message):
        parse_udp_url(url)


def test_discard_pending_drops_the_startup_backlog():
    layout = FixedLayout(1)
    source, pub = udp_loopback(layout)
    try:
        for seq in range(3):
            pub.send(layout.encode(UadpMessage(7, 1, 1, seq, seq, time.time_ns(), (0.0,))))
        time.sleep(0.1)
        assert source.discard_pending() == 3
        assert source.receive(0.05) is None
    finally:
        source.close()
        pub.close()


def test_a_receive_is_one_blocking_call_with_the_kernels_timeout():
    """The socket stays blocking (no Python timeout: that polls, then receives, releasing the GIL twice);
    the kernel's SO_RCVTIMEO ends a wait without a frame, and a timeout of 0 is a non-blocking receive."""
    layout = FixedLayout(2)
    source, pub = udp_loopback(layout, publisher_id=7, writer_id=1)
    try:
        sock = source._sock
        assert sock.gettimeout() is None
        t0 = time.monotonic()
        assert source.receive(0.03) is None and source.link_errors == 0
        assert time.monotonic() - t0 >= 0.029  # it waited (rounded up to the kernel's tick, never down)
        sec, usec = struct.unpack("qq", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
        assert (sec, usec) != (0, 0) and 30_000 <= sec * 1_000_000 + usec <= 40_000
        assert source.receive(0) is None  # nothing queued: returns at once, counts nothing
        assert source.receive(-1.0) is None and source.link_errors == 0
        pub.send(layout.encode(UadpMessage(7, 1, 1, 4, 4, time.time_ns(), (1.0, 2.0))))
        deadline = time.monotonic() + 2.0
        frame = None
        while frame is None and time.monotonic() < deadline:
            frame = source.receive(0)  # non-blocking receives until the datagram is there
        assert frame is not None and frame.sequence_number == 4
        pub.send(layout.encode(UadpMessage(7, 1, 1, 5, 5, time.time_ns(), (1.0, 2.0))))
        frame = source.receive(1.5)  # a new timeout: set once, then reused
        assert frame is not None and frame.sequence_number == 5
        sec, usec = struct.unpack("qq", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
        assert sec * 1_000_000 + usec >= 1_500_000
    finally:
        source.close()
        pub.close()
