"""General UADP codec (plc.uadp.encode/decode): round trips, asyncua interop, the fixed fast path, malformed input."""
from __future__ import annotations

import datetime as dt
import random
import struct
import time
import uuid

import pytest
from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.pubsub import uadp as aua
from asyncua.ua.ua_binary import variant_from_binary, variant_to_binary
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plc.errors import UadpDecodeError
from plc.uadp import (DataSetMessage, DataSetMessageType, FieldEncoding, FixedLayout, NetworkMessage,
                      PublisherIdType, UadpMessage, datetime_ticks_from_ns, decode, encode)

V, T = ua.Variant, ua.VariantType
KEY, DELTA, EVENT, KEEP = (DataSetMessageType.KEY_FRAME, DataSetMessageType.DELTA_FRAME,
                           DataSetMessageType.EVENT, DataSetMessageType.KEEP_ALIVE)
VARIANT, RAW, DATAVALUE = FieldEncoding.VARIANT, FieldEncoding.RAW_DATA, FieldEncoding.DATA_VALUE
UTC = dt.timezone.utc

# ---- strategies --------------------------------------------------------------------------------

u8, u16, u32 = st.integers(0, 0xFF), st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF)
ticks = st.integers(-(2**63), 2**63 - 1)
# asyncua converts DateTime to datetime at microsecond precision and clamps to 1601..9999
datetimes = st.datetimes(min_value=dt.datetime(1700, 1, 1), max_value=dt.datetime(9000, 1, 1)).map(
    lambda d: d.replace(tzinfo=UTC))
float32 = st.floats(width=32, allow_nan=False)
double = st.floats(allow_nan=False)
# values RawData can carry, by field type
raw_values = {
    T.Boolean: st.booleans(), T.SByte: st.integers(-128, 127), T.Byte: u8,
    T.Int16: st.integers(-(2**15), 2**15 - 1), T.UInt16: u16, T.Int32: st.integers(-(2**31), 2**31 - 1),
    T.UInt32: u32, T.Int64: st.integers(-(2**63), 2**63 - 1), T.UInt64: st.integers(0, 2**64 - 1),
    T.Float: float32, T.Double: double, T.DateTime: datetimes,
}
raw_types = st.lists(st.sampled_from(list(raw_values)), min_size=1, max_size=6).map(tuple)
scalar_variants = st.one_of(
    *(raw_values[t].map(lambda v, t=t: V(v, t)) for t in raw_values),
    st.text(max_size=12).map(lambda s: V(s, T.String)),
    st.binary(max_size=12).map(lambda b: V(b, T.ByteString)),
    st.uuids().map(lambda g: V(g, T.Guid)),
    u32.map(lambda c: V(ua.StatusCode(c), T.StatusCode)),
    st.builds(ua.LocalizedText, st.text(max_size=5), st.text(max_size=3)).map(lambda t: V(t, T.LocalizedText)),
    st.builds(lambda i, ns: V(ua.NodeId(i, ns), T.NodeId), u32, u16),
    st.just(V(None)),
)
array_variants = st.one_of(
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5).map(lambda xs: V(xs, T.Int32)),
    st.lists(st.text(max_size=4), max_size=4).map(lambda xs: V(xs, T.String)),
    st.lists(double, min_size=4, max_size=4).map(lambda xs: V([xs[:2], xs[2:]], T.Double, [2, 2])),
)
variants = st.one_of(scalar_variants, array_variants)
data_values = st.builds(
    lambda value, status, src, srv, sp, vp: ua.DataValue(Value=value, StatusCode=status, SourceTimestamp=src,
                                                         ServerTimestamp=srv, SourcePicoseconds=sp,
                                                         ServerPicoseconds=vp),
    st.none() | variants, st.none() | u32.map(ua.StatusCode), st.none() | datetimes, st.none() | datetimes,
    st.none() | u16, st.none() | u16)


