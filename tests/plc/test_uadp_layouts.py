"""The fast path for every PublisherId type a config can declare, `header_ids`, and the config side of it."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from asyncua import ua
from hypothesis import given, settings
from hypothesis import strategies as st

from plc.errors import UadpDecodeError
from plc.uadp import (DataSetMessage, NetworkMessage, PublisherIdType, RawDoubleLayout, UadpMessage, compile_layout,
                      decode, encode)
from plc.uadp.fixed import PUBLISHER_ID_TYPES, FixedLayout, header_ids

u16 = st.integers(0, 0xFFFF)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
stamps = st.integers(0, 2**60).map(lambda t: t * 100)
ID_VALUES = {
    "byte": st.integers(0, 0xFF), "uint16": u16, "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1),
    "string": st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=24),
}
WIRE_TYPE = {"byte": PublisherIdType.BYTE, "uint16": PublisherIdType.UINT16, "uint32": PublisherIdType.UINT32,
             "uint64": PublisherIdType.UINT64, "string": PublisherIdType.STRING}


@st.composite
def typed_messages(draw):
    kind = draw(st.sampled_from(sorted(PUBLISHER_ID_TYPES)))
    n = draw(st.integers(1, 24))
    msg = UadpMessage(draw(ID_VALUES[kind]), draw(u16), draw(u16), draw(u16), draw(u16), draw(stamps),
                      tuple(draw(st.lists(finite, min_size=n, max_size=n))))
    return kind, msg


@pytest.mark.parametrize("encoding", ["variant", "raw"])
@settings(max_examples=150)
@given(case=typed_messages())
def test_round_trip_for_every_publisher_id_type(encoding, case):
    """Encode/decode/decode_into agree, and the general decoder reads the same ids and values."""
    kind, msg = case
    layout = compile_layout(len(msg.values), encoding, kind, msg.publisher_id)
    data = layout.encode(msg)
    assert len(data) == layout.size
    assert layout.decode(data) == msg
    out = np.zeros(len(msg.values))
    head = layout.decode_into(data, out)
    assert head == (msg.publisher_id, msg.writer_group_id, msg.writer_id, msg.network_sequence,
                    msg.dataset_sequence, msg.timestamp_ns)
    assert out.tolist() == list(msg.values)
    general = decode(data, field_types=[ua.VariantType.Double] * len(msg.values))
    assert general.publisher_id == msg.publisher_id and general.publisher_id_type == WIRE_TYPE[kind]
    assert general.writer_group_id == msg.writer_group_id and general.dataset_writer_ids == (msg.writer_id,)
    assert [v.Value for v in general.messages[0].fields] == list(msg.values)
    assert header_ids(data) == (msg.publisher_id, msg.writer_group_id, (msg.writer_id,))


@pytest.mark.parametrize("kind,publisher_id", [("byte", 7), ("uint32", 70000), ("uint64", 2**63 + 5),
                                               ("string", "mill-1")])
def test_general_encoder_produces_the_fast_path_bytes(kind, publisher_id):
    """An independent encoding of the same NetworkMessage is byte-identical to the compiled layout's."""
    t_ticks = 133_000_000_000_000_000
    values = (1.0, -2.5, 3.25)
    ours = compile_layout(3, "variant", kind, publisher_id).encode(
        UadpMessage(publisher_id, 4, 5, 6, 7, (t_ticks - 116_444_736_000_000_000) * 100, values))
    theirs = encode(NetworkMessage(
        (DataSetMessage(tuple(ua.Variant(v, ua.VariantType.Double) for v in values), sequence_number=7,
                        timestamp=t_ticks),),
        publisher_id=publisher_id, publisher_id_type=WIRE_TYPE[kind], writer_group_id=4, sequence_number=6,
        dataset_writer_ids=(5,), timestamp=t_ticks))
    assert ours == theirs


@pytest.mark.parametrize("kind,publisher_id,shift", [("byte", 7, -1), ("uint16", 7, 0), ("uint32", 7, 2),
                                                     ("uint64", 7, 6), ("string", "abc", 5)])
