"""threads: reader threads for the index reader without CPU augmentation (eval, device_augment)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import convert_images
from training_adapter import make_loader
from training_adapter.threads import in_threads
from wds_tools.errors import ShardError

S = 8


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("training_adapter-reader")]


def test_items_come_round_robin_and_every_one_once():
    makers = [lambda w=w, n=n: iter([(w, i) for i in range(n)]) for w, n in enumerate([5, 3, 4])]
    got = list(in_threads(makers, depth=2))
    assert got[:9] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]
    assert got[9:] == [(0, 3), (2, 3), (0, 4)]  # worker 1 has ended and is passed over


def test_an_error_in_a_thread_is_raised_to_the_caller():
    def failing():
        yield 1
        raise ShardError("x.tar: byte 7: damaged", url="x.tar", offset=7)

    it = in_threads([failing, lambda: iter(range(10, 20))], depth=1)
    assert next(it) == 1 and next(it) == 10
    with pytest.raises(ShardError, match="x.tar: byte 7: damaged") as e:
        list(it)
    assert (e.value.url, e.value.offset) == ("x.tar", 7)


def test_a_caller_that_stops_early_stops_the_threads():
    made = []

    def endless(w):
        i = 0
        while True:
            made.append((w, i))
            yield i
            i += 1

    threads: list = []
    it = in_threads([lambda: endless(0), lambda: endless(1)], depth=2, threads=threads)
    assert [next(it) for _ in range(4)] == [0, 0, 1, 1]
    it.close()
    assert len(threads) == 2 and not any(t.is_alive() for t in threads)
    n = len(made)
    time.sleep(0.1)
    assert len(made) == n <= 4 + 2 * (2 + 1)  # at most depth + 1 items ahead per thread, then nothing


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """90 train samples in 6 shards of 15."""
    return convert_images(tmp_path_factory.mktemp("threads"), 90, size=S, shard_size=15, val_fraction=0.0)


def _epoch(loader) -> list[tuple[str, int, bytes]]:
    return [(k, int(lab), im.numpy().tobytes()) for b in loader for im, lab, k in zip(b[0], b[1], b[-1])]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_reader_threads_yield_the_in_process_batches(folder, workers):
    """Eval and device_augment with workers run in threads, batch for batch as with num_workers=0."""
    before = set(_reader_threads())
    for opts in (dict(train=False), dict(train=True, device_augment=True)):
        kw = dict(batch_size=4, split="train", return_keys=True, **opts)
        ref = make_loader(folder, num_workers=0, **kw)
        ld = make_loader(folder, num_workers=workers, **kw)
        assert ld.dataset.copies_only
        for epoch in (0, 1):
            ref.set_epoch(epoch)
            ld.set_epoch(epoch)
            assert _epoch(ld) == _epoch(ref)
    assert not set(_reader_threads()) - before


def test_readers_and_their_mappings_last_from_epoch_to_epoch(folder):
    ld = make_loader(folder, batch_size=4, train=False, num_workers=2, split="train")
    first = sum(len(b[1]) for b in ld)
    readers = ld._readers
    gathers = [r._gather for r in readers]
    assert first == 90 and all(g is not None and g._maps for g in gathers)
    it = iter(ld)
    next(it)
    it.close()  # an abandoned epoch: its threads are stopped and waited for, the readers kept
    assert ld._readers is readers and sum(len(b[1]) for b in ld) == 90
    assert [r._gather for r in ld._readers] == gathers


def test_a_damaged_sample_in_a_reader_thread(folder, tmp_path):
    from training_adapter.indexread import read_sample_index
    from training_adapter.shardlist import resolve_urls

    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    shards = resolve_urls(bad, split="train")
    idx = read_sample_index(shards.index_base, shards.meta, shards.urls, shards.names)
    r = int(np.flatnonzero(idx.shard == 3)[7])
    name = Path(idx.urls[3]).name
    data = bytearray((bad / name).read_bytes())
    data[int(idx.cls_offset[r])] ^= 0x02
    (bad / name).write_bytes(bytes(data))
    kw = dict(batch_size=4, train=False, num_workers=2, split="train", return_keys=True)
    before = set(_reader_threads())
    with pytest.raises(ShardError, match=rf"{name}: byte {int(idx.cls_offset[r])}: sample '{idx.key_str(r)}'"):
        list(make_loader(bad, **kw))
    got = _epoch(make_loader(bad, on_error="skip", **kw))
    keys = [k for k, *_ in got]
    assert len(keys) == len(set(keys)) == 89 and idx.key_str(r) not in keys
    time.sleep(0.2)
    assert not set(_reader_threads()) - before
