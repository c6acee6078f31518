"""UdpFrameSource on loopback multicast: every PublisherId type from the simulator, writer-group filtering,
the general-decoder fallback for messages the fast path refuses, and what stays malformed."""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from asyncua import ua

from plc.simulator.physics import SIGNALS
from plc.simulator.server import RollingMillSimulator, SimulatorSettings
from plc.uadp import (DataSetMessage, DataSetMessageType, FieldEncoding, NetworkMessage, PublisherIdType,
                      UadpMessage, compile_layout)
from plc.uadp import encode as encode_general
from plc.uadp.fixed import datetime_ticks_from_ns
from plc.udp import UdpFrameSource

from ..conftest import multicast_group_url, udp_loopback

V, T = ua.Variant, ua.VariantType
VALUES = (1.5, -2.0, 3.25)


@pytest.fixture
def link():
    """A source for publisher 7, writer group 1, writer 2 with three Variant Double fields, and a publisher."""
    layout = compile_layout(3)
    source, pub = udp_loopback(layout, publisher_id=7, writer_id=2, writer_group_id=1)
    yield source, pub, layout
    source.close()
    pub.close()


def _general(seq: int, fields=None, *, publisher_id=7, group=1, writers=(2,), encoding=FieldEncoding.VARIANT,
             kind=DataSetMessageType.KEY_FRAME, t_ns: int | None = None, **extra) -> bytes:
    """Our layout's message from the general encoder, with whatever the test changes."""
    ticks = datetime_ticks_from_ns(t_ns if t_ns is not None else time.time_ns())
    if fields is None:
        fields = tuple(V(v, T.Double) for v in VALUES)
    if isinstance(publisher_id, int):
        extra.setdefault("publisher_id_type", PublisherIdType.UINT16)
    ds_extra = {k: extra.pop(k) for k in ("status", "valid", "major_version") if k in extra}
    messages = tuple(DataSetMessage(fields, kind, encoding, sequence_number=seq, timestamp=ticks, **ds_extra)
                     for _ in (writers or (0,)))
    return encode_general(NetworkMessage(messages, publisher_id=publisher_id, writer_group_id=group,
                                         sequence_number=seq, dataset_writer_ids=writers, timestamp=ticks, **extra))


def _drain(source, timeout_s: float = 0.3):
    frames = []
    while (frame := source.receive(timeout_s)) is not None:
        frames.append((frame.publisher_id, frame.writer_id, frame.sequence_number, frame.values.tolist()))
    return frames


# ---- the simulator publishes every PublisherId type; the daemon's source reads it on the fast path ----

