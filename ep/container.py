"""Weight container (`weights.sitsw`): named tensors in zstd frames with a SHA-256 per chunk.

File layout (all integers little-endian)::

    file header   struct "<8sIIQ"     magic b"SITSW\\x00\\x00\\x01", version (1), flags (bit 0: byte
                                      shuffle), nominal raw chunk size
    chunk 0       struct "<4sIQQ32s"  magic b"SWCK", chunk index, raw length, compressed length,
                                      SHA-256 of the raw (uncompressed) chunk
                  one zstd frame      level 3, checksum and content size in the frame header
    chunk 1 ...
    index         UTF-8 JSON          tensors and chunks, see below
    trailer       struct "<32sQ8s"    SHA-256 of the index bytes, index length, magic b"SITSWIDX"

The *raw stream* is the concatenation of every tensor's bytes in index order, each tensor
byte-shuffled on its own (all first bytes of its elements, then all second bytes, ... as in
blosc/HDF5; a no-op for 1-byte types), cut into chunks of `chunk_size` raw bytes (the last one
shorter). A tensor may span chunks. The index (JSON) holds::

    {"version": 1, "chunk_size": N, "shuffle": "byte",
     "chunks":  [{"offset": file offset of the chunk header, "raw_length": .., "compressed_length": ..,
                  "sha256": hex of the raw chunk, "frame_sha256": hex of the compressed frame}],
     "tensors": [{"name": .., "dtype": "float32" | "float8_e4m3fn" | .. | "bytes", "shape": [..],
                  "stream_offset": .., "length": .., "chunk": first chunk, "offset": offset in it}]}

Reading checks every chunk header against the index, decompresses each frame with reads
bounded by the declared raw length (then seeks past the frame: zstandard's reader reads ahead and
`read_across_frames=False` does not stop at a frame end; the frame is also served through a reader
limited to its compressed length, which hashes it), and checks both SHA-256s. Every length
is bounded by the file size before anything is allocated (compressed lengths by the bytes present,
raw lengths by zstd's maximum ratio of 32768:1, the chunk size and `max_raw_bytes`), and buffers
only grow as decompressed data arrives. Any mismatch raises `ContainerError` naming the chunk, the
tensors in it and its byte range in the file; a short file is reported as truncated.

Reading float8/bfloat16 tensors as numpy arrays needs `ml_dtypes`; `read_container_entries`
returns raw little-endian bytes and needs neither it nor `onnx` (the daemon's artifact loader uses it).
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zstandard as zstd

from .errors import EpError

MAGIC = b"SITSW\x00\x00\x01"
VERSION = 1
FLAG_SHUFFLE = 1
FILE_HEADER = struct.Struct("<8sIIQ")
CHUNK_MAGIC = b"SWCK"
CHUNK_HEADER = struct.Struct("<4sIQQ32s")
TRAILER_MAGIC = b"SITSWIDX"
TRAILER = struct.Struct("<32sQ8s")
DEFAULT_CHUNK_SIZE = 16 << 20
MAX_CHUNK_SIZE = 1 << 30
MAX_INDEX_BYTES = 64 << 20
MAX_NDIM = 32
DEFAULT_MAX_RAW_BYTES = 16 << 30
ZSTD_MAX_RATIO = 32768  # an RLE block: 4 bytes for 128 KiB; so raw bytes <= 32768 x file size
_READ_PIECE = 1 << 20

# dtype name -> (itemsize, numpy dtype string or None for the ml_dtypes types, ONNX TensorProto type)
DTYPES: dict[str, tuple[int, str | None, int]] = {
    "float32": (4, "<f4", 1), "uint8": (1, "|u1", 2), "int8": (1, "|i1", 3), "uint16": (2, "<u2", 4),
    "int16": (2, "<i2", 5), "int32": (4, "<i4", 6), "int64": (8, "<i8", 7), "bool": (1, "|b1", 9),
    "float16": (2, "<f2", 10), "float64": (8, "<f8", 11), "uint32": (4, "<u4", 12), "uint64": (8, "<u8", 13),
    "bfloat16": (2, None, 16), "float8_e4m3fn": (1, None, 17), "float8_e5m2": (1, None, 19),
    "bytes": (1, None, 0),
}


class ContainerError(EpError):
    """The weight container is missing, truncated, corrupted or hostile.

    `chunk` (index), `tensors` (names stored in that chunk) and `byte_range` ((start, end) in the
    file) are set when the problem is in one chunk."""

    def __init__(self, message: str, *, chunk: int | None = None, tensors: tuple[str, ...] = (),
                 byte_range: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.chunk, self.tensors, self.byte_range = chunk, tuple(tensors), byte_range


@dataclass(frozen=True)
class ChunkInfo:
    index: int
    offset: int  # file offset of the chunk header
    raw_length: int
    compressed_length: int
    sha256: str  # hex, raw chunk
    frame_sha256: str  # hex, compressed frame
    tensors: tuple[str, ...] = ()

    @property
    def byte_range(self) -> tuple[int, int]:
        return self.offset, self.offset + CHUNK_HEADER.size + self.compressed_length


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    stream_offset: int
    length: int
    chunk: int
    offset: int


@dataclass(frozen=True)
class ContainerInfo:
    path: Path
    sha256: str  # hex, whole file
    size: int
    chunk_size: int
    chunks: tuple[ChunkInfo, ...]
    tensors: tuple[TensorEntry, ...] = field(default=())

    @property
    def raw_size(self) -> int:
        return sum(c.raw_length for c in self.chunks)

    def to_json(self) -> dict:
        return {"sha256": self.sha256, "bytes": self.size, "chunk_size": self.chunk_size,
                "raw_bytes": self.raw_size,
                "chunks": [{"index": c.index, "sha256": c.sha256, "frame_sha256": c.frame_sha256,
                            "raw_bytes": c.raw_length, "compressed_bytes": c.compressed_length,
                            "byte_range": list(c.byte_range), "tensors": list(c.tensors)} for c in self.chunks]}


# --- dtypes and shuffling ----------------------------------------------------------------------

def dtype_name(a: np.ndarray) -> str:
    name = a.dtype.name
    if name in ("float8_e4m3fn", "float8_e5m2", "bfloat16"):
        return name
    if a.dtype == np.bool_:
        return "bool"
    if a.dtype.kind in "fiu" and name in DTYPES:
        return name
    raise ContainerError(f"dtype {a.dtype} is not supported in a weight container "
                         f"(supported: {', '.join(sorted(DTYPES))})")


def numpy_dtype(name: str) -> np.dtype:
    itemsize, np_str, _ = DTYPES[name]
    if np_str is not None:
        return np.dtype(np_str)
    if name == "bytes":
        return np.dtype(np.uint8)
    try:
        import ml_dtypes
    except ImportError as exc:  # pragma: no cover - ml_dtypes comes with onnx
        raise ContainerError(f"reading {name} tensors as numpy arrays needs the ml_dtypes package") from exc
    return np.dtype(getattr(ml_dtypes, name))


def _le_bytes(a: np.ndarray) -> np.ndarray:
    """The array's elements as a C-contiguous little-endian uint8 array."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not np.little_endian):
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.reshape(-1).view(np.uint8)


