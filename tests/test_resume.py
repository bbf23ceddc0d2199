"""Mid-epoch resume (training_adapter/resume.py): ``state_dict`` / ``load_state_dict``.

Exact: a run stopped after a random batch, its state saved through ``torch.save``, continued in a
fresh process, yields the uninterrupted run's keys in its order, and every pixel equals the loader
oracle's independent reference (tests/oracle.py, tests/augref.py) for its (seed, epoch, key).
Elastic: stopped on 2 ranks and continued on 3 (and 3 on 2), the epoch covers the split, each
sample once. The planner's rules hold over drawn (epoch length, batch size, ranks, workers, stop).
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import convert_images, once_per_run
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import Epoch, Expect, check_epoch, read_stored
from shardkit import build_dataset
from test_eval_coverage import tar_keys
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training_adapter import AugmentConfig, make_loader
from training_adapter.resume import Span, StreamPlan, epoch_span, replayed, stream_rest
from wds_tools.errors import OptionError

B = 7
SHARDS, PER_SHARD = 6, 20  # 120 train samples
SIZE = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_dataset(
        tmp_path_factory.mktemp("resume"),
        {"train": [[(j + t) % 3 for t in range(PER_SHARD)] for j in range(SHARDS)]},
        size=SIZE,
    )


@pytest.fixture(scope="module")
def stored(folder) -> dict:
    return read_stored(sorted(folder.glob("train-*.tar")))


EXPECT = Expect(train=True, augment=AugmentConfig())


# --- in processes of their own, under gloo ---------------------------------------------------------------
def _rank_main(rank: int, world: int, init: str, folder: str, jobs: list[dict], out: str) -> None:
    """Run each job (``full``: whole epochs; ``stop``: ``stop`` batches, then torch.save the state;
    ``resume``: torch.load a state, then the rest and the next epoch) and write what it yielded."""
    import multiprocessing

    import torch.distributed as dist

    multiprocessing.set_start_method("fork", force=True)  # as under torchrun
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        result = {}
        for job in jobs:
            ld = make_loader(folder, train=True, batch_size=B, return_keys=True, **job["opts"])
            epochs: list[list] = []
            if job["kind"] == "resume":
                ld.load_state_dict(torch.load(job["state"], weights_only=True))
            for e in range(job.get("epochs", 2)):
                batches = []
                for i, (images, labels, keys) in enumerate(ld):
                    batches.append([keys, labels.tolist(), images.numpy().copy()])
                    if job["kind"] == "stop" and i + 1 == job["stop"]:
                        break
                epochs.append([ld.epoch if job["kind"] != "stop" else e, batches])
                if job["kind"] == "stop":
                    if rank == 0:  # every rank's state is the same: rank 0 saves it
                        torch.save(ld.state_dict(), job["state"])
                    assert ld.state_dict() == torch.load(job["state"], weights_only=True) if world == 1 else True
                    break
            np.save(
                Path(out, f"{job['name']}-{rank}.npy"),
                np.stack([im for _, bs in epochs for b in bs for im in b[2]])
                if any(b for _, b in epochs)
                else np.zeros((0, 3, SIZE, SIZE), np.uint8),
            )
            result[job["name"]] = [[e, [[b[0], b[1]] for b in bs]] for e, bs in epochs]
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        if world > 1:
            dist.destroy_process_group()


def _spawn(world: int, folder: Path, jobs: list[dict], tmp: Path) -> list[dict]:
    """Each rank's result per job: its epochs as [epoch, [(keys, labels, images)]]."""
    import torch.multiprocessing as tmp_mp

    run = tmp / f"run{random.getrandbits(32)}"
    run.mkdir()
    tmp_mp.spawn(_rank_main, args=(world, f"file://{run}/init", str(folder), jobs, str(run)), nprocs=world, join=True)
    out = []
    for r in range(world):
        res = json.loads((run / f"rank{r}.json").read_text())
        for job in jobs:
            images = iter(np.load(run / f"{job['name']}-{r}.npy"))
            res[job["name"]] = [
                (e, [(k, lab, np.stack([next(images) for _ in k])) for k, lab in bs]) for e, bs in res[job["name"]]
            ]
        out.append(res)
    return out


def _check_pixels(stored: dict, epoch: int, batches: list) -> list[str]:
    """The batches' samples against the oracle's reference (labels, pixels); their keys in order."""
    ep = Epoch([[(k, lab, im, None) for k, lab, im in zip(keys, labels, images)] for keys, labels, images in batches])
    return check_epoch(ep, stored, EXPECT, epoch, batch_size=B)


