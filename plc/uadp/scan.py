"""Bounds check of a Variant's structure before asyncua decodes it.

asyncua trusts lengths: a negative String length rewinds its cursor, and an array of Null (zero
bytes per element) of length 2**31 loops and allocates without bound. This walks a Variant once
and checks every length against the bytes left, so hostile input fails with its exact offset.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import struct

from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua.ua_binary import get_safe_type_hints, nodeid_from_binary
from asyncua.ua.uatypes import type_from_list, type_from_optional, type_is_list, type_is_optional, type_is_union

from ..errors import UadpDecodeError

_I32 = struct.Struct("<i")

# Guards so that random input cannot recurse or allocate without bound inside asyncua.
MAX_NESTING = 32  # Variant-in-Variant / DataValue / ExtensionObject depth
MAX_ARRAY_RANK = 32

# ---- Variant structure scan -------------------------------------------------------------------
# asyncua trusts lengths: a negative String length rewinds its cursor, and an array of Null
# (zero bytes per element) of length 2**31 loops and allocates without bound. Before asyncua sees
# a Variant we walk its structure once and check every length against the bytes left, rejecting
# such input with its exact offset. Returns (end offset, whether asyncua decodes an ExtensionObject
# body, which must then use the _StrictBuffer).

_FIXED = (0, 1, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 0, 8, 16, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0)  # by built-in type id
_NODEID = {0: 1, 1: 3, 2: 6, 4: 18}  # fixed NodeId sizes after the encoding byte, by NodeId encoding


def _need(n: int, p: int, end: int, what: str) -> None:
    if p + n > end:
        raise UadpDecodeError(f"truncated {what}: needs {n} bytes, {end - p} left", p)


def _length(data: bytes, p: int, end: int, what: str) -> int:
    _need(4, p, end, f"{what} length")
    n = _I32.unpack_from(data, p)[0]
    if n < -1:
        raise UadpDecodeError(f"{what} length {n} is negative", p)
    if n > end - p - 4:
        raise UadpDecodeError(f"{what} length {n} exceeds the {end - p - 4} bytes left", p)
    return n


def scan_variant(data: bytes, p: int, end: int, depth: int) -> tuple[int, bool]:
    if depth > MAX_NESTING:
        raise UadpDecodeError(f"Variant nesting deeper than {MAX_NESTING} levels", p)
    _need(1, p, end, "Variant EncodingMask")
    mask, at = data[p], p
    vtype, p = mask & 0x3F, p + 1
    if vtype > 25:
        raise UadpDecodeError(f"Variant type {vtype} is not a built-in type", at)
    if not mask & 0x80:
        if mask & 0x40:
            raise UadpDecodeError("Variant has ArrayDimensions but is not an array", at)
        return _scan_value(vtype, data, p, end, depth)
    if vtype == 0:
        raise UadpDecodeError("Variant array of type Null", at)
    count = _length(data, p, end, "Variant array")
    p += 4
    strict = False
    size = _FIXED[vtype]
    if size:
        _need(count * size, p, end, f"Variant array of {count} x {size} bytes")
        p += max(count, 0) * size
    else:
        for _ in range(count):  # count <= bytes left and every element takes >= 1 byte
            p, s = _scan_value(vtype, data, p, end, depth)
            strict |= s
    if mask & 0x40:
        p = _scan_dimensions(data, p, end, max(count, 0))
    return p, strict


def _scan_dimensions(data: bytes, p: int, end: int, count: int) -> int:
    at = p
    rank = _length(data, p, end, "ArrayDimensions")
    if not 1 <= rank <= MAX_ARRAY_RANK:
        raise UadpDecodeError(f"ArrayDimensions rank {rank} is outside 1..{MAX_ARRAY_RANK}", at)
    _need(4 * rank, p + 4, end, "ArrayDimensions")
    dims = struct.unpack_from(f"<{rank}i", data, p + 4)
    product = padded = 1
    for i, d in enumerate(dims):
        if d < 0:
            raise UadpDecodeError(f"ArrayDimensions[{i}] is negative ({d})", p + 8 + 4 * i)
        product *= d
        padded *= d if i == 0 else max(d, 1)
    # asyncua pads the flat list up to dims[0] * prod(max(d, 1)) empty lists: bound that too
    if product != count or padded > max(count, 1):
        raise UadpDecodeError(f"ArrayDimensions {list(dims)} do not match the array length {count}", at)
    return p + 4 + 4 * rank


def _scan_value(vtype: int, data: bytes, p: int, end: int, depth: int) -> tuple[int, bool]:
    size = _FIXED[vtype]
    if size or vtype == 0:
        _need(size, p, end, ua.VariantType(vtype).name)
        return p + size, False
    if vtype in (12, 15, 16):  # String, ByteString, XmlElement
        return p + 4 + max(_length(data, p, end, ua.VariantType(vtype).name), 0), False
    if vtype in (17, 18):
        return _scan_nodeid(data, p, end), False
    if vtype == 20:  # QualifiedName: UInt16 + String
        _need(2, p, end, "QualifiedName")
        return p + 6 + max(_length(data, p + 2, end, "QualifiedName Name"), 0), False
    if vtype == 21:  # LocalizedText: mask, optional Locale and Text Strings
        _need(1, p, end, "LocalizedText EncodingMask")
        if data[p] & 0xFC:
            raise UadpDecodeError(f"LocalizedText EncodingMask 0x{data[p]:02x} sets reserved bits", p)
        mask, p = data[p], p + 1
        for bit in (1, 2):
            if mask & bit:
                p += 4 + max(_length(data, p, end, "LocalizedText String"), 0)
        return p, False
    if vtype == 22:
        return _scan_extension_object(data, p, end)
    if vtype == 23:
        return _scan_data_value(data, p, end, depth + 1)
    if vtype == 24:
        return scan_variant(data, p, end, depth + 1)
    return _scan_diagnostic_info(data, p, end), False


def _scan_nodeid(data: bytes, p: int, end: int) -> int:
    _need(1, p, end, "NodeId EncodingMask")
    mask, at = data[p], p
    kind, p = mask & 0x3F, p + 1
    if kind in _NODEID:
        _need(_NODEID[kind], p, end, "NodeId")
        p += _NODEID[kind]
    elif kind in (3, 5):  # String / ByteString identifier after a UInt16 namespace
        _need(2, p, end, "NodeId namespace")
        p += 6 + max(_length(data, p + 2, end, "NodeId identifier"), 0)
    else:
        raise UadpDecodeError(f"NodeId encoding {kind} is not defined", at)
    if mask & 0x80:  # ExpandedNodeId NamespaceUri
        p += 4 + max(_length(data, p, end, "ExpandedNodeId NamespaceUri"), 0)
    if mask & 0x40:  # ExpandedNodeId ServerIndex
        _need(4, p, end, "ExpandedNodeId ServerIndex")
        p += 4
    return p


def _scan_extension_object(data: bytes, p: int, end: int) -> tuple[int, bool]:
    at = p
    p = _scan_nodeid(data, p, end)
    _need(1, p, end, "ExtensionObject Encoding")
    encoding, p = data[p], p + 1
    if encoding == 0:
        return p, False
    if encoding == 2:
        raise UadpDecodeError("XML-encoded ExtensionObject bodies are not supported", p - 1)
    if encoding != 1:
        raise UadpDecodeError(f"ExtensionObject Encoding {encoding} is reserved", p - 1)
    n = _length(data, p, end, "ExtensionObject body")
    if n < 0:
        raise UadpDecodeError("ExtensionObject body length -1 (null) with a body flag", p)
    type_id = nodeid_from_binary(Buffer(data, at, p - at))
    cls = ua.extension_objects_by_typeid.get(type_id)
    if cls is None:  # unknown type: asyncua keeps the body as bytes
        return p + 4 + n, False
    if not _decoder_is_bounded(cls):
        raise UadpDecodeError(f"ExtensionObject {cls.__name__} is not supported: its members include "
                              "Variant-like or empty types that asyncua decodes without a size bound", at)
    return p + 4 + n, True


def _scan_data_value(data: bytes, p: int, end: int, depth: int) -> tuple[int, bool]:
    _need(1, p, end, "DataValue EncodingMask")
    mask, p = data[p], p + 1
    if mask & 0xC0:
        raise UadpDecodeError(f"DataValue EncodingMask 0x{mask:02x} sets reserved bits 6-7", p - 1)
    strict = False
    if mask & 0x01:
        p, strict = scan_variant(data, p, end, depth)
    size = sum(n for bit, n in ((0x02, 4), (0x04, 8), (0x08, 8), (0x10, 2), (0x20, 2)) if mask & bit)
    _need(size, p, end, "DataValue")
    return p + size, strict


def _scan_diagnostic_info(data: bytes, p: int, end: int) -> int:
    _need(1, p, end, "DiagnosticInfo EncodingMask")
    mask, at = data[p], p
    if mask & 0x80:
        raise UadpDecodeError(f"DiagnosticInfo EncodingMask 0x{mask:02x} sets reserved bit 7", at)
    if mask & 0x40:  # asyncua 2.1.0 reads InnerDiagnosticInfo as an ExtensionObject, not per Part 6
        raise UadpDecodeError("DiagnosticInfo with InnerDiagnosticInfo is not supported", at)
    fixed = 1 + 4 * bin(mask & 0x0F).count("1")  # the mask, then one Int32 per index bit
    _need(fixed, at, end, "DiagnosticInfo")  # checked before moving: the error names a byte inside the message
    p += fixed
    if mask & 0x10:
        p += 4 + max(_length(data, p, end, "DiagnosticInfo AdditionalInfo"), 0)
    if mask & 0x20:
        _need(4, p, end, "DiagnosticInfo InnerStatusCode")
        p += 4
    return p


_UNBOUNDED = {"Null", "Variant", "DataValue", "ExtensionObject", "DiagnosticInfo"}


@functools.lru_cache(maxsize=None)
def _decoder_is_bounded(cls: type, _seen: frozenset = frozenset()) -> bool:
    """Whether asyncua's struct decoder for `cls` reads >= 1 byte per list element and no Variant-like
    member (whose Null arrays take zero bytes each). With the _StrictBuffer its work is then bounded
    by the body length. Conservative: unions, self-references and unknown annotations count as unbounded."""
    if issubclass(cls, enum.Enum):
        return True
    if not dataclasses.is_dataclass(cls) or issubclass(cls, ua.UaUnion) or cls in _seen:
        return False
    try:
        hints = get_safe_type_hints(cls, {"ua": ua})
    except Exception:
        return False
    members = dataclasses.fields(cls)
    if not members:  # zero bytes on the wire: unbounded as a list element
        return False
    for member in members:
        t = hints.get(member.name)
        if type_is_optional(t):
            t = type_from_optional(t)
        if type_is_list(t):
            t = type_from_list(t)
        elif type_is_union(t):
            return False
        if not isinstance(t, type):
            return False
        if hasattr(ua.VariantType, t.__name__):
            if t.__name__ in _UNBOUNDED:
                return False
        elif not _decoder_is_bounded(t, _seen | {cls}):
            return False
    return True