@st.composite
def dataset_messages(draw, types: tuple | None):
    """`types`: the RawData field types the decoder will be given (None: RawData key frames carry raw bytes)."""
    kind = draw(st.sampled_from([KEY, DELTA, EVENT, KEEP]))
    enc = draw(st.sampled_from([VARIANT, RAW, DATAVALUE]))
    if kind is DELTA and enc is RAW and types is None:
        enc = VARIANT  # a RawData delta frame cannot be decoded without field types
    raw, fields = None, ()
    value = (data_values if enc is DATAVALUE else variants) if kind is not EVENT else variants
    if kind is KEY and enc is RAW:
        if types is None:
            raw = draw(st.binary(max_size=16))
        else:
            fields = tuple(V(draw(raw_values[t]), t) for t in types)
    elif kind is KEY or kind is EVENT:
        fields = tuple(draw(st.lists(value, max_size=4)))
    elif kind is DELTA:
        if enc is RAW:
            idx = draw(st.lists(st.integers(0, len(types) - 1), max_size=4))
            fields = tuple((i, V(draw(raw_values[types[i]]), types[i])) for i in idx)
        else:
            fields = tuple(draw(st.lists(st.tuples(u16, value), max_size=4)))
    opt = lambda s: draw(st.none() | s)  # noqa: E731
    return DataSetMessage(fields, kind, enc, raw, draw(st.booleans()), opt(u16), opt(ticks), opt(u16), opt(u16),
                          opt(u32), opt(u32))


publishers = st.one_of(
    st.tuples(st.none(), st.none()),
    st.tuples(u8, st.just(PublisherIdType.BYTE)), st.tuples(u16, st.just(PublisherIdType.UINT16)),
    st.tuples(u32, st.just(PublisherIdType.UINT32)),
    st.tuples(st.integers(0, 2**64 - 1), st.just(PublisherIdType.UINT64)),
    st.tuples(st.text(max_size=10), st.just(PublisherIdType.STRING)),
)


@st.composite
def network_messages(draw):
    types = draw(st.none() | raw_types)
    n = draw(st.integers(1, 4))
    msgs = tuple(draw(dataset_messages(types)) for _ in range(n))
    ids = tuple(draw(st.lists(u16, min_size=n, max_size=n))) if n > 1 or draw(st.booleans()) else None
    pid, ptype = draw(publishers)
    opt = lambda s: draw(st.none() | s)  # noqa: E731
    promoted = tuple(draw(st.lists(variants, max_size=3))) if n == 1 and draw(st.booleans()) else None
    msg = NetworkMessage(msgs, pid, ptype, opt(st.uuids()), opt(u16), opt(u32), opt(u16), opt(u16), ids,
                         opt(ticks), opt(u16), promoted)
    return msg, types


# ---- round trips -------------------------------------------------------------------------------

@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(network_messages())
def test_round_trip_across_flag_combinations(case):
    msg, types = case
    data = encode(msg)
    assert decode(data, types) == msg
    assert encode(decode(data, types)) == data


@given(scalar_variants)
def test_scalar_fast_paths_match_asyncua(v):
    """Scalar Boolean..Double Variants skip asyncua's dispatch in both directions; bytes and objects must match."""
    data = variant_to_binary(v)
    msg = decode(encode(NetworkMessage((DataSetMessage((v,)),))))
    assert msg.messages[0].fields == (variant_from_binary(Buffer(data)),)
    assert encode(NetworkMessage((DataSetMessage((v,)),))).endswith(b"\x01\x00" + data)


def test_minimal_message_layout():
    """Version 1, no optional header: UADPFlags 0x01, DataSetFlags1 valid, FieldCount 0."""
    assert encode(NetworkMessage((DataSetMessage(),))) == b"\x01\x01\x00\x00"
    assert decode(b"\x01\x01\x00\x00") == NetworkMessage((DataSetMessage(),))
    assert decode(bytearray(b"\x01\x01\x00\x00")) == decode(memoryview(b"\x01\x01\x00\x00"))


