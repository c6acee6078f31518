"""UADP over raw Ethernet between two network namespaces joined by a veth pair (real kernel path)."""
import json
import subprocess
import sys

import pytest

from plc.errors import TransportError
from plc.eth import EthAddress, parse_eth_url

from ..conftest import REPO

RECEIVER = """
import json, sys
from plc.eth import EthFrameSource
from plc.uadp import FixedLayout
src = EthFrameSource(sys.argv[1], sys.argv[2], FixedLayout(3), publisher_id=7)
print("ready", flush=True)
out = []
while len(out) < int(sys.argv[3]):
    f = src.receive(5.0)
    if f is None:
        break
    out.append({"seq": f.sequence_number, "values": f.values.tolist(), "pcp": f.vlan_pcp, "vid": src.last_vid,
                "source": f.rx_stamp_source.name, "sent": f.sender_timestamp_ns, "rx": f.rx_timestamp_ns})
print(json.dumps({"frames": out, "malformed": src.malformed, "foreign": src.foreign}), flush=True)
"""

PUBLISHER = """
import sys, time
from plc.eth import EthPublisher
from plc.uadp import FixedLayout, UadpMessage
pub = EthPublisher(sys.argv[1], sys.argv[2])
layout = FixedLayout(3)
pub.send(b"not uadp at all")
pub.send(layout.encode(UadpMessage(8, 1, 1, 99, 99, time.time_ns(), (0.0, 0.0, 0.0))))  # another publisher
for seq in range(1, int(sys.argv[3]) + 1):
    pub.send(layout.encode(UadpMessage(7, 1, 1, seq, seq, time.time_ns(), (seq, -1.5, 2.0 * seq))))
    time.sleep(0.002)
"""


