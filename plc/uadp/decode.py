"""General UADP NetworkMessage decoder (OPC 10000-14 §7.2.4, Annex A).

Every malformed input raises UadpDecodeError(reason, offset); no other exception escapes `decode`.

Ethernet padding: a frame is at least 60 bytes before the FCS, so an Ethernet payload shorter than 46
bytes arrives padded (42 bytes and up when an 802.1Q tag was part of the minimum-size frame). The frame
does not say how long the UADP message in it was, but a UADP message does: a NetworkMessage with a
Sizes array says how long its DataSetMessages are, and one with a single DataSetMessage ends where
that message's last field ends. RawData fields carry no tags, so there the configured field types say
where the message ends: without types a RawData key frame runs to the end of the data, padding
included, and a publisher that sends fewer RawData fields than configured into a minimum-size frame
gets padding read as zero values (a config mismatch the wire cannot show; UDP would refuse it for
length). Variant and DataValue fields and keep-alives are self-delimiting and have no such ambiguity.

`decode(..., padded=True)` and `unpadded_length` are for payloads of at most ETHERNET_MIN_PAYLOAD
bytes from raw Ethernet only. After the message ends the rest must be zero bytes (what Linux and NIC
auto-padding write; 802.3 leaves the pad's content open, but a non-zero byte more likely means a
malformed message than a stale pad), anything else is still an error. UDP datagrams and longer frames
carry their exact length and are decoded strictly.
"""
from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Mapping, Sequence

from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua.ua_binary import variant_from_binary

from ..errors import UadpDecodeError
from .scan import scan_variant
from .messages import (DataSetMessage, DataSetMessageType, FieldEncoding, NetworkMessage, PublisherIdType,
                       check_raw_types, raw_struct)

FieldTypes = Sequence[ua.VariantType] | Mapping[int, Sequence[ua.VariantType]]

_U16, _U32, _U64, _I32, _I64 = (struct.Struct(f) for f in ("<H", "<I", "<Q", "<i", "<q"))
_PUBLISHER_ID = {PublisherIdType.BYTE: struct.Struct("<B"), PublisherIdType.UINT16: _U16,
                 PublisherIdType.UINT32: _U32, PublisherIdType.UINT64: _U64}


ETHERNET_MIN_PAYLOAD = 46  # shorter Ethernet payloads are padded on the wire (60-byte frame without FCS)

_KINDS, _ENCODINGS = tuple(DataSetMessageType), tuple(FieldEncoding)  # indexable by the wire value


class _Reader:
    """The byte cursor; `end` shrinks to a DataSetMessage (Sizes array) or PromotedFields while inside one."""

    __slots__ = ("data", "pos", "end", "scope")

    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.end, self.scope = data, 0, len(data), "the message"

    def truncated(self, n: int, what: str) -> UadpDecodeError:
        return UadpDecodeError(f"truncated {what}: needs {n} bytes, {self.end - self.pos} left in {self.scope}",
                               self.pos)

    def u8(self, what: str) -> int:
        p = self.pos
        if p >= self.end:
            raise self.truncated(1, what)
        self.pos = p + 1
        return self.data[p]

    def unpack(self, st: struct.Struct, what: str):
        p = self.pos
        if p + st.size > self.end:
            raise self.truncated(st.size, what)
        self.pos = p + st.size
        return st.unpack_from(self.data, p)

    def one(self, st: struct.Struct, what: str) -> int:
        return self.unpack(st, what)[0]

    def take(self, n: int, what: str) -> bytes:
        p = self.pos
        if p + n > self.end:
            raise self.truncated(n, what)
        self.pos = p + n
        return self.data[p:p + n]


def decode(data: bytes | bytearray | memoryview, field_types: FieldTypes | None = None, *,
           padded: bool = False) -> NetworkMessage:
    """Decode one UADP NetworkMessage with DataSetMessage payload.

    `field_types` describes RawData fields, which carry no type tags: one sequence for every
    DataSetMessage, or a mapping DataSetWriterId -> sequence (used with a PayloadHeader). Without
    types a RawData key frame keeps its payload in `DataSetMessage.raw` and a RawData delta frame
    is an error. Timestamps stay DateTime ticks (exact round trip); Variant/DataValue bodies come
    from asyncua's binary codec.

    `padded`: `data` is the payload of a minimum-size Ethernet frame (at most ETHERNET_MIN_PAYLOAD
    bytes): zero bytes after the message's end are padding, not trailing garbage (see the module doc).
    """
    return _decode(data, field_types, padded)[0]