@pytest.mark.parametrize("at,value,reason", [
    (4, 0x01, "GroupFlags"), (9, 2, "2 DataSetMessages"), (20, 0x8B, "DataSetFlags1"), (21, 0x11, "DataSetFlags2"),
    (32, 5, "FieldCount 5"), (34, 0x06, "field 0 has Variant type 0x06"),
])
def test_errors_name_the_byte_for_every_id_type(kind, publisher_id, shift, at, value, reason):
    """Every byte after the PublisherId moves with its size; the errors' offsets move with it."""
    layout = FixedLayout(2, kind, publisher_id)
    data = bytearray(layout.encode(UadpMessage(publisher_id, 1, 1, 1, 1, 0, (1.0, 2.0))))
    data[at + shift] = value
    with pytest.raises(UadpDecodeError) as exc:
        layout.decode(bytes(data))
    assert reason in exc.value.reason and exc.value.offset == at + shift


def test_another_id_type_is_named():
    data = bytearray(FixedLayout(1).encode(UadpMessage(7, 1, 1, 1, 1, 0, (1.0,))))
    data[1] = 0x22  # ExtendedFlags1: a UInt32 PublisherId
    with pytest.raises(UadpDecodeError) as exc:
        FixedLayout(1).decode(bytes(data))
    assert exc.value.offset == 1 and "uint32 PublisherId, layout expects uint16" in exc.value.reason


def test_string_id_length_and_utf8_errors():
    layout = FixedLayout(1, "string", "ab")
    data = bytearray(layout.encode(UadpMessage("ab", 1, 1, 1, 1, 0, (1.0,))))
    bad_length = bytearray(data)
    struct.pack_into("<i", bad_length, 2, 3)
    with pytest.raises(UadpDecodeError) as exc:
        layout.decode(bytes(bad_length))
    assert exc.value.offset == 2 and "String length 3" in exc.value.reason
    data[6] = 0xFF  # not UTF-8
    with pytest.raises(UadpDecodeError) as exc:
        layout.decode(bytes(data))
    assert exc.value.offset == 6 and "not valid UTF-8" in exc.value.reason
    raw = RawDoubleLayout(1, "string", "ab")
    rdata = bytearray(raw.encode(UadpMessage("ab", 1, 1, 1, 1, 0, (1.0,))))
    struct.pack_into("<i", rdata, 2, 1)
    with pytest.raises(UadpDecodeError) as exc:
        raw.decode(bytes(rdata))
    assert exc.value.offset == 2


@pytest.mark.parametrize("kind,publisher_id,message", [
    ("byte", 256, "does not fit publisher_id_type byte"),
    ("uint16", -1, "does not fit publisher_id_type uint16"),
    ("string", 7, "needs a non-empty str publisher_id"),
    ("string", "", "needs a non-empty str publisher_id"),
    ("int8", 1, "choose one of byte, uint16"),
])
def test_compile_refuses_an_id_that_does_not_fit(kind, publisher_id, message):
    with pytest.raises(ValueError, match=message):
        compile_layout(2, "variant", kind, publisher_id)


def test_encoder_names_an_id_that_does_not_fit():
    with pytest.raises(ValueError, match="publisher_id 300 does not fit the layout's PublisherId type byte"):
        FixedLayout(1, "byte").encode(UadpMessage(300, 1, 1, 1, 1, 0, (1.0,)))
    with pytest.raises(ValueError, match="the layout was compiled for a 2-byte String id"):
        RawDoubleLayout(1, "string", "ab").encode(UadpMessage("abc", 1, 1, 1, 1, 0, (1.0,)))


@pytest.mark.parametrize("kind,publisher_id", [("byte", 1), ("uint64", 1), ("string", "plc")])
@given(data=st.binary(max_size=90))
def test_arbitrary_bytes_raise_only_decode_errors(kind, publisher_id, data):
    for layout in (FixedLayout(3, kind, publisher_id), RawDoubleLayout(3, kind, publisher_id)):
        try:
            layout.decode(data)
        except UadpDecodeError as exc:
            assert 0 <= exc.offset <= len(data)
    try:
        header_ids(data)
    except UadpDecodeError as exc:
        assert 0 <= exc.offset <= len(data)


@settings(max_examples=200)
@given(pid=st.none() | st.integers(0, 2**32 - 1) | st.text(min_size=1, max_size=8), group=st.none() | u16,
       writers=st.none() | st.lists(u16, min_size=1, max_size=4).map(tuple), seq=st.none() | u16,
       version=st.none() | st.integers(0, 2**32 - 1), class_id=st.booleans(), pico=st.none() | u16)
