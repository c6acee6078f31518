"""UADP encode/decode cost: fixed-layout fast path vs our general codec vs asyncua's codec.

    python bench/uadp_codec.py [--iterations N] [--json]

Every codec encodes and decodes the same NetworkMessage: the 6-Double layout the demo config
declares (the three encoders produce identical bytes; checked before timing). A richer message
(several DataSetMessages, DataValue and delta frames, strings, arrays) compares the two general
codecs. Calls are timed in batches so timer overhead stays out of sub-microsecond numbers; the
figures are medians of per-call ns over the batches. The last line of stdout with --json is one
JSON object (keys encode_ns/decode_ns are the fast path). The `source` figures time a frame source's
per-message work without a socket: the fast path with the publisher/group/writer filter and the Frame,
the general-decoder fallback for the same message sent with DataValue field encoding, and skipping
another publisher's DataValue message by its headers alone. The `typed` figures are the fast path
compiled for a mixed-type layout (Double, Float, Int32, UInt32, UInt16, Int16, Boolean fields; Variant
and RawData) against the general decoder and asyncua on the same bytes.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncua import ua  # noqa: E402
from asyncua.common.utils import Buffer  # noqa: E402
from asyncua.pubsub import uadp as aua  # noqa: E402

from plc.uadp import (DataSetMessage, DataSetMessageType, FieldEncoding, FixedLayout, NetworkMessage,  # noqa: E402
                      PublisherIdType, UadpMessage, compile_layout, datetime_ticks_from_ns, decode, encode,
                      field_types_of)

BATCH = 20


def _median_ns(fn, iterations: int) -> float:
    """Median per-call ns over batches of BATCH calls (after a warm-up batch)."""
    for _ in range(BATCH):
        fn()
    batches = max(iterations // BATCH, 5)
    out = np.empty(batches)
    for i in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(BATCH):
            fn()
        out[i] = (time.perf_counter_ns() - t0) / BATCH
    return float(np.median(out))


def demo_messages():
    """The fixed layout's message three ways; the timestamp is whole microseconds because asyncua
    carries DateTime as a Python datetime (microsecond resolution)."""
    values = (4.0, 3.0, 1.4, 8000.0, 120.0, 2.6)
    t_ns = (time.time_ns() // 1000) * 1000
    fixed = UadpMessage(7, 1, 2, 3, 4, t_ns, values)
    general, theirs = _general_and_asyncua(tuple(ua.Variant(v, ua.VariantType.Double) for v in values),
                                           datetime_ticks_from_ns(t_ns))
    return fixed, general, theirs


def _general_and_asyncua(variants: tuple, ticks: int):
    """One DataSetMessage of `variants` (publisher 7, group 1 seq 3, writer 2 seq 4) as our general codec's
    NetworkMessage and as asyncua's UadpNetworkMessage."""
    general = NetworkMessage(
        (DataSetMessage(variants, sequence_number=4, timestamp=ticks),),
        publisher_id=7, publisher_id_type=PublisherIdType.UINT16, writer_group_id=1, sequence_number=3,
        dataset_writer_ids=(2,), timestamp=ticks)
    stamp = ua.win_epoch_to_datetime(ticks)
    theirs = aua.UadpNetworkMessage(
        Header=aua.UadpHeader(PublisherId=ua.UInt16(7)),
        GroupHeader=aua.UadpGroupHeader(WriterGroupId=ua.UInt16(1), SequenceNo=ua.UInt16(3)),
        DataSetPayloadHeader=[ua.UInt16(2)], Timestamp=stamp,
        Payload=[aua.UadpDataSetVariant(aua.UadpDataSetMessageHeader(SequenceNo=4, Timestamp=stamp), list(variants))])
    return general, theirs