def test_data_value_body_follows_part6_order():
    """OPC 10000-6 §5.2.2.17: SourceTimestamp, SourcePicoseconds, ServerTimestamp, ServerPicoseconds.
    asyncua 2.1.0's struct codec writes SourceTimestamp, ServerTimestamp, SourcePicoseconds, so it
    misreads such a DataValue; we encode and decode the Part 6 order."""
    src, srv = dt.datetime(2020, 1, 1, tzinfo=UTC), dt.datetime(2021, 1, 1, tzinfo=UTC)
    dv = ua.DataValue(V(1.5), StatusCode=None, SourceTimestamp=src, SourcePicoseconds=7, ServerTimestamp=srv)
    data = encode(NetworkMessage((DataSetMessage((dv,), field_encoding=DATAVALUE),)))
    body = data[-(1 + 9 + 8 + 2 + 8):]
    assert body == (bytes((0x1D,)) + variant_to_binary(V(1.5)) + struct.pack("<qHq", ua.datetime_to_win_epoch(src), 7,
                                                                              ua.datetime_to_win_epoch(srv)))
    assert decode(data).messages[0].fields == (dv,)
    theirs = aua.UadpNetworkMessage.from_binary(Buffer(data)).Payload[0].Data[0]
    assert theirs.SourcePicoseconds != 7  # asyncua reads 2 bytes of the ServerTimestamp here


# ---- RawData -----------------------------------------------------------------------------------

def _raw_message(**kw) -> NetworkMessage:
    fields = (V(True, T.Boolean), V(-3, T.Int16), V(2.5, T.Float), V(dt.datetime(2024, 5, 1, tzinfo=UTC), T.DateTime))
    return NetworkMessage((DataSetMessage(fields, field_encoding=RAW, sequence_number=4),), **kw)


def test_raw_key_frame_with_and_without_field_types():
    msg = _raw_message()
    data = encode(msg)
    types = [T.Boolean, T.Int16, T.Float, T.DateTime]
    assert decode(data, types) == msg
    kept = decode(data).messages[0]
    assert kept.fields == () and kept.raw == struct.pack("<?hfq", True, -3, 2.5,
                                                         ua.datetime_to_win_epoch(dt.datetime(2024, 5, 1, tzinfo=UTC)))
    assert encode(decode(data)) == data  # raw bytes go back verbatim
    with pytest.raises(UadpDecodeError, match=r"need 15 bytes, 14 left") as exc:
        decode(data[:-1], types)
    assert exc.value.offset == 4
    with pytest.raises(UadpDecodeError, match="1 trailing bytes after DataSetMessage 0") as exc:
        decode(data + b"\x00", types)
    assert exc.value.offset == len(data)


def test_raw_field_types_by_writer_id_and_delta_frames():
    a = DataSetMessage((V(1, T.UInt32),), field_encoding=RAW)
    b = DataSetMessage(((1, V(2.0, T.Double)),), DELTA, RAW)
    msg = NetworkMessage((a, b), dataset_writer_ids=(10, 20))
    data = encode(msg)
    assert decode(data, {10: [T.UInt32], 20: [T.Byte, T.Double]}) == msg
    with pytest.raises(UadpDecodeError, match="RawData delta frame; decoding it needs the field types"):
        decode(data)
    with pytest.raises(UadpDecodeError, match="FieldIndex 1 is out of range for 1 field types"):
        decode(data, {10: [T.UInt32], 20: [T.Double]})
    with pytest.raises(ValueError, match="fixed-size scalars"):
        decode(data, [T.String])


# ---- the fixed-layout fast path ----------------------------------------------------------------

@given(st.builds(UadpMessage, u16, u16, u16, u16, u16, st.integers(0, 2**60).map(lambda t: t * 100),
                 st.lists(double, min_size=1, max_size=20).map(tuple)))
def test_fixed_layout_bytes_decode_to_the_same_values(m):
    layout = FixedLayout(len(m.values))
    data = layout.encode(m)
    g = decode(data)
    ticks_ = datetime_ticks_from_ns(m.timestamp_ns)
    assert (g.publisher_id, g.publisher_id_type) == (m.publisher_id, PublisherIdType.UINT16)
    assert (g.writer_group_id, g.sequence_number, g.dataset_writer_ids, g.timestamp) == (
        m.writer_group_id, m.network_sequence, (m.writer_id,), ticks_)
    (ds,) = g.messages
    assert (ds.message_type, ds.field_encoding, ds.sequence_number, ds.timestamp) == (KEY, VARIANT,
                                                                                      m.dataset_sequence, ticks_)
    assert ds.fields == tuple(V(v, T.Double) for v in m.values)
    assert encode(g) == data  # the general encoder picks the same (minimal) flags as the fixed layout