@pytest.mark.parametrize("kind,publisher_id,encoding", [
    ("byte", 200, "variant"), ("uint16", 7, "variant"), ("uint32", 70_000, "variant"),
    ("uint64", 2**63 + 11, "raw"), ("string", "walzwerk-3 / Gerüst 2", "variant"), ("string", "plc", "raw"),
])
def test_simulator_publishes_every_publisher_id_type_end_to_end(kind, publisher_id, encoding):
    url = multicast_group_url()
    layout = compile_layout(len(SIGNALS), encoding, kind, publisher_id)
    source = UdpFrameSource(url, layout, "127.0.0.1", publisher_id=publisher_id, writer_id=1, writer_group_id=1)
    sim = RollingMillSimulator(SimulatorSettings(udp_url=url, rate_hz=200.0, publisher_id=publisher_id,
                                                 publisher_id_type=kind, field_encoding=encoding), verifier=None)
    publisher = threading.Thread(target=sim.run_publisher, args=(0.25,), daemon=True)
    publisher.start()
    try:
        frames = []
        while (frame := source.receive(1.0)) is not None:
            frames.append((frame.publisher_id, frame.writer_id, frame.sequence_number, frame.values.copy()))
        publisher.join(2)
        assert len(frames) >= 20
        assert {f[0] for f in frames} == {publisher_id} and {f[1] for f in frames} == {1}
        seqs = [f[2] for f in frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # in order, none lost on loopback
        assert 3.0 < frames[-1][3][0] < 5.0  # entry thickness, mm: real physics values, not zeros
        assert (source.malformed, source.foreign, source.fallback_decodes) == (0, 0, 0)  # all on the fast path
    finally:
        sim.stop()
        source.close()


def test_a_string_id_of_another_length_is_foreign_not_malformed():
    """The String layout is compiled for the configured id's length; other ids are told apart by their headers."""
    layout = compile_layout(2, "variant", "string", "line-1")
    source, pub = udp_loopback(layout, publisher_id="line-1", writer_id=1, writer_group_id=1)
    try:
        pub.send(compile_layout(2, "variant", "string", "line-12").encode(
            UadpMessage("line-12", 1, 1, 1, 1, time.time_ns(), (0.0, 0.0))))
        pub.send(compile_layout(2, "variant", "string", "line-2").encode(  # same length, other id
            UadpMessage("line-2", 1, 1, 2, 2, time.time_ns(), (0.0, 0.0))))
        pub.send(compile_layout(2, "variant", "uint16").encode(UadpMessage(7, 1, 1, 3, 3, time.time_ns(), (0.0, 0.0))))
        pub.send(layout.encode(UadpMessage("line-1", 1, 1, 4, 4, time.time_ns(), (1.0, 2.0))))
        assert _drain(source) == [("line-1", 1, 4, [1.0, 2.0])]
        assert (source.foreign, source.malformed, source.fallback_decodes) == (3, 0, 0)
    finally:
        source.close()
        pub.close()


# ---- writer groups -------------------------------------------------------------------------------

def test_other_writer_groups_are_skipped_and_counted(link):
    source, pub, layout = link
    now = time.time_ns()
    pub.send(layout.encode(UadpMessage(7, 2, 2, 1, 1, now, VALUES)))  # writer group 2: fast path, filtered
    pub.send(_general(2, encoding=FieldEncoding.DATA_VALUE, group=3,  # group 3 on the fallback path
                      fields=tuple(ua.DataValue(V(v, T.Double)) for v in VALUES)))
    pub.send(layout.encode(UadpMessage(7, 1, 3, 3, 3, now, VALUES)))  # right group, writer 3
    pub.send(layout.encode(UadpMessage(7, 1, 2, 4, 4, now, VALUES)))
    assert _drain(source) == [(7, 2, 4, list(VALUES))]
    assert (source.foreign, source.malformed, source.fallback_decodes) == (3, 0, 0)


def test_no_writer_group_configured_accepts_every_group():
    layout = compile_layout(1)
    source, pub = udp_loopback(layout, publisher_id=7, writer_id=1)
    try:
        for group in (1, 9):
            pub.send(layout.encode(UadpMessage(7, group, 1, group, group, time.time_ns(), (1.0,))))
        assert [f[2] for f in _drain(source)] == [1, 9] and source.foreign == 0
    finally:
        source.close()
        pub.close()


# ---- the fallback: well-formed UADP the fast path refuses ------------------------------------------

@pytest.mark.parametrize("name,build,reason", [
    ("DataValue fields", lambda seq: _general(seq, tuple(ua.DataValue(V(v, T.Double), SourceTimestamp=None)
                                                         for v in VALUES), encoding=FieldEncoding.DATA_VALUE),
     "DataSetFlags1 0x8d"),
    ("NetworkMessage PicoSeconds flag", lambda seq: _general(seq, picoseconds=250), "ExtendedFlags1 0x61"),
    ("DataSetClassId", lambda seq: _general(seq, dataset_class_id=uuid.uuid4()), "ExtendedFlags1 0x29"),
    ("DataSetMessage status", lambda seq: _general(seq, status=0), "DataSetFlags1 0x99"),
    ("UInt32 PublisherId 7", lambda seq: _general(seq, publisher_id_type=PublisherIdType.UINT32),
     "uint32 PublisherId"),
    ("numeric non-Double Variants", lambda seq: _general(seq, (V(1, T.Int32), V(-2, T.Int16), V(True, T.Boolean))),
     "message is"),
    ("two writers, ours second", lambda seq: _general(seq, writers=(5, 2)), "DataSetMessages"),
])
def test_well_formed_messages_the_fast_path_refuses_take_the_fallback(link, name, build, reason):
    source, pub, layout = link
    pub.send(build(11))
    pub.send(layout.encode(UadpMessage(7, 1, 2, 12, 12, time.time_ns(), VALUES)))  # the fast path still works
    frames = _drain(source)
    want = [1.0, -2.0, 1.0] if "non-Double" in name else list(VALUES)
    assert frames == [(7, 2, 11, want), (7, 2, 12, list(VALUES))], name
    assert (source.fallback_decodes, source.malformed, source.foreign) == (1, 0, 0)
    assert reason in source.last_fallback_reason
    assert source.decode_status()["fallback_decodes"] == 1


def test_fallback_keeps_the_sender_timestamp(link):
    source, pub, _ = link
    t_ns = time.time_ns() // 100 * 100
    pub.send(_general(1, picoseconds=1, t_ns=t_ns))
    frame = source.receive(1.0)
    assert frame is not None and frame.sender_timestamp_ns == t_ns and frame.rx_timestamp_ns >= t_ns


def test_raw_layout_falls_back_for_rawdata_with_extra_flags():
    layout = compile_layout(3, "raw")
    source, pub = udp_loopback(layout, publisher_id=7, writer_id=2, writer_group_id=1)
    try:
        raw_fields = tuple(V(v, T.Double) for v in VALUES)
        pub.send(_general(5, raw_fields, encoding=FieldEncoding.RAW_DATA, picoseconds=7))
        assert _drain(source) == [(7, 2, 5, list(VALUES))] and source.fallback_decodes == 1
    finally:
        source.close()
        pub.close()


# ---- ours but unusable, and truly malformed: counted malformed with an offset ------------------------

@pytest.mark.parametrize("build,reason", [
    (lambda: _general(1, tuple(V(v, T.Double) for v in VALUES[:2])), "carries 2 fields, the config declares 3"),
    (lambda: _general(1, tuple(ua.DataValue(V(1.0), StatusCode=ua.StatusCode(ua.StatusCodes.BadSensorFailure))
                               for _ in VALUES), encoding=FieldEncoding.DATA_VALUE), "BadSensorFailure"),
    (lambda: _general(1, (V("x", T.String), V(1.0), V(2.0))), "field 0 of String"),
    (lambda: _general(1, (V([1.0, 2.0], T.Double), V(1.0), V(2.0))), "field 0 of a Double array"),
    (lambda: _general(1, valid=False, picoseconds=1), "invalid"),
    (lambda: _general(1, group=None, picoseconds=1), "carries no WriterGroupId"),
    (lambda: _general(1, writers=None, picoseconds=1), "has no PayloadHeader"),
])
def test_ours_but_unusable_is_malformed_and_says_why(link, build, reason):
    source, pub, _ = link
    pub.send(build())
    assert source.receive(0.3) is None
    assert (source.malformed, source.fallback_decodes, source.foreign) == (1, 0, 0)
    assert reason in source.last_error.reason and "read as general UADP it" in source.last_error.reason


def test_keep_alives_of_our_writer_are_counted_and_skipped_not_malformed(link):
    """Part 14: a writer with no new data sends keep-alives; they are neither frames nor faults."""
    source, pub, _ = link
    pub.send(_general(1, (), kind=DataSetMessageType.KEEP_ALIVE))
    assert source.receive(0.3) is None
    assert (source.keep_alives, source.malformed, source.fallback_decodes) == (1, 0, 0)
    assert source.decode_status()["keep_alives"] == 1
    pub.send(_general(2, tuple(V(v, T.Double) for v in VALUES), picoseconds=1))  # data again: delivered
    assert _drain(source) and source.fallback_decodes == 1


def test_truly_malformed_stays_malformed_with_an_offset(link):
    source, pub, layout = link
    good = layout.encode(UadpMessage(7, 1, 2, 1, 1, time.time_ns(), VALUES))
    pub.send(good[:-3])  # our layout, truncated
    assert source.receive(0.3) is None
    # the general decoder names where the message stops making sense: the last Double, cut short
    assert source.malformed == 1 and source.last_error.offset == len(good) - 8
    assert "truncated" in source.last_error.reason and "fast path refused it" in source.last_error.reason
    dv = _general(1, tuple(ua.DataValue(V(v, T.Double)) for v in VALUES), encoding=FieldEncoding.DATA_VALUE)
    pub.send(dv[:-2])  # a DataValue message of ours, truncated inside the last field
    pub.send(b"\x00garbage")  # not UADP
    pub.send(bytes([0xF1, 0x25]))  # a reserved PublisherId type
    assert source.receive(0.3) is None
    assert source.malformed == 4 and source.fallback_decodes == 0 and source.foreign == 0
    assert source.last_error.offset == 1 and "reserved" in source.last_error.reason


def test_fallback_is_bounded_by_message_size(link):
    """A huge message of ours is not handed to the general decoder (bounded cost per frame)."""
    source, pub, _ = link
    big = V("x" * (source.fallback_max_bytes + 100), T.String)
    data = encode_general(NetworkMessage(
        (DataSetMessage(tuple(V(v) for v in VALUES), sequence_number=1, timestamp=datetime_ticks_from_ns(0)),
         DataSetMessage((big,), sequence_number=1)), publisher_id=7, publisher_id_type=PublisherIdType.UINT16,
        writer_group_id=1, sequence_number=1,
        dataset_writer_ids=(2, 3)))
    pub.send(data)
    assert source.receive(0.3) is None
    assert source.malformed == 1 and "too large for the general-decoder fallback" in source.last_error.reason


def test_other_publishers_other_layouts_are_foreign_without_a_general_decode(link, monkeypatch):
    import plc.socket_source

    source, pub, _ = link
    calls = []
    real = plc.socket_source.decode
    monkeypatch.setattr(plc.socket_source, "decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    dv = tuple(ua.DataValue(V(v, T.Double)) for v in VALUES)
    pub.send(_general(1, dv, publisher_id=8, encoding=FieldEncoding.DATA_VALUE))
    pub.send(_general(2, dv, publisher_id="plc-8", encoding=FieldEncoding.DATA_VALUE))
    pub.send(_general(3, dv, writers=(4, 5), encoding=FieldEncoding.DATA_VALUE))
    assert source.receive(0.3) is None
    assert (source.foreign, source.malformed, calls) == (3, 0, [])