def mixed_messages():
    """Three DataSetMessages: mixed Variant key frame, DataValue key frame, Variant delta frame."""
    when = dt.datetime(2026, 5, 1, 12, 0, 0, 250, tzinfo=dt.timezone.utc)
    V, T = ua.Variant, ua.VariantType
    key = (V(1.5), V(42, T.Int32), V("stand-3"), V(True), V([1.0, 2.0, 3.0, 4.0], T.Double), V(when, T.DateTime))
    dvs = tuple(ua.DataValue(V(float(i)), SourceTimestamp=when) for i in range(4))
    delta = ((2, V(7, T.UInt16)), (5, V(-1.25)))
    general = NetworkMessage(
        (DataSetMessage(key, sequence_number=10),
         DataSetMessage(dvs, field_encoding=FieldEncoding.DATA_VALUE, sequence_number=11),
         DataSetMessage(delta, DataSetMessageType.DELTA_FRAME, sequence_number=12)),
        publisher_id="mill-1", writer_group_id=5, sequence_number=99, dataset_writer_ids=(1, 2, 3))
    hdr = aua.UadpDataSetMessageHeader
    theirs = aua.UadpNetworkMessage(
        Header=aua.UadpHeader(PublisherId=ua.String("mill-1")),
        GroupHeader=aua.UadpGroupHeader(WriterGroupId=ua.UInt16(5), SequenceNo=ua.UInt16(99)),
        DataSetPayloadHeader=[ua.UInt16(i) for i in (1, 2, 3)],
        Payload=[aua.UadpDataSetVariant(hdr(SequenceNo=10), list(key)),
                 aua.UadpDataSetDataValue(hdr(SequenceNo=11), list(dvs)),
                 aua.UadpDataSetDeltaVariant(hdr(SequenceNo=12), [aua.DeltaVariant(n, v) for n, v in delta])])
    return general, theirs


# A PLC DataSet of mixed fixed-size types (what a real S7/ControlLogix publisher sends more often than
# all Doubles): measured values, a Float pair, counters, a status word, a setpoint step and flags.
TYPED_LAYOUT = ("double", "double", "double", "double", "float", "float", "int32", "uint32", "uint16", "int16",
                "boolean", "boolean")
TYPED_VALUES = (4.0, 3.0, 1.4, 8000.0, 0.5, -2.25, -120000, 4_000_000_000, 0xBEEF, -300, True, False)