def unpadded_length(data: bytes | bytearray | memoryview, field_types: FieldTypes | None = None) -> int:
    """How many bytes of a minimum-size Ethernet payload (at most ETHERNET_MIN_PAYLOAD bytes) the UADP
    NetworkMessage takes; the rest is zero padding. Raises UadpDecodeError as `decode(padded=True)` does."""
    return _decode(data, field_types, True)[1]


def _decode(data, field_types, padded: bool) -> tuple[NetworkMessage, int]:
    if padded and len(data) > ETHERNET_MIN_PAYLOAD:
        raise ValueError(f"padded=True is for Ethernet payloads of at most {ETHERNET_MIN_PAYLOAD} bytes, this one "
                         f"has {len(data)}: longer frames are never padded")
    if isinstance(field_types, Mapping):
        types_by_writer = {w: check_raw_types(t, f"field_types[{w}]") for w, t in field_types.items()}
        shared = None
    else:
        types_by_writer, shared = None, None if field_types is None else check_raw_types(field_types, "field_types")
    r = _Reader(data if type(data) is bytes else bytes(data))  # asyncua decodes strings from bytes slices
    try:
        return _network_message(r, shared, types_by_writer, padded), r.pos
    except UadpDecodeError:
        raise
    except Exception as exc:  # a decoder bug must still surface as a decode error, never as a crash
        raise UadpDecodeError(f"internal decoder error {type(exc).__name__}: {exc}", r.pos) from exc


def _network_message(r: _Reader, shared, types_by_writer, padded: bool) -> NetworkMessage:
    flags = r.u8("UADPFlags")
    if flags & 0x0F != 1:
        raise UadpDecodeError(f"UADP version {flags & 0x0F} is not supported (expected 1)", 0)
    ext1 = ext2 = 0
    if flags & 0x80:
        ext1 = r.u8("ExtendedFlags1")
        if ext1 & 0x07 > 4:
            raise UadpDecodeError(f"PublisherId type {ext1 & 0x07} is reserved (ExtendedFlags1 bits 0-2)", 1)
        if ext1 & 0x10:
            raise UadpDecodeError("message security is not supported (ExtendedFlags1 bit 4)", 1)
        if ext1 & 0x80:
            ext2 = r.u8("ExtendedFlags2")
            _check_ext2(ext2, 2)

    publisher_id = publisher_id_type = None
    if flags & 0x10:
        publisher_id_type = PublisherIdType(ext1 & 0x07)
        if publisher_id_type is PublisherIdType.STRING:
            publisher_id = _string(r, "PublisherId")
        else:
            publisher_id = r.one(_PUBLISHER_ID[publisher_id_type], f"PublisherId ({publisher_id_type.name})")
    class_id = uuid.UUID(bytes_le=r.take(16, "DataSetClassId")) if ext1 & 0x08 else None

    group = (None, None, None, None)
    if flags & 0x20:
        at = r.pos
        gflags = r.u8("GroupFlags")
        if gflags & 0xF0:
            raise UadpDecodeError(f"GroupFlags 0x{gflags:02x} sets reserved bits 4-7", at)
        group = tuple(r.one(st, name) if gflags & bit else None for bit, st, name in (
            (1, _U16, "WriterGroupId"), (2, _U32, "GroupVersion"),
            (4, _U16, "NetworkMessageNumber"), (8, _U16, "SequenceNumber")))

    writer_ids = None
    if flags & 0x40:
        at = r.pos
        count = r.u8("PayloadHeader Count")
        if count == 0:
            raise UadpDecodeError("PayloadHeader Count is 0; a NetworkMessage carries at least one DataSetMessage", at)
        writer_ids = r.unpack(_u16_array(count), f"PayloadHeader DataSetWriterIds[{count}]")

    timestamp = r.one(_I64, "NetworkMessage Timestamp") if ext1 & 0x20 else None
    picoseconds = r.one(_U16, "NetworkMessage PicoSeconds") if ext1 & 0x40 else None
    promoted = _promoted_fields(r, writer_ids) if ext2 & 0x02 else None

    messages = _payload(r, writer_ids, shared, types_by_writer, padded)
    return NetworkMessage(messages, publisher_id, publisher_id_type, class_id, *group, writer_ids,
                          timestamp, picoseconds, promoted)