# ---- asyncua interop ---------------------------------------------------------------------------

def _asyncua_message(publisher_id, payload, ids=(1,)):
    return aua.UadpNetworkMessage(
        Header=aua.UadpHeader(PublisherId=publisher_id),
        GroupHeader=aua.UadpGroupHeader(WriterGroupId=ua.UInt16(3), SequenceNo=ua.UInt16(9)),
        DataSetPayloadHeader=[ua.UInt16(i) for i in ids], Payload=payload)


def _hdr(**kw):
    return aua.UadpDataSetMessageHeader(**kw)


ASYNCUA_PUBLISHERS = [(ua.Byte(7), PublisherIdType.BYTE), (ua.UInt16(700), PublisherIdType.UINT16),
                      (ua.UInt32(70000), PublisherIdType.UINT32), (ua.String("plc-7"), PublisherIdType.STRING)]


@pytest.mark.parametrize("pid,ptype", ASYNCUA_PUBLISHERS)
def test_decode_asyncua_encoding(pid, ptype):
    stamp = dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    dv = ua.DataValue(V(2, T.Int16), SourceTimestamp=stamp)
    payload = [
        aua.UadpDataSetVariant(_hdr(SequenceNo=5, Timestamp=stamp), [V(1.5), V("a"), V([1, 2], T.Int32)]),
        aua.UadpDataSetDataValue(_hdr(Status=2), [dv]),
        aua.UadpDataSetDeltaVariant(_hdr(CfgMajorVersion=1, CfgMinorVersion=2), [aua.DeltaVariant(4, V(True))]),
        aua.UadpDataSetDeltaDataValue(_hdr(), [aua.DeltaDataValue(1, dv)]),
        aua.UadpDataSetKeepAlive(_hdr(SequenceNo=6)),
        aua.UadpDataSetRaw(_hdr(), struct.pack("<id", -5, 0.25)),
    ]
    data = _asyncua_message(pid, payload, ids=range(1, 7)).to_binary()
    msg = decode(data, {6: [T.Int32, T.Double]})
    assert (msg.publisher_id, msg.publisher_id_type) == (pid, ptype)
    assert (msg.writer_group_id, msg.sequence_number, msg.dataset_writer_ids) == (3, 9, (1, 2, 3, 4, 5, 6))
    a, b, c, d, e, f = msg.messages
    assert a == DataSetMessage((V(1.5), V("a"), V([1, 2], T.Int32)), sequence_number=5,
                               timestamp=ua.datetime_to_win_epoch(stamp))
    assert b == DataSetMessage((dv,), field_encoding=DATAVALUE, status=2)
    assert c == DataSetMessage(((4, V(True)),), DELTA, major_version=1, minor_version=2)
    assert d == DataSetMessage(((1, dv),), DELTA, DATAVALUE)
    assert e == DataSetMessage(message_type=KEEP, sequence_number=6)
    assert f == DataSetMessage((V(-5, T.Int32), V(0.25, T.Double)), field_encoding=RAW)


