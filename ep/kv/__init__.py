"""KV cache tiers for streaming models: page and snapshot codecs, the cold slot file, the frame
journal, and the warm/cold page tiers with their eviction policy (hot buffers: `ep.streaming.pool`)."""
from .codec import KvError, PageCodec, SnapshotCodec
from .cold import ColdStore
from .journal import FrameJournal
from .tiers import PageTiers

__all__ = ["ColdStore", "FrameJournal", "KvError", "PageCodec", "PageTiers", "SnapshotCodec"]