def _check_ext2(ext2: int, at: int) -> None:
    if ext2 & 0xE0:
        raise UadpDecodeError(f"ExtendedFlags2 0x{ext2:02x} sets reserved bits 5-7", at)
    if ext2 & 0x01:
        raise UadpDecodeError("chunked NetworkMessages are not supported (ExtendedFlags2 bit 0)", at)
    kind = (ext2 >> 2) & 0x07
    if kind in (1, 2):
        name = "request" if kind == 1 else "response"
        raise UadpDecodeError(f"discovery {name} NetworkMessages are not supported (ExtendedFlags2 type {kind})", at)
    if kind:
        raise UadpDecodeError(f"NetworkMessage type {kind} is reserved (ExtendedFlags2 bits 2-4)", at)


@functools.lru_cache(maxsize=None)  # n <= 255: the PayloadHeader Count is a Byte
def _u16_array(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}H")


def _string(r: _Reader, what: str) -> str:
    at = r.pos
    n = r.one(_I32, f"{what} String length")
    if n < 0:
        raise UadpDecodeError(f"{what} String length {n} (null or negative) is not allowed", at)
    # take() checks n against the bytes left before slicing, so a huge length allocates nothing
    raw = r.take(n, f"{what} String")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UadpDecodeError(f"{what} String is not valid UTF-8 ({exc.reason})", at + 4 + exc.start) from None


def _promoted_fields(r: _Reader, writer_ids) -> tuple:
    at = r.pos
    size = r.one(_U16, "PromotedFields Size")
    if writer_ids is not None and len(writer_ids) != 1:
        raise UadpDecodeError(f"PromotedFields require exactly one DataSetMessage, PayloadHeader has {len(writer_ids)}",
                              at)
    if size > r.end - r.pos:
        raise UadpDecodeError(f"PromotedFields Size {size} exceeds the {r.end - r.pos} bytes left", at)
    outer_end, outer_scope = r.end, r.scope
    r.end, r.scope = r.pos + size, f"PromotedFields (Size {size})"
    fields = []
    while r.pos < r.end:  # every Variant consumes at least one byte, so this terminates
        fields.append(_field(r, _variant, "PromotedField {}", len(fields)))
    r.end, r.scope = outer_end, outer_scope
    return tuple(fields)


def _padding(r: _Reader, start: int, what: str) -> None:
    """Bytes start..end of a padded payload follow the message: Ethernet padding, which must be zeros."""
    for p in range(start, r.end):
        if r.data[p]:
            raise UadpDecodeError(f"{r.end - start} trailing bytes after {what}, not zero (byte {p} is "
                                  f"0x{r.data[p]:02x}), so not Ethernet padding", p)


def _payload(r: _Reader, writer_ids, shared, types_by_writer, padded: bool) -> tuple[DataSetMessage, ...]:
    count = 1 if writer_ids is None else len(writer_ids)
    sizes = None
    if count > 1:
        at = r.pos
        sizes = r.unpack(_u16_array(count), f"Sizes array[{count}]")
        for i, size in enumerate(sizes):
            if size == 0:
                raise UadpDecodeError(f"Sizes[{i}] is 0; a DataSetMessage has at least its DataSetFlags1", at + 2 * i)
        total = sum(sizes)
        if padded and total < r.end - r.pos:  # the Sizes array says where the message ends
            _padding(r, r.pos + total, f"the {count} DataSetMessages of the Sizes array")
            r.end = r.pos + total
        if total != r.end - r.pos:
            raise UadpDecodeError(f"Sizes array totals {sum(sizes)} bytes but {r.end - r.pos} bytes follow it", at)
    elif r.pos >= r.end:
        raise r.truncated(1, "DataSetMessage")
    messages = []
    for i in range(count):
        if types_by_writer is not None:
            types = types_by_writer.get(writer_ids[i]) if writer_ids is not None else None
        else:
            types = shared
        if sizes is not None:
            r.end, r.scope = r.pos + sizes[i], f"DataSetMessage {i} (Sizes[{i}] = {sizes[i]})"
        messages.append(_dataset_message(r, i, types))
        if r.pos != r.end:
            if sizes is None:
                if padded:  # the only DataSetMessage ended where its last field did
                    _padding(r, r.pos, f"DataSetMessage {i}")
                    break
                raise UadpDecodeError(f"{r.end - r.pos} trailing bytes after DataSetMessage {i}", r.pos)
            raise UadpDecodeError(f"DataSetMessage {i} ends {r.end - r.pos} bytes before Sizes[{i}] = {sizes[i]} says",
                                  r.pos)
    return tuple(messages)


