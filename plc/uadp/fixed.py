"""UADP NetworkMessages (OPC 10000-14 §7.2, Annex A) for one fixed layout.

The layout a config declares: a PublisherId of the configured type (Byte, UInt16, UInt32, UInt64
or String), GroupHeader with WriterGroupId and sequence number, PayloadHeader with one
DataSetWriterId, a NetworkMessage timestamp, and one key-frame DataSetMessage of fixed-size scalar
fields (Variants, or RawData) with its own sequence number and timestamp. The fields are Doubles
unless the config names their types (`FIELD_TYPES`: Boolean, SByte, Byte, Int16, UInt16, Int32,
UInt32, Int64, UInt64, Float, Double, in any mix). It is compiled once into one `struct` format so
that encode and decode cost about a microsecond; anything that does not match (a flag, a count, a
Variant type tag, the size) raises UadpDecodeError with the offset, and the frame sources hand such a
message to the general decoder. Decoded values are what the general decoder's Variants hold (bool,
int, float); `decode_into` writes them into float64 as the general path's fallback does. A String
PublisherId carries its length on the wire; the layout is compiled for the configured id's length
(a publisher's id does not change between messages), so another publisher's id of another length
is refused here and told apart by `header_ids`, which reads only the identifiers of any UADP message.
"""
from __future__ import annotations

import operator
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import UadpDecodeError
from .messages import RAW_FORMATS, VariantType

# DateTime in OPC UA: 100 ns ticks since 1601-01-01 UTC.
_EPOCH_DELTA_TICKS = 116_444_736_000_000_000

UADP_VERSION = 1
# UADPFlags: version 1 | PublisherId | GroupHeader | PayloadHeader | ExtendedFlags1
UADP_FLAGS = 0xF0 | UADP_VERSION
# ExtendedFlags1: PublisherId type UInt16 (1) | Timestamp (bit 5); other id types change bits 0-2
EXT_FLAGS1 = 0x01 | 0x20
# GroupFlags: WriterGroupId (bit 0) | SequenceNumber (bit 3)
GROUP_FLAGS = 0x01 | 0x08
# DataSetFlags1: valid (bit 0) | field encoding Variant (bits 1-2 = 00) | seq (bit 3) | flags2 (bit 7)
DATASET_FLAGS1 = 0x01 | 0x08 | 0x80
# DataSetFlags2: message type key frame (bits 0-3 = 0) | Timestamp (bit 4)
DATASET_FLAGS2 = 0x10
VARIANT_DOUBLE = 0x0B

# PublisherId types a config can name: ExtendedFlags1 bits 0-2, the struct code, the largest id.
PUBLISHER_ID_TYPES: dict[str, tuple[int, str | None, int | None]] = {
    "byte": (0, "B", 0xFF), "uint16": (1, "H", 0xFFFF), "uint32": (2, "I", 0xFFFF_FFFF),
    "uint64": (3, "Q", 0xFFFF_FFFF_FFFF_FFFF), "string": (4, None, None)}
MAX_STRING_ID_BYTES = 1024  # a sanity bound for a configured String PublisherId (UTF-8 bytes)

# the header after the PublisherId: GroupFlags, WriterGroupId, SequenceNumber, count, DataSetWriterId,
# NetworkMessage DateTime, DataSetFlags1, DataSetFlags2, DataSetMessage SequenceNumber, DateTime
_AFTER_ID = "BHHBHqBBHq"
_HEADER = struct.Struct("<BBH" + _AFTER_ID + "H")  # the UInt16 Variant layout's header (34 bytes)


# The field types a compiled layout carries, by the name a config gives them (the built-in type's
# name, lower case): every fixed-size numeric scalar. DateTime is fixed-size too, but the loop's
# float64 values cannot hold it (the general decoder's fallback refuses a DateTime field as well),
# so a layout with one is refused when it is compiled rather than on every message.
FIELD_TYPES: dict[str, VariantType] = {t.name.lower(): t for t in RAW_FORMATS if t is not VariantType.DateTime}
MAX_FIELDS = 1024


