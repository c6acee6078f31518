"""General UADP NetworkMessage encoder (OPC 10000-14 §7.2.4): flags follow from which fields are set.

An inconsistent message (wrong types, out-of-range numbers, counts that disagree) raises ValueError.
"""
from __future__ import annotations

import struct
import uuid

from asyncua import ua
from asyncua.ua.ua_binary import variant_to_binary

from .messages import (RAW_FORMATS, DataSetMessage, DataSetMessageType, FieldEncoding, NetworkMessage,
                       PublisherIdType, raw_struct)

_B, _U16, _U32, _U64, _I32, _I64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<Q", "<i", "<q"))
_PUBLISHER_ID = {PublisherIdType.BYTE: _B, PublisherIdType.UINT16: _U16,
                 PublisherIdType.UINT32: _U32, PublisherIdType.UINT64: _U64}


def _pack(st: struct.Struct, value, what: str) -> bytes:
    try:
        return st.pack(value)
    except (struct.error, TypeError) as exc:
        raise ValueError(f"{what} = {value!r} does not fit {st.format}: {exc}") from None


def encode(msg: NetworkMessage) -> bytes:
    """Encode a NetworkMessage with DataSetMessage payload; unsupported parts (security, chunks,
    discovery) have no representation in the model and are never written."""
    out: list[bytes] = []
    ext1 = ext2 = 0
    flags = 0x01  # UADP version 1
    pid = msg.publisher_id
    if pid is not None:
        flags |= 0x10
        ptype = msg.publisher_id_type
        if ptype is None or (ptype is PublisherIdType.STRING) != isinstance(pid, str):
            raise ValueError(f"publisher_id {pid!r} does not match publisher_id_type {ptype!r}")
        ext1 |= PublisherIdType(ptype)
    elif msg.publisher_id_type is not None:
        raise ValueError("publisher_id_type is set but publisher_id is None")
    if msg.dataset_class_id is not None:
        ext1 |= 0x08
    if msg.timestamp is not None:
        ext1 |= 0x20
    if msg.picoseconds is not None:
        ext1 |= 0x40
    if msg.promoted_fields is not None:
        ext2 |= 0x02
    if ext2:
        ext1 |= 0x80
    if ext1:  # a Byte PublisherId alone needs no ExtendedFlags1: type 0 is the default
        flags |= 0x80
    group = (msg.writer_group_id, msg.group_version, msg.network_message_number, msg.sequence_number)
    gflags = sum(bit for bit, v in zip((1, 2, 4, 8), group) if v is not None)
    if gflags:
        flags |= 0x20

    messages = tuple(msg.messages)
    ids = msg.dataset_writer_ids
    if not messages:
        raise ValueError("a NetworkMessage carries at least one DataSetMessage")
    if ids is None:
        if len(messages) != 1:
            raise ValueError(f"{len(messages)} DataSetMessages need a PayloadHeader (dataset_writer_ids)")
    else:
        flags |= 0x40
        if len(ids) != len(messages) or len(ids) > 255:
            raise ValueError(f"{len(ids)} DataSetWriterIds for {len(messages)} DataSetMessages (1..255, equal)")
    if msg.promoted_fields is not None and len(messages) != 1:
        raise ValueError("PromotedFields require exactly one DataSetMessage")

    out.append(bytes((flags,)))
    if flags & 0x80:
        out.append(bytes((ext1,)))
        if ext2:
            out.append(bytes((ext2,)))
    if pid is not None:
        if isinstance(pid, str):
            body = pid.encode("utf-8")
            out.append(_pack(_I32, len(body), "PublisherId length"))
            out.append(body)
        else:
            out.append(_pack(_PUBLISHER_ID[msg.publisher_id_type], pid, "publisher_id"))
    if msg.dataset_class_id is not None:
        if not isinstance(msg.dataset_class_id, uuid.UUID):
            raise ValueError(f"dataset_class_id must be a uuid.UUID, got {msg.dataset_class_id!r}")
        out.append(msg.dataset_class_id.bytes_le)  # OPC UA Guid: Data1-3 little endian, Data4 as is
    if gflags:
        out.append(bytes((gflags,)))
        for v, st, name in zip(group, (_U16, _U32, _U16, _U16),
                               ("writer_group_id", "group_version", "network_message_number", "sequence_number")):
            if v is not None:
                out.append(_pack(st, v, name))
    if ids is not None:
        out.append(bytes((len(ids),)))
        out.extend(_pack(_U16, w, "dataset_writer_ids[]") for w in ids)
    if msg.timestamp is not None:
        out.append(_pack(_I64, msg.timestamp, "timestamp"))
    if msg.picoseconds is not None:
        out.append(_pack(_U16, msg.picoseconds, "picoseconds"))
    if msg.promoted_fields is not None:
        body = b"".join(_variant(v, f"promoted_fields[{i}]") for i, v in enumerate(msg.promoted_fields))
        out.append(_pack(_U16, len(body), "PromotedFields Size"))
        out.append(body)

    bodies = [_dataset_message(m, i) for i, m in enumerate(messages)]
    if len(bodies) > 1:  # the Sizes array is present only with a PayloadHeader Count > 1
        out.extend(_pack(_U16, len(b), f"size of DataSetMessage {i}") for i, b in enumerate(bodies))
    out.extend(bodies)
    return b"".join(out)