def test_header_ids_agree_with_the_general_decoder(pid, group, writers, seq, version, class_id, pico):
    import uuid

    kind = None if pid is None else (PublisherIdType.STRING if isinstance(pid, str) else PublisherIdType.UINT32)
    messages = tuple(DataSetMessage((ua.Variant(1.5),), sequence_number=1) for _ in (writers or (0,)))
    data = encode(NetworkMessage(messages, publisher_id=pid, publisher_id_type=kind,
                                 dataset_class_id=uuid.UUID(int=5) if class_id else None, writer_group_id=group,
                                 group_version=version, sequence_number=seq, dataset_writer_ids=writers,
                                 timestamp=5 if pico is not None else None, picoseconds=pico))
    full = decode(data)
    assert header_ids(data) == (full.publisher_id, full.writer_group_id, full.dataset_writer_ids)


def test_header_ids_refuse_what_is_not_uadp():
    with pytest.raises(UadpDecodeError, match="UADP version 0"):
        header_ids(b"\x00garbage")
    with pytest.raises(UadpDecodeError, match="truncated NetworkMessage header"):
        header_ids(b"\xf1\x21\x07")
    with pytest.raises(UadpDecodeError, match="String length 100"):
        header_ids(b"\x91\x24" + struct.pack("<i", 100) + b"abc")
    with pytest.raises(UadpDecodeError, match="reserved"):
        header_ids(b"\x91\x25\x00")


# ---- the config side: sitsd.schema's transport sections --------------------------------------------

def _transport(**fields):
    from sitsd.schema import UadpEthTransport, UadpUdpTransport

    base = {"writer_group_id": 1, "dataset_writer_id": 1}
    udp = UadpUdpTransport(kind="uadp-udp", url="opc.udp://239.0.0.1:4840", **base, **fields)
    eth = UadpEthTransport(kind="uadp-eth", url="opc.eth://01-00-5E-7F-00-01", interface="eth1", **base, **fields)
    assert (udp.publisher_id, udp.publisher_id_type) == (eth.publisher_id, eth.publisher_id_type)
    return udp


@pytest.mark.parametrize("fields,want", [
    ({"publisher_id": 7}, (7, "uint16")),  # existing configs are unchanged
    ({"publisher_id": "7"}, (7, "uint16")),  # a quoted number still reads as a number
    ({"publisher_id": 70000, "publisher_id_type": "uint32"}, (70000, "uint32")),
    ({"publisher_id": 2**64 - 1, "publisher_id_type": "uint64"}, (2**64 - 1, "uint64")),
    ({"publisher_id": "mill-1", "publisher_id_type": "string"}, ("mill-1", "string")),
    ({"publisher_id": 255, "publisher_id_type": "byte"}, (255, "byte")),
])
def test_config_publisher_id_types(fields, want):
    t = _transport(**fields)
    assert (t.publisher_id, t.publisher_id_type) == want
    layout = compile_layout(3, t.field_encoding, t.publisher_id_type, t.publisher_id)
    msg = UadpMessage(t.publisher_id, 1, 1, 1, 1, 0, (1.0, 2.0, 3.0))
    assert layout.decode(layout.encode(msg)) == msg


@pytest.mark.parametrize("fields,message", [
    ({"publisher_id": 70000}, "70000 does not fit publisher_id_type uint16 (0..65535); set publisher_id_type"),
    ({"publisher_id": 256, "publisher_id_type": "byte"}, "does not fit publisher_id_type byte"),
    ({"publisher_id": -1}, "does not fit publisher_id_type uint16"),
    ({"publisher_id": "mill-1"}, "'mill-1' is not a number, but publisher_id_type is uint16"),
    ({"publisher_id": 7, "publisher_id_type": "string"}, 'quote the id, e.g. publisher_id: "7"'),
    ({"publisher_id": "", "publisher_id_type": "string"}, "1..1024 UTF-8 bytes"),
    ({"publisher_id": 1, "publisher_id_type": "int8"}, "'byte', 'uint16', 'uint32', 'uint64' or 'string'"),
])
def test_config_refuses_an_id_that_does_not_fit_its_type(fields, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as exc:
        _transport(**fields)
    assert message in str(exc.value)
    assert exc.value.errors()[0]["loc"][0] in ("publisher_id", "publisher_id_type")
