"""RX stamps: the PHC's TAI turned into UTC, the NIC asked to stamp (SIOC[GS]HWTSTAMP), and socket
errors of a failing link counted instead of raised. This VM has no PHC: cmsg bytes and ioctl
answers are synthetic where real hardware would be needed; veth and lo refuse for real."""
import errno
import json
import socket
import struct
import subprocess
import sys
import time

import pytest

from plc import timestamps
from plc.errors import TransportError
from plc.frame import RxStampSource
from plc.timestamps import (HWTSTAMP_FILTER_ALL, HWTSTAMP_FILTER_NONE, SIOCGHWTSTAMP, SIOCSHWTSTAMP, SO_TIMESTAMPING,
                            enable_hardware_rx_stamps, phc_utc_offset_ns, rx_stamp_from_cmsg)
from plc.uadp import FixedLayout, UadpMessage
from plc.udp import UdpFrameSource, UdpPublisher

from ..conftest import REPO, multicast_group_url

UTC_NS = 1_700_000_000_123_456_789  # the true arrival time, in UTC
TAI_NS = UTC_NS + 37_000_000_000  # what a PHC steered by ptp4l reads at that moment


def _cmsg(sw_ns: int = 0, hw_ns: int = 0) -> list[tuple[int, int, bytes]]:
    sw, hw = divmod(sw_ns, 1_000_000_000), divmod(hw_ns, 1_000_000_000)
    return [(socket.SOL_SOCKET, SO_TIMESTAMPING, struct.pack("<qqqqqq", *sw, 0, 0, *hw))]


def test_hardware_stamp_in_tai_becomes_utc_and_software_stamp_is_untouched():
    tai = phc_utc_offset_ns("tai", 37)
    assert rx_stamp_from_cmsg(_cmsg(sw_ns=UTC_NS + 20_000, hw_ns=TAI_NS), tai) == (UTC_NS, RxStampSource.HARDWARE)
    assert rx_stamp_from_cmsg(_cmsg(sw_ns=UTC_NS), tai) == (UTC_NS, RxStampSource.SOFTWARE)
    # a PHC kept in UTC: nothing to subtract
    assert rx_stamp_from_cmsg(_cmsg(hw_ns=UTC_NS), phc_utc_offset_ns("utc")) == (UTC_NS, RxStampSource.HARDWARE)
    assert phc_utc_offset_ns() == 37_000_000_000  # the default: ptp4l's PTP timescale


@pytest.mark.parametrize("timescale,offset,message", [("gps", 37, "use tai"), ("tai", -1, "TAI - UTC is 37 s"),
                                                      ("tai", 3600, "currentUtcOffset")])
def test_bad_timescale_settings_say_what_to_use(timescale, offset, message):
    with pytest.raises(TransportError, match=message):
        phc_utc_offset_ns(timescale, offset)


class _FakeSocket:
    """Stands in for the source's socket: hands out one datagram with the given ancillary data, or
    raises the given error on every call."""

    def __init__(self, payload: bytes = b"", ancdata=(), error: OSError | None = None) -> None:
        self.payload, self.ancdata, self.error, self.calls = payload, list(ancdata), error, 0

    def setsockopt(self, *_args):  # SO_RCVTIMEO
        pass

    def recvmsg_into(self, buffers, _ancbufsize, _flags=0):
        self.calls += 1
        if self.error is not None:
            raise self.error
        if self.payload is None:
            raise TimeoutError
        buffers[0][:len(self.payload)] = self.payload
        n, self.payload = len(self.payload), None
        return n, self.ancdata, 0, ("10.0.0.1", 4840)

    def close(self):
        pass


def _source(**kwargs) -> UdpFrameSource:
    return UdpFrameSource(multicast_group_url(), FixedLayout(2), "127.0.0.1", publisher_id=7, **kwargs)


