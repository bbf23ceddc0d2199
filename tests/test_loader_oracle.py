"""The loader against the reference loader (tests/oracle.py), sample by sample, in every configuration.

Every batch of every configuration below (the defaults a user gets always among them) is checked:
each sample is exactly one stored sample, with its own label and its own stored pixels augmented
with its own (seed, epoch, key) parameters by the independent reference (tests/augref.py, within the
tolerance ``Expect.tolerance`` states; unaugmented pixels exactly); no key twice in a rank's epoch;
the epoch covers what the plan promises. Batches the caller keeps are checked again after later
ones were made.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import convert_images, once_per_run
from hypothesis import example, given, settings
from hypothesis import strategies as st
from oracle import Epoch, Expect, check_epoch, digest, read_stored, record

from training_adapter import AugmentConfig, make_loader
from wds_tools.errors import ShardError
from wds_tools.format.index import load_index

S = 12
B = 5
CUT = ("train-000000.tar", "train-000002.tar")  # the shards the damaged fixture cuts


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """2,160 train samples in 15 shards of 144 (batch 5 divides none), 240 val samples in 2 shards.

    With 2 workers or fewer each reads more samples than the default shuffle buffer holds (1,000),
    so the default configuration refills the buffer: the case where pixels went to other samples.
    """
    return convert_images(tmp_path_factory.mktemp("oracle"), 2400, size=S, shard_size=150, val_every=10)


@pytest.fixture(scope="module", autouse=True)
def compared():
    """Prints (with -s) how many samples this module compared with the reference."""
    import oracle

    start = oracle.COMPARED[0]
    yield
    print(f"\nloader vs reference: {oracle.COMPARED[0] - start} samples compared")


@pytest.fixture(scope="module")
def stored(folder) -> dict:
    return {split: read_stored(sorted(folder.glob(f"{split}-*.tar"))) for split in ("train", "val")}


@pytest.fixture(scope="module")
def damaged(folder, tmp_path_factory) -> Path:
    """The same folder with train shards 0 and 2 cut at 30%: rank 0 of 2 (shards 0, 2, 4, ... without
    shard shuffling) then loses more samples than its share has to spare."""
    bad = tmp_path_factory.mktemp("damaged") / str(S)
    shutil.copytree(folder, bad)
    for name in CUT:
        data = (bad / name).read_bytes()
        (bad / name).write_bytes(data[: int(len(data) * 0.3)])
    return bad


def expectation(folder: Path, opts: dict) -> Expect:
    train = opts.get("train", True)
    aug = opts.get("augment") or AugmentConfig()
    meta = load_index(folder).meta
    return Expect(
        train=train,
        augment=aug,
        seed=opts.get("seed", 0),
        device_augment=opts.get("device_augment", False),
        normalize=opts.get("normalize", False) or "device" in opts,  # device=: normalised there
        on_device="device" in opts,
        mean=tuple(meta["mean"]),
        std=tuple(meta["std"]),
    )


def run_epochs(loader, opts: dict, epochs: list[int | None]) -> list[tuple[int, Epoch]]:
    """Iterate the loader once per entry (an int: ``set_epoch`` first; None: let it advance)."""
    out = []
    for e in epochs:
        if e is not None:
            loader.set_epoch(e)
        params = opts.get("device_augment", False) and "device" not in opts  # device=: used up there
        batches = [record(b, keys=opts.get("return_keys", False), params=params) for b in loader]
        out.append((loader.epoch, Epoch(batches)))
    return out


def check_run(folder: Path, stored: dict, opts: dict, epochs=(None, None)) -> list[list[str]]:
    """Build the loader with ``opts`` (batch_size B unless given), run ``epochs``, check each against the oracle."""
    opts = {"train": True, "batch_size": B, **opts}
    train = opts["train"]
    split = opts.get("split") or ("train" if train else "val")
    loader = make_loader(opts.pop("urls", folder), **opts)
    ref = stored[split]
    if opts.get("subset") is not None:  # the subset's samples only
        idx = loader.dataset.index
        ref = {k: v for k, v in ref.items() if k in {idx.key_str(r) for r in loader.dataset.rows}}
        assert 0 < len(ref) < len(stored[split])
    runs = run_epochs(loader, opts, list(epochs))
    expect = expectation(folder, opts)
    drop_last = opts.get("drop_last", train)
    draws = bool(opts.get("resampled") or opts.get("class_weights"))  # samples may repeat
    all_keys = []
    for epoch, ep in runs:
        keys = check_epoch(ep, ref, expect, epoch, batch_size=opts["batch_size"], resampled=draws)
        short = sum(len(b) < opts["batch_size"] for b in ep.batches)
        assert short == 0 if drop_last else short <= max(1, loader.num_workers)
        if opts.get("resampled"):
            assert len(ep.batches) == len(loader) == opts["epoch_batches"]
        elif opts.get("class_weights"):
            assert len(ep.batches) == len(loader)
            mix = Counter(ref[k].label for k in keys)
            assert max(mix.values()) - min(mix.values()) <= 1 + len(keys) // 50, mix  # balanced: within 2 points
        else:
            assert len(ep.batches) == len(loader)
            if not drop_last:
                assert sorted(keys) == sorted(ref), "an epoch without drop_last covers every sample once"
            else:
                assert len(keys) == len(loader) * opts["batch_size"]
        all_keys.append(keys)
    if len(runs) > 1 and train and not draws:
        assert runs[0][0] != runs[1][0]  # the epoch moved on, so did the order
        assert all_keys[0] != all_keys[1]
    return all_keys


DEFAULTS: dict = {}  # make_loader(folder, batch_size=B, train=True): every other option as a user gets it

MATRIX = [
    pytest.param(DEFAULTS, id="defaults"),
    pytest.param(dict(return_keys=True), id="defaults+keys"),
    pytest.param(dict(num_workers=0), id="w0"),
    pytest.param(dict(num_workers=0, return_keys=True), id="w0-keys"),
    pytest.param(dict(num_workers=1, shuffle_buffer=1, return_keys=True), id="w1-sb1"),
    pytest.param(dict(num_workers=3, shuffle_buffer=3), id="w3-sb<batch"),
    pytest.param(dict(num_workers=2, shuffle_buffer=50, return_keys=True), id="w2-sb>shard"),
    pytest.param(dict(num_workers=0, shuffle_buffer=0, drop_last=False, batch_size=7), id="w0-sb0-b7-keep-last"),
    pytest.param(dict(num_workers=0, batch_size=8), id="w0-b8-divides-shards"),
    pytest.param(dict(num_workers=2, shuffle_buffer=200, batch_size=48), id="w2-b48-divides-shards"),
    pytest.param(dict(num_workers=2, drop_last=False, batch_size=3), id="w2-b3-keep-last"),
    pytest.param(dict(num_workers=2, persistent_workers=True, return_keys=True), id="w2-persistent"),
    pytest.param(
        dict(num_workers=1, persistent_workers=True, multiprocessing_context="spawn"), id="w1-spawn-persistent"
    ),
    pytest.param(dict(num_workers=2, normalize=True), id="w2-normalize"),
    pytest.param(dict(num_workers=0, normalize=True, return_keys=True), id="w0-normalize"),
    pytest.param(dict(num_workers=0, device_augment=True, return_keys=True), id="w0-device-augment"),
    pytest.param(dict(num_workers=2, device_augment=True), id="w2-device-augment"),
    pytest.param(dict(num_workers=2, augment=AugmentConfig(size=7, saturation=0.3)), id="w2-resize-saturation"),
    pytest.param(dict(num_workers=0, augment=AugmentConfig(size=20)), id="w0-upsize"),
    pytest.param(
        dict(num_workers=0, augment=AugmentConfig(affine_p=1.0), return_keys=True, epochs=(2,)), id="w0-cpu-affine"
    ),
    pytest.param(dict(num_workers=2, seed=11, shuffle_shards=False), id="w2-seed-no-shard-shuffle"),
    pytest.param(dict(num_workers=2, subset=0.3, return_keys=True), id="w2-subset-fraction"),
    pytest.param(dict(num_workers=0, subset={"label": ["a", "c"]}, drop_last=False), id="w0-subset-classes"),
    pytest.param(dict(num_workers=2, class_weights="balanced", return_keys=True), id="w2-balanced"),
    pytest.param(dict(num_workers=0, class_weights="balanced", subset=0.5), id="w0-balanced-subset"),
    pytest.param(dict(train=False), id="eval-defaults"),
    pytest.param(dict(train=False, num_workers=0, return_keys=True, batch_size=3), id="eval-w0"),
    pytest.param(dict(train=False, num_workers=1, split="train", drop_last=True), id="eval-train-split-drop"),
    # the index reader's workers are threads without CPU augmentation (eval, device_augment)
    pytest.param(dict(train=False, split="train", num_workers=3, batch_size=7, return_keys=True), id="eval-w3-threads"),
    pytest.param(
        dict(num_workers=3, device_augment=True, return_keys=True, persistent_workers=True),
        id="w3-device-augment-threads",
    ),
    # make_loader(device="cpu"): the device path, normalised (and augmented by augment_batch) in the main process
    pytest.param(dict(num_workers=2, device="cpu", epochs=(1,)), id="w2-device"),
    pytest.param(
        dict(num_workers=2, device="cpu", device_augment=True, return_keys=True, epochs=(2,)),
        id="w2-device-augment-on-device",
    ),
    pytest.param(dict(train=False, num_workers=0, device="cpu"), id="eval-w0-device"),
    # every sample's pixels and label checked against the index, or nothing but the NPY header
    pytest.param(dict(num_workers=2, check_samples=True), id="w2-check-samples"),
    pytest.param(dict(train=False, num_workers=0, check_samples=True, return_keys=True), id="eval-w0-check-samples"),
    pytest.param(dict(train=False, num_workers=2, check_samples=False), id="eval-w2-no-checks"),
]


READERS = [pytest.param("auto", id="index"), pytest.param("stream", id="stream")]  # auto: the index reader here


def _with_readers(matrix):
    """Every configuration with the index reader (the default here) and the streaming one, but
    subsets and class weights, which only the index reader offers."""
    for p in matrix:
        opts = p.values[0]
        yield pytest.param(opts, id=f"{p.id}-index")
        if "subset" not in opts and "class_weights" not in opts and opts.get("check_samples") is not True:
            yield pytest.param({**opts, "reader": "stream"}, id=f"{p.id}-stream")


@pytest.mark.parametrize("opts", list(_with_readers(MATRIX)))
def test_matrix_against_the_reference(folder, stored, opts):
    opts = dict(opts)
    check_run(folder, stored, opts, epochs=opts.pop("epochs", (None, None)))


def test_explicit_epochs_and_advance_without_set_epoch(folder, stored):
    keys = check_run(folder, stored, dict(return_keys=True), epochs=(0, 1, None, 1))
    assert keys[1] == keys[3]  # set_epoch(1) again: the same epoch, the same order
    assert keys[2] != keys[1]  # the un-set iteration after epoch 1 is epoch 2


def test_resampled_with_epoch_batches(folder, stored):
    check_run(folder, stored, dict(num_workers=2, resampled=True, epoch_batches=9, return_keys=True))
    check_run(folder, stored, dict(num_workers=0, resampled=True, epoch_batches=5))


@settings(max_examples=15, deadline=None)
@given(
    workers=st.sampled_from([0, 1, 2]),
    buffer=st.sampled_from([None, 0, 1, 2, 5, 64]),
    batch=st.sampled_from([1, 3, 4, 7]),
    drop_last=st.sampled_from([None, True, False]),
    device_augment=st.booleans(),
    keys=st.booleans(),
    seed=st.integers(0, 3),
    reader=st.sampled_from(["auto", "stream"]),
)
@example(workers=None, buffer=None, batch=B, drop_last=None, device_augment=False, keys=False, seed=0, reader="auto")
@example(workers=None, buffer=None, batch=B, drop_last=None, device_augment=False, keys=False, seed=0, reader="stream")
def test_drawn_configurations_against_the_reference(
    folder, stored, workers, buffer, batch, drop_last, device_augment, keys, seed, reader
):
    opts = dict(batch_size=batch, device_augment=device_augment, return_keys=keys, seed=seed, reader=reader)
    for name, value in (("num_workers", workers), ("shuffle_buffer", buffer), ("drop_last", drop_last)):
        if value is not None:
            opts[name] = value
    check_run(folder, stored, opts, epochs=(None,))


def test_pixels_do_not_depend_on_workers_buffer_or_batch_size(folder, stored):
    """The same epoch through very different pipelines: each key's image is identical."""

    def images(**kw):
        ld = make_loader(folder, train=True, return_keys=True, drop_last=False, **kw)
        ld.set_epoch(3)
        return {k: digest(im) for b in ld for im, k in zip(b[0], b[-1])}

    a = images(batch_size=4, num_workers=0, shuffle_buffer=0)
    b = images(batch_size=3, num_workers=2)
    c = images(batch_size=7, num_workers=3, shuffle_buffer=50)
    assert a.keys() == b.keys() == c.keys() == stored["train"].keys()
    assert a == b == c


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("workers", [0, 2])
def test_on_error_skip_with_a_damaged_shard(damaged, stored, workers, reader, caplog):
    """One rank: the damaged shards' samples are lost (streaming: those after the damage; the index
    reader: the whole shards, whose size is not the index's), the epoch is shorter, nothing repeats."""
    opts = dict(num_workers=workers, on_error="skip", return_keys=True, drop_last=False, reader=reader)
    with caplog.at_level("WARNING", logger="training_adapter"):
        loader = make_loader(damaged, train=True, batch_size=B, **opts)
        ep = run_epochs(loader, opts, [None])[0][1]
    keys = check_epoch(ep, stored["train"], expectation(damaged, {}), 0, batch_size=B)
    readable = read_stored(sorted(damaged.glob("train-*.tar")))
    assert set(keys) <= set(readable) and len(keys) < len(stored["train"])
    if reader == "stream":
        assert len(keys) >= len(readable) - 2  # each cut shard loses at most its cut sample
    else:
        whole = read_stored([p for p in sorted(damaged.glob("train-*.tar")) if p.name not in CUT])
        assert sorted(keys) == sorted(whole)
        assert "leaving out a damaged shard" in caplog.text


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("workers", [0, 2])
def test_on_error_skip_in_an_eval_pass(damaged, stored, workers, reader):
    """An eval pass with one rank over cut shards (the case that used to re-read a damaged shard to
    reach the planned batch count, then fail): every sample at most once, all readable ones read
    (streaming: up to the cut; the index reader: the whole undamaged shards), no error."""
    opts = dict(train=False, split="train", num_workers=workers, on_error="skip", return_keys=True, reader=reader)
    loader = make_loader(damaged, batch_size=B, **opts)
    ep = run_epochs(loader, opts, [None])[0][1]
    keys = check_epoch(ep, stored["train"], expectation(damaged, opts), 0, batch_size=B)
    readable = read_stored(sorted(damaged.glob("train-*.tar")))
    whole = read_stored([p for p in sorted(damaged.glob("train-*.tar")) if p.name not in CUT])
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted(readable if reader == "stream" else whole)


