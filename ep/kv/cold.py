"""Cold tier: fixed-size slots in one file (`os.pwrite`/`os.pread`), rebuilt from the file on open.

Every slot starts with a 48-byte header::

    struct "<4sBBHQQQIIII"  magic b"SKVC", kind (1 page, 2 snapshot), 0, 0, stream id, key (page index;
                            0 for snapshots), generation, part, parts, payload length, CRC32 of payload

A slot whose magic, lengths or CRC do not check out is free (never written, released, or torn by a
crash mid-write). Two record kinds:

- **pages** (archived KV pages, one slot each). Retention is a per-stream ring of `ring_pages`
  slots: page k lives in the stream's ring position k % ring_pages and overwrites page
  k - ring_pages in place. Disk per stream and the in-RAM index (one int32 array per stream) are
  therefore fixed; older pages are gone (the audit log keeps the frames that produced them).
- **snapshots** (lossless hot state of a suspended or checkpointed stream), one per stream, spread
  over as many slots as needed. A new snapshot is written to free slots under a higher generation
  before the old one's slots are released, so a crash at any point leaves one complete snapshot.

Durability: writes reach the page cache at once (they survive a process crash); `sync()` (fsync)
is for power loss and is called by checkpoints, not per token.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

from .codec import KvError

SLOT_MAGIC = b"SKVC"
SLOT_HEADER = struct.Struct("<4sBBHQQQIIII")
KIND_PAGE, KIND_SNAPSHOT = 1, 2


class ColdStore:
    def __init__(self, path: str | Path, slot_bytes: int = 4096, ring_pages: int = 1024) -> None:
        if slot_bytes < SLOT_HEADER.size + 64 or slot_bytes % 512:
            raise KvError(f"cold store {path}: slot_bytes {slot_bytes} must be a multiple of 512 and >= 512")
        self.path = Path(path)
        self.slot_bytes, self.ring_pages = slot_bytes, ring_pages
        self.payload_bytes = slot_bytes - SLOT_HEADER.size
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise KvError(f"cold store {self.path}: cannot open it: {exc}") from exc
        self._slots = 0
        self._free: list[int] = []
        self._rings: dict[int, np.ndarray] = {}      # stream -> slot per ring position (-1: none)
        self._ring_keys: dict[int, np.ndarray] = {}  # stream -> page index held per ring position
        self._snapshots: dict[int, tuple[int, list[int]]] = {}  # stream -> (generation, slots)
        self._generation = 0
        self._zero = bytes(slot_bytes)
        self._scan()

    # --- open / recovery ---------------------------------------------------------------------
    def _scan(self) -> None:
        size = os.fstat(self._fd).st_size
        if size % self.slot_bytes:
            raise KvError(f"cold store {self.path}: size {size} is not a multiple of the slot size "
                          f"{self.slot_bytes} (another slot size, or not a cold store)")
        self._slots = size // self.slot_bytes
        parts: dict[tuple[int, int], dict[int, int]] = {}
        nparts: dict[tuple[int, int], int] = {}
        free = []
        for slot in range(self._slots):
            head = self._read_valid(slot)
            if head is None:
                free.append(slot)
                continue
            kind, stream, key, gen, part, n = head
            self._generation = max(self._generation, gen)
            if kind == KIND_PAGE:
                ring, keys = self._ring(stream)
                pos = key % self.ring_pages
                if ring[pos] >= 0 and keys[pos] >= key:
                    free.append(slot)  # an older copy (a crash between two writes of one position)
                    continue
                if ring[pos] >= 0:
                    free.append(int(ring[pos]))
                ring[pos], keys[pos] = slot, key
            else:
                parts.setdefault((stream, gen), {})[part] = slot
                nparts[(stream, gen)] = n
        for (stream, gen), got in sorted(parts.items(), key=lambda kv: kv[0][1]):
            complete = len(got) == nparts[(stream, gen)] and set(got) == set(range(nparts[(stream, gen)]))
            if complete:
                old = self._snapshots.get(stream)
                if old is not None:
                    free.extend(old[1])
                self._snapshots[stream] = (gen, [got[i] for i in range(len(got))])
            else:
                free.extend(got.values())
        self._free = sorted(set(free), reverse=True)

    def _read_valid(self, slot: int):
        buf = os.pread(self._fd, self.slot_bytes, slot * self.slot_bytes)
        if len(buf) < SLOT_HEADER.size:
            return None
        magic, kind, _, _, stream, key, gen, part, n, length, crc = SLOT_HEADER.unpack_from(buf)
        if magic != SLOT_MAGIC or kind not in (KIND_PAGE, KIND_SNAPSHOT) or length > self.payload_bytes \
                or part >= n or zlib.crc32(buf[SLOT_HEADER.size:SLOT_HEADER.size + length]) != crc:
            return None
        return kind, stream, key, gen, part, n

    # --- slots -------------------------------------------------------------------------------
    def _ring(self, stream: int) -> tuple[np.ndarray, np.ndarray]:
        if stream not in self._rings:
            self._rings[stream] = np.full(self.ring_pages, -1, np.int32)
            self._ring_keys[stream] = np.full(self.ring_pages, -1, np.int64)
        return self._rings[stream], self._ring_keys[stream]

    def _alloc(self) -> int:
        if self._free:
            return self._free.pop()
        self._slots += 1
        return self._slots - 1

    def _write(self, slot: int, kind: int, stream: int, key: int, gen: int, part: int, n: int, payload) -> None:
        head = SLOT_HEADER.pack(SLOT_MAGIC, kind, 0, 0, stream, key, gen, part, n, len(payload), zlib.crc32(payload))
        buf = head + bytes(payload) + self._zero[: self.slot_bytes - SLOT_HEADER.size - len(payload)]
        os.pwrite(self._fd, buf, slot * self.slot_bytes)

    def _release(self, slots) -> None:
        for slot in slots:
            os.pwrite(self._fd, self._zero[:SLOT_HEADER.size], slot * self.slot_bytes)
            self._free.append(slot)

    # --- pages -------------------------------------------------------------------------------
    def put_page(self, stream: int, page_index: int, blob: bytes) -> None:
        if len(blob) > self.payload_bytes:
            raise KvError(f"cold store {self.path}: page {page_index} of stream {stream} is {len(blob)} bytes, "
                          f"a slot holds {self.payload_bytes}: use a larger slot_bytes")
        ring, keys = self._ring(stream)
        pos = page_index % self.ring_pages
        if ring[pos] < 0:
            ring[pos] = self._alloc()
        self._generation += 1
        self._write(int(ring[pos]), KIND_PAGE, stream, page_index, self._generation, 0, 1, blob)
        keys[pos] = page_index

    def get_page(self, stream: int, page_index: int) -> bytes:
        ring, keys = self._rings.get(stream), self._ring_keys.get(stream)
        pos = page_index % self.ring_pages
        if ring is None or keys[pos] != page_index:
            raise KvError(f"cold store {self.path}: page {page_index} of stream {stream} is not retained "
                          f"(the ring keeps the last {self.ring_pages} pages)")
        return self._payload(int(ring[pos]), f"page {page_index} of stream {stream}")

    def pages(self, stream: int) -> list[int]:
        keys = self._ring_keys.get(stream)
        return sorted(int(k) for k in keys if k >= 0) if keys is not None else []

    def _payload(self, slot: int, what: str) -> bytes:
        buf = os.pread(self._fd, self.slot_bytes, slot * self.slot_bytes)
        head = SLOT_HEADER.unpack_from(buf)
        length, crc = head[9], head[10]
        payload = buf[SLOT_HEADER.size:SLOT_HEADER.size + length]
        if head[0] != SLOT_MAGIC or zlib.crc32(payload) != crc:
            raise KvError(f"cold store {self.path}: slot {slot} ({what}) is damaged (magic or CRC32)")
        return payload

    # --- snapshots ---------------------------------------------------------------------------
    def put_snapshot(self, stream: int, blob: bytes) -> None:
        n = max(1, -(-len(blob) // self.payload_bytes))
        self._generation += 1
        slots = [self._alloc() for _ in range(n)]
        view = memoryview(blob)
        for part, slot in enumerate(slots):
            chunk = view[part * self.payload_bytes:(part + 1) * self.payload_bytes]
            self._write(slot, KIND_SNAPSHOT, stream, 0, self._generation, part, n, chunk)
        old = self._snapshots.get(stream)
        self._snapshots[stream] = (self._generation, slots)
        if old is not None:
            self._release(old[1])

    def get_snapshot(self, stream: int) -> bytes:
        entry = self._snapshots.get(stream)
        if entry is None:
            raise KvError(f"cold store {self.path}: no snapshot of stream {stream}")
        return b"".join(self._payload(s, f"snapshot of stream {stream}") for s in entry[1])

    def has_snapshot(self, stream: int) -> bool:
        return stream in self._snapshots

    def streams(self) -> set[int]:
        return set(self._snapshots) | set(self._rings)

    def drop_stream(self, stream: int) -> None:
        """Releases every slot of `stream` (its snapshot and its archived pages)."""
        entry = self._snapshots.pop(stream, None)
        if entry is not None:
            self._release(entry[1])
        ring = self._rings.pop(stream, None)
        self._ring_keys.pop(stream, None)
        if ring is not None:
            self._release(int(s) for s in ring if s >= 0)

    # --- file --------------------------------------------------------------------------------
    @property
    def file_bytes(self) -> int:
        return self._slots * self.slot_bytes

    def index_bytes(self) -> int:
        """RAM held by the in-memory index (ring arrays; snapshot slot lists)."""
        rings = sum(r.nbytes + k.nbytes for r, k in zip(self._rings.values(), self._ring_keys.values()))
        return rings + sum(8 * len(s) for _, s in self._snapshots.values())

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
