import hashlib
import json
import struct
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zstandard as zstd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ep.container import (CHUNK_HEADER, FILE_HEADER, TRAILER, TRAILER_MAGIC, ContainerError, inspect_container,
                          read_container, read_container_entries, write_container)

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.bool_,
          ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def _same(a, b) -> bool:
    if isinstance(a, bytes):
        return a == b
    return a.dtype == b.dtype and a.shape == b.shape and _bits(a) == _bits(b)


@st.composite
def tensor_dicts(draw):
    n = draw(st.integers(0, 6))
    out = {}
    for i in range(n):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = draw(st.binary(min_size=size, max_size=size))
        a = np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(shape) if size else np.zeros(shape, dtype)
        if dtype == np.bool_:
            a = a.view(np.uint8) % 2 == 1
        out[f"t{i}/{draw(st.text(min_size=0, max_size=4))}"] = a
    if draw(st.booleans()):
        out["blob"] = draw(st.binary(max_size=300))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=tensor_dicts(), chunk_size=st.sampled_from([1, 5, 64, 1000, 16 << 20]))
def test_round_trip(tensors, chunk_size):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.sitsw"
        info = write_container(path, tensors, chunk_size=chunk_size)
        assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert info.size == path.stat().st_size
        got = read_container(path)
        assert list(got) == list(tensors)
        for name, value in tensors.items():
            assert _same(value, got[name]), name
        total = sum(len(v) if isinstance(v, bytes) else v.nbytes for v in tensors.values())
        assert info.raw_size == total
        assert len(info.chunks) == -(-total // chunk_size)
        assert inspect_container(path).chunks == info.chunks


def test_multi_chunk_layout_and_frames(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((100, 37)).astype(np.float32), "b": np.arange(10, dtype=np.int64),
               "c": rng.standard_normal(300).astype(ml_dtypes.float8_e4m3fn)}
    info = write_container(tmp_path / "w.sitsw", tensors, chunk_size=1000)
    assert len(info.chunks) == 16 and info.chunk_size == 1000
    assert info.chunks[0].tensors == ("a",)
    assert info.chunks[14].tensors == ("a", "b", "c")  # a ends at 14800, b is 80 bytes, c follows
    data = (tmp_path / "w.sitsw").read_bytes()
    for c in info.chunks:
        magic, idx, raw, comp, sha = CHUNK_HEADER.unpack_from(data, c.offset)
        assert (magic, idx, raw, comp, sha.hex()) == (b"SWCK", c.index, c.raw_length, c.compressed_length, c.sha256)
        frame = data[c.offset + CHUNK_HEADER.size:c.byte_range[1]]
        params = zstd.get_frame_parameters(frame)
        assert params.has_checksum and params.content_size == c.raw_length
    got = read_container(tmp_path / "w.sitsw")
    assert all(_same(tensors[k], got[k]) for k in tensors)


def test_shuffle_helps_on_smooth_float32(tmp_path):
    smooth = np.linspace(0, 1, 1 << 16, dtype=np.float32)
    info = write_container(tmp_path / "w.sitsw", {"x": smooth})
    assert info.chunks[0].compressed_length < smooth.nbytes * 0.5


def test_entries_are_raw_little_endian(tmp_path):
    a = np.arange(6, dtype=">i4").reshape(2, 3)
    write_container(tmp_path / "w.sitsw", {"a": a, "q": np.ones(3, ml_dtypes.float8_e5m2)})
    entries, info = read_container_entries(tmp_path / "w.sitsw")
    (ea, ra), (eq, rq) = entries
    assert (ea.dtype, ea.shape, ra) == ("int32", (2, 3), np.arange(6, dtype="<i4").tobytes())
    assert (eq.dtype, rq) == ("float8_e5m2", bytes([0x3C]) * 3)


def _sample(tmp_path, chunk_size=512):
    rng = np.random.default_rng(1)
    tensors = {"w1": rng.standard_normal((40, 8)).astype(np.float32), "b1": rng.standard_normal(8).astype(np.float32),
               "q": rng.standard_normal((32, 16)).astype(ml_dtypes.float8_e4m3fn)}
    path = tmp_path / "w.sitsw"
    return path, write_container(path, tensors, chunk_size=chunk_size)


def test_every_flipped_byte_in_a_chunk_names_the_chunk(tmp_path):
    path, info = _sample(tmp_path)
    assert len(info.chunks) >= 3
    c = info.chunks[1]
    lo, hi = c.byte_range
    data = path.read_bytes()
    bad = tmp_path / "bad.sitsw"
    for mask in (0x01, 0xFF):
        for i in range(lo, hi):
            d = bytearray(data)
            d[i] ^= mask
            bad.write_bytes(d)
            with pytest.raises(ContainerError) as exc:
                read_container(bad)
            e = exc.value
            assert e.chunk == 1 and e.byte_range == (lo, hi) and e.tensors == c.tensors, (i - lo, mask, str(e))
            assert f"chunk 1 (bytes {lo}..{hi}, tensors: {', '.join(c.tensors)})" in str(e)


def test_flips_outside_chunks_are_detected(tmp_path):
    path, info = _sample(tmp_path)
    data = path.read_bytes()
    end_chunks = info.chunks[-1].byte_range[1]
    for i in list(range(FILE_HEADER.size)) + list(range(end_chunks, len(data))):
        d = bytearray(data)
        d[i] ^= 0x10
        (tmp_path / "bad.sitsw").write_bytes(d)
        with pytest.raises(ContainerError):
            read_container(tmp_path / "bad.sitsw")


def test_truncation_is_reported(tmp_path):
    path, info = _sample(tmp_path)
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) - TRAILER.size, info.chunks[1].offset + 10, FILE_HEADER.size + 3, 5, 0):
        (tmp_path / "cut.sitsw").write_bytes(data[:cut])
        with pytest.raises(ContainerError, match="truncated"):
            read_container(tmp_path / "cut.sitsw")
    with pytest.raises(ContainerError, match="cannot read"):
        read_container(tmp_path / "missing.sitsw")


