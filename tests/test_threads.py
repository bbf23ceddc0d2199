"""threads: reader threads for the index reader without CPU augmentation (eval, device_augment)."""

from __future__ import annotations

import io
import itertools
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from conftest import convert_images

from training_adapter import make_loader
from training_adapter.threads import in_order
from wds_tools.errors import ShardError

S = 8


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("training_adapter-reader")]


def test_results_come_in_task_order_from_each_threads_own_state():
    """Tasks of uneven cost: results in task order, each made with the state of the thread that ran it."""
    seen: list[tuple[int, int]] = []

    def run(w: int, task: int) -> int:
        time.sleep(0.002 * (task % 3))
        seen.append((w, task))
        return task * task

    assert list(in_order(range(40), run, 3, ahead=6)) == [t * t for t in range(40)]
    assert sorted(t for _, t in seen) == list(range(40))
    assert {w for w, _ in seen} <= {0, 1, 2} and len({w for w, _ in seen}) > 1


def test_an_error_is_raised_in_its_turn_and_the_threads_end():
    def run(w: int, task: int) -> int:
        if task == 5:
            raise ShardError("x.tar: byte 7: damaged", url="x.tar", offset=7)
        return task

    before = set(_reader_threads())
    got = []
    with pytest.raises(ShardError, match="x.tar: byte 7: damaged") as e:
        for r in in_order(range(20), run, 2, ahead=4):
            got.append(r)
    assert got == [0, 1, 2, 3, 4] and (e.value.url, e.value.offset) == ("x.tar", 7)
    assert not set(_reader_threads()) - before


@pytest.mark.parametrize(
    "workers, ahead, caller, taken", [(2, 4, False, 3), (1, 3, True, 4)], ids=["threads only", "the caller helping"]
)
def test_a_caller_that_stops_early_stops_the_threads(workers, ahead, caller, taken):
    started = []

    def run(w: int, task: int) -> int:
        started.append(task)
        time.sleep(0.001)
        return task

    before = set(_reader_threads())
    it = in_order(itertools.count(), run, workers, ahead=ahead, caller=caller)
    assert [next(it) for _ in range(taken)] == list(range(taken))
    it.close()
    assert not set(_reader_threads()) - before
    n = len(started)
    time.sleep(0.05)
    assert len(started) == n <= taken + ahead  # the tasks submitted ahead at most, then nothing


def test_the_caller_makes_what_the_threads_have_not_started():
    """caller=True: while the result it waits for is not ready, the caller runs the next task nobody
    started (as worker ``workers``); results in task order, never more than ``ahead`` started
    beyond those taken."""
    seen: list[tuple[int, int]] = []
    taken = [0]
    lock = threading.Lock()

    def run(w: int, task: int) -> int:
        with lock:
            assert task < taken[0] + 3  # ahead=3: at most 3 started beyond the results taken
            seen.append((w, task))
        if w == 0:
            time.sleep(0.02)  # a slow background thread: the caller takes over the rest
        return task * 10

    got = []
    for r in in_order(range(30), run, 1, ahead=3, caller=True):
        got.append(r)
        taken[0] += 1
    assert got == [t * 10 for t in range(30)]
    assert sorted(t for _, t in seen) == list(range(30))
    ran = {w: sum(1 for x, _ in seen if x == w) for w in (0, 1)}
    assert ran[1] > ran[0] > 0  # both ran tasks, the caller most of them


def test_with_no_threads_the_caller_runs_every_task():
    before = set(_reader_threads())
    seen = []
    assert list(in_order(range(7), lambda w, t: seen.append(w) or -t, 0, ahead=2)) == [-t for t in range(7)]
    assert seen == [0] * 7 and not set(_reader_threads()) - before


@pytest.mark.parametrize("bad_in", ["caller", "thread"])
def test_an_error_in_a_task_the_caller_ran_or_a_thread_ran_comes_in_its_turn(bad_in):
    def run(w: int, task: int) -> int:
        if task == 5 and (w == 1) == (bad_in == "caller"):
            raise ShardError("x.tar: byte 9: damaged", url="x.tar", offset=9)
        if w == 0 and bad_in == "caller":
            time.sleep(0.01)  # the caller gets to most tasks, task 5 among them (or the thread raises it)
        return task

    before = set(_reader_threads())
    for _ in range(5):  # which thread runs task 5 is up to timing: an error is raised in turn either way
        got = []
        try:
            for r in in_order(range(12), run, 1, ahead=2, caller=True):
                got.append(r)
        except ShardError as e:
            assert got == [0, 1, 2, 3, 4] and (e.url, e.offset) == ("x.tar", 9)
        else:
            assert got == list(range(12))
    assert not set(_reader_threads()) - before


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """90 train samples in 6 shards of 15."""
    return convert_images(tmp_path_factory.mktemp("threads"), 90, size=S, shard_size=15, val_fraction=0.0)


def _epoch(loader: Iterable) -> list[tuple[str, int, bytes]]:
    """(key, label, [H, W, 3] pixel bytes) of every sample the loader yields, in order."""
    return [
        (k, int(lab), im.permute(1, 2, 0).contiguous().numpy().tobytes())
        for b in loader
        for im, lab, k in zip(b[0], b[1], b[-1])
    ]


