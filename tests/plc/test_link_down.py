"""A link that goes away under a running receiver, between two network namespaces (real kernel path).

The receiver must survive (no exception out of receive()), count what the socket reported, not
spin while the link is gone, and deliver frames again once the link is back: after a plain
down/up, and after the interface was deleted and re-created under a new index.
"""
import json
import subprocess
import sys
import time

from ..conftest import REPO

RECEIVER = """
import json, sys, time
from plc.uadp import FixedLayout
kind, url, where, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
if kind == "eth":
    from plc.eth import EthFrameSource
    src = EthFrameSource(url, where, FixedLayout(3), publisher_id=7)
else:
    from plc.udp import UdpFrameSource
    src = UdpFrameSource(url, FixedLayout(3), where, publisher_id=7)
print(json.dumps({"hw_stamps": src.hw_stamps.detail}), flush=True)
frames, cpu = [], []
end = time.monotonic() + seconds
next_sample = 0.0
while (now := time.monotonic()) < end:
    if now >= next_sample:
        cpu.append((now, time.process_time()))
        next_sample = now + 0.1
    f = src.receive(0.05)
    if f is not None:
        frames.append((time.monotonic(), f.sequence_number))
print(json.dumps({"frames": frames, "cpu": cpu, **src.link_status()}), flush=True)
"""

PUBLISHER = """
import json, sys, time
from plc.uadp import FixedLayout, UadpMessage
kind, url, where, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
if kind == "eth":
    from plc.eth import EthPublisher
    pub = EthPublisher(url, where)
else:
    from plc.udp import UdpPublisher
    pub = UdpPublisher(url, where)
layout = FixedLayout(3)
end, seq, sent = time.monotonic() + seconds, 0, 0
while time.monotonic() < end:
    seq += 1
    sent += pub.send(layout.encode(UadpMessage(7, 1, 1, seq & 0xFFFF, seq & 0xFFFF, time.time_ns(), (seq, 0.0, 1.0))))
    time.sleep(0.002)
print(json.dumps({"sent": sent, "tries": seq, "send_errors": pub.send_errors,
                  "last": str(pub.last_send_error)}), flush=True)
"""

ETH_URL = "opc.eth://01-00-5E-7F-00-01:100.5"
UDP_URL = "opc.udp://239.255.7.9:48409"
ADDR = {"a": "10.214.9.1", "b": "10.214.9.2"}


def _ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    assert r.returncode == 0, f"ip {' '.join(args)}: {r.stderr.strip()}"


def _addresses(veth_pair):
    ns_a, if_a, ns_b, if_b = veth_pair
    for ns, ifname, ip in ((ns_a, if_a, ADDR["a"]), (ns_b, if_b, ADDR["b"])):
        _ip("-n", ns, "addr", "add", f"{ip}/30", "dev", ifname)
        _ip("-n", ns, "route", "replace", "224.0.0.0/4", "dev", ifname)


