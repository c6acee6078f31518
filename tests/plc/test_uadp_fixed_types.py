"""The compiled fast path for layouts of mixed fixed-size field types: it agrees with the general decoder
(values and the float64 the loop gets), refuses what the layout does not declare (the frame source then
takes the general decoder), and the config names the types."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from asyncua import ua
from hypothesis import given, settings
from hypothesis import strategies as st

from plc.errors import UadpDecodeError
from plc.frame import RxStampSource
from plc.socket_source import UadpSocketSource
from plc.uadp import (FIELD_TYPES, DataSetMessage, FieldEncoding, NetworkMessage, PublisherIdType, RawLayout,
                      UadpMessage, compile_layout, decode, encode)
from plc.uadp.fixed import PUBLISHER_ID_TYPES, datetime_ticks_from_ns, field_types_of

T = ua.VariantType
VALUES = {
    T.Boolean: st.booleans(), T.SByte: st.integers(-2**7, 2**7 - 1), T.Byte: st.integers(0, 2**8 - 1),
    T.Int16: st.integers(-2**15, 2**15 - 1), T.UInt16: st.integers(0, 2**16 - 1),
    T.Int32: st.integers(-2**31, 2**31 - 1), T.UInt32: st.integers(0, 2**32 - 1),
    T.Int64: st.integers(-2**63, 2**63 - 1), T.UInt64: st.integers(0, 2**64 - 1),
    T.Float: st.floats(width=32), T.Double: st.floats(),  # NaN and the infinities included
}
ID_VALUES = {
    "byte": st.integers(0, 0xFF), "uint16": st.integers(0, 0xFFFF), "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1),
    "string": st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12),
}
WIRE_ID = {"byte": PublisherIdType.BYTE, "uint16": PublisherIdType.UINT16, "uint32": PublisherIdType.UINT32,
           "uint64": PublisherIdType.UINT64, "string": PublisherIdType.STRING}
ENCODINGS = {"variant": FieldEncoding.VARIANT, "raw": FieldEncoding.RAW_DATA}
USER = RxStampSource.USER


@st.composite
def typed_layouts(draw):
    """(publisher id type, field types, UadpMessage) with values of each field's type."""
    kind = draw(st.sampled_from(sorted(PUBLISHER_ID_TYPES)))
    types = tuple(draw(st.lists(st.sampled_from(list(VALUES)), min_size=1, max_size=16)))
    values = tuple(draw(VALUES[t]) for t in types)
    u16 = st.integers(0, 0xFFFF)
    msg = UadpMessage(draw(ID_VALUES[kind]), draw(u16), draw(u16), draw(u16), draw(u16),
                      draw(st.integers(0, 2**60)) * 100, values)
    return kind, types, msg


def general_message(msg: UadpMessage, types, encoding: FieldEncoding, kind: str, **dataset) -> NetworkMessage:
    """The fast path's message as the general codec's model: the same bytes come out of `encode`."""
    ticks = datetime_ticks_from_ns(msg.timestamp_ns)
    fields = tuple(ua.Variant(v, t) for v, t in zip(msg.values, types))
    if encoding is FieldEncoding.DATA_VALUE:
        fields = tuple(ua.DataValue(f) for f in fields)
    return NetworkMessage(
        (DataSetMessage(fields, field_encoding=encoding, sequence_number=msg.dataset_sequence, timestamp=ticks,
                        **dataset),),
        publisher_id=msg.publisher_id, publisher_id_type=WIRE_ID[kind], writer_group_id=msg.writer_group_id,
        sequence_number=msg.network_sequence, dataset_writer_ids=(msg.writer_id,), timestamp=ticks)


def same(a, b) -> bool:
    """Equal values, NaN equal to NaN and -0.0 told from 0.0 (the loop sees the bits)."""
    return len(a) == len(b) and all(
        type(x) is type(y) and (struct.pack("<d", x) == struct.pack("<d", y) if isinstance(x, float) else x == y)
        for x, y in zip(a, b))