def field_types_of(fields) -> tuple[VariantType, ...]:
    """The field types of a layout: `fields` is a count (that many Doubles, the layout before field
    types could be declared) or a sequence of types (ua.VariantType, its number, or its name in any
    case: "double", "Int16"). ValueError names what cannot be compiled."""
    if isinstance(fields, int) and not isinstance(fields, bool):
        if not 1 <= fields <= MAX_FIELDS:
            raise ValueError(f"field_count must be 1..{MAX_FIELDS}, got {fields}")
        return (VariantType.Double,) * fields
    if isinstance(fields, (str, bytes)):
        raise ValueError(f"field types must be a sequence of types, got the string {fields!r}")
    out = []
    for i, t in enumerate(fields):
        vt = None
        if isinstance(t, str):
            vt = FIELD_TYPES.get(t.lower())
            if vt is None and t.lower() == "datetime":
                vt = VariantType.DateTime
        elif isinstance(t, int) and not isinstance(t, bool):
            try:
                vt = VariantType(t)
            except ValueError:
                vt = None
        if vt is VariantType.DateTime:
            raise ValueError(f"field {i} is DateTime: the loop takes numeric values (float64), which cannot hold "
                             "a DateTime; publish it as a number (e.g. Int64 ticks or a Double of seconds)")
        if vt is None or vt not in FIELD_TYPES.values():
            raise ValueError(f"field {i} has type {t!r}; a compiled layout carries fixed-size numeric scalars: "
                             f"{', '.join(FIELD_TYPES)}")
        out.append(vt)
    if not 1 <= len(out) <= MAX_FIELDS:
        raise ValueError(f"a layout has 1..{MAX_FIELDS} fields, got {len(out)}")
    return tuple(out)


def describe_types(types: tuple[VariantType, ...]) -> str:
    """'6 Double fields', or the runs of a mixed layout: '4 fields (Double x2, Int16, Boolean)'."""
    if all(t is VariantType.Double for t in types):
        return f"{len(types)} Double field{'s' if len(types) != 1 else ''}"
    runs: list[list] = []
    for t in types:
        if runs and runs[-1][0] is t:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    text = ", ".join(t.name if n == 1 else f"{t.name} x{n}" for t, n in runs[:12])
    return f"{len(types)} fields ({text}{', ...' if len(runs) > 12 else ''})"


def datetime_ticks_from_ns(t_ns: int) -> int:
    return t_ns // 100 + _EPOCH_DELTA_TICKS


def ns_from_datetime_ticks(ticks: int) -> int:
    return (ticks - _EPOCH_DELTA_TICKS) * 100


@dataclass(frozen=True, slots=True)
class UadpMessage:
    publisher_id: int | str
    writer_group_id: int
    writer_id: int
    network_sequence: int  # UInt16, wraps
    dataset_sequence: int  # UInt16, wraps
    timestamp_ns: int
    values: tuple[float, ...]  # by field type: bool (Boolean), int (the integer types) or float


def check_publisher_id(publisher_id_type: str, publisher_id: int | str | None) -> bytes | None:
    """Validate a PublisherId against its type; the UTF-8 bytes of a String id, else None.

    A String layout needs the id (its length is compiled in); a numeric one accepts None (no id known)."""
    if publisher_id_type not in PUBLISHER_ID_TYPES:
        raise ValueError(f"publisher_id_type {publisher_id_type!r}: choose one of {', '.join(PUBLISHER_ID_TYPES)}")
    _, _, largest = PUBLISHER_ID_TYPES[publisher_id_type]
    if publisher_id_type == "string":
        if not isinstance(publisher_id, str) or not publisher_id:
            raise ValueError(f"publisher_id_type string needs a non-empty str publisher_id, got {publisher_id!r}")
        encoded = publisher_id.encode("utf-8")
        if len(encoded) > MAX_STRING_ID_BYTES:
            raise ValueError(f"publisher_id is {len(encoded)} UTF-8 bytes, at most {MAX_STRING_ID_BYTES} are allowed")
        return encoded
    if publisher_id is not None and (type(publisher_id) is not int or not 0 <= publisher_id <= largest):
        raise ValueError(f"publisher_id {publisher_id!r} does not fit publisher_id_type {publisher_id_type} "
                         f"(an int in 0..{largest})")
    return None