@pytest.mark.parametrize("pid,ptype", ASYNCUA_PUBLISHERS)
def test_asyncua_decodes_our_encoding(pid, ptype):
    dv = ua.DataValue(V(7, T.UInt16), ServerTimestamp=dt.datetime(2024, 1, 1, tzinfo=UTC), ServerPicoseconds=3)
    msg = NetworkMessage(
        (DataSetMessage((V(1.5), V("a")), sequence_number=1, timestamp=ua.datetime_to_win_epoch(dt.datetime(2024, 1, 1))),
         DataSetMessage((dv,), field_encoding=DATAVALUE, major_version=4),
         DataSetMessage(((2, V(9, T.Int32)),), DELTA),
         DataSetMessage(((0, dv),), DELTA, DATAVALUE),
         DataSetMessage(message_type=KEEP, sequence_number=3),
         DataSetMessage((V(1, T.Byte), V(-1.0, T.Double)), field_encoding=RAW)),
        int(pid) if ptype is not PublisherIdType.STRING else str(pid), ptype, uuid.uuid4(), writer_group_id=3,
        sequence_number=8, dataset_writer_ids=(1, 2, 3, 4, 5, 6), timestamp=ua.datetime_to_win_epoch(dt.datetime(2024, 1, 1)))
    net = aua.UadpNetworkMessage.from_binary(Buffer(encode(msg)))
    assert net.Header.PublisherId == msg.publisher_id
    assert net.Header.DataSetClassId == msg.dataset_class_id
    assert (net.GroupHeader.WriterGroupId, net.GroupHeader.SequenceNo) == (3, 8)
    assert net.DataSetPayloadHeader == [1, 2, 3, 4, 5, 6]
    a, b, c, d, e, f = net.Payload
    assert a.Data == [V(1.5), V("a")] and a.Header.SequenceNo == 1
    assert b.Data == [dv] and b.Header.CfgMajorVersion == 4
    assert [(x.No, x.Value) for x in c.Data] == [(2, V(9, T.Int32))]
    assert [(x.No, x.Value) for x in d.Data] == [(0, dv)]
    assert isinstance(e, aua.UadpDataSetKeepAlive) and e.Header.SequenceNo == 3
    assert f.Data == struct.pack("<Bd", 1, -1.0)


def test_asyncua_uint64_publisher_id_is_rejected():
    """asyncua 2.1.0 writes a UInt64 PublisherId with ExtendedFlags1 type bits 0b110 (6, reserved);
    Part 14 Table 142 says UInt64 is 0b011. We reject its encoding instead of guessing."""
    data = _asyncua_message(ua.UInt64(1), [aua.UadpDataSetVariant(_hdr(), [V(1.0)])]).to_binary()
    assert data[1] & 0x07 == 6
    with pytest.raises(UadpDecodeError, match="PublisherId type 6 is reserved") as exc:
        decode(data)
    assert exc.value.offset == 1
    ours = encode(NetworkMessage((DataSetMessage(),), 2**64 - 1, PublisherIdType.UINT64))
    assert ours[1] & 0x07 == 3 and decode(ours).publisher_id == 2**64 - 1


def test_asyncua_promoted_fields_are_not_part14():
    """asyncua 2.1.0 writes the PromotedFields Size as a field count; Part 14 says it is a byte size."""
    net = _asyncua_message(ua.Byte(1), [aua.UadpDataSetVariant(_hdr(), [V(1.0)])])
    net.PromotedFields = [V(2.0)]
    with pytest.raises(UadpDecodeError, match=r"PromotedField 0: truncated Double: needs 8 bytes, 0 left"):
        decode(net.to_binary())
    ours = encode(NetworkMessage((DataSetMessage((V(1.0),)),), promoted_fields=(V(2.0),)))
    assert ours[3:5] == struct.pack("<H", 9)


# ---- malformed input: reason and offset ---------------------------------------------------------

GOOD = encode(NetworkMessage((DataSetMessage((V(1.0),)), DataSetMessage((V(2, T.Int16),))),
                             publisher_id=5, publisher_id_type=PublisherIdType.UINT16, writer_group_id=1,
                             dataset_writer_ids=(1, 2)))
# UADPFlags F1 | Ext1 01 | PublisherId 0500 | GroupFlags 01 WriterGroupId 0100 | Count 02 ids 0100 0200 |
# Sizes 0c00 0600 (offset 12) | DS0 at 16: 01 0100 0b <8> | DS1 at 28: 01 0100 04 0200