@pytest.fixture(scope="module")
def flipped(folder, tmp_path_factory) -> tuple[Path, set[str]]:
    """The folder with one pixel byte flipped in 7 samples (shard sizes unchanged): damage only the
    npy_xxh3 check sees. Returns the folder and the damaged keys."""
    from training_adapter.indexplan import read_sample_index
    from training_adapter.shardlist import resolve_urls

    bad = tmp_path_factory.mktemp("flipped") / str(S)
    shutil.copytree(folder, bad)
    shards = resolve_urls(bad, split="train")
    idx = read_sample_index(shards.index_base, shards.info, shards.urls, shards.names)
    rows = np.random.default_rng(5).choice(len(idx), 7, replace=False)
    for r in rows:
        path = Path(idx.urls[int(idx.shard[r])])
        data = bytearray(path.read_bytes())
        data[int(idx.offset[r]) + 128 + 3 * int(r) % (S * S * 3)] ^= 0x10
        path.write_bytes(bytes(data))
    return bad, {idx.key_str(int(r)) for r in rows}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("train", [True, False])
def test_index_reader_skips_damaged_samples_one_rank(flipped, stored, workers, train, caplog):
    """check_samples=True, on_error='skip': each flipped sample is left out of its batch and logged,
    the others are their own, the batch count is len()'s and nothing repeats."""
    bad, hurt = flipped
    opts = dict(
        train=train,
        split="train",
        num_workers=workers,
        on_error="skip",
        return_keys=True,
        check_samples=True,
        drop_last=False,
    )
    with caplog.at_level("WARNING", logger="training_adapter"):
        loader = make_loader(bad, batch_size=B, **opts)
        ep = run_epochs(loader, opts, [None])[0][1]
    keys = check_epoch(ep, stored["train"], expectation(bad, opts), loader.epoch, batch_size=B)
    assert len(ep.batches) == len(loader)
    assert sorted(keys) == sorted(set(stored["train"]) - hurt)
    if workers == 0 or loader.dataset.copies_only:  # read in this process: its log is captured
        assert caplog.text.count("leaving out a damaged sample") == len(hurt)