def typed_messages():
    """The mixed-type layout's message three ways (Variant fields); the same ids as the demo message."""
    t_ns = (time.time_ns() // 1000) * 1000
    fixed = UadpMessage(7, 1, 2, 3, 4, t_ns, TYPED_VALUES)
    ticks = datetime_ticks_from_ns(t_ns)
    types = field_types_of(TYPED_LAYOUT)
    variants = tuple(ua.Variant(v, t) for v, t in zip(TYPED_VALUES, types))
    general, theirs = _general_and_asyncua(variants, ticks)
    return fixed, general, theirs, types


def typed_costs(iterations: int) -> dict:
    """The fast path compiled for the mixed-type layout (Variant and RawData) vs the general decoder and
    asyncua on the same bytes, and the frame source's per-message cost on it."""
    from plc.frame import RxStampSource
    from plc.socket_source import UadpSocketSource

    fixed, general, theirs, types = typed_messages()
    layout = compile_layout(len(types), "variant", field_types=types)
    data = layout.encode(fixed)
    if not encode(general) == theirs.to_binary() == data:
        raise SystemExit("the three encoders disagree on the mixed-type message; fix before timing")
    out = np.zeros(len(types))
    layout.decode_into(data, out)
    if decode(data) != general or out.tolist() != [float(v) for v in TYPED_VALUES]:
        raise SystemExit("the fast path and the general decoder disagree on the mixed-type message")
    raw_layout = compile_layout(len(types), "raw", field_types=types)
    raw = raw_layout.encode(fixed)
    src = UadpSocketSource(None, layout, 7, 2, buffer_size=0, writer_group_id=1)
    user = RxStampSource.USER
    frame = src._frame(data, 0, user)
    if frame is None or src.fallback_decodes or frame.values.tolist() != out.tolist():
        raise SystemExit("the frame source did not take the fast path for the mixed-type message")
    # the same message at a source compiled for Doubles (the config without field_types): the general decoder
    doubles = UadpSocketSource(None, compile_layout(len(types)), 7, 2, buffer_size=0, writer_group_id=1)
    frame = doubles._frame(data, 0, user)
    if frame is None or doubles.fallback_decodes != 1 or frame.values.tolist() != out.tolist():
        raise SystemExit(f"the all-Double layout's fallback did not deliver the mixed-type message: "
                         f"{doubles.last_error}")
    return {
        "fields": len(types), "message_bytes": len(data), "raw_message_bytes": len(raw),
        "encode_ns": _median_ns(lambda: layout.encode(fixed), iterations),
        "decode_ns": _median_ns(lambda: layout.decode_into(data, out), iterations),
        "raw_decode_ns": _median_ns(lambda: raw_layout.decode_into(raw, out), iterations),
        "general_decode_ns": _median_ns(lambda: decode(data), iterations),
        "general_raw_decode_ns": _median_ns(lambda: decode(raw, types), iterations),
        "asyncua_encode_ns": _median_ns(theirs.to_binary, iterations),
        "asyncua_decode_ns": _median_ns(lambda: aua.UadpNetworkMessage.from_binary(Buffer(data)), iterations),
        "fast_frame_ns": _median_ns(lambda: src._frame(data, 0, user), iterations),
        "untyped_fallback_frame_ns": _median_ns(lambda: doubles._frame(data, 0, user), iterations),
    }


def run(iterations: int) -> dict:
    fixed, general, theirs = demo_messages()
    layout = FixedLayout(6)
    data = layout.encode(fixed)
    if not encode(general) == theirs.to_binary() == data:
        raise SystemExit("the three encoders disagree on the demo message; fix before timing")
    assert decode(data) == general and layout.decode(data) == fixed
    out = np.zeros(6)
    r = {
        "message_bytes": len(data), "iterations": iterations,
        "encode_ns": _median_ns(lambda: layout.encode(fixed), iterations),
        # the loop's path: header tuple plus the values written into a preallocated array
        "decode_ns": _median_ns(lambda: layout.decode_into(data, out), iterations),
        "fixed_decode_object_ns": _median_ns(lambda: layout.decode(data), iterations),
        "general_encode_ns": _median_ns(lambda: encode(general), iterations),
        "general_decode_ns": _median_ns(lambda: decode(data), iterations),
        "asyncua_encode_ns": _median_ns(theirs.to_binary, iterations),
        "asyncua_decode_ns": _median_ns(lambda: aua.UadpNetworkMessage.from_binary(Buffer(data)), iterations),
    }
    mixed, mixed_theirs = mixed_messages()
    mdata = encode(mixed)
    if mdata != mixed_theirs.to_binary():
        raise SystemExit("our and asyncua's encodings of the mixed message differ")
    r["mixed"] = {
        "message_bytes": len(mdata),
        "general_encode_ns": _median_ns(lambda: encode(mixed), iterations),
        "general_decode_ns": _median_ns(lambda: decode(mdata), iterations),
        "asyncua_encode_ns": _median_ns(mixed_theirs.to_binary, iterations),
        "asyncua_decode_ns": _median_ns(lambda: aua.UadpNetworkMessage.from_binary(Buffer(mdata)), iterations),
    }
    r["source"] = source_costs(iterations)
    typed = typed_costs(iterations)
    typed["decode_speedup"] = typed["asyncua_decode_ns"] / typed["decode_ns"]
    typed["general_decode_speedup"] = typed["general_decode_ns"] / typed["decode_ns"]
    r["typed"] = {k: round(v, 2) for k, v in typed.items()}
    r["decode_speedup"] = r["asyncua_decode_ns"] / r["decode_ns"]
    r["encode_speedup"] = r["asyncua_encode_ns"] / r["encode_ns"]
    r["general_decode_speedup"] = r["asyncua_decode_ns"] / r["general_decode_ns"]
    r["general_encode_speedup"] = r["asyncua_encode_ns"] / r["general_encode_ns"]
    r["mixed"] = {k: round(v, 2) for k, v in r["mixed"].items()}
    r["source"] = {k: round(v, 2) for k, v in r["source"].items()}
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}