@pytest.mark.parametrize("timescale,ancdata,expect", [
    ("tai", _cmsg(sw_ns=UTC_NS + 5_000, hw_ns=TAI_NS), (UTC_NS, RxStampSource.HARDWARE)),
    ("utc", _cmsg(hw_ns=UTC_NS), (UTC_NS, RxStampSource.HARDWARE)),
    ("tai", _cmsg(sw_ns=UTC_NS), (UTC_NS, RxStampSource.SOFTWARE)),
])
def test_the_frame_carries_utc_whatever_stamped_it(timescale, ancdata, expect):
    source = _source(phc_timescale=timescale)
    try:
        payload = FixedLayout(2).encode(UadpMessage(7, 1, 1, 3, 3, UTC_NS - 50_000, (1.0, 2.0)))
        source._sock.close()
        source._sock = _FakeSocket(payload, ancdata)
        frame = source.receive(0.1)
        assert (frame.rx_timestamp_ns, frame.rx_stamp_source) == expect
        assert 50_000 <= frame.rx_timestamp_ns - frame.sender_timestamp_ns < 50_100  # transit (100 ns ticks), not 37 s
    finally:
        source.close()


def test_lo_refuses_hardware_stamps_and_that_is_reported_not_raised():
    setup = enable_hardware_rx_stamps("lo")
    assert (setup.hardware, setup.action) == (False, "unavailable")
    assert setup.detail.startswith("hardware stamps unavailable on lo: ")
    assert setup.detail.endswith(", using software stamps")
    source = _source()  # 127.0.0.1 is lo's: the source asked, and says so
    try:
        assert source.hw_stamps.detail == setup.detail
    finally:
        source.close()
    wildcard = UdpFrameSource(multicast_group_url(), FixedLayout(2), "0.0.0.0")
    try:
        assert wildcard.hw_stamps.action == "not attempted" and "set transport.interface" in wildcard.hw_stamps.detail
    finally:
        wildcard.close()


def test_veth_refuses_hardware_stamps_cleanly(veth_pair):
    """SIOCGHWTSTAMP and SIOCSHWTSTAMP on a real veth (EOPNOTSUPP): a sentence, not an exception."""
    _, _, ns_b, if_b = veth_pair
    code = ("import dataclasses, json, sys\nfrom plc.timestamps import enable_hardware_rx_stamps\n"
            "print(json.dumps(dataclasses.asdict(enable_hardware_rx_stamps(sys.argv[1]))))")
    r = subprocess.run(["ip", "netns", "exec", ns_b, sys.executable, "-c", code, if_b], capture_output=True,
                       text=True, cwd=REPO, timeout=30)
    assert r.returncode == 0, r.stderr
    setup = json.loads(r.stdout)
    assert (setup["hardware"], setup["action"]) == (False, "unavailable")
    assert setup["detail"] == (f"hardware stamps unavailable on {if_b}: the driver has no hardware timestamping "
                               "(SIOCSHWTSTAMP: Operation not supported), using software stamps")


class _FakeNic:
    """Answers SIOC[GS]HWTSTAMP as a NIC driver would; records what was asked."""

    def __init__(self, rx_filter: int, tx_type: int = 1, grants: int = HWTSTAMP_FILTER_ALL, set_error: int = 0):
        self.config, self.grants, self.set_error, self.sets = (0, tx_type, rx_filter), grants, set_error, []

    def __call__(self, _sock, _interface, request, config):
        if request == SIOCGHWTSTAMP:
            return self.config
        assert request == SIOCSHWTSTAMP
        self.sets.append(config)
        if self.set_error:
            raise OSError(self.set_error, "refused")
        self.config = (config[0], config[1], self.grants)
        return self.config


def test_hardware_stamping_is_turned_on_when_off_and_tx_stamping_is_left_alone(monkeypatch):
    nic = _FakeNic(HWTSTAMP_FILTER_NONE, tx_type=1)  # ptp4l turned TX stamps on; RX off
    monkeypatch.setattr(timestamps, "_hwtstamp_ioctl", nic)
    setup = enable_hardware_rx_stamps("eth1")
    assert (setup.hardware, setup.action, setup.rx_filter_before, setup.rx_filter_after) == (True, "enabled", 0, 1)
    assert nic.sets == [(0, 1, HWTSTAMP_FILTER_ALL)]
    assert setup.detail == "hardware RX stamps on eth1: enabled (rx_filter none -> all)"