def test_index_reader_refuses_a_shard_that_does_not_match_its_index(damaged):
    with pytest.raises(
        ShardError,
        match=rf"{damaged}/train-000000.tar is [\d,]+ bytes; its index says [\d,]+: "
        r"the shard does not match its index .*\(2 such shards\)",
    ):
        make_loader(damaged, train=True, batch_size=B)


# --- batches the caller keeps ------------------------------------------------------------------
HELD = [
    pytest.param(dict(num_workers=0), id="w0-defaults"),
    pytest.param(dict(num_workers=2), id="w2-defaults"),
    pytest.param(dict(num_workers=0, shuffle_buffer=0), id="w0-sb0"),
    pytest.param(dict(num_workers=2, shuffle_buffer=0, prefetch_factor=1), id="w2-sb0"),
    pytest.param(dict(num_workers=2, persistent_workers=True), id="w2-persistent"),
    pytest.param(dict(num_workers=2, device_augment=True), id="w2-device-augment"),
    pytest.param(dict(num_workers=0, train=False, split="train"), id="eval-w0"),
    pytest.param(dict(num_workers=2, train=False, split="train", prefetch_factor=1), id="eval-w2"),
    pytest.param(dict(num_workers=2, train=False, split="train"), id="eval-w2-prefetch2"),
    pytest.param(dict(num_workers=1, train=False, split="train", prefetch_factor=3), id="eval-w1-prefetch3"),
    pytest.param(dict(num_workers=3, device_augment=True, prefetch_factor=1), id="w3-device-augment-threads"),
]