@pytest.mark.parametrize("encoding", ["variant", "raw"])
@settings(max_examples=200, deadline=None)
@given(case=typed_layouts())
def test_fast_path_agrees_with_the_general_codec_on_mixed_layouts(encoding, case):
    kind, types, msg = case
    layout = compile_layout(len(types), encoding, kind, msg.publisher_id, field_types=[t.name for t in types])
    assert layout.field_types == types
    data = encode(general_message(msg, types, ENCODINGS[encoding], kind))
    # the general encoder writes the layout's bytes, and the fast path's encoder writes them too
    assert layout.encode(msg) == data and len(data) == layout.size
    got = layout.decode(data)
    general = decode(data, field_types=types).messages[0]
    assert same(got.values, [f.Value for f in general.fields])
    assert same(got.values, msg.values)
    assert (got.publisher_id, got.writer_group_id, got.writer_id, got.network_sequence, got.dataset_sequence,
            got.timestamp_ns) == (msg.publisher_id, msg.writer_group_id, msg.writer_id, msg.network_sequence,
                                  msg.dataset_sequence, msg.timestamp_ns)
    # the loop's float64 values: what the general decoder's fallback writes, bit for bit
    out = np.full(len(types), -1.0)
    layout.decode_into(data, out)
    ref = np.zeros(len(types))
    for i, f in enumerate(general.fields):
        ref[i] = f.Value
    assert out.tobytes() == ref.tobytes()


@settings(max_examples=100, deadline=None)
@given(case=typed_layouts())
def test_frame_source_fast_path_and_fallback_deliver_the_same_values(case):
    """One message over the fast path (Variant fields) and as DataValue fields (the fast path refuses:
    the general decoder): the Frames carry the same float64 values."""
    kind, types, msg = case
    layout = compile_layout(len(types), "variant", kind, msg.publisher_id, field_types=types)
    source = UadpSocketSource(None, layout, msg.publisher_id, msg.writer_id, buffer_size=0,
                              writer_group_id=msg.writer_group_id)
    fast = source._frame(layout.encode(msg), 0, USER)
    assert fast is not None and source.fallback_decodes == 0
    fast_values = fast.values.copy()
    slow = source._frame(encode(general_message(msg, types, FieldEncoding.DATA_VALUE, kind)), 0, USER)
    assert slow is not None and source.fallback_decodes == 1 and source.malformed == 0, source.last_error
    assert slow.values.tobytes() == fast_values.tobytes()
    assert (slow.sequence_number, slow.sender_timestamp_ns) == (fast.sequence_number, fast.sender_timestamp_ns)


# ---- refusal: what the layout does not declare -----------------------------------------------------

LAYOUT = ("double", "int32", "boolean", "uint16", "float")
LAYOUT_VALUES = (1.5, -70000, True, 65535, 0.25)


def _message(values=LAYOUT_VALUES, types=None, encoding=FieldEncoding.VARIANT, seq=5):
    types = types or field_types_of(LAYOUT)
    return encode(general_message(UadpMessage(7, 1, 2, seq, seq, 10**18, values), types, encoding, "uint16"))


@pytest.mark.parametrize("swap,reason", [
    (T.Float, "field 1 has Variant type 0x0a (Float), layout expects Int32 (0x06)"),  # same size
    (T.Int16, "field 1 has Variant type 0x04 (Int16), layout expects Int32 (0x06)"),  # shorter: named with the size
    (T.Double, "field 1 has Variant type 0x0b (Double), layout expects Int32 (0x06)"),  # longer
])
def test_a_field_of_another_type_is_refused_and_the_fallback_delivers_it(swap, reason):
    layout = compile_layout(5, "variant", field_types=LAYOUT)
    types = list(field_types_of(LAYOUT))
    types[1] = swap
    values = list(LAYOUT_VALUES)
    values[1] = -7.5 if swap in (T.Float, T.Double) else -7
    data = _message(tuple(values), tuple(types))
    with pytest.raises(UadpDecodeError) as exc:
        layout.decode(data)
    assert reason in exc.value.reason
    if len(data) == layout.size:
        assert exc.value.offset == layout._header.size + 9  # field 1's tag, after the Double's 9 bytes
    source = UadpSocketSource(None, layout, 7, 2, buffer_size=0, writer_group_id=1)
    frame = source._frame(data, 0, USER)
    assert frame is not None and frame.values.tolist() == [1.5, values[1], 1.0, 65535.0, 0.25]
    assert (source.fallback_decodes, source.malformed) == (1, 0)
    assert reason in source.last_fallback_reason
    # and the layout's own message still takes the fast path
    assert source._frame(_message(), 0, USER).values.tolist() == [1.5, -70000.0, 1.0, 65535.0, 0.25]
    assert source.fallback_decodes == 1