CONFIGS = [dict(num_workers=0), dict(num_workers=2)]
ELASTIC = dict(num_workers=1, drop_last=False)
STOPS = {(2, 3): 3, (3, 2): 2}  # elastic (old ranks, new ranks): batches before the stop


@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory) -> dict:
    """Every run of the tests below, in five spawns (each costs a torch import per rank): per world
    1 and 2, the uninterrupted runs and runs stopped after a random batch, then their resumptions;
    the elastic runs stopped on 2 (3) ranks and resumed on 3 (2), beside 3 (2) ranks' own epochs.

    Made once per test run (conftest.once_per_run: 28 s of CPU on each pytest-xdist worker otherwise), with the
    digest of the shards it read: each worker's ``folder`` must be those bytes."""
    made = once_per_run(tmp_path_factory, "test_resume-runs", lambda tmp: _make_runs(folder, tmp))
    assert made.pop("shards") == _shards_digest(folder), "the runs were made from other shards than this folder's"
    return made


def _shards_digest(folder: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for tar in sorted(folder.glob("*.tar")):
        h.update(tar.name.encode() + tar.read_bytes())
    return h.hexdigest()


def _make_runs(folder: Path, tmp: Path) -> dict:
    rng = random.Random(23)
    stops = {w: [rng.randrange(1, (SHARDS * PER_SHARD // w) // B) for _ in CONFIGS] for w in (1, 2)}

    def exact(world: int, kind: str) -> list[dict]:
        jobs = []
        for j, (opts, k) in enumerate(zip(CONFIGS, stops[world])):
            state = str(tmp / f"w{world}-{j}.pt")
            if kind == "resume":
                jobs.append(dict(name=f"resume{j}", kind="resume", opts=opts, state=state))
            else:
                jobs += [
                    dict(name=f"full{j}", kind="full", opts=opts),
                    dict(name=f"stop{j}", kind="stop", opts=opts, stop=k, state=state),
                ]
        return jobs

    def elastic(old: int, new: int, kind: str) -> dict:
        state = str(tmp / f"e{old}-{new}.pt")
        if kind == "stop":
            return dict(name=f"stop{old}{new}", kind="stop", opts=ELASTIC, stop=STOPS[old, new], state=state)
        return dict(name=f"resume{old}{new}", kind="resume", opts=ELASTIC, state=state)

    out = {(1, "before"): _spawn(1, folder, exact(1, "before"), tmp)}
    out[1, "after"] = _spawn(1, folder, exact(1, "resume"), tmp)
    out[2, "before"] = _spawn(2, folder, exact(2, "before") + [elastic(2, 3, "stop")], tmp)
    out[3, "after"] = _spawn(
        3,
        folder,
        [elastic(3, 2, "stop"), elastic(2, 3, "resume"), dict(name="full", kind="full", opts=ELASTIC)],
        tmp,
    )
    out[2, "after"] = _spawn(
        2,
        folder,
        exact(2, "resume") + [elastic(3, 2, "resume"), dict(name="full", kind="full", opts=ELASTIC)],
        tmp,
    )
    out["stops"] = stops
    out["shards"] = _shards_digest(folder)
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_resume_is_exact_in_a_fresh_process(runs, stored, world):
    """Stopped after a random batch, saved, continued elsewhere: the uninterrupted run's batches, to the pixel."""
    before, after = runs[world, "before"], runs[world, "after"]
    for j, k in enumerate(runs["stops"][world]):
        for r in range(world):
            full = before[r][f"full{j}"]
            stopped = before[r][f"stop{j}"][0][1]
            resumed = after[r][f"resume{j}"]
            assert len(stopped) == k
            assert [e for e, _ in resumed] == [0, 1], "the rest of epoch 0, then epoch 1"
            want = _check_pixels(stored, 0, full[0][1])
            got = _check_pixels(stored, 0, stopped) + _check_pixels(stored, 0, resumed[0][1])
            assert got == want, f"config {CONFIGS[j]}, rank {r}: stopped after {k} batches"
            assert [len(b[0]) for b in stopped + resumed[0][1]] == [len(b[0]) for b in full[0][1]]
            assert _check_pixels(stored, 1, resumed[1][1]) == _check_pixels(stored, 1, full[1][1])


@pytest.mark.parametrize("old,new", list(STOPS))
def test_elastic_resume_covers_the_split_once(runs, stored, old, new):
    """120 samples, batches of 7, no drop_last: the 2*3*7 (3*2*7) samples read before the stop and the
    78 left, dealt to the new ranks, are the split, each once; the next epoch is the new world's own."""
    before = runs[old, "before" if old == 2 else "after"]
    after = runs[new, "after"]
    keys = []
    for r in range(old):
        keys += _check_pixels(stored, 0, before[r][f"stop{old}{new}"][0][1])
    counts = set()
    for r in range(new):
        resumed = after[r][f"resume{old}{new}"]
        keys += _check_pixels(stored, 0, resumed[0][1])
        counts.add(len(resumed[0][1]))
        assert resumed[1][0] == 1
        assert _check_pixels(stored, 1, resumed[1][1]) == _check_pixels(stored, 1, after[r]["full"][1][1])
    assert len(counts) == 1, "every new rank yields the same number of batches"
    assert sum(len(b[0]) for r in range(new) for b in after[r][f"resume{old}{new}"][0][1]) == 78
    assert sorted(keys) == sorted(stored), (
        f"dup {[k for k, n in Counter(keys).items() if n > 1][:3]}, missing {sorted(set(stored) - set(keys))[:3]}"
    )


def _ranks_stop(root: Path, monkeypatch, world: int, k: int, opts: dict) -> tuple[list[list[str]], dict]:
    """Every rank's keys of its first ``k`` batches (in this process, the rank set by RANK/WORLD_SIZE), and
    rank 0's state then (every rank's, once each has yielded k or all it has)."""
    heads, states = [], []
    for r in range(world):
        _ranked(monkeypatch, r, world)
        ld = make_loader(root, **opts)
        it = iter(ld)
        heads.append([key for _, b in zip(range(k), it) for key in b[-1]])
        states.append(json.loads(json.dumps(ld.state_dict())))
        del it
    return heads, states[0]


def test_streaming_resumes_on_other_ranks_only_where_nothing_is_lost(folder, monkeypatch):
    """Streamed on 3 ranks (2 shards of 20 each, in order, no buffer), stopped after 2 batches of 7:
    each rank is 14 samples into its first shard, whose 6 others only its own stream gives. On 3 ranks
    the rest is exactly each rank's uninterrupted rest; on 2 the state is refused, naming the 3 x 6
    samples that would be lost. Stopped after 0 batches (nothing begun) it resumes on 2 ranks."""
    opts = dict(train=True, batch_size=B, num_workers=1, reader="stream", shuffle_buffer=0, return_keys=True)
    whole, _ = _ranks_stop(folder, monkeypatch, 3, 10**6, opts)
    heads, state = _ranks_stop(folder, monkeypatch, 3, 2, opts)
    assert [len(h) for h in heads] == [14] * 3
    for r in range(3):
        _ranked(monkeypatch, r, 3)
        again = make_loader(folder, **opts)
        again.load_state_dict(state)
        assert heads[r] + [key for b in again for key in b[-1]] == whole[r], f"rank {r}"
    for r in range(2):
        _ranked(monkeypatch, r, 2)
        with pytest.raises(
            OptionError,
            match=r"after 2 batches on 3 ranks, 1 reader each.*this loader reads on 2 "
            r"ranks, 1 reader each.*: 18 samples that the stopped readers had pulled.*would be lost",
        ):
            make_loader(folder, **opts).load_state_dict(state)
    _, fresh = _ranks_stop(folder, monkeypatch, 3, 0, opts)
    keys = []
    for r in range(2):
        _ranked(monkeypatch, r, 2)
        again = make_loader(folder, **opts)
        again.load_state_dict(fresh)
        keys += [key for b in again for key in b[-1]]
    assert len(keys) == len(set(keys)) > 0


# --- in this process ------------------------------------------------------------------------------------
def test_state_is_small_json_and_refuses_another_run(folder):
    ld = make_loader(folder, train=True, batch_size=B, num_workers=0)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 600
    assert state["epoch"] == 0 and state["position"] == B
    for other, match in [
        (dict(seed=1), "seed=0, this loader has seed=1.*make the loader with seed=0"),
        (dict(subset=0.5), "samples=120"),
    ]:
        with pytest.raises(OptionError, match=match):
            make_loader(folder, train=True, batch_size=B, num_workers=0, **other).load_state_dict(state)
    with pytest.raises(OptionError, match="stream reader"):
        make_loader(folder, train=True, batch_size=B, num_workers=0, reader="stream").load_state_dict(state)
    with pytest.raises(OptionError, match="expected the dict loader.state_dict"):
        ld.load_state_dict({"epoch": 0})
    for _ in it:
        pass
    assert ld.state_dict()["epoch"] == 1 and ld.state_dict()["position"] == 0, "a finished epoch: the next one"


def test_set_epoch_to_another_epoch_drops_the_loaded_state(folder, caplog):
    ld = make_loader(folder, train=True, batch_size=B, num_workers=0, return_keys=True)
    first = next(iter(ld))[-1]
    state = ld.state_dict()
    again = make_loader(folder, train=True, batch_size=B, num_workers=0, return_keys=True)
    again.load_state_dict(state)
    again.set_epoch(0)  # the epoch of the state: kept
    assert next(iter(again))[-1] != first
    again.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="training_adapter"):
        again.set_epoch(3)
    assert "drops the loaded state of epoch 0" in caplog.text
    assert again.epoch == 3 and len(list(again)) == len(again)


STREAMED = [
    pytest.param(dict(num_workers=0), id="w0"),
    pytest.param(dict(num_workers=0, shuffle_buffer=0), id="w0-no-buffer"),
    pytest.param(dict(num_workers=2), id="w2"),
    pytest.param(dict(num_workers=3, persistent_workers=True, shuffle_buffer=10), id="w3-persistent"),
    pytest.param(dict(num_workers=2, train=False, split="train"), id="w2-eval"),
    pytest.param(dict(num_workers=2, resampled=True, epoch_batches=9), id="w2-resampled"),
]


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    """7 train shards of 20, 13, 20, 9, 20, 17 and 11 samples: workers run out at different batches."""
    sizes = [20, 13, 20, 9, 20, 17, 11]
    return build_dataset(
        tmp_path_factory.mktemp("uneven"), {"train": [[t % 3 for t in range(n)] for n in sizes]}, size=4
    )


@pytest.mark.parametrize("opts", STREAMED)
def test_a_resumed_streamed_epoch_is_the_uninterrupted_one(uneven, opts):
    """Stopped after k batches, its state through JSON, continued by a fresh loader (and that one stopped
    again and continued): the uninterrupted epoch's batches, in its order, to the pixel; then the next
    epoch. The workers' shards differ in samples, so they run out at different batches."""
    opts = {"train": True, "batch_size": B, "reader": "stream", "return_keys": True, "seed": 5, **opts}
    ld = make_loader(uneven, **opts)
    whole = [(b[-1], b[0].clone()) for b in ld]
    after = [b[-1] for b in ld]
    assert len(whole) >= 8
    for stops in ([1], [len(whole) // 2], [len(whole) - 1], [2, 5]):
        got, state = [], None
        for stop in [*stops, None]:
            ld = make_loader(uneven, **opts)
            if state is not None:
                ld.load_state_dict(json.loads(json.dumps(state)))
            it = iter(ld)
            for b in it:
                got.append((b[-1], b[0].clone()))
                if stop is not None and len(got) == stop:
                    break
            state = ld.state_dict()
            del it
        assert [k for k, _ in got] == [k for k, _ in whole], f"stopped after {stops}"
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, whole))
        assert state["epoch"] == 1 and state["batches"] == 0
        ld = make_loader(uneven, **opts)
        ld.load_state_dict(state)
        assert [b[-1] for b in ld] == after


def test_the_issues_streamed_resume_yields_the_rest_of_the_epoch(tmp_path):
    """Issue 38's case: 0 workers, the default 1000-sample buffer, 38-sample shards, 33 batches of 32;
    stopped after 7, the resumed epoch yields the other 26 (it yielded none, skipping 840 samples with a
    log line, before the resume replayed the stream)."""
    root = build_dataset(tmp_path / "d", {"train": [[t % 3 for t in range(38)] for _ in range(28)]}, size=4)
    opts = dict(train=True, batch_size=32, num_workers=0, reader="stream", return_keys=True)
    whole = [b[-1] for b in make_loader(root, **opts)]
    assert len(whole) == 33
    ld = make_loader(root, **opts)
    it = iter(ld)
    head = [next(it)[-1] for _ in range(7)]
    state = ld.state_dict()
    del it
    again = make_loader(root, **opts)
    again.load_state_dict(state)
    rest = [b[-1] for b in again]
    assert len(rest) == 26 and head + rest == whole
    other = make_loader(root, **{**opts, "num_workers": 2})
    with pytest.raises(
        OptionError,
        match=r"1 rank, 1 reader each \(num_workers=0 or 1\); this loader reads on 1 "
        r"rank, 2 readers each \(num_workers=2\): 840 samples",
    ):
        other.load_state_dict(state)  # 1000 + 7 x 32 samples pulled: every shard opened, 1064 - 224 not yielded


def test_the_state_after_a_resumed_epoch_is_the_next_epoch_whole(folder):
    """A resumed epoch run to its end: the state names the next epoch from its start (it said
    end=0, an empty next epoch, before issue 32)."""
    opts = dict(train=True, batch_size=B, num_workers=0, return_keys=True)
    ld = make_loader(folder, **opts)
    epochs = [[k for b in ld for k in b[-1]] for _ in range(2)]
    ld = make_loader(folder, **opts)
    it = iter(ld)
    head = [k for _ in range(3) for k in next(it)[-1]]
    state = ld.state_dict()
    del it
    again = make_loader(folder, **opts)
    again.load_state_dict(state)
    assert head + [k for b in again for k in b[-1]] == epochs[0]
    after = again.state_dict()
    assert (after["epoch"], after["position"], after["end"]) == (1, 0, None)
    third = make_loader(folder, **opts)
    third.load_state_dict(after)
    assert [k for b in third for k in b[-1]] == epochs[1]


# --- evaluation across ranks (issue 32, point 2) ----------------------------------------------------------
@pytest.fixture(scope="module")
def val31(tmp_path_factory) -> Path:
    """31 val samples converted from real JPEGs, 8 shards of up to 4: on 2 ranks 16 and 15 samples
    (batches of 5: 4 and 3 batches, the issue's case)."""
    return convert_images(tmp_path_factory.mktemp("val31"), 31, size=16, shard_size=4, val_every=1)


def _ranked(monkeypatch, rank: int, world: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


def _eval_stop(root: Path, monkeypatch, world: int, k: int, opts: dict) -> tuple[list[str], list[dict]]:
    """Every rank's keys of its first ``k`` batches (or all it has), and each rank's state then."""
    head, states = [], []
    for r in range(world):
        _ranked(monkeypatch, r, world)
        ld = make_loader(root, **opts)
        it = iter(ld)
        for _ in range(k):
            batch = next(it, None)
            if batch is None:
                break
            head += batch[-1]
        states.append(json.loads(json.dumps(ld.state_dict())))
        del it
    return head, states


def _eval_resume(root: Path, monkeypatch, world: int, state: dict, opts: dict) -> list[list[str]]:
    """Each rank's keys of the rest of the epoch ``state`` names, on ``world`` ranks."""
    out = []
    for r in range(world):
        _ranked(monkeypatch, r, world)
        ld = make_loader(root, **opts)
        ld.load_state_dict(state)
        out.append([k for b in ld for k in b[-1]])
    return out


@pytest.mark.parametrize(
    "batch,old,new,workers",
    [(5, 2, 2, 0), (1, 2, 2, 0), (2, 2, 2, 2), (5, 2, 3, 0), (3, 3, 2, 0), (4, 1, 4, 0), (2, 4, 1, 0)],
)
def test_a_resumed_evaluation_covers_every_sample_once_across_ranks(val31, monkeypatch, batch, old, new, workers):
    """Index reader, evaluation: stopped after k batches on every rank (or all a rank has), for every
    k, rank 0's state resumed on ``new`` ranks: the union over ranks, by key, is the split's keys read
    with stock tarfile, each exactly once, as in an uninterrupted evaluation."""
    want = tar_keys(val31, "val")
    opts = dict(train=False, batch_size=batch, num_workers=workers, return_keys=True)
    whole, _ = _eval_stop(val31, monkeypatch, old, 10**6, opts)
    assert sorted(whole) == want, "the uninterrupted evaluation: every sample once"
    first = -(-31 // old)  # rank 0's rows, the most of any rank
    most = -(-first // batch)
    for k in range(most + 1):
        head, states = _eval_stop(val31, monkeypatch, old, k, opts)
        few = -(-(31 // old) // batch)  # the last rank's batches, the fewest
        assert all(s == states[0] for s in states[: old if k <= few else 1]), "rank 0's state is every rank's"
        state = states[0]
        assert state["epoch"] == (k == most), f"after {k} of rank 0's {most} batches"
        if k == most:  # the epoch is done: the state names the next one
            assert sorted(head) == want
            continue
        rest = _eval_resume(val31, monkeypatch, new, state, opts)
        keys = head + [key for r in rest for key in r]
        assert sorted(keys) == want, (k, sorted(set(want) - set(keys)), [x for x in keys if keys.count(x) > 1])
    if (batch, old, new) == (5, 2, 2):  # the issue's case: after 3 batches, rank 0's last one is still to come
        _, states = _eval_stop(val31, monkeypatch, 2, 3, opts)
        assert (states[0]["epoch"], states[0]["position"], states[0]["end"]) == (0, 30, 31)
        assert [len(r) for r in _eval_resume(val31, monkeypatch, 2, states[0], opts)] == [1, 0]


def _shard_of(root: Path, split: str) -> dict[str, str]:
    """Each sample key's shard, read with stock tarfile."""
    import tarfile

    out = {}
    for path in sorted(root.glob(f"{split}-*.tar")):
        with tarfile.open(path) as tf:
            out.update({m.name.split(".", 1)[0]: path.name for m in tf.getmembers()})
    return out


@pytest.mark.parametrize("old,new,workers", [(2, 2, 1), (2, 3, 1), (3, 2, 1), (1, 2, 1), (2, 2, 2)])
def test_a_resumed_streamed_evaluation_is_exact_or_refused(val31, monkeypatch, old, new, workers):
    """Streaming reader, evaluation: on the ranks it stopped on, each rank's rest is its uninterrupted
    rest; on others, a state whose readers had begun shards they had not finished is refused, naming
    the samples of those shards no batch yielded (counted here from the keys read, by stock tarfile's
    shard of each key), else the rest covers every sample not yet read, each once."""
    want = tar_keys(val31, "val")
    shard = _shard_of(val31, "val")
    opts = dict(train=False, batch_size=3, num_workers=workers, reader="stream", return_keys=True)
    whole, _ = _ranks_stop(val31, monkeypatch, old, 10**6, opts)
    for k in range(1, 4) if workers == 1 else [2]:
        heads, state = _ranks_stop(val31, monkeypatch, old, k, opts)
        head = [key for h in heads for key in h]
        begun = {shard[key] for key in head}
        lost = [key for key in want if shard[key] in begun and key not in head]
        rest: list[list[str]] = []
        for r in range(new):
            _ranked(monkeypatch, r, new)
            ld = make_loader(val31, **opts)
            if old != new and lost:
                with pytest.raises(OptionError, match=rf"after {k} batches.*: {len(lost)} samples that the stopped"):
                    ld.load_state_dict(state)
                continue
            ld.load_state_dict(state)
            rest.append([key for b in ld for key in b[-1]])
        if old == new:
            assert [h + r for h, r in zip(heads, rest)] == whole, f"stopped after {k}"
        elif not lost:
            keys = head + [key for r in rest for key in r]
            assert sorted(keys) == want, f"stopped after {k}"


# --- the planner --------------------------------------------------------------------------------------------
# the planner's inputs, for training and evaluation alike
PLANNED_SETTINGS = settings(max_examples=300, deadline=None)
PLANNED_INPUTS = given(
    n=st.integers(1, 200),
    batch=st.integers(1, 9),
    world=st.integers(1, 4),
    new=st.integers(1, 4),
    drop_last=st.booleans(),
    cap=st.one_of(st.none(), st.integers(1, 30)),
    stop=st.floats(0, 1),
)


def _rank_batches(
    order: list[int],
    world: int,
    rank: int,
    batch_size: int,
    drop_last: bool,
    max_batches: int | None = None,
    *,
    cover: bool = False,
) -> list[list[int]]:
    """The documented deal, restated: rank r takes every world-th row from r, batches in order; in training
    equal counts (the rows past a multiple of world left out), in evaluation (``cover``) all of them."""
    mine = order[rank::world]
    if not cover and world > 1:
        mine = mine[: len(order) // world]
    n = len(mine) // batch_size if drop_last else -(-len(mine) // batch_size)
    n = n if max_batches is None else min(n, max_batches)
    return [mine[j * batch_size : (j + 1) * batch_size] for j in range(n)]


@PLANNED_SETTINGS
@PLANNED_INPUTS
def test_planner_resume(n, batch, world, new, drop_last, cap, stop):
    order = list(np.random.default_rng(n).permutation(n))
    span = epoch_span(n, world=world, batch_size=batch, drop_last=drop_last, max_batches=cap)
    full = [_rank_batches(order, world, r, batch, drop_last, cap) for r in range(world)]
    nb = len(full[0])
    assert span.batches(world, batch, drop_last) == nb and all(len(f) == nb for f in full)
    k = int(stop * nb)
    pos = span.position(k, world, batch)
    rest = Span(pos, span.end)
    # same world: exactly the batches after the k-th, on every rank
    for r in range(world):
        assert _rank_batches(order[pos : span.end], world, r, batch, drop_last) == full[r][k:]
    # another world: the rest once, equal batch counts, the left-out ones counted
    done = [i for r in range(world) for b in full[r][:k] for i in b]
    after = [_rank_batches(order[pos : span.end], new, r, batch, drop_last) for r in range(new)]
    assert len({len(a) for a in after}) == 1
    again = [i for a in after for b in a for i in b]
    assert len(set(done + again)) == len(done) + len(again), "no sample twice"
    planned = {i for f in full for b in f for i in b}
    assert set(again) <= set(order[: span.end]) and planned - set(done) <= set(order[pos : span.end])
    assert span.end - pos - len(again) == rest.left_out(new, batch, drop_last)
    assert rest.left_out(new, batch, drop_last) < new * (batch if drop_last else 1) + new


@PLANNED_SETTINGS
@PLANNED_INPUTS
def test_planner_resume_in_evaluation(n, batch, world, new, drop_last, cap, stop):
    """cover: ranks differ by a row; after k batches on every rank (or all it has) the rows read are the
    prefix [0, position); the rest dealt to the same ranks is exactly each rank's remaining batches, to
    other ranks every row of it once (drop_last: the short batches counted by left_out)."""
    order = list(np.random.default_rng(n).permutation(n))
    span = epoch_span(n, world=world, batch_size=batch, drop_last=drop_last, max_batches=cap, cover=True)
    full = [_rank_batches(order, world, r, batch, drop_last, cap, cover=True) for r in range(world)]
    most = len(full[0])
    assert span.batches(world, batch, drop_last, True) >= most and all(len(f) <= most for f in full)
    planned = [i for f in full for b in f for i in b]
    assert set(planned) <= set(order[: span.end]) and len(planned) == len(set(planned))
    assert drop_last or cap is not None or sorted(planned) == sorted(order), "every row once"
    k = int(stop * most)
    pos = span.position(k, world, batch, True)
    done = [i for f in full for b in f[:k] for i in b]
    assert set(done) <= set(order[:pos]) and set(planned) & set(order[:pos]) == set(done), "a prefix"
    rest = Span(pos, span.end)
    for r in range(world):  # the same ranks: exactly the batches each had left
        assert _rank_batches(order[pos : span.end], world, r, batch, drop_last, cover=True) == full[r][k:]
    after = [
        i
        for r in range(new)
        for b in _rank_batches(order[pos : span.end], new, r, batch, drop_last, cover=True)
        for i in b
    ]
    assert len(set(done + after)) == len(done) + len(after), "no row twice"
    assert span.end - pos - len(after) == rest.left_out(new, batch, drop_last, True)
    assert drop_last or len(after) == span.end - pos, "without drop_last every remaining row"


class _Tagged(IterableDataset):
    def __init__(self, planned: list[int]) -> None:
        self.planned = planned

    def __iter__(self):
        w = get_worker_info().id
        yield from (w for _ in range(self.planned[w]))


def yielded_per_worker(k: int, planned: list[int]) -> list[int]:
    """The reference for ``replayed``, by hand: batches each worker has handed over after the
    DataLoader yielded ``k``, taking them round-robin and passing over a worker once it has yielded
    its ``planned`` batches (it was resume.py's own until replayed's closed form replaced it there)."""
    got = [0] * len(planned)
    left = k
    while left > 0:
        moved = False
        for w, p in enumerate(planned):
            if left and got[w] < p:
                got[w] += 1
                left -= 1
                moved = True
        if not moved:
            break
    return got


@pytest.mark.parametrize("planned", [[3, 3], [1, 4, 2], [0, 2, 5]])
def test_yielded_per_worker_is_the_dataloaders_order(planned):
    """Against a real DataLoader: which worker each of its batches came from."""
    tags = [int(t) for t in DataLoader(_Tagged(planned), batch_size=None, num_workers=len(planned))]
    assert sorted(tags) == sorted(w for w, p in enumerate(planned) for _ in range(p))
    for k in range(len(tags) + 1):
        assert yielded_per_worker(k, planned) == [tags[:k].count(w) for w in range(len(planned))]


@pytest.mark.parametrize("planned", [[3, 3], [1, 4, 2], [0, 2, 5], [4, 1, 1, 3]])
def test_a_replay_rotates_the_workers_into_the_dataloaders_order(planned):
    """After each k: workers rotated to start at ``replayed``'s next one, each with its batches left,
    a real DataLoader yields (by the original worker) the rest of the uninterrupted order."""
    tags = [int(t) for t in DataLoader(_Tagged(planned), batch_size=None, num_workers=len(planned))]
    W = len(planned)
    for k in range(len(tags)):
        got, first = replayed(k, planned)
        assert got == yielded_per_worker(k, planned)
        order = [(first + j) % W for j in range(W)]
        rest = [
            int(t) for t in DataLoader(_Tagged([planned[w] - got[w] for w in order]), batch_size=None, num_workers=W)
        ]
        assert [order[t] for t in rest] == tags[k:], f"after {k}"


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    new=st.integers(1, 3),
    new_workers=st.integers(1, 3),
    batch=st.integers(1, 6),
    buffer=st.sampled_from([0, 5, 30]),
    cover=st.booleans(),
)
def test_stream_rest_never_reopens_a_shard(data, world, workers, new, new_workers, batch, buffer, cover):
    """Training: no shard begun is read again, ranks equal. Evaluation (``cover``, no buffer, every
    worker its shards whole): every sample is yielded before the stop, skipped (counted), or in the
    rest's batches, exactly once."""
    if cover:
        buffer = 0
    n_shards = data.draw(st.integers(1 if cover else world * workers, 12))
    counts = data.draw(st.lists(st.integers(0, 15), min_size=n_shards, max_size=n_shards))
    shards = [[list(range(n_shards))[r::world][w::workers] for w in range(workers)] for r in range(world)]
    if cover:
        planned = [[-(-sum(counts[i] for i in s) // batch) for s in r] for r in shards]
        quota = max(sum(p) for p in planned)
    else:
        planned = [[sum(counts[i] for i in s) // batch for s in r] for r in shards]
        quota = min(sum(p) for p in planned)
        for p in planned:  # equal totals
            while sum(p) > quota:
                p[p.index(max(p))] -= 1
    k = data.draw(st.integers(0, quota))
    out = stream_rest(
        StreamPlan(shards, planned),
        counts,
        k,
        batch_size=batch,
        buffer=buffer,
        world=new,
        num_workers=new_workers,
        drop_last=not cover,
        cover=cover,
    )
    if cover:
        got = [yielded_per_worker(k, p) for p in planned]
        yielded = sum(
            min(g * batch, sum(counts[i] for i in s)) for r in range(world) for g, s in zip(got[r], shards[r])
        )
        rest_samples = sum(counts[i] for r in out.plan.shards for w in r for i in w)
        assert yielded + out.skipped + rest_samples == sum(counts) and out.left_out == 0
        for r, ranks in enumerate(out.plan.shards):  # every worker reads its shards whole
            assert out.plan.batches[r] == [-(-sum(counts[i] for i in w) // batch) for w in ranks]
    got = [yielded_per_worker(k, p) for p in planned]
    n = buffer if buffer > 1 else 0
    opened = set()
    for r in range(world):
        for w in range(workers):
            if got[r][w] and got[r][w] < planned[r][w]:
                pulled, before = n + got[r][w] * batch, 0
                for i in shards[r][w]:
                    if before < pulled:
                        opened.add(i)
                    before += counts[i]
    rest, skipped = out.plan, out.skipped
    left = [i for r in rest.shards for w in r for i in w]
    assert len(left) == len(set(left)) and not set(left) & opened
    assert skipped >= 0
    assert len(rest.shards) == new and all(len(r) == new_workers for r in rest.shards)
    if new > 1 and not cover:
        assert len({sum(b) for b in rest.batches}) == 1


def test_train_example_resumes_with_its_checkpoint(tmp_path):
    """scripts/train_example.py stopped after 5 steps (--stop-after), then --resume: the batches trained
    on, by key, are the uninterrupted run's."""
    import subprocess
    import sys

    data = build_dataset(
        tmp_path / "d", {"train": [[t % 3 for t in range(20)] for _ in range(4)], "val": [[0, 1, 2, 0]]}, size=SIZE
    )
    script = Path(__file__).resolve().parents[1] / "scripts" / "train_example.py"
    config = tmp_path / "train.toml"  # no worker processes: three runs of the script stay quick
    config.write_text(f'[dataset]\ntrain_urls = "{data}"\nval_urls = "{data}"\nbatch_size = {B}\nnum_workers = 0\n')
    base = [sys.executable, str(script), "--config", str(config), "--epochs", "2"]

    def run(*extra: str) -> str:
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    run("--log-keys", str(tmp_path / "full.txt"))
    ck = str(tmp_path / "ck.pt")
    assert "stopped after 5 steps" in run(
        "--log-keys", str(tmp_path / "cut.txt"), "--checkpoint", ck, "--stop-after", "5"
    )
    assert "resumed from" in run("--log-keys", str(tmp_path / "cut.txt"), "--checkpoint", ck, "--resume")
    full = (tmp_path / "full.txt").read_text().splitlines()
    assert len(full) == 2 * (80 // B)
    assert (tmp_path / "cut.txt").read_text().splitlines() == full


@pytest.mark.parametrize(
    "opts",
    [
        dict(device_augment=True, num_workers=2),  # reader threads
        dict(train=False, split="train", num_workers=2),  # eval: threads, in order
        dict(persistent_workers=True, num_workers=2),
    ],
)
def test_resume_in_the_other_worker_paths(folder, opts):
    """Reader threads and persistent workers (loaded after they started) resume exactly too."""
    opts = {"train": True, "batch_size": B, "return_keys": True, **opts}
    ld = make_loader(folder, **opts)
    full = [b[-1] for b in ld]
    ld2 = make_loader(folder, **opts)
    it = iter(ld2)
    head = [next(it)[-1] for _ in range(3)]
    state = ld2.state_dict()
    del it
    again = make_loader(folder, **opts)
    if opts.get("persistent_workers"):
        assert len(list(again)) == len(full)  # the workers are started, with the dataset as it was
    again.load_state_dict(state)
    assert head + [b[-1] for b in again] == full