@pytest.mark.parametrize("opts", HELD)
def test_batches_kept_by_the_caller_never_change(folder, stored, opts):
    """Whole batches, views of them and numpy arrays of them, kept over two epochs, stay as yielded."""
    opts = {"train": True, "batch_size": 16, "return_keys": True, **opts}
    loader = make_loader(folder, **opts)
    expect = expectation(folder, opts)
    split = opts.get("split") or ("train" if opts["train"] else "val")
    held = []  # (epoch, batch tuple, a view of the images, their numpy array, a digest per image at yield time)
    for _ in range(2):
        for batch in loader:
            images = batch[0]
            held.append((loader.epoch, batch, images[1:], images.numpy(), [digest(im) for im in images]))
    assert len(held) > 2 * (2 + 2 + 2)  # more batches than any worker's ring slots or the buffer pool
    assert sum(len(b[1]) for _, b, *_ in held) > 2 * 1000 + 2 * 16  # and the shuffle buffer was refilled
    for epoch, batch, view, arr, digests in held:
        images, keys = batch[0], batch[-1]
        assert [digest(im) for im in images] == digests
        assert [digest(im) for im in view] == digests[1:]
        assert [digest(torch.from_numpy(a)) for a in arr] == digests
        for im, k in zip(images, keys):
            src = stored[split][k]
            expect.check(im.numpy(), expect.image(src, k, epoch), k, epoch, src.pixels.shape[0])


