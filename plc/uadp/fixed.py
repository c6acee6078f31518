"""UADP NetworkMessages (OPC 10000-14 §7.2, Annex A) for one fixed layout.

The layout a config declares: UInt16 PublisherId, GroupHeader with WriterGroupId and
sequence number, PayloadHeader with one DataSetWriterId, a NetworkMessage timestamp,
and one key-frame DataSetMessage of Double Variant fields with its own sequence number
and timestamp. It is compiled once into `struct` formats so that encode and decode cost
about a microsecond; anything that does not match raises UadpDecodeError with the offset.
"""
from __future__ import annotations

import operator
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import UadpDecodeError

# DateTime in OPC UA: 100 ns ticks since 1601-01-01 UTC.
_EPOCH_DELTA_TICKS = 116_444_736_000_000_000

UADP_VERSION = 1
# UADPFlags: version 1 | PublisherId | GroupHeader | PayloadHeader | ExtendedFlags1
UADP_FLAGS = 0xF0 | UADP_VERSION
# ExtendedFlags1: PublisherId type UInt16 (1) | Timestamp (bit 5)
EXT_FLAGS1 = 0x01 | 0x20
# GroupFlags: WriterGroupId (bit 0) | SequenceNumber (bit 3)
GROUP_FLAGS = 0x01 | 0x08
# DataSetFlags1: valid (bit 0) | field encoding Variant (bits 1-2 = 00) | seq (bit 3) | flags2 (bit 7)
DATASET_FLAGS1 = 0x01 | 0x08 | 0x80
# DataSetFlags2: message type key frame (bits 0-3 = 0) | Timestamp (bit 4)
DATASET_FLAGS2 = 0x10
VARIANT_DOUBLE = 0x0B

_HEADER = struct.Struct("<BBHBHHBHqBBHqH")


def datetime_ticks_from_ns(t_ns: int) -> int:
    return t_ns // 100 + _EPOCH_DELTA_TICKS


def ns_from_datetime_ticks(ticks: int) -> int:
    return (ticks - _EPOCH_DELTA_TICKS) * 100


@dataclass(frozen=True, slots=True)
class UadpMessage:
    publisher_id: int
    writer_group_id: int
    writer_id: int
    network_sequence: int  # UInt16, wraps
    dataset_sequence: int  # UInt16, wraps
    timestamp_ns: int
    values: tuple[float, ...]


