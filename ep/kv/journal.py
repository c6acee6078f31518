"""Frame journal: every token's input frame, appended before the step runs, for crash recovery.

A stream's state after a crash = its last snapshot in the cold store + the journaled frames after
it, replayed through the model (one intra-op thread: ORT computes the same bits again, so the
recovered KV equals the lost one). Record: struct "<QQ" (stream id, position) + n_inputs float32 +
CRC32 of the preceding bytes. A torn record at the tail (crash mid-write) fails its CRC and ends the
read. `os.write` on an O_APPEND descriptor: the record is in the page cache when `append` returns
(survives a process crash); `sync()` (fsync) is for power loss. `truncate()` after a checkpoint of
every stream keeps the file short.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

from .codec import KvError

HEAD = struct.Struct("<QQ")


class FrameJournal:
    def __init__(self, path: str | Path, n_inputs: int) -> None:
        self.path = Path(path)
        self.n_inputs = n_inputs
        self.record_bytes = HEAD.size + 4 * n_inputs + 4
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise KvError(f"frame journal {self.path}: cannot open it: {exc}") from exc
        self._buf = bytearray(self.record_bytes)
        self._frame = np.frombuffer(self._buf, np.float32, n_inputs, HEAD.size)

    def append(self, stream: int, position: int, frame: np.ndarray) -> None:
        HEAD.pack_into(self._buf, 0, stream, position)
        self._frame[:] = frame.reshape(-1)
        end = self.record_bytes - 4
        struct.pack_into("<I", self._buf, end, zlib.crc32(memoryview(self._buf)[:end]))
        os.write(self._fd, self._buf)

    def read(self) -> dict[int, list[tuple[int, np.ndarray]]]:
        """stream -> [(position, frame float32 [n_inputs]), ...] in file order, up to the first bad record."""
        out: dict[int, list[tuple[int, np.ndarray]]] = {}
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        end = self.record_bytes - 4
        for off in range(0, len(data) - self.record_bytes + 1, self.record_bytes):
            rec = data[off:off + self.record_bytes]
            if zlib.crc32(rec[:end]) != struct.unpack_from("<I", rec, end)[0]:
                break
            stream, position = HEAD.unpack_from(rec)
            out.setdefault(stream, []).append((position, np.frombuffer(rec, np.float32, self.n_inputs, HEAD.size)))
        return out

    def truncate(self) -> None:
        os.ftruncate(self._fd, 0)

    def sync(self) -> None:
        os.fsync(self._fd)

    @property
    def file_bytes(self) -> int:
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
