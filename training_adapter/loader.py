"""Loader: ``make_loader`` and its options, each declared once in ``LoaderOptions``.

``make_loader`` checks its keywords as a ``LoaderOptions``, resolves the shards, picks the reader
(by offset where an index lists the shards, else streaming the tars) and returns the
``shardloader.ShardLoader`` that runs its batches (docs/guide/loader-internals.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from wds_tools.cpus import usable_cpus
from wds_tools.errors import OptionError

from .augment import AugmentConfig
from .device import as_device, as_dtype, to_device
from .indexed import IndexedDataset
from .indexplan import ClassWeights, Subset, check_subset, check_weights, readable_by_offset
from .options import MAX_SEED, check_all, choice, context, flag, function, integer, names, option, rgb, text
from .shardlist import ShardList, rank_world, resolve_urls
from .shardloader import ShardLoader
from .streaming import StreamingDataset
from .tarread import DEFAULT_CHUNK
from .transform import check_picklable

__all__ = [
    "LoaderOptions",
    "ShardLoader",
    "make_loader",
    "open_loader",
    "open_dataset",
    "to_device",
    "default_workers",
]


def default_workers(cpus: int, local_ranks: int = 1) -> int:
    """``num_workers`` left to its default: half of this rank's cores (``cpus`` shared by
    ``local_ranks`` ranks on the machine), at least 1, leaving the rest to the training process.

    Chosen from the curve measured on one H200 with 16 cores (``docs/guide/figures.md``, GPU):
    ResNet-18 trained at 8,936 images/s with 15 workers (every core but one) and 10,181 with 8;
    the best counts were 6 to 8. To be measured again there (``scripts/bench_gpu.py``) now that the
    workers' batches are neither copied nor mapped in the training process."""
    return max(1, cpus // max(1, local_ranks) // 2)


def _local_ranks() -> int:
    """The ranks torchrun starts on this machine (``LOCAL_WORLD_SIZE``), 1 without it."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _augment(a: Any) -> AugmentConfig | bool | None:
    if isinstance(a, Mapping):
        return AugmentConfig.from_dict(a)
    if a is None or isinstance(a, (bool, AugmentConfig)):
        return a
    raise OptionError(
        f"augment={a!r} is {'a function' if callable(a) else 'a ' + type(a).__name__}; augment takes the built-in augmentation's "
        f"settings (an AugmentConfig or a mapping of them), None or True (the defaults) or False (none). To apply "
        f"your own function to each sample pass it as transform= (with augment=False to replace the built-in one, "
        f"e.g. transform=torchvision.transforms.v2.RandAugment()), or to whole batches as batch_transform="
    )


def _device(d: Any) -> torch.device | None:
    return None if d is None else as_device(d)  # before any work: one line where it is not there


@dataclass(frozen=True)
class LoaderOptions:
    """``make_loader``'s keywords (its docstring says what each does), each declared once: its type,
    default and check, whether it decides which sample comes when (``order``: a resume state records
    it) and whether a trainer config may set it (``config``); see ``options.option``. Checked on
    creation, by name. The properties say what applies: evaluation neither augments nor shuffles,
    and keeps a short last batch by default.
    """

    batch_size: int = option(check=integer(1, expected="a positive integer"), order=True)
    train: bool = option(check=flag(), order=True, config=False)
    num_workers: int | None = option(None, check=integer(0, expected="an integer >= 0, or None", none=True))
    seed: int = option(0, check=integer(0, MAX_SEED, expected="an integer from 0 to 2**63 - 1"), order=True)
    augment: AugmentConfig | bool | None = option(None, check=_augment, config=False)  # the config's own block
    device_augment: bool = option(False, check=flag())
    normalize: bool = option(False, check=flag())
    shuffle_buffer: int = option(
        1000, check=integer(0, expected="a number of samples >= 0"), order=True, none_default=True
    )
    shuffle_shards: bool = option(True, check=flag(), order=True)
    resampled: bool = option(False, check=flag(), order=True)
    epoch_batches: int | None = option(
        None, check=integer(1, expected="a number of batches >= 1, or None", none=True), order=True
    )
    drop_last: bool | None = option(
        None,
        check=flag(none=True, expected="True, False or None (the default: True in training, False in evaluation)"),
        order=True,
    )
    on_error: str = option("raise", check=choice("raise", "skip"))
    return_keys: bool = option(False, check=flag(), config=False)
    pin_memory: bool | None = option(None, check=flag(none=True, expected="True, False or None (the default)"))
    persistent_workers: bool = option(False, check=flag())
    prefetch_factor: int | None = option(None, check=integer(1, expected="an integer >= 1, or None", none=True))
    device: torch.device | None = option(None, check=_device)
    dtype: torch.dtype = option(torch.float32, check=as_dtype)
    mean: tuple[float, ...] | None = option(None, check=rgb)
    std: tuple[float, ...] | None = option(None, check=rgb)
    split: str | None = option(None, check=text, config=False)
    read_size: int = option(DEFAULT_CHUNK, check=integer(1, expected="a number of bytes >= 1"), config=False)
    reader: str = option("auto", check=choice("auto", "index", "stream"))
    subset: Subset = option(None, check=check_subset)
    class_weights: ClassWeights | None = option(None, check=check_weights)
    check_samples: bool | str = option(
        "labels",
        check=choice("labels", True, False, expected="'labels' (the default), True (labels and pixels) or False"),
    )
    allow_mixed: bool = option(False, check=flag())
    allow_partial: bool = option(False, check=flag())
    multiprocessing_context: Any = option(None, check=context, config=False)
    transform: Callable[[Any], Any] | None = option(None, check=function, config=False)
    batch_transform: Callable[[Any, Any], Any] | None = option(None, check=function, config=False)
    metadata: tuple[str, ...] = option((), check=names)

    def __post_init__(self) -> None:
        check_all(self)
        if self.transform is not None and self.device_augment:
            raise OptionError(
                "transform= runs in the workers after the built-in augmentation, which "
                "device_augment=True leaves to the accelerator; drop device_augment, or pass "
                "augment=False and apply your transform yourself after augment_batch"
            )
        if self.device is not None and self.normalize:
            raise OptionError(
                "normalize=True normalises in the workers (float32 batches, 4x the bytes); device= normalises "
                "on the device: drop normalize"
            )

    @cached_property  # once: the batch step asks for every batch
    def augmentation(self) -> AugmentConfig | None:
        """The built-in augmentation applied: ``augment`` (default settings when None or True) in
        training unless it is False, else none."""
        if not self.train or self.augment is False:
            return None
        return self.augment if isinstance(self.augment, AugmentConfig) else AugmentConfig()

    @property
    def on_device(self) -> bool:
        """Whether batches come with augmentation parameters for ``augment_batch`` on the accelerator."""
        return self.device_augment and self.train

    @property
    def buffer(self) -> int:
        """The streaming reader's shuffle buffer in samples (0 in evaluation)."""
        return self.shuffle_buffer if self.train else 0

    @property
    def shuffles_shards(self) -> bool:
        """Whether the shard order is shuffled (training only)."""
        return self.shuffle_shards and self.train

    @property
    def drops_last(self) -> bool:
        """Whether a short last batch is dropped (``drop_last``; by default in training only)."""
        return self.train if self.drop_last is None else self.drop_last

    @property
    def covers(self) -> bool:
        """Whether an epoch holds every sample once across the ranks (evaluation, without resampling):
        ranks then differ by at most one sample (index reader) or by their shards (streaming)."""
        return not self.train and not self.resampled

    @property
    def needs_index(self) -> list[str]:
        """The options set that only the index reader takes (for the message refusing them)."""
        needs = [
            name
            for name, v in (
                ("subset", self.subset),
                ("class_weights", self.class_weights),
                ("metadata", self.metadata or None),
            )
            if v is not None
        ]
        return needs + (["check_samples=True"] if self.check_samples is True else [])  # "labels": where there is one


def _reads_index(shards: ShardList, options: LoaderOptions) -> bool:
    """Whether the loader reads by offset from the index (``reader``: auto, index or stream)."""
    possible = shards.info is not None and all(readable_by_offset(u) for u in shards.urls)
    needs = options.needs_index
    if not possible and (options.reader == "index" or needs):
        why = (
            "these URLs are pipe: or http(s) (no ranged reads)"
            if shards.info is not None
            else "no index.json lists these shards"
        )
        raise OptionError(
            f"{', '.join(needs) or 'reader=index'} needs the index reader, but {why}; point urls at "
            f"the shards folder or its index.json (local or object storage)"
        )
    if options.reader == "stream" and needs:
        raise OptionError(f"{needs[0]} needs the index reader; drop reader='stream'")
    return possible and options.reader != "stream"


def open_dataset(shards: ShardList, options: LoaderOptions) -> StreamingDataset | IndexedDataset:
    """The batch dataset of ``shards``: the index reader where it can and may read them, else streaming."""
    if _reads_index(shards, options):
        return IndexedDataset(shards, options)
    return StreamingDataset(shards, options)


def make_loader(
    urls: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    batch_size: int,
    train: bool,
    num_workers: int | None = None,
    seed: int = 0,
    augment: AugmentConfig | Mapping[str, Any] | bool | None = None,
    device_augment: bool = False,
    normalize: bool = False,
    shuffle_buffer: int = 1000,
    shuffle_shards: bool = True,
    resampled: bool = False,
    epoch_batches: int | None = None,
    drop_last: bool | None = None,
    on_error: str = "raise",
    return_keys: bool = False,
    pin_memory: bool | None = None,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    device: torch.device | str | int | None = None,
    dtype: torch.dtype | str = torch.float32,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    split: str | None = None,
    read_size: int = DEFAULT_CHUNK,
    reader: str = "auto",
    subset: Subset = None,
    class_weights: ClassWeights | None = None,
    check_samples: bool | str = "labels",
    allow_mixed: bool = False,
    allow_partial: bool = False,
    multiprocessing_context: Any = None,
    transform: Callable[[Any], Any] | None = None,
    batch_transform: Callable[[Any, Any], Any] | None = None,
    metadata: Sequence[str] = (),
) -> ShardLoader:
    """A loader of ``(images, labels)`` batches from WebDataset shards (see the training guide).

    Each batch is ``(images, labels)``: uint8 ``[B, 3, S, S]`` (channels-last memory) and int64
    ``[B]``; with ``device_augment`` a third item, the float32 params for ``augment_batch``; with
    ``metadata`` the next, a dict of the named columns; with ``return_keys`` a last item, the sample
    keys. With ``device`` the images and labels are on that device, the images normalised (and
    augmented under ``device_augment``, which then adds no params) as ``dtype``, channels-last.
    Call ``set_epoch(epoch)`` before each epoch (without it the epoch advances by one per
    iteration); ``state_dict()``/``load_state_dict()`` resume mid-epoch.

    Args:
        urls: A shards folder or its index.json (then ``split`` picks the split), a brace pattern
            (``shards/v1/224/train-{000000..000041}.tar``), a list or ``::``-joined patterns;
            local, object storage (``s3://``), ``pipe:`` or ``http(s)://``.
        batch_size: Samples per batch.
        train: Training (shuffle, augment, drop a short last batch) or evaluation (every sample
            once across the ranks, pixels as stored).
        num_workers: DataLoader worker processes per rank (reader threads where they only copy and
            CUDA is absent); None: half of this rank's cores (``default_workers``), but no more than
            its shards (streaming) or batches; 0: read in this process.
        seed: Seeds the shard order, shuffles and augmentation, with the epoch: an integer from 0 to
            2**63 - 1 (a numpy integer or a 0-d integer tensor is taken as its value; a bool, float or
            string is refused).
        augment: The built-in augmentation's settings (an ``AugmentConfig`` or a mapping of its
            fields), None or True for the defaults, False for none; training only.
        device_augment: Leave the augmentation to ``augment_batch`` on the accelerator: batches
            carry un-augmented images and each sample's params.
        normalize: Return normalised float32 images (with the index's mean/std) instead of uint8,
            normalised in the workers (``device`` normalises on the device instead).
        shuffle_buffer: The streaming reader's sample shuffle buffer per worker (training only), in
            samples (150 KB each at 224 px); 0: none; None: the default.
        shuffle_shards: Shuffle the shard order (and, with the index reader, the samples) per epoch
            in training.
        resampled: Draw samples (index reader) or shards (streaming) with replacement.
        epoch_batches: Batches per rank per epoch: at most this many, or exactly this many with
            ``resampled``; None: the whole split.
        drop_last: Drop a short last batch; None: in training only.
        on_error: ``"raise"`` a ``ShardError`` on a damaged shard or sample, or ``"skip"`` it
            (logged; the epoch is shorter, ranks stay equal).
        return_keys: Add each batch's sample keys as its last item.
        pin_memory: Without ``device``: True puts batches in page-locked memory (where CUDA is
            available), so that a copy with ``non_blocking=True`` is asynchronous: worker processes'
            batches are their shared-memory slots, page-locked once (no copy), others are copied. A
            slot is written again once the work queued, when you let go of its batch, on the current
            stream of every device with a CUDA context has completed: copy a batch on the current
            stream (``to_device``), or make the current stream wait for the stream you copied on
            (``torch.cuda.current_stream().wait_stream(s)``) before asking for the next batch. None
            (the default) or False: pageable batches (copies from them are synchronous). With a CUDA
            ``device``: None or True page-locks the ring's slots once for the loader's own copies;
            False leaves them pageable (each batch is then copied into page-locked memory first).
        persistent_workers: Keep worker processes alive between epochs.
        prefetch_factor: Batches each worker (or reader thread) prepares ahead; None: 2.
        device: Yield batches on this device (``"cuda"``, ``"cuda:1"``, ``"cpu"``), ready to train on:
            copied (and prepared) there on a side stream two batches ahead of the training step;
            ``"cuda"`` is the current device when ``make_loader`` is called, or under torchrun
            (``LOCAL_RANK``, several devices visible) ``cuda:LOCAL_RANK`` where the current one is
            still cuda:0 (``loader.device`` names it; another current device is refused as ambiguous);
            a device this machine lacks (``"mps"``, ``"xpu"``) is refused before anything is read;
            None: uint8 batches on the CPU, for ``to_device``.
        dtype: With ``device``: the images' dtype, ``torch.float32``, ``torch.bfloat16`` or
            ``torch.float16`` (or their names), normalised in float32 first.
        mean: Per-channel means in 0-1 units, replacing the index's (``loader.mean``).
        std: Per-channel standard deviations in 0-1 units, replacing the index's.
        split: The split to read from a folder or index; None: ``train`` or ``val`` by ``train``.
        read_size: The streaming reader's read size in bytes.
        reader: ``"auto"`` reads by offset when an index lists the shards (local or object
            storage), else streams the tars; ``"index"`` or ``"stream"`` force one.
        subset: Index reader only: the samples to read, as a fraction, a collection of keys, a
            ``{column: values}`` mapping or a function of the samples.npz columns.
        class_weights: Index reader only: each class's share of every epoch, ``"balanced"`` (equal
            shares) or ``{class: weight}`` (classes by name or index; a class not named gets none).
        check_samples: Index reader: compare every sample read with the index: ``"labels"``, its
            ``.cls`` with the ``label`` column and the member name in the tar header in front of its
            ``.npy`` with ``<key>.npy`` (a shard of another conversion copied over this one); True,
            also its ``.npy`` bytes with ``npy_xxh3`` (costs a quarter to a third of the eval read
            rate); False, neither (the NPY header is always checked).
        allow_mixed: Read shards of different datasets as one set with the streaming reader (each
            label is its own ``.cls``; classes, mean/std and size are the first index's); refused by
            default, since a label then names different classes in different shards.
        allow_partial: Read a pattern that names only some shards of a split; refused by default,
            naming the missing shards.
        multiprocessing_context: The DataLoader's multiprocessing context (e.g. ``"spawn"``).
        transform: Your function of each sample (a uint8 ``[3, H, W]`` tensor in, a tensor out), run
            in the workers after the built-in augmentation (instead of it with ``augment=False``),
            in training and evaluation, seeded per sample from (seed, epoch, key).
        batch_transform: ``(images, labels) -> (images, labels)`` on each batch in the main process
            as the loader yields it (e.g. CutMix); not seeded by the loader.
        metadata: Index reader only: metadata column names whose values each batch carries as a
            dict (numbers float32 ``[B]``, NaN where missing; strings as lists, None where missing).

    Returns:
        A ``ShardLoader`` (a DataLoader with ``set_epoch``, ``len`` where the index gives counts,
        ``mean``/``std``, ``classes`` and ``state_dict``/``load_state_dict``).

    Raises:
        OptionError: An option is out of range or malformed, an index-reader option without an
            index, shards of different datasets or part of a split without ``allow_mixed`` or
            ``allow_partial``, an epoch that ``drop_last`` would leave empty, a ``device`` that is
            not there, or ``device`` with ``normalize=True`` or without mean/std; at the first
            iteration, worker processes' batch ring larger than the shared memory free (/dev/shm).
        IndexFormatError: An index cannot be read, or the folder is an unfinished conversion.
        ShardError: A shard's size differs from its index's (with ``on_error="raise"``).
    """
    options = LoaderOptions(**{k: v for k, v in locals().items() if k != "urls"})  # every keyword, checked by name
    split = options.split or ("train" if train else "val")
    return open_loader(resolve_urls(urls, split=split, allow_mixed=allow_mixed, allow_partial=allow_partial), options)


def open_loader(shards: ShardList, options: LoaderOptions) -> ShardLoader:
    """The ``ShardLoader`` of resolved ``shards`` read with ``options`` (``make_loader`` past its keywords)."""
    if options.mean is not None:
        shards.mean = list(options.mean)
    if options.std is not None:
        shards.std = list(options.std)
    rank, world = rank_world()
    ds = open_dataset(shards, options)
    num_workers = options.num_workers
    if num_workers is None:  # half the cores, but no more workers than this rank has shards (streaming) or batches
        cores = default_workers(usable_cpus(), _local_ranks())
        if isinstance(ds, IndexedDataset):
            num_workers = min(cores, max(1, ds.num_batches(rank=rank, world=world, num_workers=1) or 0))
        elif options.resampled:
            num_workers = cores
        else:
            num_workers = min(cores, max(1, len(shards) // world))
    if options.transform is not None and num_workers:  # a transform runs in worker processes, never threads
        check_picklable(options.transform, options.multiprocessing_context)
    ds.prepare(rank=rank, world=world, num_workers=max(1, num_workers))
    if options.device is not None and (ds.shards.mean is None or ds.shards.std is None):
        raise OptionError(
            "device= normalises the images there and needs mean and std: point urls at the shards "
            "folder or its index.json, or pass mean= and std="
        )
    return ShardLoader(ds, num_workers=num_workers)
