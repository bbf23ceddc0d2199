"""transform: make_loader(transform=...) against the same function applied by hand to the stored pixels
(read with tarfile) under the documented per-sample seed; batch_transform; the recipes of docs/guide/training.md, run."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import convert_images
from oracle import read_stored

from training_adapter import make_loader
from wds_tools.errors import OptionError

S = 16
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "training.md"  # the recipes, moved from the README


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """60 samples in 3 classes, train shards of 10 (50 train samples), every 6th row in val."""
    return convert_images(tmp_path_factory.mktemp("transform"), 60, size=S, shard_size=10, val_every=6)


@pytest.fixture(scope="module")
def stored(folder) -> dict:
    return {split: read_stored(sorted(folder.glob(f"{split}-*.tar"))) for split in ("train", "val")}


def documented_seed(seed: int, epoch: int, key: str) -> int:
    """The rule of docs/guide/training.md: BLAKE2b with an 8-byte digest of "seed NUL epoch NUL key NUL transform", little-endian."""
    digest = hashlib.blake2b(f"{seed}\x00{epoch}\x00{key}\x00transform".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def by_hand(fn, x: torch.Tensor, seed: int, epoch: int, key: str) -> torch.Tensor:
    """fn(x) with the three global generators seeded as docs/guide/training.md says."""
    s = documented_seed(seed, epoch, key)
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2**32)
    return fn(x)


def three_generators(x: torch.Tensor) -> torch.Tensor:
    """A user transform drawing from torch, Python's random and numpy: a random 12 px crop, a flip, a shift."""
    top, left = (int(v) for v in torch.randint(0, x.shape[1] - 11, (2,)))
    y = x[:, top : top + 12, left : left + 12]
    if random.random() < 0.5:
        y = y.flip(-1)
    return (y.int() + int(np.random.randint(-20, 21))).clamp(0, 255).to(torch.uint8)


def epoch_by_key(loader) -> dict[str, tuple[np.ndarray, int]]:
    out = {}
    for images, labels, keys in loader:
        for i, k in enumerate(keys):
            assert k not in out
            out[k] = (images[i].numpy().copy(), int(labels[i]))
    return out


@pytest.mark.parametrize("reader, workers", [("index", 0), ("index", 2), ("stream", 0), ("stream", 2)])
def test_transform_is_the_function_under_the_documented_seed(folder, stored, reader, workers):
    """augment=False: each yielded image is the user's function of the stored pixels under the sample's seed,
    whatever the reader and workers; the next epoch draws again."""
    loader = make_loader(
        folder,
        batch_size=8,
        train=True,
        augment=False,
        transform=three_generators,
        return_keys=True,
        reader=reader,
        num_workers=workers,
        seed=4,
        drop_last=False,
    )
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        got = epoch_by_key(loader)
        assert set(got) == set(stored["train"])
        for key, (image, label) in got.items():
            src = torch.from_numpy(stored["train"][key].pixels).permute(2, 0, 1)
            assert np.array_equal(image, by_hand(three_generators, src, 4, epoch, key).numpy()), key
            assert label == stored["train"][key].label
    first = make_loader(
        folder,
        batch_size=8,
        train=True,
        augment=False,
        transform=three_generators,
        return_keys=True,
        reader=reader,
        num_workers=workers,
        seed=4,
        drop_last=False,
    )
    assert any(not np.array_equal(got[k][0], v[0]) for k, v in epoch_by_key(first).items())  # epoch 0 != epoch 1


def test_transform_runs_after_the_built_in_augmentation(folder):
    """With the default augmentation on, the transform takes the augmented sample: the loader without the
    transform, then the transform by hand, gives the same pixels (workers 0 and 2)."""
    plain = epoch_by_key(make_loader(folder, batch_size=8, train=True, return_keys=True, num_workers=0))
    for workers in (0, 2):
        got = epoch_by_key(
            make_loader(
                folder, batch_size=8, train=True, transform=three_generators, return_keys=True, num_workers=workers
            )
        )
        assert set(got) == set(plain)
        for key, (image, _) in got.items():
            assert np.array_equal(image, by_hand(three_generators, torch.from_numpy(plain[key][0]), 0, 0, key).numpy())