def test_an_array_or_string_field_is_refused_and_counted():
    layout = compile_layout(5, "variant", field_types=LAYOUT)
    V = ua.Variant
    fields = (V(1.5, T.Double), V("x", T.String), V(True, T.Boolean), V(1, T.UInt16), V(0.5, T.Float))
    data = encode(NetworkMessage((DataSetMessage(fields, sequence_number=1, timestamp=10**17),),
                                 publisher_id=7, publisher_id_type=PublisherIdType.UINT16, writer_group_id=1,
                                 sequence_number=1, dataset_writer_ids=(2,), timestamp=10**17))
    with pytest.raises(UadpDecodeError, match=r"field 1 has Variant type 0x0c \(String\)"):
        layout.decode(data)
    source = UadpSocketSource(None, layout, 7, 2, buffer_size=0, writer_group_id=1)
    assert source._frame(data, 0, USER) is None
    assert (source.fallback_decodes, source.malformed) == (0, 1)
    assert "field 1 of String" in str(source.last_error)


def test_raw_data_of_another_size_is_refused_and_counted_malformed():
    """RawData carries no tags: a publisher's other types show only as another size, and the general
    decoder, reading the configured types, refuses it too (counted malformed, never delivered)."""
    layout = compile_layout(5, "raw", field_types=LAYOUT)
    source = UadpSocketSource(None, layout, 7, 2, buffer_size=0, writer_group_id=1)
    good = _message(encoding=FieldEncoding.RAW_DATA)
    assert layout.decode(good).values == LAYOUT_VALUES
    assert source._frame(good, 0, USER).values.tolist() == [1.5, -70000.0, 1.0, 65535.0, 0.25]
    types = list(field_types_of(LAYOUT))
    types[1] = T.Int64
    other = _message(types=tuple(types), encoding=FieldEncoding.RAW_DATA)
    with pytest.raises(UadpDecodeError, match=r"message is 55 bytes, RawData layout with a uint16 PublisherId and "
                                              r"5 fields \(Double, Int32, Boolean, UInt16, Float\) is 51"):
        layout.decode(other)
    assert source._frame(other, 0, USER) is None
    assert (source.fallback_decodes, source.malformed) == (0, 1)
    assert "trailing bytes" in str(source.last_error)


def test_a_double_layout_names_the_first_foreign_tag():
    layout = compile_layout(3)
    data = _message((1.0, 2, 3.0), (T.Double, T.Int16, T.Double))
    with pytest.raises(UadpDecodeError, match=r"message is 55 bytes, layout with a uint16 PublisherId and 3 Double "
                                              r"fields is 61 \(field 1 has Variant type 0x04 \(Int16\)"):
        layout.decode(data)


# ---- compiling and encoding -------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["variant", "raw"])
def test_sizes_and_names(encoding):
    types = ["Boolean", "sbyte", T.Byte, int(T.Int16), "UINT16", "int32", "uint32", "int64", "uint64", "float",
             "double"]
    layout = compile_layout(11, encoding, field_types=types)
    assert layout.field_types == tuple(FIELD_TYPES.values())
    payload = 1 + 1 + 1 + 2 + 2 + 4 + 4 + 8 + 8 + 4 + 8
    header = 32 if encoding == "raw" else 34  # with a UInt16 id; the Variant layout adds the FieldCount
    assert layout.size == header + payload + (11 if encoding == "variant" else 0)
    assert isinstance(compile_layout(2, "raw"), RawLayout) and compile_layout(2).field_types == (T.Double,) * 2