def test_hardware_stamping_already_on_is_left_as_it_is(monkeypatch):
    nic = _FakeNic(HWTSTAMP_FILTER_ALL)
    monkeypatch.setattr(timestamps, "_hwtstamp_ioctl", nic)
    setup = enable_hardware_rx_stamps("eth1")
    assert (setup.hardware, setup.action, nic.sets) == (True, "already on", [])


def test_a_ptp_only_driver_and_a_missing_capability_are_explained(monkeypatch):
    monkeypatch.setattr(timestamps, "_hwtstamp_ioctl", _FakeNic(12, grants=12))  # ptp4l's PTP_V2_EVENT, kept
    setup = enable_hardware_rx_stamps("eth1")
    assert (setup.hardware, setup.action) == (False, "ptp only")
    assert "stamps only rx_filter ptp-v2-event in hardware" in setup.detail
    monkeypatch.setattr(timestamps, "_hwtstamp_ioctl", _FakeNic(HWTSTAMP_FILTER_NONE, set_error=errno.EPERM))
    setup = enable_hardware_rx_stamps("eth1")
    assert setup.action == "unavailable" and "CAP_NET_ADMIN" in setup.detail and "hwts_filter full" in setup.detail


def test_transient_socket_errors_are_counted_backed_off_and_never_spin():
    source = _source()
    try:
        source._sock.close()
        source._sock = fake = _FakeSocket(error=OSError(errno.ENOBUFS, "No buffer space available"))
        start, cpu = time.monotonic(), time.process_time()
        returned = [source.receive(0.05) for _ in range(12)]
        wall = time.monotonic() - start
        assert returned == [None] * 12
        assert source.link_errors == fake.calls == 12 and source.link_down
        assert "No buffer space" in str(source.last_link_error)
        assert wall >= 0.3  # 10 ms, 20 ms, 40 ms, then the caller's 50 ms timeout each time
        assert time.process_time() - cpu < 0.5 * wall  # slept, not spun
        assert source.link_status()["link_errors"] == 12
        fake.error = None  # the link is back: the next frame clears the state
        fake.payload = FixedLayout(2).encode(UadpMessage(7, 1, 1, 4, 4, time.time_ns(), (1.0, 2.0)))
        assert source.receive(0.05).sequence_number == 4 and not source.link_down
    finally:
        source.close()


def test_a_broken_socket_still_raises_and_says_so():
    source = _source()
    try:
        source._sock.close()
        source._sock = _FakeSocket(error=OSError(errno.EBADF, "Bad file descriptor"))
        with pytest.raises(TransportError, match="receiving failed: .*Bad file descriptor.*not a link problem"):
            source.receive(0.05)
    finally:
        source.close()


def test_publisher_counts_sends_the_link_lost_and_goes_on():
    pub = UdpPublisher(multicast_group_url(), "127.0.0.1")

    class _Failing:
        def __init__(self, err):
            self.err = err

        def sendto(self, *_):
            raise OSError(self.err, errno.errorcode[self.err])

        def setsockopt(self, *_):
            pass

        def close(self):
            pass

    real = pub._sock
    try:
        pub._sock = _Failing(errno.ENETDOWN)
        assert pub.send(b"x") is False and pub.send(b"x") is False
        assert pub.send_errors == 2 and pub.last_send_error.errno == errno.ENETDOWN
        pub._sock = _Failing(errno.EBADF)
        with pytest.raises(TransportError, match="sending from 127.0.0.1 failed"):
            pub.send(b"x")
        pub._sock = real
        assert pub.send(b"x") is True
    finally:
        real.close()