def _dataset_message(m: DataSetMessage, index: int) -> bytes:
    where = f"DataSetMessage {index}"
    kind, enc = DataSetMessageType(m.message_type), FieldEncoding(m.field_encoding)
    f1 = (0x01 if m.valid else 0) | (enc << 1)
    f2 = kind
    for bit, v in ((0x08, m.sequence_number), (0x10, m.status), (0x20, m.major_version), (0x40, m.minor_version)):
        if v is not None:
            f1 |= bit
    if m.timestamp is not None:
        f2 |= 0x10
    if m.picoseconds is not None:
        f2 |= 0x20
    if f2:  # a key frame without timestamps needs no DataSetFlags2
        f1 |= 0x80
    out = [bytes((f1, f2)) if f2 else bytes((f1,))]
    for v, st, name in ((m.sequence_number, _U16, "sequence_number"), (m.timestamp, _I64, "timestamp"),
                        (m.picoseconds, _U16, "picoseconds"), (m.status, _U16, "status"),
                        (m.major_version, _U32, "major_version"), (m.minor_version, _U32, "minor_version")):
        if v is not None:
            out.append(_pack(st, v, f"{where} {name}"))

    if m.raw is not None and (kind is not DataSetMessageType.KEY_FRAME or enc is not FieldEncoding.RAW_DATA
                              or m.fields):
        raise ValueError(f"{where}: raw bytes are only for a RawData key frame without fields")
    if kind is DataSetMessageType.KEEP_ALIVE:
        if m.fields:
            raise ValueError(f"{where}: a keep-alive carries no fields")
    elif kind is DataSetMessageType.KEY_FRAME and enc is FieldEncoding.RAW_DATA:
        out.append(bytes(m.raw) if m.raw is not None else _raw(m.fields, where))  # no FieldCount
    else:
        out.append(_pack(_U16, len(m.fields), f"{where} FieldCount"))
        write = _data_value if enc is FieldEncoding.DATA_VALUE and kind is not DataSetMessageType.EVENT else _variant
        if kind is DataSetMessageType.DELTA_FRAME:
            for i, pair in enumerate(m.fields):
                try:
                    no, value = pair
                except (TypeError, ValueError):
                    raise ValueError(f"{where} delta {i} must be a (field_index, value) pair, got {pair!r}") from None
                out.append(_pack(_U16, no, f"{where} delta {i} FieldIndex"))
                out.append(_raw((value,), f"{where} delta {i}") if enc is FieldEncoding.RAW_DATA
                           else write(value, f"{where} delta {i}"))
        else:
            out.extend(write(v, f"{where} field {i}") for i, v in enumerate(m.fields))
    return b"".join(out)


# Scalar Boolean..Double Variants: the type byte and the value, exactly as asyncua's variant_to_binary
# writes them (a test checks this), without its per-call dispatch.
_SCALARS = {ua.VariantType(t): struct.Struct("<B" + f) for t, f in enumerate("_?bBhHiIqQfd") if t}


def _variant(v, where: str) -> bytes:
    if not isinstance(v, ua.Variant):
        raise ValueError(f"{where} must be a ua.Variant, got {type(v).__name__}")
    st = _SCALARS.get(v.VariantType)
    if st is not None and not v.is_array and not isinstance(v.Value, list | tuple):
        try:
            return st.pack(v.VariantType, v.Value)
        except (struct.error, TypeError):
            pass  # asyncua below raises with its explanation
    try:
        return variant_to_binary(v)
    except Exception as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _data_value(dv, where: str) -> bytes:
    # Body order per OPC 10000-6 §5.2.2.17 (asyncua 2.1.0 swaps SourcePicoseconds and ServerTimestamp).
    if not isinstance(dv, ua.DataValue):
        raise ValueError(f"{where} must be a ua.DataValue, got {type(dv).__name__}")
    value = dv.Value
    has_value = value is not None and not (value.VariantType == ua.VariantType.Null and not value.is_array)
    parts = [_variant(value, f"{where} Value")] if has_value else []
    mask = 0x01 if has_value else 0
    if dv.StatusCode is not None:
        if not isinstance(dv.StatusCode, ua.StatusCode):
            raise ValueError(f"{where} StatusCode must be a ua.StatusCode, got {dv.StatusCode!r}")
        mask |= 0x02
        parts.append(_pack(_U32, dv.StatusCode.value, f"{where} StatusCode"))
    for bit, v, name in ((0x04, dv.SourceTimestamp, "SourceTimestamp"), (0x10, dv.SourcePicoseconds, "SourcePicoseconds"),
                         (0x08, dv.ServerTimestamp, "ServerTimestamp"), (0x20, dv.ServerPicoseconds, "ServerPicoseconds")):
        if v is not None:
            mask |= bit
            parts.append(_pack(_U16, v, f"{where} {name}") if bit & 0x30 else _ticks(v, f"{where} {name}"))
    return bytes((mask,)) + b"".join(parts)


def _ticks(when, where: str) -> bytes:
    try:
        return _I64.pack(ua.datetime_to_win_epoch(when))
    except Exception as exc:
        raise ValueError(f"{where} = {when!r} is not a DateTime: {exc}") from None


def _raw(values, where: str) -> bytes:
    types = []
    plain = []
    for i, v in enumerate(values):
        if not isinstance(v, ua.Variant) or v.VariantType not in RAW_FORMATS or v.is_array:
            raise ValueError(f"{where} field {i}: RawData needs a scalar ua.Variant of "
                             f"{', '.join(t.name for t in RAW_FORMATS)}, got {v!r}")
        types.append(v.VariantType)
        plain.append(ua.datetime_to_win_epoch(v.Value) if v.VariantType == ua.VariantType.DateTime else v.Value)
    try:
        return raw_struct(tuple(types)).pack(*plain)
    except (struct.error, TypeError) as exc:
        raise ValueError(f"{where}: RawData value does not fit its type: {exc}") from None
