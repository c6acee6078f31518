"""Value types of general UADP NetworkMessages (OPC 10000-14 §7.2.4): frozen, `None` means absent.

Presence flags on the wire are derived from which fields are set, so `decode(encode(m)) == m`.
"""
from __future__ import annotations

import enum
import functools
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncua.ua import VariantType


class PublisherIdType(enum.IntEnum):
    """ExtendedFlags1 bits 0-2; values 5-7 are reserved."""

    BYTE = 0
    UINT16 = 1
    UINT32 = 2
    UINT64 = 3
    STRING = 4


class FieldEncoding(enum.IntEnum):
    """DataSetFlags1 bits 1-2; 0b11 is reserved."""

    VARIANT = 0
    RAW_DATA = 1
    DATA_VALUE = 2


class DataSetMessageType(enum.IntEnum):
    """DataSetFlags2 bits 0-3; values 4-15 are reserved."""

    KEY_FRAME = 0
    DELTA_FRAME = 1
    EVENT = 2
    KEEP_ALIVE = 3


@dataclass(frozen=True, slots=True)
class DataSetMessage:
    """One DataSetMessage.

    `fields` holds, by `message_type`:
      KEY_FRAME   - one value per field: `ua.Variant` (VARIANT and RAW_DATA) or `ua.DataValue` (DATA_VALUE);
      DELTA_FRAME - `(field_index, value)` pairs with values as for a key frame;
      EVENT       - `ua.Variant` values (events are always Variant-encoded on the wire);
      KEEP_ALIVE  - nothing.
    `raw` holds the undecoded payload of a RAW_DATA key frame decoded without field types; it is
    written back verbatim by the encoder and is only valid with `fields == ()`.
    `timestamp` is an OPC UA DateTime: Int64 100 ns ticks since 1601-01-01 UTC.
    """

    fields: tuple[Any, ...] = ()
    message_type: DataSetMessageType = DataSetMessageType.KEY_FRAME
    field_encoding: FieldEncoding = FieldEncoding.VARIANT
    raw: bytes | None = None
    valid: bool = True
    sequence_number: int | None = None  # UInt16
    timestamp: int | None = None  # DateTime ticks
    picoseconds: int | None = None  # UInt16
    status: int | None = None  # UInt16, the high 16 bits of a StatusCode
    major_version: int | None = None  # UInt32 ConfigurationVersion.MajorVersion
    minor_version: int | None = None  # UInt32 ConfigurationVersion.MinorVersion


@dataclass(frozen=True, slots=True)
class NetworkMessage:
    """A NetworkMessage carrying DataSetMessages (the only NetworkMessage type supported).

    `dataset_writer_ids` is the PayloadHeader: `None` omits it, and then the message carries exactly
    one DataSetMessage that runs to the end of the data (a Subscriber without a PayloadHeader would
    otherwise need its reader configuration to split the payload). `publisher_id_type` is needed for
    integer PublisherIds; a `str` PublisherId implies STRING. The GroupHeader is present iff one of
    its four fields is set.
    """

    messages: tuple[DataSetMessage, ...]
    publisher_id: int | str | None = None
    publisher_id_type: PublisherIdType | None = None
    dataset_class_id: uuid.UUID | None = None
    writer_group_id: int | None = None  # UInt16
    group_version: int | None = None  # UInt32 VersionTime
    network_message_number: int | None = None  # UInt16
    sequence_number: int | None = None  # UInt16, the GroupHeader SequenceNumber
    dataset_writer_ids: tuple[int, ...] | None = None
    timestamp: int | None = None  # DateTime ticks
    picoseconds: int | None = None  # UInt16
    promoted_fields: tuple[Any, ...] | None = None  # ua.Variant values; only with one DataSetMessage

    def __post_init__(self) -> None:
        if self.publisher_id_type is None and isinstance(self.publisher_id, str):
            object.__setattr__(self, "publisher_id_type", PublisherIdType.STRING)


# RawData carries fixed-size scalars without a type tag; the reader must know the types.
# DateTime travels as Int64 ticks and is converted like asyncua does for Variants.
RAW_FORMATS: dict[VariantType, str] = {
    VariantType.Boolean: "?", VariantType.SByte: "b", VariantType.Byte: "B",
    VariantType.Int16: "h", VariantType.UInt16: "H", VariantType.Int32: "i", VariantType.UInt32: "I",
    VariantType.Int64: "q", VariantType.UInt64: "Q", VariantType.Float: "f", VariantType.Double: "d",
    VariantType.DateTime: "q",
}


@functools.lru_cache(maxsize=256)
def raw_struct(types: tuple[VariantType, ...]) -> struct.Struct:
    """The packed little-endian layout of RawData fields of these types (no padding, no tags)."""
    return struct.Struct("<" + "".join(RAW_FORMATS[t] for t in types))


def check_raw_types(types: Sequence[VariantType], where: str) -> tuple[VariantType, ...]:
    """Validate a caller's field types; a wrong argument is a programming error, not bad input."""
    out = []
    for i, t in enumerate(types):
        if t not in RAW_FORMATS:  # IntEnum: a plain int such as 11 matches VariantType.Double
            raise ValueError(f"{where}[{i}] = {t!r}: RawData supports only fixed-size scalars "
                             f"({', '.join(t.name for t in RAW_FORMATS)})")
        out.append(VariantType(t))
    return tuple(out)