def source_costs(iterations: int) -> dict:
    """Per-message ns of UadpSocketSource._frame (no socket): fast path, fallback, foreign skip."""
    from plc.frame import RxStampSource
    from plc.socket_source import UadpSocketSource

    fixed, general, _ = demo_messages()
    layout = FixedLayout(6)
    src = UadpSocketSource(None, layout, 7, 2, buffer_size=0, writer_group_id=1)
    fast = layout.encode(fixed)
    ds = general.messages[0]
    dv = [ua.DataValue(v) for v in ds.fields]
    as_dv = NetworkMessage((DataSetMessage(tuple(dv), field_encoding=FieldEncoding.DATA_VALUE,
                                           sequence_number=ds.sequence_number, timestamp=ds.timestamp),),
                           **{k: getattr(general, k) for k in ("publisher_id", "publisher_id_type", "writer_group_id",
                                                               "sequence_number", "dataset_writer_ids", "timestamp")})
    fallback = encode(as_dv)
    foreign = encode(NetworkMessage(as_dv.messages, publisher_id=8, publisher_id_type=PublisherIdType.UINT16,
                                    writer_group_id=1, sequence_number=3, dataset_writer_ids=(2,),
                                    timestamp=as_dv.timestamp))
    user = RxStampSource.USER
    frame = src._frame(fallback, 0, user)
    if frame is None or frame.values.tolist() != list(fixed.values) or src.fallback_decodes != 1:
        raise SystemExit(f"the fallback did not decode the DataValue message: {src.last_error}")
    if src._frame(foreign, 0, user) is not None or src.foreign != 1:
        raise SystemExit("another publisher's message was not skipped as foreign")
    return {"fast_frame_ns": _median_ns(lambda: src._frame(fast, 0, user), iterations),
            "fallback_frame_ns": _median_ns(lambda: src._frame(fallback, 0, user), iterations),
            "fallback_message_bytes": len(fallback),
            "foreign_skip_ns": _median_ns(lambda: src._frame(foreign, 0, user), iterations)}


_PUBLISHER = """
import sys, time
from plc.eth import EthPublisher
from plc.udp import UdpPublisher
from plc.uadp import FixedLayout, UadpMessage
kind, url, where, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
pub = EthPublisher(url, where) if kind == "eth" else UdpPublisher(url, where)
layout = FixedLayout(6)
time.sleep(0.3)
next_t = time.monotonic()
for seq in range(1, count + 1):
    pub.send(layout.encode(UadpMessage(7, 1, 1, seq, seq, time.time_ns(), (1.0, 2.0, 3.0, 4.0, 5.0, 6.0))))
    next_t += 0.0005
    time.sleep(max(0.0, next_t - time.monotonic()))
"""


def one_way(count: int) -> dict:
    """One-way latency (PLC send stamp to recvmsg return) across a veth pair, UDP vs raw Ethernet."""
    import os
    import subprocess
    import threading

    from plc.eth import EthFrameSource
    from plc.udp import UdpFrameSource
    from sitsd.demo_netns import DemoLink

    if os.geteuid() != 0:
        return {"udp_one_way_us": None, "eth_one_way_us": None, "note": "needs root (network namespaces)"}
    out = {}
    link = DemoLink().open()
    try:
        subprocess.run(link.exec_prefix() + ["ip", "route", "add", "224.0.0.0/4", "dev", link.plc_if], check=True)
        layout = FixedLayout(6)
        cases = {"udp": ("opc.udp://239.255.42.42:48420", link.plc_ip,
                         lambda url: UdpFrameSource(url, layout, link.host_ip, publisher_id=7)),
                 "eth": ("opc.eth://01-00-5E-7F-00-2A:100.5", link.plc_if,
                         lambda url: EthFrameSource(url, link.host_if, layout, publisher_id=7))}
        for kind, (url, where, make) in cases.items():
            source = make(url)
            lat = []

            def receive() -> None:
                while len(lat) < count:
                    f = source.receive(2.0)
                    if f is None:
                        return
                    lat.append((time.time_ns() - f.sender_timestamp_ns) / 1e3)

            t = threading.Thread(target=receive)
            t.start()
            subprocess.run(link.exec_prefix() + [sys.executable, "-c", _PUBLISHER, kind, url, where, str(count)],
                           check=True, cwd=str(Path(__file__).resolve().parents[1]))
            t.join(10)
            source.close()
            v = np.array(lat[50:]) if len(lat) > 100 else np.array(lat)  # skip the warm-up
            out[f"{kind}_one_way_us"] = ({"p50": round(float(np.percentile(v, 50)), 1),
                                          "p99": round(float(np.percentile(v, 99)), 1), "received": len(lat)}
                                         if v.size else None)
    finally:
        link.close()
    return out