class _CompiledLayout:
    """decode/decode_into over a subclass's `_decode`, which unpacks a whole message in one call and
    leaves the field values in `_last_values`."""

    _last_values: tuple[float, ...] = ()

    def _decode(self, data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
        raise NotImplementedError

    def decode(self, data: bytes | memoryview) -> UadpMessage:
        return UadpMessage(*self._decode(data), values=self._last_values)

    def decode_into(self, data: bytes | memoryview, out: np.ndarray) -> tuple[int, int, int, int, int, int]:
        """Decode the header and write the field values into `out` (float64, preallocated)."""
        head = self._decode(data)
        out[:] = self._last_values
        return head


class FixedLayout(_CompiledLayout):
    """Encoder/decoder for the fixed layout above with `field_count` Double fields."""

    def __init__(self, field_count: int) -> None:
        if not 1 <= field_count <= 1024:
            raise ValueError(f"field_count must be 1..1024, got {field_count}")
        self.field_count = field_count
        self._fields = struct.Struct("<" + "Bd" * field_count)
        self.size = _HEADER.size + self._fields.size
        self._buffer = bytearray(self.size)
        self._whole = struct.Struct(_HEADER.format + "Bd" * field_count)
        tag_positions = range(14, 14 + 2 * field_count, 2)
        self._constants = operator.itemgetter(0, 1, 3, 6, 9, 10, 13, *tag_positions)
        self._expected = (UADP_FLAGS, EXT_FLAGS1, GROUP_FLAGS, 1, DATASET_FLAGS1, DATASET_FLAGS2, field_count) + (
            VARIANT_DOUBLE,) * field_count
        self._last_values: tuple[float, ...] = ()

    def encode(self, msg: UadpMessage) -> bytes:
        if len(msg.values) != self.field_count:
            raise ValueError(f"layout has {self.field_count} fields, message has {len(msg.values)}")
        ticks = datetime_ticks_from_ns(msg.timestamp_ns)
        _HEADER.pack_into(
            self._buffer, 0,
            UADP_FLAGS, EXT_FLAGS1, msg.publisher_id,
            GROUP_FLAGS, msg.writer_group_id, msg.network_sequence & 0xFFFF,
            1, msg.writer_id, ticks,
            DATASET_FLAGS1, DATASET_FLAGS2, msg.dataset_sequence & 0xFFFF, ticks, self.field_count,
        )
        args = []
        for v in msg.values:
            args.append(VARIANT_DOUBLE)
            args.append(v)
        self._fields.pack_into(self._buffer, _HEADER.size, *args)
        return bytes(self._buffer)

    def _decode(self, data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
        # One unpack of the whole message and one tuple comparison of every constant byte (flags,
        # counts, Variant tags); only a message that fails it takes the slow path that names the
        # offending byte.
        if len(data) != self.size:
            self._explain(data)
        v = self._whole.unpack_from(data)
        if self._constants(v) != self._expected:
            self._explain(data)
        self._last_values = v[15::2]
        return v[2], v[4], v[7], v[5], v[11], (v[12] - _EPOCH_DELTA_TICKS) * 100

    def _explain(self, data: bytes | memoryview) -> None:
        """Raise UadpDecodeError for the first byte that breaks the layout."""
        self.decode_header(data)
        tags = self._fields.unpack_from(data, _HEADER.size)[0::2]
        for i, tag in enumerate(tags):
            if tag != VARIANT_DOUBLE:
                raise UadpDecodeError(f"field {i} has Variant type 0x{tag:02x}, layout expects Double (0x0b)",
                                      _HEADER.size + 9 * i)
        raise AssertionError("_explain called on a message that matches the layout")

    def decode_header(self, data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
        if len(data) != self.size:
            raise UadpDecodeError(
                f"message is {len(data)} bytes, layout with {self.field_count} Double fields is {self.size}",
                min(len(data), self.size))
        (flags, ext1, publisher_id, gflags, group_id, net_seq, count, writer_id, ticks,
         ds1, ds2, ds_seq, ds_ticks, field_count) = _HEADER.unpack_from(data, 0)
        if flags != UADP_FLAGS:
            if flags & 0x0F != UADP_VERSION:
                raise UadpDecodeError(f"UADP version {flags & 0x0F}, expected {UADP_VERSION}", 0)
            raise UadpDecodeError(f"UADPFlags 0x{flags:02x}, layout expects 0x{UADP_FLAGS:02x}", 0)
        if ext1 != EXT_FLAGS1:
            raise UadpDecodeError(f"ExtendedFlags1 0x{ext1:02x}, layout expects 0x{EXT_FLAGS1:02x}", 1)
        if gflags != GROUP_FLAGS:
            raise UadpDecodeError(f"GroupFlags 0x{gflags:02x}, layout expects 0x{GROUP_FLAGS:02x}", 4)
        if count != 1:
            raise UadpDecodeError(f"{count} DataSetMessages, layout expects 1", 9)
        if ds1 != DATASET_FLAGS1:
            raise UadpDecodeError(f"DataSetFlags1 0x{ds1:02x}, layout expects 0x{DATASET_FLAGS1:02x}", 20)
        if ds2 != DATASET_FLAGS2:
            raise UadpDecodeError(f"DataSetFlags2 0x{ds2:02x}, layout expects key frame 0x{DATASET_FLAGS2:02x}", 21)
        if field_count != self.field_count:
            raise UadpDecodeError(f"FieldCount {field_count}, layout expects {self.field_count}", 32)
        return publisher_id, group_id, writer_id, net_seq, ds_seq, ns_from_datetime_ticks(ds_ticks)


# RawData field encoding (bits 1-2 = 01): no FieldCount, no Variant tags, the Doubles back to back,
# as Annex A's periodic fixed layouts carry them; the subscriber knows the types from the config.
DATASET_FLAGS1_RAW = 0x01 | 0x02 | 0x08 | 0x80
_RAW_HEADER = struct.Struct("<BBHBHHBHqBBHq")


class RawDoubleLayout(_CompiledLayout):
    """The fixed layout above with RawData field encoding: `field_count` little-endian Doubles."""

    def __init__(self, field_count: int) -> None:
        if not 1 <= field_count <= 1024:
            raise ValueError(f"field_count must be 1..1024, got {field_count}")
        self.field_count = field_count
        self.size = _RAW_HEADER.size + 8 * field_count
        self._whole = struct.Struct(_RAW_HEADER.format + "d" * field_count)
        self._constants = operator.itemgetter(0, 1, 3, 6, 9, 10)
        self._expected = (UADP_FLAGS, EXT_FLAGS1, GROUP_FLAGS, 1, DATASET_FLAGS1_RAW, DATASET_FLAGS2)
        self._buffer = bytearray(self.size)
        self._last_values: tuple[float, ...] = ()

    def encode(self, msg: UadpMessage) -> bytes:
        if len(msg.values) != self.field_count:
            raise ValueError(f"layout has {self.field_count} fields, message has {len(msg.values)}")
        ticks = datetime_ticks_from_ns(msg.timestamp_ns)
        self._whole.pack_into(self._buffer, 0, UADP_FLAGS, EXT_FLAGS1, msg.publisher_id, GROUP_FLAGS,
                              msg.writer_group_id, msg.network_sequence & 0xFFFF, 1, msg.writer_id, ticks,
                              DATASET_FLAGS1_RAW, DATASET_FLAGS2, msg.dataset_sequence & 0xFFFF, ticks, *msg.values)
        return bytes(self._buffer)

    def _decode(self, data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
        if len(data) != self.size:
            raise UadpDecodeError(f"message is {len(data)} bytes, RawData layout with {self.field_count} Doubles "
                                  f"is {self.size}", min(len(data), self.size))
        v = self._whole.unpack_from(data)
        if self._constants(v) != self._expected:
            names = ("UADPFlags", "ExtendedFlags1", "GroupFlags", "DataSetMessage count", "DataSetFlags1",
                     "DataSetFlags2")
            for name, offset, got, want in zip(names, (0, 1, 4, 9, 20, 21), self._constants(v), self._expected):
                if got != want:
                    raise UadpDecodeError(f"{name} 0x{got:02x}, RawData layout expects 0x{want:02x}", offset)
        self._last_values = v[13:]
        return v[2], v[4], v[7], v[5], v[11], (v[12] - _EPOCH_DELTA_TICKS) * 100


def compile_layout(field_count: int, encoding: str = "variant") -> FixedLayout | RawDoubleLayout:
    """The fast codec for the layout a config declares: Double fields as Variants or as RawData."""
    if encoding == "variant":
        return FixedLayout(field_count)
    if encoding == "raw":
        return RawDoubleLayout(field_count)
    raise ValueError(f"field encoding {encoding!r}: choose variant or raw")
