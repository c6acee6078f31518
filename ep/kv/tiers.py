"""Warm and cold tiers for KV pages that slid out of the hot window, and the eviction policy.

Tiers (what attention sees is only the hot window; the others are an archive and a parking lot):

    hot    fixed-capacity float32 buffers that ORT's GroupQueryAttention appends to in place
           (`ep.streaming.pool`); a limited number of slots shared by all streams
    warm   evicted pages quantized (int8 default, or float8 e4m3fn) + zstd, in RAM: a preallocated
           arena of `warm_pages` fixed-size page slots per hot slot, so warm RAM never grows
    cold   the fixed-slot file (`ep.kv.cold`): pages demoted from warm (a ring of `ring_pages` per
           stream) and the lossless snapshots of suspended streams

Eviction policy:
  - a hot window that is full slides by one page: its oldest page goes to warm (encode ~10 us);
  - a stream's warm pages beyond `warm_pages` go to cold, oldest first;
  - when a stream needs a hot slot and none is free, the least recently used stream is suspended:
    its window is snapshotted losslessly to cold and its warm pages are demoted to cold, so a
    suspended stream holds no KV in RAM (only its metadata);
  - cold keeps the last `ring_pages` pages per stream; older ones are overwritten.

Nothing here is read on the per-token path: `page()` (decode an archived page) is for audit,
replay and inspection. RAM is allocated once: the hot slab and the warm arenas (hot_slots x
warm_pages x page_slot_bytes); a stream's KV RAM is one hot slot + one arena, at any length.
"""
from __future__ import annotations

import numpy as np

from .codec import PAGE_HEADER, KvError, PageCodec
from .cold import ColdStore


def page_slot_bytes(layers: int, kv_heads: int, tokens: int, head_dim: int) -> int:
    """The largest encoded page: header, scales and zstd's worst case (ZSTD_compressBound) for the
    1-byte values."""
    n = layers * 2 * kv_heads * tokens * head_dim
    bound = n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0)
    return PAGE_HEADER.size + 4 * layers * 2 * kv_heads + bound


class PageTiers:
    """Warm arenas (one per hot slot, attached to the stream that holds the slot) and the cold store."""

    def __init__(self, cold: ColdStore, arenas: int, warm_pages: int, slot_bytes: int,
                 page_format: str = "int8") -> None:
        self.cold = cold
        self.warm_pages, self.slot_bytes = warm_pages, slot_bytes
        self.codec = PageCodec(page_format)
        self.slab = np.zeros((arenas, max(warm_pages, 1), slot_bytes), np.uint8)
        self._len = np.zeros((arenas, max(warm_pages, 1)), np.int64)
        self._index = np.full((arenas, max(warm_pages, 1)), -1, np.int64)
        self._head = [0] * arenas   # oldest page's position in the arena ring
        self._count = [0] * arenas
        self._arena: dict[int, int] = {}
        self.stats = {"archived": 0, "to_cold": 0}

    def attach(self, stream: int, arena: int) -> None:
        """`stream` takes hot slot `arena`'s warm arena (empty: a parked stream has no warm pages)."""
        self._arena[stream] = arena
        self._head[arena] = self._count[arena] = 0

    def archive(self, stream: int, page_index: int, page: np.ndarray) -> None:
        """Encodes `page` (float32 [layers, 2, kv_heads, tokens, head_dim]) into the stream's arena; when
        it is full, the oldest warm page moves to cold first."""
        blob = self.codec.encode(page)
        if len(blob) > self.slot_bytes:  # cannot happen within ZSTD_compressBound; a wrong page shape would
            raise KvError(f"stream {stream}: page {page_index} encodes to {len(blob)} bytes, the warm slot "
                          f"holds {self.slot_bytes} (page shape {page.shape} does not match the pool)")
        self.stats["archived"] += 1
        a = self._arena.get(stream)
        if a is None or self.warm_pages == 0:
            self.cold.put_page(stream, page_index, blob)
            self.stats["to_cold"] += 1
            return
        if self._count[a] == self.warm_pages:
            self._oldest_to_cold(stream, a)
        pos = (self._head[a] + self._count[a]) % self.warm_pages
        self.slab[a, pos, :len(blob)] = np.frombuffer(blob, np.uint8)
        self._len[a, pos], self._index[a, pos] = len(blob), page_index
        self._count[a] += 1

    def _oldest_to_cold(self, stream: int, a: int) -> None:
        pos = self._head[a]
        self.cold.put_page(stream, int(self._index[a, pos]), self.slab[a, pos, :self._len[a, pos]].tobytes())
        self._head[a] = (pos + 1) % self.warm_pages
        self._count[a] -= 1
        self.stats["to_cold"] += 1

    def flush(self, stream: int) -> None:
        """Every warm page of `stream` to cold (checkpoint); the arena stays attached."""
        a = self._arena.get(stream)
        while a is not None and self._count[a]:
            self._oldest_to_cold(stream, a)

    def demote(self, stream: int) -> None:
        """`stream` goes idle: its warm pages to cold, its arena free for the next holder of the slot."""
        self.flush(stream)
        self._arena.pop(stream, None)

    def drop(self, stream: int) -> None:
        self._arena.pop(stream, None)
        self.cold.drop_stream(stream)

    def _warm(self, stream: int):
        a = self._arena.get(stream)
        if a is None:
            return
        for k in range(self._count[a]):
            pos = (self._head[a] + k) % self.warm_pages
            yield int(self._index[a, pos]), a, pos

    def page(self, stream: int, page_index: int) -> tuple[np.ndarray, str]:
        """(decoded page float32, "warm" or "cold"): off the per-token path."""
        for index, a, pos in self._warm(stream):
            if index == page_index:
                return self.codec.decode(self.slab[a, pos, :self._len[a, pos]].tobytes()), "warm"
        try:
            return self.codec.decode(self.cold.get_page(stream, page_index)), "cold"
        except KvError as exc:
            raise KvError(f"stream {stream}: page {page_index} is in neither tier ({exc})") from exc

    def warm_indices(self, stream: int) -> list[int]:
        return [index for index, _, _ in self._warm(stream)]

    def warm_used_bytes(self, stream: int) -> int:
        """Encoded bytes of the stream's warm pages (what a growing store would hold)."""
        return int(sum(self._len[a, pos] for _, a, pos in self._warm(stream)))

    def arena_bytes(self) -> int:
        """RAM of one warm arena (allocated whether or not it is full)."""
        return self.slab[0].nbytes + self._len[0].nbytes + self._index[0].nbytes