class _IdLayout:
    """What the PublisherId type changes in a compiled layout: the struct code(s) of the id, how many
    tuple items and bytes it takes (everything after it moves), ExtendedFlags1, the encoder's args."""

    def __init__(self, publisher_id_type: str, publisher_id: int | str | None) -> None:
        self.encoded = check_publisher_id(publisher_id_type, publisher_id)
        self.type_name = publisher_id_type
        code, fmt, self.largest = PUBLISHER_ID_TYPES[publisher_id_type]
        self.ext1 = code | 0x20
        if self.encoded is None:
            self.format, self.items, self.size = fmt, 1, struct.calcsize("<" + fmt)
        else:  # String: Int32 length, then the UTF-8 bytes
            self.format, self.items, self.size = f"i{len(self.encoded)}s", 2, 4 + len(self.encoded)
        self.shift = self.size - 2  # byte offsets after the id, relative to the UInt16 layout

    def args(self, publisher_id: int | str) -> tuple:
        """The struct arguments of the id; ValueError naming the id when it does not fit the layout. A
        numeric id is not checked here on the hot path: `struct` refuses what does not fit, and the
        encoder calls `check_numeric` then for the message."""
        if self.encoded is None:
            return (publisher_id,)
        if not isinstance(publisher_id, str):
            raise ValueError(f"publisher_id {publisher_id!r}: the layout's PublisherId type is string")
        encoded = publisher_id.encode("utf-8")
        if len(encoded) != len(self.encoded):
            raise ValueError(f"publisher_id {publisher_id!r} is {len(encoded)} UTF-8 bytes, the layout was compiled "
                             f"for a {len(self.encoded)}-byte String id")
        return len(encoded), encoded

    def check_numeric(self, publisher_id) -> None:
        if self.encoded is None and (type(publisher_id) is not int or not 0 <= publisher_id <= self.largest):
            raise ValueError(f"publisher_id {publisher_id!r} does not fit the layout's PublisherId type "
                             f"{self.type_name} (0..{self.largest})")

    def check(self, length: int, raw: bytes) -> str:
        """The String id of a message that matched the layout's constants: length, then valid UTF-8."""
        if length != len(self.encoded):
            raise UadpDecodeError(f"PublisherId String length {length}, layout is compiled for the configured id's "
                                  f"{len(self.encoded)} bytes", 2)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UadpDecodeError(f"PublisherId String is not valid UTF-8 ({exc.reason})", 6 + exc.start) from None