def _dataset_message(r: _Reader, index: int, types) -> DataSetMessage:
    at = r.pos
    f1 = r.u8("DataSetFlags1")
    encoding = (f1 >> 1) & 0x03
    if encoding == 3:
        raise UadpDecodeError(f"DataSetMessage {index} field encoding 0b11 is reserved (DataSetFlags1 bits 1-2)", at)
    f2 = 0
    if f1 & 0x80:
        f2 = r.u8("DataSetFlags2")
        if f2 & 0xC0:
            raise UadpDecodeError(f"DataSetMessage {index} DataSetFlags2 0x{f2:02x} sets reserved bits 6-7", at + 1)
        if f2 & 0x0F > 3:
            raise UadpDecodeError(f"DataSetMessage {index} type {f2 & 0x0F} is reserved (DataSetFlags2 bits 0-3)",
                                  at + 1)
    # Header fields follow in this order, each present when its flag is set.
    seq = r.one(_U16, "DataSetMessage SequenceNumber") if f1 & 0x08 else None
    ts = r.one(_I64, "DataSetMessage Timestamp") if f2 & 0x10 else None
    pico = r.one(_U16, "DataSetMessage PicoSeconds") if f2 & 0x20 else None
    status = r.one(_U16, "DataSetMessage Status") if f1 & 0x10 else None
    major = r.one(_U32, "ConfigurationVersion MajorVersion") if f1 & 0x20 else None
    minor = r.one(_U32, "ConfigurationVersion MinorVersion") if f1 & 0x40 else None
    kind, enc = _KINDS[f2 & 0x0F], _ENCODINGS[encoding]

    raw = None
    fields: tuple = ()
    if kind is DataSetMessageType.KEY_FRAME and enc is FieldEncoding.RAW_DATA:
        # RawData key frames have no FieldCount: the fields fill the DataSetMessage.
        if types is None:
            raw = r.take(r.end - r.pos, "RawData")
        else:
            fields = _raw_key_frame(r, types, f"DataSetMessage {index}")
    elif kind is not DataSetMessageType.KEEP_ALIVE:
        count_at = r.pos
        count = r.one(_U16, "FieldCount")
        delta = kind is DataSetMessageType.DELTA_FRAME
        read = _data_value if enc is FieldEncoding.DATA_VALUE and kind is not DataSetMessageType.EVENT else _variant
        if delta and enc is FieldEncoding.RAW_DATA:
            if types is None:
                raise UadpDecodeError(f"DataSetMessage {index} is a RawData delta frame; decoding it needs the "
                                      "field types", count_at)
            read = None
        min_size = 3 if delta else 1  # a delta entry is a UInt16 FieldIndex plus >= 1 byte of value
        if count * min_size > r.end - r.pos:  # reject before looping: each field takes at least min_size bytes
            raise UadpDecodeError(f"DataSetMessage {index} FieldCount {count} needs at least {count * min_size} bytes, "
                                  f"{r.end - r.pos} left in {r.scope}", count_at)
        if not delta:
            fields = tuple(_field(r, read, "DataSetMessage {} field {}", index, i) for i in range(count))
        else:
            out = []
            for i in range(count):
                at_index = r.pos
                no = r.one(_U16, "delta FieldIndex")
                if read is None:
                    if no >= len(types):
                        raise UadpDecodeError(f"DataSetMessage {index} delta {i} FieldIndex {no} is out of range for "
                                              f"{len(types)} field types", at_index)
                    value = _raw_key_frame(r, types[no:no + 1], f"DataSetMessage {index} delta {i}")[0]
                else:
                    value = _field(r, read, "DataSetMessage {} delta {} (field {})", index, i, no)
                out.append((no, value))
            fields = tuple(out)
    return DataSetMessage(fields, kind, enc, raw, bool(f1 & 0x01), seq, ts, pico, status, major, minor)