# --- several ranks under gloo ------------------------------------------------------------------
def _rank_main(rank: int, world: int, init: str, runs: list[tuple[str, dict]], out: str) -> None:
    import multiprocessing

    import torch.distributed as dist

    multiprocessing.set_start_method("fork", force=True)  # as in a process torchrun starts (mp.spawn set spawn)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        result = []
        for j, (folder, opts) in enumerate(runs):
            ld = make_loader(folder, train=True, batch_size=B, **opts)
            epochs = run_epochs(ld, opts, [None, None])
            for n, (_, ep) in enumerate(epochs):  # the images beside the JSON, in yield order
                np.save(Path(out, f"rank{rank}-{j}-{n}.npy"), np.stack([im for _, _, im, _ in ep.samples]))
            result.append(
                {
                    "len": len(ld),
                    "epochs": [
                        [e, [[[k, lab, None if p is None else p.tolist()] for k, lab, _, p in b] for b in ep.batches]]
                        for e, ep in epochs
                    ],
                }
            )
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


RANK_RUNS: list[dict] = [
    dict(),
    dict(num_workers=1, return_keys=True),
    dict(num_workers=0, device_augment=True, return_keys=True),
    dict(num_workers=0, resampled=True, epoch_batches=3, return_keys=True),
    dict(num_workers=2, class_weights="balanced", return_keys=True),
    dict(subset=0.5, return_keys=True),
    dict(reader="stream"),
    dict(num_workers=2, shuffle_buffer=3, return_keys=True, reader="stream"),
    dict(num_workers=0, resampled=True, epoch_batches=3, return_keys=True, reader="stream"),
]