def _run(veth_pair, kind: str, disturb) -> tuple[dict, dict, tuple[float, float]]:
    """Receiver in ns B and publisher in ns A for a few seconds; `disturb` breaks and mends the link
    in between and returns (broken_at, mended_at) on CLOCK_MONOTONIC, which namespaces share."""
    ns_a, if_a, ns_b, if_b = veth_pair
    url, rx_where, tx_where = (ETH_URL, if_b, if_a) if kind == "eth" else (UDP_URL, ADDR["b"], ADDR["a"])
    receiver = subprocess.Popen(["ip", "netns", "exec", ns_b, sys.executable, "-c", RECEIVER, kind, url, rx_where, "5"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    publisher = None
    try:
        head = receiver.stdout.readline()
        assert head, receiver.stderr.read()
        publisher = subprocess.Popen(["ip", "netns", "exec", ns_a, sys.executable, "-c", PUBLISHER, kind, url,
                                      tx_where, "4.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=REPO)
        time.sleep(1.0)
        window = disturb()
        pub_out, pub_err = publisher.communicate(timeout=30)
        out, err = receiver.communicate(timeout=30)
    finally:
        for proc in (receiver, publisher):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert publisher.returncode == 0, f"the publisher crashed: {pub_err}"
    assert receiver.returncode == 0, f"the receiver crashed: {err}"
    return json.loads(out.splitlines()[-1]), json.loads(pub_out.splitlines()[-1]), window


def _check_survived(rx: dict, window: tuple[float, float]) -> None:
    broken, mended = window
    before = [seq for t, seq in rx["frames"] if t < broken]
    after = [seq for t, seq in rx["frames"] if t > mended]
    assert len(before) > 50, rx
    assert len(after) > 50, f"no frames after the link came back: {rx['frames'][-5:]}, {rx['last_link_error']}"
    assert min(after) > max(before)
    # no busy loop while the link was gone: CPU time over the outage stays a small share of it
    samples = [(t, c) for t, c in rx["cpu"] if broken <= t <= mended]
    (t0, c0), (t1, c1) = samples[0], samples[-1]
    assert t1 - t0 > 0.5 and (c1 - c0) / (t1 - t0) < 0.35, f"receiver used {(c1 - c0) / (t1 - t0):.0%} CPU while down"


def _down_up(ns: str, ifname: str):
    def disturb():
        _ip("-n", ns, "link", "set", ifname, "down")
        broken = time.monotonic()
        time.sleep(1.2)
        mended = time.monotonic()
        _ip("-n", ns, "link", "set", ifname, "up")
        return broken, mended + 0.3  # carrier and multicast reports take a moment
    return disturb


def test_eth_receiver_survives_link_down_counts_it_and_resumes(veth_pair):
    ns_a, if_a, ns_b, if_b = veth_pair
    rx, pub, window = _run(veth_pair, "eth", _down_up(ns_b, if_b))
    _check_survived(rx, window)
    assert rx["link_errors"] >= 1 and "Network is down" in rx["last_link_error"], rx
    assert not rx["link_down"] and rx["link_recoveries"] == 0  # same index: the kernel re-attached the socket
    assert "hardware stamps unavailable on" in rx["hw_stamps"] and "using software stamps" in rx["hw_stamps"]
    assert pub["tries"] >= pub["sent"] > 0


def test_udp_receiver_survives_link_down_and_resumes(veth_pair):
    """A UDP socket gets no error when its link goes down; it must keep its group and resume."""
    ns_a, if_a, ns_b, if_b = veth_pair
    _addresses(veth_pair)

    def disturb():
        window = _down_up(ns_b, if_b)()
        _ip("-n", ns_b, "route", "replace", "224.0.0.0/4", "dev", if_b)  # down removed it (as on a real box)
        return window

    rx, pub, window = _run(veth_pair, "udp", disturb)
    _check_survived(rx, window)
    assert rx["hw_stamps"].startswith("hardware stamps unavailable on " + if_b), rx["hw_stamps"]


def _recreate(veth_pair):
    ns_a, if_a, ns_b, if_b = veth_pair

    def disturb():
        _ip("-n", ns_b, "link", "del", if_b)  # takes the peer in ns A with it
        broken = time.monotonic()
        time.sleep(1.0)
        _ip("link", "add", if_a, "netns", ns_a, "type", "veth", "peer", "name", if_b, "netns", ns_b)
        for ns, ifname in ((ns_a, if_a), (ns_b, if_b)):
            _ip("-n", ns, "link", "set", ifname, "up")
        mended = time.monotonic()
        return broken, mended + 1.2  # the receiver looks at a quiet link once a second
    return disturb


def test_eth_receiver_rebinds_to_a_recreated_interface(veth_pair):
    rx, pub, window = _run(veth_pair, "eth", _recreate(veth_pair))
    _check_survived(rx, window)
    assert rx["link_errors"] >= 1 and rx["link_recoveries"] == 1, rx
    assert pub["send_errors"] > 0, pub  # ENXIO while gone, ENETDOWN until up: counted, the publisher went on


def test_udp_receiver_rejoins_its_group_on_a_recreated_interface(veth_pair):
    ns_a, if_a, ns_b, if_b = veth_pair
    _addresses(veth_pair)
    recreate = _recreate(veth_pair)

    def disturb():
        broken, mended = recreate()
        _addresses(veth_pair)
        return broken, mended

    rx, pub, window = _run(veth_pair, "udp", disturb)
    _check_survived(rx, window)
    assert rx["link_recoveries"] == 1, rx  # the membership was lost with the old device and made again
    assert pub["send_errors"] > 0, pub  # the publisher's interface was gone for a second: counted, not raised