def _raw_key_frame(r: _Reader, types: tuple[ua.VariantType, ...], label: str) -> tuple:
    st = raw_struct(types)
    if st.size > r.end - r.pos:
        raise UadpDecodeError(f"{label} RawData fields of types {[t.name for t in types]} need {st.size} bytes, "
                              f"{r.end - r.pos} left in {r.scope}", r.pos)
    values = r.unpack(st, "RawData")
    return tuple(ua.Variant(ua.win_epoch_to_datetime(v) if t is ua.VariantType.DateTime else v, t)
                 for t, v in zip(types, values))


def _field(r: _Reader, read, label: str, *args):
    """Run one field reader; asyncua's exceptions of any type become errors at the field's offset.
    The label is formatted only on error: this runs once per field."""
    at = r.pos
    try:
        return read(r)
    except UadpDecodeError as exc:
        raise UadpDecodeError(f"{label.format(*args)}: {exc.reason}", exc.offset) from None
    except Exception as exc:
        raise UadpDecodeError(f"{label.format(*args)}: asyncua could not decode it ({type(exc).__name__}: {exc})",
                              at) from None


# Scalar Boolean..Double Variants are unpacked here directly: the same values and ua.Variant objects
# asyncua's variant_from_binary builds (a test checks this), at a third of the cost.
_SCALARS = {t: (struct.Struct("<" + f), ua.VariantType(t)) for t, f in enumerate("_?bBhHiIqQfd") if t}


def _variant(r: _Reader) -> ua.Variant:
    at = r.pos
    if at < r.end:
        scalar = _SCALARS.get(r.data[at])  # only masks 1..11: no array or dimensions bits set
        if scalar is not None:
            st, vtype = scalar
            if at + 1 + st.size <= r.end:
                r.pos = at + 1 + st.size
                return ua.Variant(st.unpack_from(r.data, at + 1)[0], vtype)
    try:
        end, strict = scan_variant(r.data, at, r.end, 0)
    except UadpDecodeError as exc:  # say which bound ran out: the message, a Sizes entry, PromotedFields
        if not exc.reason.startswith("truncated"):
            raise
        raise UadpDecodeError(f"{exc.reason} in {r.scope}", exc.offset) from None
    # The Buffer stops at the scanned end, so asyncua cannot read past this field.
    buf = (_StrictBuffer if strict else Buffer)(r.data, at, end - at)
    value = variant_from_binary(buf)
    if buf.cur_pos != end:
        raise UadpDecodeError(f"asyncua read {buf.cur_pos - at} bytes of a {end - at}-byte Variant", at)
    r.pos = end
    return value


def _data_value(r: _Reader) -> ua.DataValue:
    # Decoded here rather than by asyncua's struct codec: asyncua 2.1.0 orders the body as
    # SourceTimestamp, ServerTimestamp, SourcePicoseconds, while OPC 10000-6 §5.2.2.17 puts
    # SourcePicoseconds right after SourceTimestamp. Field objects are still asyncua's.
    at = r.pos
    mask = r.u8("DataValue EncodingMask")
    if mask & 0xC0:
        raise UadpDecodeError(f"DataValue EncodingMask 0x{mask:02x} sets reserved bits 6-7", at)
    value = _variant(r) if mask & 0x01 else None
    status = ua.StatusCode(r.one(_U32, "DataValue StatusCode")) if mask & 0x02 else None
    src = ua.win_epoch_to_datetime(r.one(_I64, "DataValue SourceTimestamp")) if mask & 0x04 else None
    src_pico = r.one(_U16, "DataValue SourcePicoseconds") if mask & 0x10 else None
    srv = ua.win_epoch_to_datetime(r.one(_I64, "DataValue ServerTimestamp")) if mask & 0x08 else None
    srv_pico = r.one(_U16, "DataValue ServerPicoseconds") if mask & 0x20 else None
    return ua.DataValue(Value=value, StatusCode=status, SourceTimestamp=src, ServerTimestamp=srv,
                        SourcePicoseconds=src_pico, ServerPicoseconds=srv_pico)


class _StrictBuffer(Buffer):
    """asyncua's Buffer moves its cursor backwards on a negative read; inside ExtensionObject bodies
    (which the scan below does not walk) that would let a list of -4-length Strings loop 2**31 times."""

    def read(self, size: int) -> bytes:
        if size < 0:
            raise ValueError(f"negative length {size}")
        return super().read(size)

    def skip(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"negative length {size}")
        super().skip(size)

    def copy(self, size: int = -1) -> Buffer:
        left = len(self)
        return _StrictBuffer(self._data, self.cur_pos, left if size < 0 or size > left else size)