class _CompiledLayout:
    """decode/decode_into over a subclass's `_decode`, which unpacks a whole message in one call and
    leaves the field values in `_last_values`; the PublisherId handling shared by both encodings."""

    _last_values: tuple[float, ...] = ()
    field_count: int
    field_types: tuple[VariantType, ...]
    size: int

    def _init_id(self, fields, publisher_id_type: str, publisher_id: int | str | None) -> None:
        self.field_types = field_types_of(fields)
        self.field_count = len(self.field_types)
        self._described = describe_types(self.field_types)
        self.publisher_id_type = publisher_id_type
        self._id = _IdLayout(publisher_id_type, publisher_id)
        self._last_id: tuple[bytes, str] = (b"", "")
        if self._id.encoded is not None:  # the String id moves every later tuple item by one
            self._decode = self._decode_string_id

    def _decode(self, data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
        raise NotImplementedError

    def _decode_string_id(self, data: bytes | memoryview) -> tuple:
        raise NotImplementedError

    def _string_id(self, v: tuple) -> str:
        # the same publisher sends the same id: decode its bytes once, not per message
        raw = v[3]
        last = self._last_id
        if raw == last[0]:
            return last[1]
        text = self._id.check(v[2], raw)
        self._last_id = (raw, text)
        return text

    def decode(self, data: bytes | memoryview) -> UadpMessage:
        return UadpMessage(*self._decode(data), values=self._last_values)

    def decode_into(self, data: bytes | memoryview, out: np.ndarray) -> tuple[int, int, int, int, int, int]:
        """Decode the header and write the field values into `out` (float64, preallocated): a Boolean as
        0.0/1.0, an integer rounded to the nearest float64, as the general decoder's fallback writes them."""
        head = self._decode(data)
        out[:] = self._last_values
        return head

    def _bad_values(self, values) -> None:
        """After `struct` refused the values: ValueError naming the first field whose value does not fit."""
        for i, (t, v) in enumerate(zip(self.field_types, values)):
            try:
                struct.pack("<" + RAW_FORMATS[t], v)
            except (struct.error, TypeError) as exc:
                raise ValueError(f"field {i} = {v!r} does not fit its type {t.name}: {exc}") from None


class FixedLayout(_CompiledLayout):
    """Encoder/decoder for the fixed layout above with Variant fields: `fields` is a count of Doubles or
    a sequence of field types (see `field_types_of`); each field is its type tag and its value.

    `publisher_id_type`: byte, uint16 (the default), uint32, uint64 or string; `publisher_id`: the
    configured id, required for string (its UTF-8 length is part of the layout), checked otherwise."""

    def __init__(self, fields, publisher_id_type: str = "uint16",
                 publisher_id: int | str | None = None) -> None:
        self._init_id(fields, publisher_id_type, publisher_id)
        field_count = self.field_count
        pid, k = self._id, self._id.items - 1
        self._tags = tuple(int(t) for t in self.field_types)
        codes = "".join("B" + RAW_FORMATS[t] for t in self.field_types)
        self._header = struct.Struct("<BB" + pid.format + _AFTER_ID + "H")
        self._fields = struct.Struct("<" + codes)
        self.size = self._header.size + self._fields.size
        self._buffer = bytearray(self.size)
        self._whole = struct.Struct(self._header.format + codes)
        tag_positions = range(14 + k, 14 + k + 2 * field_count, 2)
        # the String id's length (item 2) is a constant of the layout too
        self._constants = operator.itemgetter(0, 1, *((2,) if k else ()), 3 + k, 6 + k, 9 + k, 10 + k, 13 + k,
                                              *tag_positions)
        self._expected = (UADP_FLAGS, pid.ext1, *((len(pid.encoded),) if k else ()), GROUP_FLAGS, 1, DATASET_FLAGS1,
                          DATASET_FLAGS2, field_count) + self._tags
        self._last_values: tuple[float, ...] = ()

    def encode(self, msg: UadpMessage) -> bytes:
        if len(msg.values) != self.field_count:
            raise ValueError(f"layout has {self.field_count} fields, message has {len(msg.values)}")
        ticks = datetime_ticks_from_ns(msg.timestamp_ns)
        ident = self._id
        try:
            if ident.encoded is None:  # numeric ids: no per-message argument tuple
                self._header.pack_into(
                    self._buffer, 0,
                    UADP_FLAGS, ident.ext1, msg.publisher_id,
                    GROUP_FLAGS, msg.writer_group_id, msg.network_sequence & 0xFFFF,
                    1, msg.writer_id, ticks,
                    DATASET_FLAGS1, DATASET_FLAGS2, msg.dataset_sequence & 0xFFFF, ticks, self.field_count,
                )
            else:
                self._header.pack_into(
                    self._buffer, 0,
                    UADP_FLAGS, ident.ext1, *ident.args(msg.publisher_id),
                    GROUP_FLAGS, msg.writer_group_id, msg.network_sequence & 0xFFFF,
                    1, msg.writer_id, ticks,
                    DATASET_FLAGS1, DATASET_FLAGS2, msg.dataset_sequence & 0xFFFF, ticks, self.field_count,
                )
        except struct.error:
            ident.check_numeric(msg.publisher_id)  # name the id when it is what does not fit
            raise
        args = []
        for tag, v in zip(self._tags, msg.values):
            args.append(tag)
            args.append(v)
        try:
            self._fields.pack_into(self._buffer, self._header.size, *args)
        except struct.error:
            self._bad_values(msg.values)
            raise
        return bytes(self._buffer)

    def _decode(self, data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
        # One unpack of the whole message and one tuple comparison of every constant byte (flags,
        # counts, Variant tags); only a message that fails it takes the slow path that names the
        # offending byte. Numeric PublisherIds are one tuple item whatever their size, so the
        # indices below hold for all four.
        if len(data) != self.size:
            self._explain(data)
        v = self._whole.unpack_from(data)
        if self._constants(v) != self._expected:
            self._explain(data)
        self._last_values = v[15::2]
        return v[2], v[4], v[7], v[5], v[11], (v[12] - _EPOCH_DELTA_TICKS) * 100

    def _decode_string_id(self, data: bytes | memoryview) -> tuple:
        # as _decode, every item one later: the String id is its length and its bytes
        if len(data) != self.size:
            self._explain(data)
        v = self._whole.unpack_from(data)
        if self._constants(v) != self._expected:
            self._explain(data)
        publisher_id = self._string_id(v)
        self._last_values = v[16::2]
        return publisher_id, v[5], v[8], v[6], v[12], (v[13] - _EPOCH_DELTA_TICKS) * 100

    def _explain(self, data: bytes | memoryview) -> None:
        """Raise UadpDecodeError for the first byte that breaks the layout."""
        self.decode_header(data, check_size=False)
        # the first tag that differs is named even when the size differs too: a type of another size
        # moves every later field and changes the size, but the tag is what an operator needs to see
        pos = self._header.size
        for i, want in enumerate(self.field_types):
            if pos >= len(data):
                break
            tag = data[pos]
            if tag != want:
                try:
                    got = VariantType(tag & 0x3F).name
                except ValueError:
                    got = "unknown"
                reason = (f"field {i} has Variant type 0x{tag:02x} ({got}{' array' if tag & 0x80 else ''}), layout "
                          f"expects {want.name} (0x{int(want):02x})")
                if len(data) != self.size:
                    self._wrong_size(data, f" ({reason})")
                raise UadpDecodeError(reason, pos)
            pos += 1 + struct.calcsize(RAW_FORMATS[want])
        if len(data) != self.size:
            self._wrong_size(data)
        raise AssertionError("_explain called on a message that matches the layout")

    def decode_header(self, data: bytes | memoryview,
                      check_size: bool = True) -> tuple[int | str, int, int, int, int, int]:
        # the header's bytes are checked before the size: a publisher that adds a flag changes both, and
        # the flag is what an operator needs named (it is also what the fallback's counter reports)
        if len(data) < self._header.size:
            self._wrong_size(data)
        v = self._header.unpack_from(data, 0)
        flags, ext1 = v[0], v[1]
        k, d = self._id.items - 1, self._id.shift
        _check_flags(flags, ext1, self._id.ext1)
        if k:  # not the cache: the length item is what may be wrong here
            publisher_id = self._id.check(v[2], v[3])
        else:
            publisher_id = v[2]
        (gflags, group_id, net_seq, count, writer_id, _ticks, ds1, ds2, ds_seq, ds_ticks,
         field_count) = v[3 + k:]
        if gflags != GROUP_FLAGS:
            raise UadpDecodeError(f"GroupFlags 0x{gflags:02x}, layout expects 0x{GROUP_FLAGS:02x}", 4 + d)
        if count != 1:
            raise UadpDecodeError(f"{count} DataSetMessages, layout expects 1", 9 + d)
        if ds1 != DATASET_FLAGS1:
            raise UadpDecodeError(f"DataSetFlags1 0x{ds1:02x}, layout expects 0x{DATASET_FLAGS1:02x}", 20 + d)
        if ds2 != DATASET_FLAGS2:
            raise UadpDecodeError(f"DataSetFlags2 0x{ds2:02x}, layout expects key frame 0x{DATASET_FLAGS2:02x}", 21 + d)
        if field_count != self.field_count:
            raise UadpDecodeError(f"FieldCount {field_count}, layout expects {self.field_count}", 32 + d)
        if check_size and len(data) != self.size:
            self._wrong_size(data)
        return publisher_id, group_id, writer_id, net_seq, ds_seq, ns_from_datetime_ticks(ds_ticks)

    def _wrong_size(self, data, why: str = "") -> None:
        raise UadpDecodeError(f"message is {len(data)} bytes, layout with a {self.publisher_id_type} PublisherId and "
                              f"{self._described} is {self.size}{why}", min(len(data), self.size))


def _check_flags(flags: int, ext1: int, want_ext1: int) -> None:
    if flags != UADP_FLAGS:
        if flags & 0x0F != UADP_VERSION:
            raise UadpDecodeError(f"UADP version {flags & 0x0F}, expected {UADP_VERSION}", 0)
        raise UadpDecodeError(f"UADPFlags 0x{flags:02x}, layout expects 0x{UADP_FLAGS:02x}", 0)
    if ext1 != want_ext1:
        if ext1 & 0x07 != want_ext1 & 0x07:
            names = {code: name for name, (code, _, _) in PUBLISHER_ID_TYPES.items()}
            got = names.get(ext1 & 0x07, f"reserved {ext1 & 0x07}")
            raise UadpDecodeError(f"ExtendedFlags1 0x{ext1:02x} announces a {got} PublisherId, layout expects "
                                  f"{names[want_ext1 & 0x07]} (0x{want_ext1:02x})", 1)
        raise UadpDecodeError(f"ExtendedFlags1 0x{ext1:02x}, layout expects 0x{want_ext1:02x}", 1)


# RawData field encoding (bits 1-2 = 01): no FieldCount, no Variant tags, the Doubles back to back,
# as Annex A's periodic fixed layouts carry them; the subscriber knows the types from the config.
DATASET_FLAGS1_RAW = 0x01 | 0x02 | 0x08 | 0x80


class RawLayout(_CompiledLayout):
    """The fixed layout above with RawData field encoding: the fields' little-endian values back to back,
    no tags (`fields` and the PublisherId as for FixedLayout). The wire cannot show a field of another
    type here: only the size, so the config's field types must be the publisher's."""

    def __init__(self, fields, publisher_id_type: str = "uint16",
                 publisher_id: int | str | None = None) -> None:
        self._init_id(fields, publisher_id_type, publisher_id)
        pid, k = self._id, self._id.items - 1
        header = self._header = struct.Struct("<BB" + pid.format + _AFTER_ID)
        codes = "".join(RAW_FORMATS[t] for t in self.field_types)
        self._whole = struct.Struct(header.format + codes)
        self.size = self._whole.size
        self._first_value = 13 + k
        self._constants = operator.itemgetter(0, 1, *((2,) if k else ()), 3 + k, 6 + k, 9 + k, 10 + k)
        self._expected = (UADP_FLAGS, pid.ext1, *((len(pid.encoded),) if k else ()), GROUP_FLAGS, 1,
                          DATASET_FLAGS1_RAW, DATASET_FLAGS2)
        self._buffer = bytearray(self.size)
        self._last_values: tuple[float, ...] = ()

    def encode(self, msg: UadpMessage) -> bytes:
        if len(msg.values) != self.field_count:
            raise ValueError(f"layout has {self.field_count} fields, message has {len(msg.values)}")
        ticks = datetime_ticks_from_ns(msg.timestamp_ns)
        ident = self._id
        try:
            self._whole.pack_into(self._buffer, 0, UADP_FLAGS, ident.ext1, *ident.args(msg.publisher_id),
                                  GROUP_FLAGS, msg.writer_group_id, msg.network_sequence & 0xFFFF, 1, msg.writer_id,
                                  ticks, DATASET_FLAGS1_RAW, DATASET_FLAGS2, msg.dataset_sequence & 0xFFFF, ticks,
                                  *msg.values)
        except struct.error:
            ident.check_numeric(msg.publisher_id)
            self._bad_values(msg.values)
            raise
        return bytes(self._buffer)

    def _unpack(self, data: bytes | memoryview) -> tuple:
        if len(data) != self.size:
            if len(data) >= self._header.size:  # name a header byte that differs first (see FixedLayout)
                v = self._header.unpack_from(data)
                if self._constants(v) != self._expected:
                    self._explain(v)
            raise UadpDecodeError(f"message is {len(data)} bytes, RawData layout with a {self.publisher_id_type} "
                                  f"PublisherId and {self._described} is {self.size}",
                                  min(len(data), self.size))
        v = self._whole.unpack_from(data)
        if self._constants(v) != self._expected:
            self._explain(v)
        return v

    def _explain(self, v: tuple) -> None:
        d = self._id.shift
        _check_flags(v[0], v[1], self._id.ext1)
        if self._id.items == 2 and v[2] != len(self._id.encoded):
            self._id.check(v[2], v[3])
        names = ("GroupFlags", "DataSetMessage count", "DataSetFlags1", "DataSetFlags2")
        offsets = (4 + d, 9 + d, 20 + d, 21 + d)
        k = 3 if self._id.items == 2 else 2
        for name, offset, got, want in zip(names, offsets, self._constants(v)[k:], self._expected[k:]):
            if got != want:
                raise UadpDecodeError(f"{name} 0x{got:02x}, RawData layout expects 0x{want:02x}", offset)
        raise AssertionError("_explain called on a message that matches the layout")

    def _decode(self, data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
        v = self._unpack(data)
        self._last_values = v[13:]
        return v[2], v[4], v[7], v[5], v[11], (v[12] - _EPOCH_DELTA_TICKS) * 100

    def _decode_string_id(self, data: bytes | memoryview) -> tuple:
        v = self._unpack(data)
        publisher_id = self._string_id(v)
        self._last_values = v[14:]
        return publisher_id, v[5], v[8], v[6], v[12], (v[13] - _EPOCH_DELTA_TICKS) * 100


# the name from when RawData layouts carried Doubles only
RawDoubleLayout = RawLayout


def compile_layout(fields, encoding: str = "variant", publisher_id_type: str = "uint16",
                   publisher_id: int | str | None = None, *,
                   field_types=None) -> FixedLayout | RawLayout:
    """The fast codec for the layout a config declares: its fields as Variants or as RawData, the
    PublisherId of the configured type (a String id's length comes from `publisher_id`).

    `fields`: the number of fields (all Double unless `field_types` says otherwise) or their types;
    `field_types`: the config's types (names such as "int16", or ua.VariantType), one per field, or
    None for Doubles; with a count, the two must agree. ValueError says what cannot be compiled."""
    if field_types is not None:
        types = field_types_of(field_types)
        if isinstance(fields, int) and not isinstance(fields, bool) and fields != len(types):
            raise ValueError(f"{len(types)} field types for {fields} fields: name one type per signal, in order")
        fields = types
    if encoding == "variant":
        return FixedLayout(fields, publisher_id_type, publisher_id)
    if encoding == "raw":
        return RawLayout(fields, publisher_id_type, publisher_id)
    raise ValueError(f"field encoding {encoding!r}: choose variant or raw")


_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_ID_STRUCTS = {code: struct.Struct("<" + fmt) for code, fmt, _ in PUBLISHER_ID_TYPES.values() if fmt}


def header_ids(data: bytes | memoryview) -> tuple[int | str | None, int | None, tuple[int, ...] | None]:
    """(PublisherId, WriterGroupId, DataSetWriterIds) of any UADP NetworkMessage, None where absent.

    Reads the headers only (no payload), so a receiver can skip another publisher's messages,
    whatever their layout, for the cost of a few byte reads instead of a general decode. It checks
    what it reads (version, id type, lengths), not the rest of the message: `plc.uadp.decode` does."""
    n = len(data)
    pos = 0
    try:
        flags = data[0]
        if flags & 0x0F != UADP_VERSION:
            raise UadpDecodeError(f"UADP version {flags & 0x0F} is not supported (expected {UADP_VERSION})", 0)
        ext1 = 0
        pos = 1
        if flags & 0x80:
            ext1 = data[1]
            pos = 3 if ext1 & 0x80 else 2  # ExtendedFlags2 follows
        publisher_id = None
        if flags & 0x10:
            kind = ext1 & 0x07
            if kind == 4:
                length = _I32.unpack_from(data, pos)[0]
                if length < 0 or pos + 4 + length > n:
                    raise UadpDecodeError(f"PublisherId String length {length} does not fit the {n - pos - 4} bytes "
                                          "left", pos)
                raw = bytes(data[pos + 4:pos + 4 + length])
                try:
                    publisher_id = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise UadpDecodeError(f"PublisherId String is not valid UTF-8 ({exc.reason})",
                                          pos + 4 + exc.start) from None
                pos += 4 + length
            elif kind in _ID_STRUCTS:
                st = _ID_STRUCTS[kind]
                publisher_id = st.unpack_from(data, pos)[0]
                pos += st.size
            else:
                raise UadpDecodeError(f"PublisherId type {kind} is reserved (ExtendedFlags1 bits 0-2)", 1)
        if ext1 & 0x08:
            pos += 16  # DataSetClassId
        group_id = None
        if flags & 0x20:
            gflags = data[pos]
            pos += 1
            if gflags & 0x01:
                group_id = _U16.unpack_from(data, pos)[0]
            pos += 2 * (gflags & 0x01) + 4 * (gflags >> 1 & 1) + 2 * (gflags >> 2 & 1) + 2 * (gflags >> 3 & 1)
        writer_ids = None
        if flags & 0x40:
            count = data[pos]
            writer_ids = struct.unpack_from(f"<{count}H", data, pos + 1)
    except (IndexError, struct.error):
        raise UadpDecodeError(f"truncated NetworkMessage header ({n} bytes)", min(pos, n)) from None
    return publisher_id, group_id, writer_ids