def test_transform_in_evaluation_and_float_outputs(folder, stored):
    """Evaluation applies the transform too (to the stored pixels); a float result is batched as it comes."""
    loader = make_loader(
        folder, batch_size=7, train=False, return_keys=True, num_workers=2, transform=lambda x: x.float() / 255
    )
    got = epoch_by_key(loader)
    assert set(got) == set(stored["val"])
    for key, (image, _) in got.items():
        assert image.dtype == np.float32
        assert np.allclose(image * 255, stored["val"][key].pixels.transpose(2, 0, 1), atol=1e-4)


def test_the_callers_random_streams_are_left_alone(folder):
    torch.manual_seed(123)
    random.seed(123)
    want = torch.rand(3), random.random()
    torch.manual_seed(123)
    random.seed(123)
    for _ in make_loader(folder, batch_size=8, train=True, transform=three_generators, num_workers=0):
        pass
    assert torch.equal(torch.rand(3), want[0]) and random.random() == want[1]


def test_non_config_augment_is_refused_pointing_to_transform(folder):
    with pytest.raises(OptionError, match=r"augment=.* is a function.*transform="):
        make_loader(folder, batch_size=8, train=True, augment=lambda x: x)
    with pytest.raises(OptionError, match=r"augment=.* is a str.*transform="):
        make_loader(folder, batch_size=8, train=True, augment="randaugment")
    with pytest.raises(OptionError, match="transform=.*expected a function"):
        make_loader(folder, batch_size=8, train=True, transform=3)
    with pytest.raises(OptionError, match="device_augment"):
        make_loader(folder, batch_size=8, train=True, transform=three_generators, device_augment=True)