def _spawn_ranks(world: int, runs: list[tuple[Path, dict]], tmp: Path) -> list[list[dict]]:
    """Each rank's result per (folder, options) run: len() and its epochs, each epoch's images read back
    from its .npy. The ranks are started once and make every run in turn."""
    import torch.multiprocessing as tmp_mp

    runs_ = [(str(f), opts) for f, opts in runs]
    tmp_mp.spawn(_rank_main, args=(world, f"file://{tmp}/init", runs_, str(tmp)), nprocs=world, join=True)
    results = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]
    for r, per_run in enumerate(results):
        for j, res in enumerate(per_run):
            res["images"] = [np.load(tmp / f"rank{r}-{j}-{n}.npy") for n in range(len(res["epochs"]))]
    return results


def _epochs_of(rank_result: dict) -> list[tuple[int, Epoch]]:
    out = []
    for (e, batches), images in zip(rank_result["epochs"], rank_result["images"]):
        it = iter(images)
        out.append(
            (
                e,
                Epoch(
                    [
                        [(k, lab, next(it), None if p is None else np.array(p, np.float32)) for k, lab, p in b]
                        for b in batches
                    ]
                ),
            )
        )
    return out


# three ranks (a split that does not divide evenly) on the defaults and one run per reader and way of drawing;
# two ranks on every run (each run costs its ranks' processes and workers: the suite's longest test otherwise)
RANK_RUNS_OF = {2: RANK_RUNS, 3: [RANK_RUNS[i] for i in (0, 3, 6, 7)]}
# two ranks over the cut shards (damaged), each reader with and without workers
TOP_UP_RUNS = [
    dict(num_workers=w, on_error="skip", return_keys=True, reader=r) for w in (0, 2) for r in ("stream", "auto")
]
# two ranks over the flipped samples (flipped), the index reader checking every sample
SKIP_RUNS = [
    dict(num_workers=w, on_error="skip", check_samples=True, return_keys=True, drop_last=False) for w in (0, 2)
]
# every two-rank run of the three tests below, made by one spawn of two ranks: (which folder, options)
TWO_RANK_RUNS = (
    [("folder", o) for o in RANK_RUNS] + [("damaged", o) for o in TOP_UP_RUNS] + [("flipped", o) for o in SKIP_RUNS]
)


def _runs_of(results: list[list[dict]], which: str) -> list[list[dict]]:
    """Each rank's results of the TWO_RANK_RUNS over ``which`` folder, in their order."""
    picked = [j for j, (name, _) in enumerate(TWO_RANK_RUNS) if name == which]
    return [[per_run[j] for j in picked] for per_run in results]


