"""UADP NetworkMessages (OPC 10000-14 §7.2.4, Annex A): a fast fixed-layout codec and a general one.

`FixedLayout` (Variant fields) and `RawLayout` (RawData) are the hot path for the one layout a config
declares (any fixed-size numeric field types); `encode`/`decode` handle any DataSetMessage
NetworkMessage (no security, chunking or discovery) with `NetworkMessage` values.
"""
from ..errors import UadpDecodeError
from .decode import ETHERNET_MIN_PAYLOAD, decode, unpadded_length
from .encode import encode
from .fixed import (DATASET_FLAGS1, DATASET_FLAGS2, EXT_FLAGS1, FIELD_TYPES, GROUP_FLAGS, UADP_FLAGS, UADP_VERSION,
                    VARIANT_DOUBLE, FixedLayout, RawDoubleLayout, RawLayout, UadpMessage, compile_layout,
                    datetime_ticks_from_ns, field_types_of, ns_from_datetime_ticks)
from .scan import MAX_ARRAY_RANK, MAX_NESTING
from .messages import RAW_FORMATS, DataSetMessage, DataSetMessageType, FieldEncoding, NetworkMessage, PublisherIdType

__all__ = [
    # fixed layout
    "FixedLayout", "RawLayout", "RawDoubleLayout", "compile_layout", "FIELD_TYPES", "field_types_of", "UadpMessage",
    "datetime_ticks_from_ns", "ns_from_datetime_ticks",
    "UADP_VERSION", "UADP_FLAGS", "EXT_FLAGS1", "GROUP_FLAGS", "DATASET_FLAGS1", "DATASET_FLAGS2", "VARIANT_DOUBLE",
    # general codec
    "encode", "decode", "NetworkMessage", "DataSetMessage", "PublisherIdType", "FieldEncoding",
    "DataSetMessageType", "unpadded_length", "ETHERNET_MIN_PAYLOAD", "RAW_FORMATS", "MAX_NESTING", "MAX_ARRAY_RANK",
    "UadpDecodeError",
]