def _run_pair(veth_pair, receiver: str, receiver_args: list[str], publisher: str,
              publisher_args: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    """Start `receiver` (Python source) in the second namespace, wait for its "ready" line, run `publisher` in
    the first, and return the publisher's result and the receiver's stdout (both must exit 0)."""
    ns_a, _, ns_b, _ = veth_pair
    rx = subprocess.Popen(["ip", "netns", "exec", ns_b, sys.executable, "-c", receiver, *receiver_args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert rx.stdout.readline().strip() == "ready", rx.stderr.read()
        pub = subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-c", publisher, *publisher_args],
                             capture_output=True, text=True, cwd=REPO, timeout=60)
        assert pub.returncode == 0, pub.stderr
        out, err = rx.communicate(timeout=30)
    finally:
        if rx.poll() is None:
            rx.kill()
    assert rx.returncode == 0, err
    return pub, out


def _exchange(veth_pair, url: str, count: int) -> dict:
    _, if_a, _, if_b = veth_pair
    _, out = _run_pair(veth_pair, RECEIVER, [url, if_b, str(count)], PUBLISHER, [url, if_a, str(count)])
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("url,pcp,vid", [
    ("opc.eth://01-00-5E-7F-00-01:100.5", 5, 100),  # multicast group, VLAN 100, priority 5
    ("opc.eth://01-00-5E-7F-00-01:0.3", 3, 0),  # priority-tagged only
    ("opc.eth://01-00-5E-7F-00-01", -1, -1),  # untagged
])
def test_frames_cross_namespaces_with_vlan_priority_and_kernel_stamps(veth_pair, url, pcp, vid):
    result = _exchange(veth_pair, url, 20)
    frames = result["frames"]
    assert [f["seq"] for f in frames] == list(range(1, 21))
    assert frames[4]["values"] == [5.0, -1.5, 10.0]
    assert {f["pcp"] for f in frames} == {pcp}
    assert {f["vid"] for f in frames} == {vid}
    # veth has no PHC: the kernel's software stamp (the first frame may precede the kernel enabling it)
    assert {f["source"] for f in frames[1:]} == {"SOFTWARE"}
    assert all(0 <= f["rx"] - f["sent"] < 1_000_000_000 for f in frames)
    assert result["foreign"] == 1  # the other publisher's frame was skipped, not decoded into ours
    assert result["malformed"] == 1  # the non-UADP payload was counted, not raised


def test_parse_eth_url():
    assert parse_eth_url("opc.eth://01-00-5E-7F-00-01:8.3") == EthAddress(bytes.fromhex("01005E7F0001"), 8, 3)
    assert parse_eth_url("opc.eth://02-00-00-00-00-0A") == EthAddress(bytes.fromhex("02000000000A"), None, None)
    for bad, msg in (("opc.eth://01:00:5E:7F:00:01", "hyphens"), ("opc.eth://01-00-5E-7F-00-01:5000", "VLAN id"),
                     ("opc.eth://01-00-5E-7F-00-01:1.9", "priority code point")):
        with pytest.raises(TransportError, match=msg):
            parse_eth_url(bad)


LAUNCH = """
import sys, time
from plc.eth import EthPublisher
from plc.uadp import FixedLayout, UadpMessage
pub = EthPublisher(sys.argv[1], sys.argv[2], launch_offset_ns=500_000)
print(pub.launch_time, pub.launch_time_status, flush=True)
layout = FixedLayout(3)
for seq in range(1, 6):
    pub.send(layout.encode(UadpMessage(7, 1, 1, seq, seq, time.time_ns(), (1.0, 2.0, 3.0))))
    time.sleep(0.002)
"""


def test_launch_time_is_detected_and_reported_and_frames_still_flow(veth_pair):
    """veth has no etf qdisc (and this kernel has none): SO_TXTIME must be reported as not honoured."""
    _, if_a, _, if_b = veth_pair
    url = "opc.eth://01-00-5E-7F-00-01:100.5"
    pub, out = _run_pair(veth_pair, RECEIVER, [url, if_b, "5"], LAUNCH, [url, if_a])
    honoured, status = pub.stdout.split(" ", 1)
    if honoured == "True":
        assert "launch times are honoured" in status
    else:
        assert "refuses SO_TXTIME" in status or "no etf/taprio qdisc" in status
    assert len(json.loads(out.splitlines()[-1])["frames"]) == 5


UDP_RECEIVER = """
import json, sys
from plc.udp import UdpFrameSource
from plc.uadp import FixedLayout
src = UdpFrameSource(sys.argv[1], FixedLayout(3), sys.argv[2], publisher_id=7)
print("ready", flush=True)
out = []
while len(out) < int(sys.argv[3]):
    f = src.receive(5.0)
    if f is None:
        break
    out.append({"seq": f.sequence_number, "values": f.values.tolist(), "source": f.rx_stamp_source.name,
                "sent": f.sender_timestamp_ns, "rx": f.rx_timestamp_ns})
print(json.dumps({"frames": out}), flush=True)
"""

UDP_PUBLISHER = """
import sys, time
from plc.udp import UdpPublisher
from plc.uadp import FixedLayout, UadpMessage
pub = UdpPublisher(sys.argv[1], sys.argv[2])
layout = FixedLayout(3)
for seq in range(1, int(sys.argv[3]) + 1):
    pub.send(layout.encode(UadpMessage(7, 1, 1, seq, seq, time.time_ns(), (seq, 0.5, -seq))))
    time.sleep(0.002)
"""


def test_udp_multicast_between_namespaces(veth_pair):
    ns_a, if_a, ns_b, if_b = veth_pair
    for ns, ifname, ip in ((ns_a, if_a, "10.214.7.1"), (ns_b, if_b, "10.214.7.2")):
        for args in (["addr", "add", f"{ip}/30", "dev", ifname], ["route", "add", "224.0.0.0/4", "dev", ifname]):
            subprocess.run(["ip", "-n", ns, *args], check=True)
    url = "opc.udp://239.255.7.7:48407"
    _, out = _run_pair(veth_pair, UDP_RECEIVER, [url, "10.214.7.2", "20"], UDP_PUBLISHER, [url, "10.214.7.1", "20"])
    frames = json.loads(out.splitlines()[-1])["frames"]
    assert [f["seq"] for f in frames] == list(range(1, 21))
    assert frames[9]["values"] == [10.0, 0.5, -10.0]
    assert {f["source"] for f in frames[1:]} == {"SOFTWARE"}
    assert all(0 <= f["rx"] - f["sent"] < 1_000_000_000 for f in frames)


LAYOUT_RECEIVER = """
import json, sys
from plc.eth import EthFrameSource
from plc.uadp import compile_layout
pid = 2**40 + 3
src = EthFrameSource(sys.argv[1], sys.argv[2], compile_layout(3, "variant", "uint64", pid), publisher_id=pid,
                     writer_id=1, writer_group_id=1)
print("ready", flush=True)
out = []
while len(out) < 3:
    f = src.receive(5.0)
    if f is None:
        break
    out.append({"seq": f.sequence_number, "values": f.values.tolist(), "pid": f.publisher_id})
print(json.dumps({"frames": out, **src.decode_status()}), flush=True)
"""

LAYOUT_PUBLISHER = """
import sys, time
from asyncua import ua
from plc.eth import EthPublisher
from plc.uadp import DataSetMessage, FieldEncoding, NetworkMessage, PublisherIdType, UadpMessage, compile_layout, encode
from plc.uadp.fixed import datetime_ticks_from_ns
pid = 2**40 + 3
pub = EthPublisher(sys.argv[1], sys.argv[2])
layout = compile_layout(3, "variant", "uint64", pid)
pub.send(layout.encode(UadpMessage(pid, 2, 1, 1, 1, time.time_ns(), (0.0, 0.0, 0.0))))  # writer group 2
pub.send(layout.encode(UadpMessage(pid, 1, 1, 2, 2, time.time_ns(), (2.0, 2.5, 3.0))))
ticks = datetime_ticks_from_ns(time.time_ns())
fields = tuple(ua.DataValue(ua.Variant(v, ua.VariantType.Double)) for v in (3.0, 3.5, 4.0))
pub.send(encode(NetworkMessage((DataSetMessage(fields, field_encoding=FieldEncoding.DATA_VALUE, sequence_number=3,
                                               timestamp=ticks),), publisher_id=pid,
                               publisher_id_type=PublisherIdType.UINT64, writer_group_id=1, sequence_number=3,
                               dataset_writer_ids=(1,), timestamp=ticks)))
pub.send(layout.encode(UadpMessage(pid, 1, 1, 4, 4, time.time_ns(), (4.0, 4.5, 5.0))))
"""


def test_uint64_publisher_writer_group_filter_and_fallback_over_ethernet(veth_pair):
    _, if_a, _, if_b = veth_pair
    url = "opc.eth://01-00-5E-7F-00-01:100.5"
    _, out = _run_pair(veth_pair, LAYOUT_RECEIVER, [url, if_b], LAYOUT_PUBLISHER, [url, if_a])
    result = json.loads(out.splitlines()[-1])
    assert [(f["seq"], f["values"], f["pid"]) for f in result["frames"]] == [
        (2, [2.0, 2.5, 3.0], 2**40 + 3), (3, [3.0, 3.5, 4.0], 2**40 + 3), (4, [4.0, 4.5, 5.0], 2**40 + 3)]
    assert (result["foreign"], result["fallback_decodes"], result["malformed"]) == (1, 1, 0)
    assert "DataSetFlags1 0x8d" in result["last_fallback_reason"]


# ---- Ethernet minimum-frame padding -----------------------------------------------------------------
# A frame is at least 60 bytes (without FCS), so a UADP message shorter than 46 bytes (42 in a tagged frame)
# arrives followed by zero padding. The general decoder must find where the message ends (its Sizes array, or
# the end of its single DataSetMessage's fields) and take only zeros after it as padding.

SHORT_RECEIVER = """
import json, sys
from plc.eth import EthFrameSource
from plc.uadp import FixedLayout
src = EthFrameSource(sys.argv[1], sys.argv[2], FixedLayout(int(sys.argv[3])), publisher_id=7, writer_group_id=1)
print("ready", flush=True)
out = []
while len(out) < 2:
    f = src.receive(5.0)
    if f is None:
        break
    out.append({"seq": f.sequence_number, "values": f.values.tolist(), "sent": f.sender_timestamp_ns,
                "pcp": f.vlan_pcp})
print(json.dumps({"frames": out, **src.decode_status()}), flush=True)
"""

SHORT_PUBLISHER = """
import json, sys, time
from asyncua import ua
from plc.eth import EthPublisher
from plc.uadp import (DataSetMessage, DataSetMessageType, FixedLayout, NetworkMessage, PublisherIdType, UadpMessage,
                      encode)
from plc.uadp.fixed import datetime_ticks_from_ns
n = int(sys.argv[3])
pub = EthPublisher(sys.argv[1], sys.argv[2])
head = dict(publisher_id=7, publisher_id_type=PublisherIdType.UINT16, writer_group_id=1)
keep_alive = DataSetMessage(message_type=DataSetMessageType.KEEP_ALIVE, sequence_number=8)
sent_ns = time.time_ns() // 100 * 100
values = (1.5, -2.25, 3.0, 4.5)[:n]
messages = [
    encode(NetworkMessage((keep_alive,), sequence_number=8, dataset_writer_ids=(1,), **head)),
    encode(NetworkMessage((keep_alive, keep_alive), sequence_number=8, dataset_writer_ids=(1, 2), **head)),  # Sizes
    encode(NetworkMessage((DataSetMessage(tuple(ua.Variant(v, ua.VariantType.Float) for v in values),
                                          sequence_number=9, timestamp=datetime_ticks_from_ns(sent_ns)),),
                          sequence_number=9, dataset_writer_ids=(1,), **head)),
]
garbage = messages[0] + b"\\x01"  # a byte after the message that is not padding: still malformed
for payload in messages + [garbage]:
    pub.send(payload)
    time.sleep(0.002)
pub.send(FixedLayout(n).encode(UadpMessage(7, 1, 1, 10, 10, time.time_ns(), (7.0,) * n)))
print(json.dumps({"lengths": [len(m) for m in messages], "sent_ns": sent_ns}))
"""


@pytest.mark.parametrize("url,fields", [
    ("opc.eth://01-00-5E-7F-00-01:100.5", 3),  # tagged: padded to 42 bytes of payload; layout larger than a frame
    ("opc.eth://01-00-5E-7F-00-01", 1),  # untagged: padded to 46; the 43-byte layout is shorter than the frame
])
def test_short_general_messages_in_padded_frames_decode(veth_pair, url, fields):
    """A keep-alive, a Sizes-array message of keep-alives and a short key frame, each in a minimum-size frame:
    decoded by the general path (not counted malformed for their padding); a non-zero byte after a message
    still is malformed; the fixed layout's own frame still takes the fast path."""
    _, if_a, _, if_b = veth_pair
    pub, out = _run_pair(veth_pair, SHORT_RECEIVER, [url, if_b, str(fields)], SHORT_PUBLISHER,
                         [url, if_a, str(fields)])
    sent = json.loads(pub.stdout.splitlines()[-1])
    assert max(sent["lengths"]) < 42  # every message really was padded on the wire
    result = json.loads(out.splitlines()[-1])
    frames = result["frames"]
    assert [(f["seq"], f["values"]) for f in frames] == [(9, [1.5, -2.25, 3.0][:fields]), (10, [7.0] * fields)]
    assert frames[0]["sent"] == sent["sent_ns"]
    assert result["keep_alives"] == 2  # the single keep-alive and the Sizes-array one
    assert result["fallback_decodes"] == 1  # the short key frame
    assert result["malformed"] == 1, result["last_error"]  # only the one with a non-zero byte after it
    assert "trailing bytes" in result["last_error"]


def test_padding_rule_of_the_general_decoder():
    """decode(padded=True) takes only zero bytes after the message's end as padding, finds that end from the
    Sizes array or the single DataSetMessage, and is refused for payloads that cannot be padded."""
    from asyncua import ua

    from plc.errors import UadpDecodeError
    from plc.uadp import (ETHERNET_MIN_PAYLOAD, DataSetMessage, DataSetMessageType, FieldEncoding, NetworkMessage,
                          PublisherIdType, decode, encode, unpadded_length)

    head = dict(publisher_id=7, publisher_id_type=PublisherIdType.UINT16, writer_group_id=1, sequence_number=3)
    keep_alive = DataSetMessage(message_type=DataSetMessageType.KEEP_ALIVE, sequence_number=3)
    doubles = (ua.VariantType.Double,) * 2
    raw = DataSetMessage((ua.Variant(1.0, ua.VariantType.Double), ua.Variant(2.0, ua.VariantType.Double)),
                         field_encoding=FieldEncoding.RAW_DATA)
    for msg in (NetworkMessage((keep_alive,), dataset_writer_ids=(1,), **head),
                NetworkMessage((keep_alive, keep_alive), dataset_writer_ids=(1, 2), **head),
                NetworkMessage((raw,), **head)):  # RawData: its end comes from the field types
        data = encode(msg)
        padded = data + bytes(ETHERNET_MIN_PAYLOAD - len(data))
        assert unpadded_length(padded, doubles) == len(data)
        assert decode(padded, doubles, padded=True) == decode(data, doubles)
        with pytest.raises(UadpDecodeError, match="trailing bytes|Sizes array totals"):
            decode(padded, doubles)  # strict: UDP and long frames carry their exact length
        bad = bytearray(padded)
        bad[-1] = 0xAA
        with pytest.raises(UadpDecodeError, match="not zero .* so not Ethernet padding"):
            decode(bytes(bad), doubles, padded=True)
    with pytest.raises(ValueError, match="at most 46"):
        decode(bytes(47), padded=True)