@pytest.mark.parametrize("context", ["spawn", "forkserver", "context-object"])
@pytest.mark.parametrize("reader", ["index", "stream"])
def test_a_lambda_transform_under_spawn_is_refused_before_workers_start(folder, context, reader):
    """Issue 32, point 9: workers started by spawn or forkserver receive the transform pickled; a lambda
    gave a raw PicklingError from the DataLoader at the first batch. Now make_loader refuses it, naming transform."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn") if context == "context-object" else context
    method = "spawn" if context == "context-object" else context
    with pytest.raises(OptionError, match=rf"transform=<function .*<lambda>.* cannot be pickled.*{method!r}"):
        make_loader(
            folder,
            batch_size=8,
            train=True,
            transform=lambda x: x,
            num_workers=2,
            reader=reader,
            multiprocessing_context=ctx,
            resampled=reader == "stream",
        )


def test_a_lambda_transform_is_fine_without_worker_processes_or_under_fork(folder):
    for kw in (
        dict(num_workers=0, multiprocessing_context="spawn"),
        dict(num_workers=1, multiprocessing_context="fork"),
    ):
        batch = next(iter(make_loader(folder, batch_size=8, train=False, transform=lambda x: x.flip(-1), **kw)))
        assert batch[0].shape == (8, 3, S, S)


def test_transform_errors_name_the_sample(folder):
    def ragged(x: torch.Tensor) -> torch.Tensor:
        return x[:, : int(torch.randint(4, 12, ()))]

    with pytest.raises(OptionError, match=r"for sample 's\d+' but torch.uint8.*same shape"):
        next(iter(make_loader(folder, batch_size=8, train=True, transform=ragged, num_workers=0)))
    with pytest.raises(OptionError, match=r"returned ndarray for sample 's\d+'; expected a tensor"):
        next(iter(make_loader(folder, batch_size=8, train=True, transform=lambda x: x.numpy(), num_workers=0)))


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_transform_gets_and_returns_images_and_labels(folder, workers):
    """batch_transform runs on each whole batch in the main process (a lambda: it never travels to a worker)."""
    seen = []

    def cut(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(images.shape)
        return images[:, :, :4].float(), torch.nn.functional.one_hot(labels, 3)

    plain = list(make_loader(folder, batch_size=8, train=False, num_workers=workers, return_keys=True))
    got = list(
        make_loader(
            folder,
            batch_size=8,
            train=False,
            num_workers=workers,
            return_keys=True,
            batch_transform=cut,
            multiprocessing_context="spawn" if workers else None,
        )
    )
    assert len(seen) == len(got) == len(plain)
    for (x, y, k), (px, py, pk) in zip(got, plain):
        assert k == pk and torch.equal(x, px[:, :, :4].float()) and torch.equal(y.argmax(1), py)
    with pytest.raises(OptionError, match=r"batch_transform= returned Tensor; expected \(images, labels\)"):
        next(iter(make_loader(folder, batch_size=8, train=False, num_workers=0, batch_transform=lambda x, y: x)))


def recipe(name: str) -> str:
    """The python block of docs/guide/training.md whose first line is ``# recipe: <name>``."""
    blocks = re.findall(r"```python\n(# recipe: [^\n]+\n.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if b.startswith(f"# recipe: {name}\n")]
    assert len(found) == 1, f"docs/guide/training.md has no single recipe {name!r}"
    return found[0]


def run_recipe(name: str, folder: Path) -> torch.Tensor:
    """Run the recipe on the test shards (the guide's path and batch size replaced), return one batch's images."""
    code = recipe(name).replace('"shards/v1/224"', repr(str(folder))).replace("batch_size=256", "batch_size=8")
    ns: dict = {}
    exec(compile(code, f"docs/guide/training.md recipe {name}", "exec"), ns)
    images, labels = next(iter(ns["train"]))
    assert labels.shape == (8,)
    return images


def test_readme_recipe_hand_written_torch(folder):
    images = run_recipe("hand-written", folder)
    assert images.shape == (8, 3, 224, 224) and images.dtype == torch.uint8
    assert images.float().std() > 5  # photo-like pixels, not a constant


def test_readme_recipe_torchvision(folder):
    pytest.importorskip("torchvision", reason="torchvision is not installed here (pip install torchvision)")
    images = run_recipe("torchvision", folder)
    assert images.shape == (8, 3, 224, 224) and images.dtype == torch.uint8


def test_readme_recipe_albumentations(folder):
    pytest.importorskip("albumentations", reason="albumentations is not installed here (pip install albumentations)")
    images = run_recipe("albumentations", folder)
    assert images.shape == (8, 3, 224, 224) and images.dtype == torch.uint8
    assert torch.equal(run_recipe("albumentations", folder), images)  # reseeded per sample: the same again


@pytest.mark.parametrize("layout", ["chw", "hwc"])
@pytest.mark.parametrize("workers", [0, 2])
def test_uint8_results_keep_their_memory_layout_through_the_workers(folder, stored, layout, workers):
    """A transform returning contiguous [3, H, W] or channels-last memory: the batch holds its values either way
    (handed over through the shared-memory slots with workers), in that layout."""

    def tf(x: torch.Tensor) -> torch.Tensor:
        y = three_generators(x)
        return y.contiguous() if layout == "chw" else y.permute(1, 2, 0).contiguous().permute(2, 0, 1)

    loader = make_loader(
        folder, batch_size=8, train=True, augment=False, transform=tf, return_keys=True, num_workers=workers, seed=9
    )
    n = 0
    for images, _, keys in loader:
        assert images.is_contiguous() == (layout == "chw")
        assert images.is_contiguous(memory_format=torch.channels_last) == (layout == "hwc")
        for i, key in enumerate(keys):
            src = torch.from_numpy(stored["train"][key].pixels).permute(2, 0, 1)
            assert torch.equal(images[i], by_hand(tf, src, 9, 0, key))
            n += 1
    assert n == 48  # 50 samples, batches of 8, the short last one dropped in training
