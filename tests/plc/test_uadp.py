import struct

import numpy as np
import pytest
from asyncua.common.utils import Buffer
from asyncua.pubsub.uadp import UadpNetworkMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from plc.errors import UadpDecodeError
from plc.uadp import FixedLayout, UadpMessage, datetime_ticks_from_ns, ns_from_datetime_ticks

u16 = st.integers(0, 0xFFFF)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
# DateTime is 100 ns ticks: keep to multiples of 100 ns within Int64's range
stamps = st.integers(0, 2**60).map(lambda t: t * 100)


@st.composite
def messages(draw, n=None):
    n = n or draw(st.integers(1, 40))
    return UadpMessage(draw(u16), draw(u16), draw(u16), draw(u16), draw(u16), draw(stamps),
                       tuple(draw(st.lists(finite, min_size=n, max_size=n))))


@given(messages())
def test_round_trip(msg):
    layout = FixedLayout(len(msg.values))
    assert layout.decode(layout.encode(msg)) == msg


@settings(max_examples=50)
@given(messages())
def test_asyncua_decodes_our_encoding(msg):
    """asyncua's general UADP decoder is an independent implementation of Part 14."""
    data = FixedLayout(len(msg.values)).encode(msg)
    net = UadpNetworkMessage.from_binary(Buffer(data))
    assert net.Header.PublisherId == msg.publisher_id
    assert net.GroupHeader.WriterGroupId == msg.writer_group_id
    assert net.GroupHeader.SequenceNo == msg.network_sequence
    assert net.DataSetPayloadHeader == [msg.writer_id]
    (ds,) = net.Payload
    assert ds.Header.SequenceNo == msg.dataset_sequence
    assert [v.Value for v in ds.Data] == list(msg.values)


def test_datetime_ticks_epoch():
    # 1970-01-01 is 116444736000000000 ticks after 1601-01-01 (published FILETIME constant)
    assert datetime_ticks_from_ns(0) == 116444736000000000
    assert ns_from_datetime_ticks(116444736000000000 + 10_000_000) == 1_000_000_000


def test_decode_into_preallocated_buffer():
    layout = FixedLayout(3)
    out = np.zeros(3)
    head = layout.decode_into(layout.encode(UadpMessage(7, 1, 2, 3, 4, 500, (1.0, 2.0, 3.0))), out)
    assert head == (7, 1, 2, 3, 4, 500)
    assert out.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("offset,value,reason", [
    (0, 0xF2, "UADP version 2"),
    (0, 0xB1, "UADPFlags"),
    (1, 0x23, "ExtendedFlags1"),
    (4, 0x01, "GroupFlags"),
    (9, 2, "2 DataSetMessages"),
    (20, 0x8B, "DataSetFlags1"),
    (21, 0x11, "DataSetFlags2"),
    (32, 5, "FieldCount 5"),
    (34, 0x06, "field 0 has Variant type 0x06"),
    (43, 0x01, "field 1 has Variant type 0x01"),
])
def test_malformed_fields_name_offset_and_reason(offset, value, reason):
    layout = FixedLayout(2)
    data = bytearray(layout.encode(UadpMessage(1, 1, 1, 1, 1, 0, (1.0, 2.0))))
    data[offset] = value
    with pytest.raises(UadpDecodeError) as exc:
        layout.decode(bytes(data))
    assert reason in str(exc.value)
    assert exc.value.offset == offset


@given(st.binary(max_size=80))
def test_arbitrary_bytes_raise_only_decode_errors(data):
    layout = FixedLayout(4)
    try:
        msg = layout.decode(data)
    except UadpDecodeError as exc:
        assert 0 <= exc.offset <= len(data)
    else:
        assert len(msg.values) == 4


def test_truncated_message():
    layout = FixedLayout(2)
    data = layout.encode(UadpMessage(1, 1, 1, 1, 1, 0, (1.0, 2.0)))
    with pytest.raises(UadpDecodeError, match=f"is {len(data) - 1} bytes"):
        layout.decode(data[:-1])


def test_header_matches_documented_layout():
    data = FixedLayout(1).encode(UadpMessage(0x1234, 5, 6, 7, 8, 0, (0.5,)))
    flags, ext1, pub = struct.unpack_from("<BBH", data)
    assert (flags, ext1, pub) == (0xF1, 0x21, 0x1234)
    assert data[34] == 0x0B and struct.unpack_from("<d", data, 35) == (0.5,)


@given(messages())
def test_raw_layout_round_trip_and_general_decoder_agrees(msg):
    from asyncua import ua

    from plc.uadp import FieldEncoding, RawDoubleLayout, decode

    layout = RawDoubleLayout(len(msg.values))
    data = layout.encode(msg)
    assert layout.decode(data) == msg
    general = decode(data, field_types=[ua.VariantType.Double] * len(msg.values))
    (ds,) = general.messages
    assert ds.field_encoding == FieldEncoding.RAW_DATA
    assert [v.Value for v in ds.fields] == list(msg.values)


def test_raw_layout_errors_name_the_byte():
    from plc.uadp import RawDoubleLayout

    layout = RawDoubleLayout(2)
    data = bytearray(layout.encode(UadpMessage(1, 1, 1, 1, 1, 0, (1.0, 2.0))))
    data[20] = 0x89  # Variant encoding announced where the layout says RawData
    with pytest.raises(UadpDecodeError) as exc:
        layout.decode(bytes(data))
    assert exc.value.offset == 20 and "DataSetFlags1 0x89" in str(exc.value)