@pytest.fixture(scope="module")
def stock(folder: Path) -> list[tuple[str, int, bytes]]:
    """Every sample as stock webdataset reads the shards, in name order (key, label, pixel bytes),
    cross-checked against stock tarfile (tests/oracle.read_stored)."""
    import webdataset as wds
    from oracle import read_stored

    tars = sorted(Path(folder).glob("train-*.tar"))
    got = [
        (s["__key__"], int(s["cls"]), np.load(io.BytesIO(s["npy"])).tobytes())
        for s in wds.WebDataset([str(t) for t in tars], shardshuffle=False)
    ]
    by_tarfile = read_stored(tars)
    assert len(got) == len(by_tarfile) == 90
    assert all((lab, px) == (by_tarfile[k].label, by_tarfile[k].pixels.tobytes()) for k, lab, px in got)
    return got


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_reader_threads_yield_what_stock_webdataset_reads(folder: Path, stock: list, workers: int) -> None:
    """Eval with workers runs in threads (the caller helping): sample by sample, the keys, labels and
    pixels stock webdataset reads, in its order (shards by name, samples as stored). device_augment
    (threads too): each epoch a permutation of those samples, each with its own label, stored pixels
    and sample_params row, in the same order as without workers (the order does not depend on them)."""
    from training_adapter import AugmentConfig, sample_params

    before = set(_reader_threads())
    kw = dict(batch_size=4, split="train", return_keys=True)
    ld = make_loader(folder, num_workers=workers, train=False, **kw)
    assert ld.dataset.copies_only
    for epoch in (0, 1):
        ld.set_epoch(epoch)
        assert _epoch(ld) == stock
    want = {k: (lab, px) for k, lab, px in stock}
    kw.update(train=True, device_augment=True, drop_last=False)
    ld = make_loader(folder, num_workers=workers, **kw)
    in_process = make_loader(folder, num_workers=0, **kw)
    assert ld.dataset.copies_only
    orders = []
    for epoch in (0, 1):
        ld.set_epoch(epoch)
        in_process.set_epoch(epoch)
        got = [
            (k, int(lab), im.permute(1, 2, 0).contiguous().numpy().tobytes(), p.numpy())
            for b in ld
            for im, lab, p, k in zip(b[0], b[1], b[2], b[-1])
        ]
        keys = [k for k, *_ in got]
        assert sorted(keys) == sorted(want) and keys != [k for k, *_ in stock]  # all of them, shuffled
        for k, lab, px, p in got:
            assert (lab, px) == want[k]
            assert np.array_equal(
                p, sample_params(AugmentConfig(), seed=0, epoch=epoch, key=k, src_size=S).astype(np.float32)
            )
        assert keys == [k for b in in_process for k in b[-1]]
        orders.append(keys)
    assert orders[0] != orders[1]
    assert not set(_reader_threads()) - before


@pytest.mark.parametrize("slow", ["caller", "threads"])
def test_batches_are_the_same_whichever_thread_makes_them(
    folder: Path, stock: list, monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """The caller or the background threads slowed down, so that the other makes most batches: the
    samples stock webdataset reads, in its order."""
    from training_adapter.indexed import IndexedDataset

    kw = dict(batch_size=4, split="train", return_keys=True, train=False)
    made: list[str] = []
    index_batch = IndexedDataset.index_batch

    def timed(self, *a, **k):
        me = threading.current_thread().name
        made.append(me)
        if me.startswith("training_adapter-reader") == (slow == "threads"):
            time.sleep(0.01)
        return index_batch(self, *a, **k)

    monkeypatch.setattr(IndexedDataset, "index_batch", timed)
    assert _epoch(make_loader(folder, num_workers=2, **kw)) == stock
    by_threads = sum(m.startswith("training_adapter-reader") for m in made)
    assert len(made) == -(-len(stock) // 4)  # every batch made once
    if slow == "caller":
        assert by_threads > len(made) / 2
    else:  # the thread starts the first batch it can, then the caller makes the rest of the window
        assert 0 < by_threads < len(made) / 2


def test_the_reader_and_its_mappings_last_from_epoch_to_epoch(folder):
    ld = make_loader(folder, batch_size=4, train=False, num_workers=2, split="train")
    before = set(_reader_threads())
    first = sum(len(b[1]) for b in ld)
    readers = ld._readers  # one per background thread, and the calling thread's
    gathers = [r._gather for r in readers]
    assert first == 90 and len(readers) == 2 and any(g is not None and g._maps for g in gathers)
    it = iter(ld)
    next(it)
    it.close()  # an abandoned epoch: its threads are stopped and waited for, the readers kept
    assert ld._readers is readers and sum(len(b[1]) for b in ld) == 90
    assert all(r._gather is g for r, g in zip(ld._readers, gathers) if g is not None)
    assert not set(_reader_threads()) - before


def test_located_copies_equal_the_pixels_tarfile_reads(folder):
    """Located.copy_into (runs with windows in one index_select, single rows one by one) gives each
    row's stored pixels as stock tarfile reads them, for runs (eval) and single rows (shuffled)."""
    from oracle import read_stored

    from training_adapter.indexplan import read_sample_index
    from training_adapter.offsetread import Gather
    from training_adapter.shardlist import resolve_urls

    shards = resolve_urls(folder, split="train")
    idx = read_sample_index(shards.index_base, shards.info, shards.urls, shards.names)
    stored = read_stored(sorted(Path(folder).glob("train-*.tar")))
    g = Gather(idx, labels=True)
    for rows in (np.arange(90), np.random.default_rng(0).permutation(90)[:37], np.array([3, 4, 5, 6, 40, 41])):
        good, located = g.locate(rows)
        got = np.zeros((len(rows), S * S * 3), np.uint8)
        located.copy_into(got)
        want = np.stack([stored[k.decode()].pixels.reshape(-1) for k in idx.key[rows].tolist()])
        assert np.array_equal(got, want) and good == list(range(len(rows)))


def test_a_damaged_sample_in_a_reader_thread(folder, tmp_path):
    from training_adapter.indexplan import read_sample_index
    from training_adapter.shardlist import resolve_urls

    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    shards = resolve_urls(bad, split="train")
    idx = read_sample_index(shards.index_base, shards.info, shards.urls, shards.names)
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
