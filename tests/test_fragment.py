"""Tar fragments: members laid out in a buffer equal what the shard writer (and so stock tarfile) writes."""

import io
import mmap
import os
import random
import tarfile

import numpy as np
import pytest

from wds_tools.convert import runner
from wds_tools.convert.fragment import SLOT_BYTES, Member, members_bytes, put_members, write_slots
from wds_tools.format.npy import npy_header
from wds_tools.format.tarwrite import ShardWriter


def _member(key: str, label: int, js: bytes, side: int, seed: int = 0) -> Member:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return Member(
        key.encode(),
        str(label).encode(),
        label.to_bytes(4, "little"),
        js,
        npy_header((side, side, 3)),
        memoryview(pixels.reshape(-1)),
    )


# .json lengths around the 512-byte blocks: 1, 511, 512, 513, 1024 bytes
MEMBERS = [
    _member("a", 0, b"{" + b"x" * 0 + b"}", 8),
    _member("k" * 95, 11, b"x" * 511, 8, 1),
    _member("ISIC_0001", 2, b"x" * 512, 16, 2),
    _member("-_09Zz", 1234567, b"x" * 513, 1, 3),
    _member("b", 7, b"x" * 1024, 224, 4),
]


def test_a_fragment_is_the_shard_writers_bytes_with_its_places(tmp_path):
    """Members laid out one after another in a buffer: the same bytes, and the same data offsets, as
    ``ShardWriter.add`` (itself checked against tarfile in test_tarwrite.py) and stock tarfile reads."""
    total = sum(members_bytes(m) for m in MEMBERS)
    buf = bytearray(b"\xff" * total)  # stale bytes in a reused slot: padding must still be zeros
    pos, places = 0, []
    for m in MEMBERS:
        pos, placed = put_members(memoryview(buf), pos, m)
        places.append(placed)
    assert pos == total
    w = ShardWriter(str(tmp_path / "s.tar"))
    ref = []
    for m in MEMBERS:
        key = m.key.decode()
        ref.append(
            (
                w.add(f"{key}.cls", m.cls),
                w.add(f"{key}.i32", m.i32),
                w.add(f"{key}.json", m.json),
                w.add(f"{key}.npy", m.npy_header, m.pixels),
            )
        )
    w.close()
    shard = (tmp_path / "s.tar").read_bytes()
    assert bytes(buf) == shard[:total] and places == ref
    with tarfile.open(fileobj=io.BytesIO(bytes(buf) + bytes(1024))) as tf:
        got = {m.name: tf.extractfile(m).read() for m in tf}
    for m in MEMBERS:
        key = m.key.decode()
        assert got[f"{key}.cls"] == m.cls and got[f"{key}.json"] == m.json
        assert got[f"{key}.npy"] == m.npy_header + bytes(m.pixels)


def test_write_slots_writes_ranges_in_any_order(tmp_path, monkeypatch):
    """A worker writes slot ranges at the offsets given, whatever their order: the file equals one
    written in order. Without the pool's shared memory it refuses (nothing written)."""
    shared = mmap.mmap(-1, 2 * SLOT_BYTES)
    data = [os.urandom(n) for n in (512, 4096, 1536, 512 * 1000)]
    offsets = np.cumsum([0] + [len(d) for d in data])
    path = str(tmp_path / "f")
    with open(path, "wb"):
        pass
    writes = []
    for i, d in enumerate(data):  # alternate slots, each range at its own place in its slot
        slot, start = i % 2, 8192 * i
        shared[slot * SLOT_BYTES + start : slot * SLOT_BYTES + start + len(d)] = d
        writes.append((slot, [(path, int(offsets[i]), start, len(d))]))
    random.Random(0).shuffle(writes)
    monkeypatch.setattr(runner, "_shared", shared)
    assert write_slots(writes) == sum(len(d) for d in data)
    assert open(path, "rb").read() == b"".join(data)
    monkeypatch.setattr(runner, "_shared", None)
    assert write_slots([]) == 0
    with pytest.raises(RuntimeError, match="write_slots runs in a worker of a pool with shared memory"):
        write_slots(writes)


def _padded(n: int) -> int:
    return -(-n // 512) * 512


def test_every_batch_the_schedule_makes_fits_a_slot_with_its_headers_and_json():
    """What SLOT_BYTES promises, worked by hand for every --size whose one sample fits a batch's pixel
    budget, alone and with a smaller second size (a multi-size run's spill): the batch schedule.py
    deals (``batch_size``) laid out as tar members (four 512-byte headers, .cls, .i32, a .json of
    64 KiB, the padded .npy) and the other size's .npy blocks fits one slot; past that budget a batch
    is one sample."""
    from wds_tools.convert.schedule import batch_size

    json_bytes = 64 << 10  # a sample's .json with long free-text metadata
    for side in range(8, 2048):
        for other in (None, 8, side // 2, side - 1):
            if other is not None and not 8 <= other < side:
                continue
            per_sample = 3 * side * side + (3 * other * other if other else 0)
            n = batch_size(10**9, 1, per_sample)  # the largest batch: much left, one worker
            members = 4 * 512 + 512 + 512 + _padded(json_bytes) + _padded(128 + 3 * side * side)
            spill = 128 + 3 * other * other if other else 0
            if per_sample <= 8 << 20:
                assert n * (members + spill) <= SLOT_BYTES, (side, other, n)
            else:
                assert n == 1, (side, other, n)