def table(r: dict) -> str:
    m = r["mixed"]
    rows = [
        f"demo message ({r['message_bytes']} B, 6 Double Variants), median ns per call over {r['iterations']} calls:",
        f"  {'':8}{'fixed':>10}{'general':>10}{'asyncua':>10}   asyncua/fixed  asyncua/general",
    ]
    for op in ("encode", "decode"):
        fx, gn, au = r[f"{op}_ns"], r[f"general_{op}_ns"], r[f"asyncua_{op}_ns"]
        rows.append(f"  {op:8}{fx:>10.0f}{gn:>10.0f}{au:>10.0f}   {au / fx:>12.1f}x  {au / gn:>14.1f}x")
    rows.append(f"mixed message ({m['message_bytes']} B, 3 DataSetMessages: Variant, DataValue, delta):")
    for op in ("encode", "decode"):
        gn, au = m[f"general_{op}_ns"], m[f"asyncua_{op}_ns"]
        rows.append(f"  {op:8}{'-':>10}{gn:>10.0f}{au:>10.0f}   {'-':>12}   {au / gn:>14.1f}x")
    t = r["typed"]
    rows.append(f"mixed-type layout ({t['message_bytes']} B, {t['fields']} Variants: Double, Float, Int32, UInt32, "
                f"UInt16, Int16, Boolean), compiled fast path:")
    rows.append(f"  {'encode':8}{t['encode_ns']:>10.0f}{'-':>10}{t['asyncua_encode_ns']:>10.0f}   "
                f"{t['asyncua_encode_ns'] / t['encode_ns']:>12.1f}x  {'-':>14}")
    rows.append(f"  {'decode':8}{t['decode_ns']:>10.0f}{t['general_decode_ns']:>10.0f}"
                f"{t['asyncua_decode_ns']:>10.0f}   "
                f"{t['decode_speedup']:>12.1f}x  {t['asyncua_decode_ns'] / t['general_decode_ns']:>14.1f}x")
    rows.append(f"  RawData ({t['raw_message_bytes']} B): fast {t['raw_decode_ns']:.0f} ns, general "
                f"{t['general_raw_decode_ns']:.0f} ns")
    rows.append(f"  frame source: fast path {t['fast_frame_ns']:.0f} ns; the same message at a source compiled for "
                f"Doubles (no field_types) takes the general-decoder fallback: {t['untyped_fallback_frame_ns']:.0f} ns")
    c = r["source"]
    rows.append(f"frame source per message: fast path {c['fast_frame_ns']:.0f} ns, general-decoder fallback "
                f"{c['fallback_frame_ns']:.0f} ns (DataValue fields, {c['fallback_message_bytes']} B), "
                f"another publisher skipped {c['foreign_skip_ns']:.0f} ns")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20000, help="calls per codec and operation (default 20000)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--frames", type=int, default=2000, help="frames per transport for the one-way latency")
    ap.add_argument("--no-network", action="store_true", help="skip the one-way latency (it needs root)")
    args = ap.parse_args()
    r = run(args.iterations)
    if not args.no_network:
        r.update(one_way(args.frames))
    print(table(r))
    for kind in ("udp", "eth"):
        v = r.get(f"{kind}_one_way_us")
        if v:
            print(f"one-way {kind:3} across a veth pair (send stamp to recvmsg return): "
                  f"p50 {v['p50']} us, p99 {v['p99']} us ({v['received']} frames)")
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
