"""The streaming sequence model (a causal transformer over sensor frames, GroupQueryAttention with
in-place KV) and its runtime: `StreamPool` (many streams, KV tiers) and `StreamingRunner`."""
from .model import (ReferenceStream, StreamSpec, build_model, head_range_of, positional_encoding,
                    reference_attention)
from .pool import PoolConfig, StreamPool, StreamState
from .runner import StreamingRunner

__all__ = ["PoolConfig", "ReferenceStream", "StreamPool", "StreamSpec", "StreamState", "StreamingRunner",
           "build_model", "head_range_of", "positional_encoding", "reference_attention"]