def _with_index(data: bytes, info, mutate) -> bytes:
    """The file with its index replaced by `mutate(index)` and a matching trailer (a hostile writer)."""
    index_len = struct.unpack_from("<Q", data, len(data) - TRAILER.size + 32)[0]
    start = len(data) - TRAILER.size - index_len
    index = json.loads(data[start:start + index_len])
    mutate(index)
    raw = json.dumps(index).encode()
    return data[:start] + raw + TRAILER.pack(hashlib.sha256(raw).digest(), len(raw), TRAILER_MAGIC)


def _set(path, value):
    def mutate(index):
        obj = index
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return mutate


@pytest.mark.parametrize("mutate, message", [
    (_set(("chunks", 0, "raw_length"), 1 << 40), "raw_length"),
    (_set(("chunks", 0, "compressed_length"), 1 << 40), "compressed_length"),
    (_set(("chunks", 1, "offset"), 10 ** 12), "offset"),
    (_set(("tensors", 0, "shape"), [1 << 30, 1 << 30]), "dimension|needs"),
    (_set(("tensors", 0, "shape"), [-1, 8]), "dimension"),
    (_set(("tensors", 0, "shape"), [1] * 100), "dimensions"),
    (_set(("tensors", 0, "length"), 1 << 50), "length"),
    (_set(("tensors", 1, "name"), "w1"), "twice"),
    (_set(("tensors", 0, "dtype"), "object"), "unknown dtype"),
    (_set(("tensors", 0, "stream_offset"), 7), "stream offset"),
    (_set(("chunks",), []), "chunks end|tensors hold"),
    (_set(("tensors",), "x"), "expected an object"),
    (_set(("chunk_size",), 12), "disagree"),
    (lambda index: index["chunks"].pop(), "chunks end"),
    (lambda index: index["chunks"][0].__setitem__("sha256", "zz"), "hex SHA-256"),
])
def test_hostile_index_is_rejected_without_huge_allocations(tmp_path, mutate, message):
    path, info = _sample(tmp_path)
    bad = tmp_path / "hostile.sitsw"
    bad.write_bytes(_with_index(path.read_bytes(), info, mutate))
    with pytest.raises(ContainerError, match=message):
        read_container(bad)


def test_hostile_trailer_and_header(tmp_path):
    path, info = _sample(tmp_path)
    data = path.read_bytes()
    huge_index = data[:-TRAILER.size] + TRAILER.pack(b"\0" * 32, 1 << 62, TRAILER_MAGIC)
    (tmp_path / "h.sitsw").write_bytes(huge_index)
    with pytest.raises(ContainerError, match="more than the file"):
        read_container(tmp_path / "h.sitsw")
    big_chunks = FILE_HEADER.pack(b"SITSW\x00\x00\x01", 1, 1, 1 << 40) + data[FILE_HEADER.size:]
    (tmp_path / "h.sitsw").write_bytes(big_chunks)
    with pytest.raises(ContainerError, match="chunk size"):
        read_container(tmp_path / "h.sitsw")
    (tmp_path / "h.sitsw").write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ContainerError, match="not a weight container"):
        read_container(tmp_path / "h.sitsw")


def test_raw_length_is_bounded_by_the_compressed_length(tmp_path):
    path = tmp_path / "zeros.sitsw"
    info = write_container(path, {"z": np.zeros(1 << 18, np.float32)}, chunk_size=1 << 30)
    comp = info.chunks[0].compressed_length
    assert comp < 100

    def mutate(index):
        index["chunks"][0]["raw_length"] = 1 << 29
        index["tensors"][0].update(shape=[1 << 27], length=1 << 29)
    path.write_bytes(_with_index(path.read_bytes(), info, mutate))
    with pytest.raises(ContainerError, match=r"chunk 0 declares 536870912 raw bytes from \d+ compressed bytes, "
                                             r"beyond zstd's maximum ratio"):
        read_container(path)


def test_decompression_bomb_is_bounded(tmp_path):
    path = tmp_path / "zeros.sitsw"
    write_container(path, {"z": np.zeros(1 << 20, np.float32)}, chunk_size=1 << 20)
    assert path.stat().st_size < 2000
    with pytest.raises(ContainerError, match="above the"):
        read_container(path, max_raw_bytes=1 << 20)
    assert read_container(path)["z"].shape == (1 << 20,)


def test_consistent_rewrite_of_a_chunk_changes_its_hash(tmp_path):
    path, info = _sample(tmp_path)
    tensors = read_container(path)
    tensors["b1"] = tensors["b1"] + 1
    info2 = write_container(tmp_path / "other.sitsw", tensors, chunk_size=512)
    changed = [a.index for a, b in zip(info.chunks, info2.chunks) if a.sha256 != b.sha256]
    assert changed and all("b1" in info.chunks[i].tensors for i in changed)


def test_unsupported_dtype_is_refused(tmp_path):
    with pytest.raises(ContainerError, match="not supported"):
        write_container(tmp_path / "w.sitsw", {"s": np.array(["a"], dtype=object)})
    with pytest.raises(ContainerError, match="not supported"):
        write_container(tmp_path / "w.sitsw", {"c": np.ones(2, np.complex64)})
    assert not (tmp_path / "w.sitsw").exists()