def shuffle(raw: np.ndarray, itemsize: int) -> bytes:
    if itemsize == 1 or raw.size == 0:
        return raw.tobytes()
    return raw.reshape(-1, itemsize).T.tobytes()


def unshuffle(buf: bytes | bytearray | memoryview, itemsize: int) -> bytes:
    if itemsize == 1 or len(buf) == 0:
        return bytes(buf)
    return np.frombuffer(buf, dtype=np.uint8).reshape(itemsize, -1).T.tobytes()


# --- writing -----------------------------------------------------------------------------------

def write_container(path: str | Path, tensors: dict[str, np.ndarray | bytes], *,
                    chunk_size: int = DEFAULT_CHUNK_SIZE, level: int = 3) -> ContainerInfo:
    """Writes `tensors` (name -> numpy array, or bytes for raw blobs) to `path` atomically."""
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ContainerError(f"chunk_size {chunk_size} outside 1..{MAX_CHUNK_SIZE}")
    path = Path(path)
    entries, payloads = [], []
    stream_offset = 0
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise ContainerError(f"tensor name {name!r}: must be a non-empty string")
        if isinstance(value, (bytes, bytearray, memoryview)):
            dt, shape, payload = "bytes", (len(value),), bytes(value)
        else:
            a = np.asarray(value)
            dt = dtype_name(a)
            shape = tuple(int(d) for d in a.shape)
            payload = shuffle(_le_bytes(a), DTYPES[dt][0])
        entries.append({"name": name, "dtype": dt, "shape": list(shape), "stream_offset": stream_offset,
                        "length": len(payload), "chunk": stream_offset // chunk_size,
                        "offset": stream_offset % chunk_size})
        payloads.append(payload)
        stream_offset += len(payload)

    cctx = zstd.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    file_hash = hashlib.sha256()
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    chunks: list[dict] = []
    try:
        with open(tmp, "wb") as fh:
            def put(data: bytes) -> None:
                fh.write(data)
                file_hash.update(data)

            put(FILE_HEADER.pack(MAGIC, VERSION, FLAG_SHUFFLE, chunk_size))
            pending = bytearray()

            def flush_chunk(raw: bytes) -> None:
                frame = cctx.compress(raw)
                raw_sha = hashlib.sha256(raw).digest()
                chunks.append({"offset": fh.tell(), "raw_length": len(raw), "compressed_length": len(frame),
                               "sha256": raw_sha.hex(), "frame_sha256": hashlib.sha256(frame).hexdigest()})
                put(CHUNK_HEADER.pack(CHUNK_MAGIC, len(chunks) - 1, len(raw), len(frame), raw_sha))
                put(frame)

            for payload in payloads:
                view = memoryview(payload)
                while len(view):
                    take = min(chunk_size - len(pending), len(view))
                    pending += view[:take]
                    view = view[take:]
                    if len(pending) == chunk_size:
                        flush_chunk(bytes(pending))
                        pending.clear()
            if pending:
                flush_chunk(bytes(pending))
            index = json.dumps({"version": VERSION, "chunk_size": chunk_size, "shuffle": "byte",
                                "chunks": chunks, "tensors": entries},
                               sort_keys=True, separators=(",", ":")).encode()
            put(index)
            put(TRAILER.pack(hashlib.sha256(index).digest(), len(index), TRAILER_MAGIC))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return _info(path, file_hash.hexdigest(), path.stat().st_size, chunk_size, chunks,
                 [_entry(e) for e in entries])