def _folders_digest(folders: dict[str, Path]) -> str:
    """Every file of the folders (index.json but the path of the manifest it was converted from)."""
    import hashlib

    h = hashlib.sha256()
    for name, folder in sorted(folders.items()):
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                if p.name == "index.json":  # the only byte another worker's conversion writes otherwise
                    index = json.loads(data)
                    index["build"].pop("source_path")
                    data = json.dumps(index, sort_keys=True).encode()
                h.update(f"{name}/{p.relative_to(folder)}".encode() + data)
    return h.hexdigest()


@pytest.fixture(scope="module")
def two_ranks(folder, damaged, flipped, tmp_path_factory) -> list[list[dict]]:
    """Each of 2 ranks' result per TWO_RANK_RUNS run, from one spawn of the 2 ranks per test run.

    Its tests land on both pytest-xdist workers (LONG_FIRST), and each spawned rank costs 2.5 s of CPU before
    it reads a sample: made once (conftest.once_per_run), with the digest of the folders it read, which must
    be this worker's ``folder``, ``damaged`` and ``flipped`` byte for byte."""
    folders = {"folder": folder, "damaged": damaged, "flipped": flipped[0]}

    def make(tmp: Path) -> dict:
        runs = [(folders[name], opts) for name, opts in TWO_RANK_RUNS]
        return {"folders": _folders_digest(folders), "results": _spawn_ranks(2, runs, tmp)}

    made = once_per_run(tmp_path_factory, "test_loader_oracle-two-ranks", make)
    assert made["folders"] == _folders_digest(folders), "the ranks read other folders than this worker's"
    return made["results"]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_against_the_reference(folder, stored, tmp_path, world, request):
    runs = RANK_RUNS_OF[world]
    if world == 2:
        results = _runs_of(request.getfixturevalue("two_ranks"), "folder")
    else:
        results = _spawn_ranks(world, [(folder, opts) for opts in runs], tmp_path)
    for j, opts in enumerate(runs):
        expect = expectation(folder, opts)
        per_epoch: dict[int, list[list[str]]] = {}
        for r in range(world):
            res = results[r][j]
            for epoch, ep in _epochs_of(res):
                draws = bool(opts.get("resampled") or opts.get("class_weights"))
                keys = check_epoch(ep, stored["train"], expect, epoch, batch_size=B, resampled=draws)
                assert len(ep.batches) == res["len"], "every rank yields the batches len() promises"
                assert all(len(b) == B for b in ep.batches), "ranks yield full batches only"
                per_epoch.setdefault(epoch, []).append(keys)
        assert len(per_epoch) == 2
        for _epoch, ranks in per_epoch.items():
            assert len({len(k) for k in ranks}) == 1, f"{opts}: ranks differ in samples per epoch"
            if not (opts.get("resampled") or opts.get("class_weights")):
                flat = [k for ks in ranks for k in ks]
                assert len(flat) == len(set(flat)), f"{opts}: ranks share samples"


def test_ranks_top_up_skipped_damage_without_repeats(damaged, stored, two_ranks):
    """Two ranks, a damaged shard skipped: every rank still yields len() batches, no key twice in a rank."""
    results = _runs_of(two_ranks, "damaged")
    readable = read_stored(sorted(damaged.glob("train-*.tar")))
    for j in range(len(TOP_UP_RUNS)):
        lens = set()
        for r in range(2):
            for epoch, ep in _epochs_of(results[r][j]):
                keys = check_epoch(ep, stored["train"], expectation(damaged, {}), epoch, batch_size=B)
                assert set(keys) <= set(readable)
                assert len(ep.batches) == results[r][j]["len"]
                lens.add(len(ep.batches))
        assert len(lens) == 1


def test_ranks_skip_damaged_samples_without_repeats(flipped, stored, two_ranks):
    """Two ranks, the index reader, flipped samples skipped: every rank yields len() batches (a
    damaged sample's batch is one shorter), and no sample appears twice, on one rank or across
    ranks: the rule that keeps batch counts equal repeats nothing."""
    bad, hurt = flipped
    results = _runs_of(two_ranks, "flipped")
    for j in range(len(SKIP_RUNS)):
        per_epoch: dict[int, list[str]] = {}
        for r in range(2):
            for epoch, ep in _epochs_of(results[r][j]):
                keys = check_epoch(ep, stored["train"], expectation(bad, {}), epoch, batch_size=B)
                assert len(ep.batches) == results[r][j]["len"]
                per_epoch.setdefault(epoch, []).extend(keys)
        for _epoch, keys in per_epoch.items():
            assert len(keys) == len(set(keys)) and not set(keys) & hurt
            assert len(keys) >= len(stored["train"]) - len(hurt) - 1  # all but the damaged (and the odd one out)