def _patch(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


MALFORMED = [
    (b"", "truncated UADPFlags: needs 1 bytes, 0 left", 0),
    (b"\x02", "UADP version 2 is not supported", 0),
    (b"\x81\x05", "PublisherId type 5 is reserved", 1),
    (b"\x81\x10", "message security is not supported", 1),
    (b"\x81\x80\x01", "chunked NetworkMessages are not supported", 2),
    (b"\x81\x80\x04", "discovery request NetworkMessages are not supported", 2),
    (b"\x81\x80\x08", "discovery response NetworkMessages are not supported", 2),
    (b"\x81\x80\x0c", "NetworkMessage type 3 is reserved", 2),
    (b"\x81\x80\x20", "ExtendedFlags2 0x20 sets reserved bits", 2),
    (b"\x91\x04\xff\xff\xff\x7f", "truncated PublisherId String: needs 2147483647 bytes, 0 left", 6),
    (b"\x91\x04\xfe\xff\xff\xff", "PublisherId String length -2 (null or negative)", 2),
    (b"\x91\x04\x02\x00\x00\x00\xc3\x28", "PublisherId String is not valid UTF-8", 6),
    (b"\x21\x10", "GroupFlags 0x10 sets reserved bits", 1),
    (b"\x41\x00", "PayloadHeader Count is 0", 1),
    (b"\x81\x80\x02\x05\x00", "PromotedFields Size 5 exceeds the 0 bytes left", 3),
    (b"\x81\x80\x02\x01\x00\x0b", "PromotedField 0: truncated Double: needs 8 bytes, 0 left", 6),
    (b"\x01", "truncated DataSetMessage: needs 1 bytes, 0 left", 1),
    (b"\x01\x07", "field encoding 0b11 is reserved", 1),
    (b"\x01\x81\x04", "DataSetMessage 0 type 4 is reserved", 2),
    (b"\x01\x81\x40", "DataSetFlags2 0x40 sets reserved bits", 2),
    (b"\x01\x09\x01", "truncated DataSetMessage SequenceNumber: needs 2 bytes, 1 left", 2),
    (b"\x01\x01\x05\x00\x0b", "FieldCount 5 needs at least 5 bytes, 1 left", 2),
    (b"\x01\x01\x01\x00\x0b\x00", "field 0: truncated Double: needs 8 bytes, 1 left", 5),
    (b"\x01\x01\x01\x00\x1b", "field 0: Variant type 27 is not a built-in type", 4),
    (b"\x01\x01\x01\x00\x80\xff\xff\xff\x7f", "field 0: Variant array of type Null", 4),
    (b"\x01\x01\x01\x00\x8c\xff\xff\xff\x7f", "field 0: Variant array length 2147483647 exceeds the 0 bytes left", 5),
    (b"\x01\x01\x01\x00\x8c\x01\x00\x00\x00\xfc\xff\xff\xff", "field 0: String length -4 is negative", 9),
    (b"\x01\x01\x01\x00\x46\x00", "field 0: Variant has ArrayDimensions but is not an array", 4),
    (b"\x01\x01\x01\x00\xc6\x01\x00\x00\x00\x05\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00",
     "field 0: ArrayDimensions [2] do not match the array length 1", 13),
    (b"\x01\x01\x01\x00" + b"\x18" * 40 + b"\x00", "field 0: Variant nesting deeper than 32 levels", 37),
    (b"\x01\x01\x01\x00\xc6\x00\x00\x00\x00\x02\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00",
     "field 0: ArrayDimensions [5, 0] do not match the array length 0", 9),
    (b"\x01\x01\x01\x00\x16\x00\x01\x02", "field 0: XML-encoded ExtensionObject bodies are not supported", 7),
    (b"\x01\x01\x01\x00\x11\x09", "field 0: NodeId encoding 9 is not defined", 5),
    (b"\x01\x05\x01\x00\x80", "field 0: DataValue EncodingMask 0x80 sets reserved bits", 4),
    (b"\x01\x83\x01\x00\x00", "DataSetMessage 0 is a RawData delta frame", 3),
    (b"\x01\x01\x00\x00\xff", "1 trailing bytes after DataSetMessage 0", 4),
    (_patch(GOOD, 12, b"\x0d\x00"), "Sizes array totals 19 bytes but 18 bytes follow it", 12),
    (_patch(GOOD, 12, b"\x0b\x00\x07\x00"), "truncated Double: needs 8 bytes, 7 left in DataSetMessage 0 (Sizes[0] = 11)",
     20),
    (_patch(GOOD, 12, b"\x0d\x00\x05\x00"), "DataSetMessage 0 ends 1 bytes before Sizes[0] = 13 says", 28),
    (_patch(GOOD, 12, b"\x00\x00\x12\x00"), "Sizes[0] is 0", 12),
]


@pytest.mark.parametrize("data,reason,offset", MALFORMED)
def test_malformed_input_names_reason_and_offset(data, reason, offset):
    with pytest.raises(UadpDecodeError) as exc:
        decode(data)
    assert reason in exc.value.reason
    assert exc.value.offset == offset


def test_unbounded_asyncua_inputs_are_rejected_before_asyncua_sees_them():
    """Inputs on which asyncua's own decoder loops 2**31 times or allocates without bound."""
    nested_null_array = b"\x01\x01\x01\x00" + b"\x98\x01\x00\x00\x00" + b"\x80\xff\xff\xff\x7f"
    with pytest.raises(UadpDecodeError, match="Variant array of type Null") as exc:
        decode(nested_null_array)
    assert exc.value.offset == 9
    # ExtensionObject KeyValuePair (i=14846) has a Variant member; asyncua would decode it unchecked
    body = ua.ua_binary.struct_to_binary(ua.KeyValuePair(ua.QualifiedName("k"), V(1)))
    kvp = b"\x01\x01\x01\x00\x16\x01\x00\xfe\x39" + b"\x01" + struct.pack("<i", len(body)) + body
    with pytest.raises(UadpDecodeError, match="ExtensionObject KeyValuePair is not supported"):
        decode(kvp)
    # ExtensionObject Range (i=886) is decoded by asyncua, under the strict buffer
    rng = encode(NetworkMessage((DataSetMessage((V(ua.Range(1.0, 2.0), T.ExtensionObject),)),)))
    assert decode(rng).messages[0].fields[0].Value == ua.Range(1.0, 2.0)


def test_encode_rejects_inconsistent_messages():
    with pytest.raises(ValueError, match="at least one DataSetMessage"):
        encode(NetworkMessage(()))
    with pytest.raises(ValueError, match="need a PayloadHeader"):
        encode(NetworkMessage((DataSetMessage(), DataSetMessage())))
    with pytest.raises(ValueError, match="does not match publisher_id_type"):
        encode(NetworkMessage((DataSetMessage(),), publisher_id=3))
    with pytest.raises(ValueError, match="does not fit"):
        encode(NetworkMessage((DataSetMessage(),), publisher_id=256, publisher_id_type=PublisherIdType.BYTE))
    with pytest.raises(ValueError, match="PromotedFields require exactly one"):
        encode(NetworkMessage((DataSetMessage(), DataSetMessage()), dataset_writer_ids=(1, 2), promoted_fields=()))
    with pytest.raises(ValueError, match="must be a ua.Variant"):
        encode(NetworkMessage((DataSetMessage((1.0,)),)))


# ---- fuzz --------------------------------------------------------------------------------------

def _corpus() -> list[bytes]:
    stamp = ua.datetime_to_win_epoch(dt.datetime(2024, 1, 1))
    dv = ua.DataValue(V([1, 2], T.Int32), SourceTimestamp=dt.datetime(2024, 1, 1, tzinfo=UTC), ServerPicoseconds=4)
    msgs = [
        NetworkMessage((DataSetMessage((V(1.0), V("x"), V(ua.LocalizedText("t", "en"), T.LocalizedText))),)),
        NetworkMessage((DataSetMessage((dv,), field_encoding=DATAVALUE, status=1, major_version=2),
                        DataSetMessage(((3, V(b"ab", T.ByteString)),), DELTA, timestamp=stamp, picoseconds=9),
                        DataSetMessage(message_type=KEEP, sequence_number=1),
                        DataSetMessage((V(ua.NodeId("n", 2), T.NodeId), V([[1.0], [2.0]], T.Double, [2, 1])), EVENT)),
                       "pub", dataset_class_id=uuid.UUID(int=7), writer_group_id=1, group_version=2,
                       network_message_number=3, sequence_number=4, dataset_writer_ids=(1, 2, 3, 4),
                       timestamp=stamp, picoseconds=5),
        NetworkMessage((DataSetMessage((V(ua.Range(0.0, 1.0), T.ExtensionObject), V([V(1), V(None)], T.Variant))),),
                       9, PublisherIdType.UINT64, promoted_fields=(V(2.0), V("p"))),
        _raw_message(publisher_id=1, publisher_id_type=PublisherIdType.BYTE, dataset_writer_ids=(5,)),
    ]
    out = [encode(m) for m in msgs]
    out.append(FixedLayout(6).encode(UadpMessage(7, 1, 1, 1, 1, 10**18, (1.0, 2.0, 3.0, 4.0, 5.0, 6.0))))
    out.append(_asyncua_message(ua.String("p"), [aua.UadpDataSetDataValue(_hdr(SequenceNo=1), [dv]),
                                                 aua.UadpDataSetKeepAlive(_hdr())], ids=(1, 2)).to_binary())
    return out


def _mutate(rng: random.Random, corpus: list[bytes]) -> bytes:
    data = bytearray(rng.choice(corpus))
    op = rng.randrange(6)
    if op == 0:  # random bytes, biased to start like a UADP message
        data = bytearray(rng.randbytes(rng.randrange(48)))
        if data and rng.random() < 0.7:
            data[0] = (data[0] & 0xF0) | 1
    elif op == 1:  # bit flips
        for _ in range(rng.randrange(1, 5)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif op == 2:  # truncation
        del data[rng.randrange(len(data) + 1):]
    elif op == 3:  # insert a valid message (or a slice of one) somewhere
        other = rng.choice(corpus)
        i = rng.randrange(len(data) + 1)
        data[i:i] = other[rng.randrange(len(other)):] if rng.random() < 0.5 else other
    elif op == 4:  # overwrite with boundary values (lengths, counts)
        for _ in range(rng.randrange(1, 4)):
            if data:
                i = rng.randrange(len(data))
                data[i:i + 4] = rng.choice([b"\xff\xff\xff\x7f", b"\xfe\xff\xff\xff", b"\x00\x00\x00\x00",
                                            b"\x80", b"\xff", b"\x00", b"\x7f\x00"])
    else:  # delete a span
        if data:
            i = rng.randrange(len(data))
            del data[i:i + rng.randrange(1, 8)]
    return bytes(data)


def test_fuzz_only_uadp_decode_errors(capsys):
    """100,000 random and mutated inputs (fixed seed): each decode returns or raises UadpDecodeError with
    an offset inside the input, never the catch-all for decoder bugs; every 16th accepted message is
    re-encoded, and its bytes decode and re-encode unchanged. About 2 s on a 2-core machine."""
    rng = random.Random(20260514)
    corpus = _corpus()
    for seed in corpus:
        decode(seed, [T.Boolean, T.Int16, T.Float, T.DateTime] if seed == corpus[3] else None)
    accepted = rejected = 0
    worst = 0
    t_start = time.perf_counter()
    for _ in range(100_000):
        data = _mutate(rng, corpus)
        t0 = time.perf_counter()
        try:
            msg = decode(data, [T.Boolean, T.Int16, T.Float, T.DateTime] if rng.random() < 0.2 else None)
        except UadpDecodeError as exc:
            assert 0 <= exc.offset <= len(data), (data, exc)
            assert not exc.reason.startswith("internal decoder error"), (data, exc)
            rejected += 1
        else:
            accepted += 1
            if accepted % 16 == 0:  # encode is total on decoded messages and the bytes are stable
                again = encode(msg)
                assert encode(decode(again, [T.Boolean, T.Int16, T.Float, T.DateTime]
                                     if any(m.field_encoding is RAW and m.fields for m in msg.messages)
                                     else None)) == again
        worst = max(worst, time.perf_counter() - t0)
    with capsys.disabled():
        print(f"\nfuzz: 100000 inputs, {accepted} accepted, {rejected} rejected, "
              f"{time.perf_counter() - t_start:.1f} s, slowest call {worst * 1e3:.2f} ms")
    assert accepted > 1000 and rejected > 50_000  # the mutations reach deep into valid structure


def test_a_truncated_diagnostic_info_names_a_byte_inside_the_message():
    """Found by the atheris UADP target: the index fields of a DiagnosticInfo were skipped before the
    bounds check, so the error named byte 28 of a 25-byte message."""
    import base64

    data = base64.b64decode("EQcBAwALAAEAAAAA+D8ZBz8LKv7AWBwAAA==")
    with pytest.raises(UadpDecodeError) as exc:
        decode(data)
    assert 0 <= exc.value.offset <= len(data)
    assert "truncated DiagnosticInfo: needs 13 bytes, 10 left" in str(exc.value)