def _entry(e: dict) -> TensorEntry:
    return TensorEntry(e["name"], e["dtype"], tuple(e["shape"]), e["stream_offset"], e["length"],
                       e["chunk"], e["offset"])


def _info(path: Path, sha: str, size: int, chunk_size: int, chunks: list[dict],
          tensors: list[TensorEntry]) -> ContainerInfo:
    starts = [c["offset"] for c in chunks]
    stream_starts, acc = [], 0
    for c in chunks:
        stream_starts.append(acc)
        acc += c["raw_length"]
    infos = []
    for i, c in enumerate(chunks):
        lo, hi = stream_starts[i], stream_starts[i] + c["raw_length"]
        names = tuple(t.name for t in tensors
                      if t.stream_offset < hi and t.stream_offset + t.length > lo)
        infos.append(ChunkInfo(i, starts[i], c["raw_length"], c["compressed_length"], c["sha256"],
                               c["frame_sha256"], names))
    return ContainerInfo(Path(path), sha, size, chunk_size, tuple(infos), tuple(tensors))


# --- reading -----------------------------------------------------------------------------------

class _BoundedHashingReader(io.RawIOBase):
    """Serves at most `limit` bytes of `fh` and hashes what it serves (the compressed frame)."""

    def __init__(self, fh, limit: int, also=None) -> None:
        super().__init__()
        self.fh, self.remaining, self.hash, self.also = fh, limit, hashlib.sha256(), also

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.remaining:
            n = self.remaining
        data = self.fh.read(n) if n else b""
        self.remaining -= len(data)
        self.hash.update(data)
        if self.also is not None:
            self.also.update(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


def _fail(msg: str) -> ContainerError:
    return ContainerError(msg)


def _read_index(fh, path: Path, size: int, max_raw_bytes: int, file_hash=None
                ) -> tuple[int, list[dict], list[TensorEntry]]:
    """Header, trailer and index, validated. `file_hash` receives the header bytes now and the index and
    trailer bytes through its `tail` attribute (to be hashed after the chunks)."""
    if size < FILE_HEADER.size:
        raise _fail(f"{path}: truncated or not a weight container ({size} bytes, smaller than the "
                    f"{FILE_HEADER.size}-byte header)")
    head = fh.read(FILE_HEADER.size)
    magic, version, flags, chunk_size = FILE_HEADER.unpack(head)
    if magic != MAGIC:
        raise _fail(f"{path}: not a weight container (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise _fail(f"{path}: container version {version}, this reader knows version {VERSION}")
    if flags != FLAG_SHUFFLE:
        raise _fail(f"{path}: unknown container flags {flags:#x}")
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise _fail(f"{path}: header declares chunk size {chunk_size}, outside 1..{MAX_CHUNK_SIZE}")
    if size < FILE_HEADER.size + TRAILER.size:
        raise _fail(f"{path}: truncated: {size} bytes, no room for the index trailer")
    fh.seek(size - TRAILER.size)
    trailer = fh.read(TRAILER.size)
    index_sha, index_len, tmagic = TRAILER.unpack(trailer)
    if tmagic != TRAILER_MAGIC:
        raise _fail(f"{path}: truncated or damaged: no index trailer at the end of the file ({size} bytes; "
                    f"found {tmagic!r} where {TRAILER_MAGIC!r} belongs)")
    index_start = size - TRAILER.size - index_len
    if index_len > MAX_INDEX_BYTES or index_start < FILE_HEADER.size:
        raise _fail(f"{path}: trailer declares a {index_len}-byte index, more than the file ({size} bytes) "
                    f"can hold")
    fh.seek(index_start)
    raw_index = fh.read(index_len)
    if hashlib.sha256(raw_index).digest() != index_sha:
        raise _fail(f"{path}: index (bytes {index_start}..{index_start + index_len}) does not match its "
                    f"SHA-256 in the trailer: damaged index")
    try:
        index = json.loads(raw_index)
    except ValueError as exc:
        raise _fail(f"{path}: index is not valid JSON: {exc}") from exc
    if file_hash is not None:
        file_hash.update(head)
        file_hash.tail = raw_index + trailer
    return _validate_index(index, path, chunk_size, index_start, max_raw_bytes)


def _int(v, what: str, path: Path, lo: int = 0, hi: int | None = None) -> int:
    if type(v) is not int or v < lo or (hi is not None and v > hi):
        raise _fail(f"{path}: hostile or damaged index: {what} = {v!r} "
                    f"(expected an integer in {lo}..{hi if hi is not None else 'inf'})")
    return v


def _validate_index(index, path: Path, chunk_size: int, index_start: int,
                    max_raw_bytes: int) -> tuple[int, list[dict], list[TensorEntry]]:
    if not isinstance(index, dict) or not isinstance(index.get("chunks"), list) \
            or not isinstance(index.get("tensors"), list):
        raise _fail(f"{path}: hostile or damaged index: expected an object with 'chunks' and 'tensors' lists")
    if index.get("version") != VERSION or index.get("chunk_size") != chunk_size or index.get("shuffle") != "byte":
        raise _fail(f"{path}: index version/chunk_size/shuffle ({index.get('version')!r}, "
                    f"{index.get('chunk_size')!r}, {index.get('shuffle')!r}) disagree with the file header")
    chunks: list[dict] = []
    pos = FILE_HEADER.size
    total_raw = 0
    for i, c in enumerate(index["chunks"]):
        if not isinstance(c, dict):
            raise _fail(f"{path}: hostile or damaged index: chunk {i} entry is not an object")
        off = _int(c.get("offset"), f"chunk {i} offset", path, 0, index_start)
        if off != pos:
            raise _fail(f"{path}: hostile or damaged index: chunk {i} at offset {off}, expected {pos}")
        comp = _int(c.get("compressed_length"), f"chunk {i} compressed_length", path, 1,
                    index_start - pos - CHUNK_HEADER.size)
        raw = _int(c.get("raw_length"), f"chunk {i} raw_length", path, 1, chunk_size)
        if raw > comp * ZSTD_MAX_RATIO + 1024:
            raise _fail(f"{path}: hostile or damaged index: chunk {i} declares {raw} raw bytes from {comp} "
                        f"compressed bytes, beyond zstd's maximum ratio ({ZSTD_MAX_RATIO}:1)")
        for key in ("sha256", "frame_sha256"):
            h = c.get(key)
            if not isinstance(h, str) or len(h) != 64 or any(ch not in "0123456789abcdef" for ch in h):
                raise _fail(f"{path}: hostile or damaged index: chunk {i} {key} is not a hex SHA-256")
        if i < len(index["chunks"]) - 1 and raw != chunk_size:
            raise _fail(f"{path}: hostile or damaged index: chunk {i} holds {raw} raw bytes, only the last "
                        f"chunk may hold less than {chunk_size}")
        chunks.append({"offset": off, "raw_length": raw, "compressed_length": comp,
                       "sha256": c["sha256"], "frame_sha256": c["frame_sha256"]})
        pos = off + CHUNK_HEADER.size + comp
        total_raw += raw
    if pos != index_start:
        raise _fail(f"{path}: hostile or damaged index: chunks end at byte {pos}, the index starts at "
                    f"{index_start}")
    if total_raw > max_raw_bytes:
        raise _fail(f"{path}: container declares {total_raw} uncompressed bytes, above the {max_raw_bytes}-byte "
                    f"limit")
    tensors: list[TensorEntry] = []
    names: set[str] = set()
    stream = 0
    for j, t in enumerate(index["tensors"]):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise _fail(f"{path}: hostile or damaged index: tensor {j} has no name")
        name = t["name"]
        if name in names:
            raise _fail(f"{path}: hostile or damaged index: tensor {name!r} appears twice")
        names.add(name)
        dt = t.get("dtype")
        if dt not in DTYPES:
            raise _fail(f"{path}: hostile or damaged index: tensor {name!r} has unknown dtype {dt!r}")
        shape = t.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM:
            raise _fail(f"{path}: hostile or damaged index: tensor {name!r} shape {shape!r} is not a list of at "
                        f"most {MAX_NDIM} dimensions")
        dims = tuple(_int(d, f"tensor {name!r} dimension", path, 0, 1 << 62) for d in shape)
        length = _int(t.get("length"), f"tensor {name!r} length", path, 0, total_raw - stream)
        expected = math.prod(dims) * DTYPES[dt][0]
        if dt == "bytes" and len(dims) != 1:
            raise _fail(f"{path}: hostile or damaged index: raw blob {name!r} must be one-dimensional")
        if expected != length:
            raise _fail(f"{path}: hostile or damaged index: tensor {name!r} {dt}{list(dims)} needs {expected} "
                        f"bytes, the index says {length}")
        so = _int(t.get("stream_offset"), f"tensor {name!r} stream_offset", path, 0, total_raw)
        if so != stream:
            raise _fail(f"{path}: hostile or damaged index: tensor {name!r} starts at stream offset {so}, "
                        f"expected {stream} (tensors are packed in order)")
        if t.get("chunk") != so // chunk_size or t.get("offset") != so % chunk_size:
            raise _fail(f"{path}: hostile or damaged index: tensor {name!r} chunk/offset "
                        f"({t.get('chunk')!r}, {t.get('offset')!r}) disagree with its stream offset {so}")
        tensors.append(TensorEntry(name, dt, dims, so, length, so // chunk_size, so % chunk_size))
        stream += length
    if stream != total_raw:
        raise _fail(f"{path}: hostile or damaged index: tensors hold {stream} bytes, the chunks {total_raw}")
    return chunk_size, chunks, tensors


def inspect_container(path: str | Path, *, max_raw_bytes: int = DEFAULT_MAX_RAW_BYTES) -> ContainerInfo:
    """Header, index and trailer only (no chunk is decompressed; `sha256` is of the whole file)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            chunk_size, chunks, tensors = _read_index(fh, path, size, max_raw_bytes)
    except OSError as exc:
        raise ContainerError(f"{path}: cannot read it: {exc}") from exc
    return _info(path, _sha256_file(path), size, chunk_size, chunks, tensors)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_chunk(fh, dctx, path: Path, c: ChunkInfo, file_hash=None) -> bytearray:
    lo, hi = c.byte_range

    def err(what: str) -> ContainerError:
        names = ", ".join(c.tensors) if c.tensors else "no tensors"
        return ContainerError(f"{path}: chunk {c.index} (bytes {lo}..{hi}, tensors: {names}) {what}",
                              chunk=c.index, tensors=c.tensors, byte_range=(lo, hi))

    fh.seek(c.offset)
    header = fh.read(CHUNK_HEADER.size)
    if len(header) != CHUNK_HEADER.size:
        raise err("is truncated: its header is cut off")
    magic, idx, raw_len, comp_len, raw_sha = CHUNK_HEADER.unpack(header)
    if magic != CHUNK_MAGIC:
        raise err(f"is corrupted: header magic {magic!r}, expected {CHUNK_MAGIC!r}")
    if idx != c.index:
        raise err(f"is corrupted: header says chunk {idx}")
    if raw_len != c.raw_length or comp_len != c.compressed_length:
        raise err(f"is corrupted: header declares {raw_len} raw / {comp_len} compressed bytes, the index "
                  f"{c.raw_length} / {c.compressed_length}")
    if raw_sha.hex() != c.sha256:
        raise err("is corrupted: the SHA-256 in its header differs from the index")
    if file_hash is not None:
        file_hash.update(header)
    src = _BoundedHashingReader(fh, comp_len, file_hash)
    out = bytearray()
    try:
        reader = dctx.stream_reader(src, read_size=_READ_PIECE, read_across_frames=False, closefd=False)
        while len(out) < raw_len:
            piece = reader.read(min(_READ_PIECE, raw_len - len(out)))
            if not piece:
                break
            out += piece
        extra = reader.read(1) if len(out) == raw_len else b""
    except zstd.ZstdError as exc:
        raise err(f"is corrupted: zstd cannot decode its frame: {exc}") from exc
    if len(out) != raw_len:
        raise err(f"is corrupted or truncated: its frame yields {len(out)} of {raw_len} raw bytes")
    if extra:
        raise err(f"is corrupted: its frame holds more than the declared {raw_len} raw bytes")
    while src.read(_READ_PIECE):
        pass  # bytes after the frame end, inside the declared length: still hashed -> mismatch below
    if src.hash.hexdigest() != c.frame_sha256:
        raise err("is corrupted: the compressed frame's SHA-256 differs from the index")
    if hashlib.sha256(out).hexdigest() != c.sha256:
        raise err("is corrupted: the SHA-256 of the decompressed data differs from its header")
    fh.seek(c.offset + CHUNK_HEADER.size + comp_len)
    return out


class _FileHash:
    def __init__(self) -> None:
        self.h, self.tail = hashlib.sha256(), b""

    def update(self, data) -> None:
        self.h.update(data)


def _read_all(path: Path, max_raw_bytes: int) -> tuple[list[tuple[TensorEntry, np.ndarray]], ContainerInfo]:
    try:
        size = path.stat().st_size
        fh = open(path, "rb")
    except OSError as exc:
        raise ContainerError(f"{path}: cannot read it: {exc}") from exc
    file_hash = _FileHash()  # the chunks and the index are read in file order: one pass hashes the file
    with fh:
        chunk_size, chunks, tensors = _read_index(fh, path, size, max_raw_bytes, file_hash)
        info = _info(path, "", size, chunk_size, chunks, tensors)
        dctx = zstd.ZstdDecompressor()
        buffers = [bytearray() for _ in tensors]
        t = 0
        stream = 0
        for c in info.chunks:
            raw = memoryview(_read_chunk(fh, dctx, path, c, file_hash))
            pos = 0
            while pos < len(raw):
                while tensors[t].stream_offset + tensors[t].length <= stream + pos:
                    t += 1
                end = tensors[t].stream_offset + tensors[t].length
                take = min(len(raw) - pos, end - (stream + pos))
                buffers[t] += raw[pos:pos + take]
                pos += take
            stream += len(raw)
    file_hash.update(file_hash.tail)
    info = ContainerInfo(info.path, file_hash.h.hexdigest(), size, chunk_size, info.chunks, info.tensors)
    out = []
    for entry, buf in zip(tensors, buffers):
        a = np.frombuffer(buf, dtype=np.uint8)
        itemsize = DTYPES[entry.dtype][0]
        if itemsize > 1 and a.size:
            a = np.ascontiguousarray(a.reshape(itemsize, -1).T)
        out.append((entry, a))
    return out, info


def read_container_entries(path: str | Path, *, max_raw_bytes: int = DEFAULT_MAX_RAW_BYTES
                           ) -> tuple[list[tuple[TensorEntry, bytes]], ContainerInfo]:
    """Every tensor as (entry, little-endian unshuffled bytes), after verifying every chunk; the
    info's `sha256` is of the whole file (hashed in the same pass)."""
    entries, info = _read_all(Path(path), max_raw_bytes)
    return [(e, a.tobytes()) for e, a in entries], info


def read_container(path: str | Path, *, max_raw_bytes: int = DEFAULT_MAX_RAW_BYTES
                   ) -> dict[str, np.ndarray | bytes]:
    """name -> numpy array (or bytes for raw blobs), after verifying every chunk's SHA-256."""
    entries, _ = _read_all(Path(path), max_raw_bytes)
    out: dict[str, np.ndarray | bytes] = {}
    for entry, a in entries:
        if entry.dtype == "bytes":
            out[entry.name] = a.tobytes()
        else:
            out[entry.name] = a.reshape(-1).view(numpy_dtype(entry.dtype)).reshape(entry.shape)
    return out
