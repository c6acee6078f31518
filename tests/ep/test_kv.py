"""KV tiers: page and snapshot codecs, the cold slot file (reopen, torn slots), warm->cold, the journal."""
import os

import ml_dtypes
import numpy as np
import pytest

from ep.kv import ColdStore, FrameJournal, KvError, PageCodec, PageTiers, SnapshotCodec
from ep.kv.cold import SLOT_HEADER
from ep.kv.tiers import page_slot_bytes

SHAPE = (2, 2, 2, 16, 16)  # layers, key/value, kv heads, tokens, head dim


def page(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(SHAPE).astype(np.float32) * scale
    p[1, 0, 1] *= 40.0  # one head with a much larger range: scales are per (layer, key/value, head)
    return p


def test_int8_page_round_trip_is_within_half_a_step_per_head():
    codec = PageCodec("int8")
    p = page(1)
    blob = codec.encode(p)
    got = codec.decode(blob)
    step = np.abs(p).max(axis=(3, 4), keepdims=True) / 127
    assert np.all(np.abs(got - p) <= step / 2 * (1 + 1e-6))
    assert len(blob) < p.nbytes / 3.5  # int8 + per-head scales; zstd adds little on int8


def test_fp8_page_round_trip_matches_e4m3_rounding():
    codec = PageCodec("float8e4m3fn")
    p = page(2)
    got = codec.decode(codec.encode(p))
    scale = np.abs(p).max(axis=(3, 4), keepdims=True) / 448
    expect = (p / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale
    np.testing.assert_allclose(got, expect, rtol=1e-6)
    assert np.all(np.abs(got - p) <= np.abs(p) / 16 + scale * 2.0 ** -9)


def test_bad_page_and_format_are_explained():
    with pytest.raises(KvError, match="choose one of int8, float8e4m3fn"):
        PageCodec("int4")
    with pytest.raises(KvError, match="bad magic"):
        PageCodec().decode(b"nonsense-bytes-here")


def test_snapshot_is_bit_exact():
    codec = SnapshotCodec()
    w = page(3)[:, :, :, :11]
    w[0, 0, 0, 0, :4] = [-0.0, 1e-45, np.float32(3.4e38), -1e-40]
    got, position = codec.decode(codec.encode(w, 123456789))
    assert position == 123456789 and got.tobytes() == np.ascontiguousarray(w).tobytes()
    blob = bytearray(codec.encode(w, 1))
    blob[-3] ^= 0xFF
    with pytest.raises(KvError, match="KV snapshot"):
        codec.decode(bytes(blob))


def test_cold_pages_ring_and_reopen(tmp_path):
    path = tmp_path / "cold.slots"
    codec = PageCodec()
    blobs = {k: codec.encode(page(k)) for k in range(7)}
    with ColdStore(path, ring_pages=4) as cold:
        for k, b in blobs.items():
            cold.put_page(5, k, b)
        assert cold.pages(5) == [3, 4, 5, 6]  # the ring kept the last 4
        assert cold.file_bytes == 4 * cold.slot_bytes  # fixed slots, reused in place
        with pytest.raises(KvError, match="page 1 of stream 5 is not retained"):
            cold.get_page(5, 1)
        cold.put_snapshot(5, b"x" * 10000)
    with ColdStore(path, ring_pages=4) as cold:  # everything comes back from the file alone
        assert cold.pages(5) == [3, 4, 5, 6]
        for k in (3, 4, 5, 6):
            assert cold.get_page(5, k) == blobs[k]
        assert cold.get_snapshot(5) == b"x" * 10000


def test_cold_torn_slot_is_free_and_damage_is_named(tmp_path):
    path = tmp_path / "cold.slots"
    with ColdStore(path) as cold:
        cold.put_page(1, 0, b"a" * 100)
        cold.put_page(1, 1, b"b" * 100)
    with open(path, "r+b") as fh:  # a crash mid-write: garbage in slot 1's payload
        fh.seek(cold.slot_bytes + SLOT_HEADER.size + 10)
        fh.write(b"\xff\xff")
    with ColdStore(path) as cold:
        assert cold.pages(1) == [0]
        cold.put_page(1, 2, b"c" * 100)
        assert cold.file_bytes == 2 * cold.slot_bytes  # the torn slot was reused
        with open(path, "r+b") as fh:
            fh.seek(SLOT_HEADER.size)
            fh.write(b"z")
        with pytest.raises(KvError, match=r"slot 0 \(page 0 of stream 1\) is damaged"):
            cold.get_page(1, 0)


def test_cold_snapshot_replacement_survives_a_crash_in_between(tmp_path):
    path = tmp_path / "cold.slots"
    with ColdStore(path) as cold:
        cold.put_snapshot(9, b"A" * 9000)
        old_slots = list(cold._snapshots[9][1])
        # a crash after the first slot of a newer snapshot was written, before the rest:
        cold._write(cold._alloc(), 2, 9, 0, cold._generation + 1, 0, 3, b"B" * cold.payload_bytes)
    with ColdStore(path) as cold:
        assert cold.get_snapshot(9) == b"A" * 9000 and cold._snapshots[9][1] == old_slots
        cold.put_snapshot(9, b"C" * 5000)
    with ColdStore(path) as cold:
        assert cold.get_snapshot(9) == b"C" * 5000
        assert cold.file_bytes <= 5 * cold.slot_bytes  # old and torn slots were released and reused


def test_tiers_warm_then_cold_and_decoded_from_both(tmp_path):
    with ColdStore(tmp_path / "c", ring_pages=16) as cold:
        tiers = PageTiers(cold, arenas=2, warm_pages=3, slot_bytes=page_slot_bytes(2, 2, 16, 16))
        arena_bytes = tiers.slab.nbytes
        tiers.attach(4, 1)
        pages = {k: page(10 + k) for k in range(8)}
        for k, p in pages.items():
            tiers.archive(4, k, p)
        assert tiers.warm_indices(4) == [5, 6, 7] and cold.pages(4) == [0, 1, 2, 3, 4]
        assert tiers.warm_used_bytes(4) == sum(len(tiers.codec.encode(pages[k])) for k in (5, 6, 7))
        assert tiers.slab.nbytes == arena_bytes  # the warm RAM was allocated up front and did not grow
        for k, p in pages.items():
            got, where = tiers.page(4, k)
            assert where == ("warm" if k >= 5 else "cold")
            np.testing.assert_array_equal(got, tiers.codec.decode(tiers.codec.encode(p)))
        tiers.demote(4)
        assert tiers.warm_used_bytes(4) == 0 and cold.pages(4) == list(range(8))
        tiers.archive(4, 8, pages[0])  # no arena attached (parked): straight to cold
        assert cold.pages(4) == list(range(9))
        with pytest.raises(KvError, match="page 99 is in neither tier"):
            tiers.page(4, 99)


def test_journal_round_trip_and_torn_tail(tmp_path):
    j = FrameJournal(tmp_path / "j", 6)
    frames = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    for i, f in enumerate(frames):
        j.append(i % 2, 100 + i, f)
    j.close()
    with open(tmp_path / "j", "ab") as fh:
        fh.write(b"\x01" * 20)  # a record cut short by a crash
    j = FrameJournal(tmp_path / "j", 6)
    got = j.read()
    assert [p for p, _ in got[0]] == [100, 102, 104] and [p for p, _ in got[1]] == [101, 103]
    np.testing.assert_array_equal(np.stack([f for _, f in got[0]]), frames[0::2])
    j.truncate()
    assert j.read() == {} and os.path.getsize(tmp_path / "j") == 0
    j.close()