@pytest.mark.parametrize("fields,field_types,message", [
    (2, ["double", "datetime"], "field 1 is DateTime: the loop takes numeric values"),
    (1, [T.DateTime], "field 0 is DateTime"),
    (1, ["string"], "field 0 has type 'string'; a compiled layout carries fixed-size numeric scalars: boolean"),
    (1, [T.Guid], "field 0 has type"),
    (1, [99], "field 0 has type 99"),
    (1, [True], "field 0 has type True"),
    (3, ["double", "int16"], "2 field types for 3 fields"),
    (1, [], "a layout has 1..1024 fields, got 0"),
    (1, "double", "must be a sequence of types"),
    (0, None, "field_count must be 1..1024, got 0"),
])
def test_compile_refuses_what_it_cannot_carry(fields, field_types, message):
    with pytest.raises(ValueError) as exc:
        compile_layout(fields, "variant", field_types=field_types)
    assert message in str(exc.value)


@pytest.mark.parametrize("encoding", ["variant", "raw"])
@pytest.mark.parametrize("values,message", [
    ((1.5, 2.0, True, 1, 0.5), "field 1 = 2.0 does not fit its type Int32"),
    ((1.5, 2**31, True, 1, 0.5), "field 1 = 2147483648 does not fit its type Int32"),
    ((1.5, 1, True, -1, 0.5), "field 3 = -1 does not fit its type UInt16"),
    ((1.5, 1, True, 1, "x"), "field 4 = 'x' does not fit its type Float"),
])
def test_encoder_names_a_value_that_does_not_fit(encoding, values, message):
    layout = compile_layout(5, encoding, field_types=LAYOUT)
    with pytest.raises(ValueError) as exc:
        layout.encode(UadpMessage(7, 1, 2, 1, 1, 0, values))
    assert message in str(exc.value)


# ---- the config side ------------------------------------------------------------------------------

def _makers():
    from sitsd.schema import UadpEthTransport, UadpUdpTransport

    base = {"writer_group_id": 1, "dataset_writer_id": 1, "publisher_id": 7}
    return (lambda **f: UadpUdpTransport(kind="uadp-udp", url="opc.udp://239.0.0.1:4840", **base, **f),
            lambda **f: UadpEthTransport(kind="uadp-eth", url="opc.eth://01-00-5E-7F-00-01", interface="eth1",
                                         **base, **f))


def _transports(**fields):
    return tuple(make(**fields) for make in _makers())


def test_config_field_types_compile():
    for t in _transports(field_types=["Double", "int32", "BOOLEAN", "uint16", "float"], field_encoding="raw"):
        assert t.field_types == LAYOUT
        layout = compile_layout(5, t.field_encoding, t.publisher_id_type, t.publisher_id, field_types=t.field_types)
        assert layout.decode(_message(encoding=FieldEncoding.RAW_DATA)).values == LAYOUT_VALUES
    for t in _transports():  # existing configs: all Double
        assert t.field_types is None
        assert compile_layout(3, t.field_encoding, field_types=t.field_types).field_types == (T.Double,) * 3


@pytest.mark.parametrize("field_types,message", [
    (["double", "datetime"], "field_types[1] is datetime"),
    (["string"], "Input should be 'boolean', 'sbyte'"),
    ([], "at least 1 item"),
])
def test_config_refuses_field_types_it_cannot_compile(field_types, message):
    from pydantic import ValidationError

    for make in _makers():
        with pytest.raises(ValidationError) as exc:
            make(field_types=field_types)
        assert message in str(exc.value)
        assert exc.value.errors()[0]["loc"][0] == "field_types"


def test_a_config_needs_one_field_type_per_signal():
    from sitsd.config import ConfigError, load_config

    from ..conftest import EXAMPLE_CONFIG

    n = len(load_config(EXAMPLE_CONFIG).signals)
    cfg = load_config(EXAMPLE_CONFIG, {"transport.field_types": ["double"] * (n - 1) + ["int32"]})
    assert cfg.transport.field_types[-1] == "int32"
    with pytest.raises(ConfigError) as exc:
        load_config(EXAMPLE_CONFIG, {"transport.field_types": ["double"] * (n - 1)})
    assert exc.value.problems[0][0] == "transport.field_types"
    assert f"{n - 1} types for {n} signals" in str(exc.value) and "leave field_types out" in str(exc.value)