def test_top_up_reads_spare_shards_only_after_damage(folder, damaged, stored, monkeypatch, caplog):
    """Rank 0 of 2 (from RANK/WORLD_SIZE): the damaged shard's loss is topped up from a spare shard."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # streaming, shard 0 is rank 0's
    opts = dict(num_workers=0, on_error="skip", return_keys=True, shuffle_shards=False, reader="stream")
    loader = make_loader(damaged, train=True, batch_size=B, **opts)
    with caplog.at_level("WARNING", logger="training_adapter"):
        ep = run_epochs(loader, opts, [None])[0][1]
    assert "topping up" in caplog.text and "skipping the rest of a shard" in caplog.text
    keys = check_epoch(ep, stored["train"], expectation(damaged, {}), 0, batch_size=B)
    assert len(ep.batches) == len(loader)
    spare_keys = read_stored([damaged / "train-000001.tar"])  # rank 1's first shard
    assert set(keys) & set(spare_keys)
    caplog.clear()
    with caplog.at_level("WARNING", logger="training_adapter"):  # undamaged shards: no spare is read
        run_epochs(make_loader(folder, train=True, batch_size=B, **opts), opts, [None])
    assert "topping up" not in caplog.text


def test_config_train_loader_against_the_reference(folder, stored, tmp_path):
    from training_adapter import load_config

    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"dataset:\n  train_urls: {folder}\n  batch_size: {B}\n")
    loader = load_config(cfg).dataset.train_loader(return_keys=True)
    ep = run_epochs(loader, dict(return_keys=True), [None])[0][1]
    keys = check_epoch(ep, stored["train"], expectation(folder, {}), 0, batch_size=B)
    assert len(keys) == len(loader) * B


def test_oracle_sees_a_swapped_image(folder, stored):
    """The reference catches the bug it exists for: one image swapped with another sample's."""
    loader = make_loader(folder, train=True, batch_size=B, num_workers=0, return_keys=True)
    ep = Epoch([record(b, keys=True, params=False) for b in loader])
    (k0, l0, d0, p0), (k1, l1, d1, p1) = ep.batches[0][:2]
    ep.batches[0][0], ep.batches[0][1] = (k0, l0, d1, p0), (k1, l1, d0, p1)
    with pytest.raises(AssertionError, match="not its own stored pixels"):
        check_epoch(ep, stored["train"], expectation(folder, {}), 0, batch_size=B)


def test_oracle_sees_its_own_pixels_with_another_epochs_transform(folder: Path, stored: dict) -> None:
    """The tolerance is tight enough to tell a sample's own pixels augmented with other parameters
    (another epoch's crop, flips and jitter) from its expected image, keys given or not."""
    from augref import augment_reference

    expect = expectation(folder, {})
    for keys in (True, False):
        loader = make_loader(folder, train=True, batch_size=B, num_workers=0, return_keys=keys)
        loader.set_epoch(0)
        ep = Epoch([record(b, keys=keys, params=False) for b in loader])
        check_epoch(ep, stored["train"], expect, 0, batch_size=B)  # as yielded: passes
        k, lab, _, p = ep.batches[0][0]
        k = k or check_epoch(Epoch([ep.batches[0][:1]]), stored["train"], expect, 0, batch_size=B)[0]
        src = stored["train"][k].pixels
        other = augment_reference(src, expect.params(k, 1, S), out=S).round().transpose(2, 0, 1).astype(np.uint8)
        ep.batches[0][0] = (ep.batches[0][0][0], lab, other, p)
        with pytest.raises(AssertionError, match="not its own stored pixels"):
            check_epoch(ep, stored["train"], expect, 0, batch_size=B)
