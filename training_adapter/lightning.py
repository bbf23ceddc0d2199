"""Lightning: ``make_loader``'s loaders as a PyTorch Lightning ``LightningDataModule`` (``ShardDataModule``).

Each of its ``*_dataloader()`` is a ``TrainerLoader``: a ``ShardLoader`` as Lightning's loops take it (ranks
checked against the trainer's, set to its epoch, resumed from its checkpoints, ``limit_train_batches`` as
``epoch_batches``); why each is so: docs/guide/lightning.md. Lightning is an optional extra (``lightning``):
this module imports it, ``import training_adapter`` does not.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from wds_tools.cpus import usable_cpus
from wds_tools.errors import ExtraNotInstalledError, OptionError, install_hint

try:
    import pytorch_lightning as pl
except ImportError as e:  # pragma: no cover - the message is tested with the import blocked
    raise ExtraNotInstalledError(
        f"training_adapter.lightning needs PyTorch Lightning ({e.name} is missing): {install_hint('lightning')}"
    ) from None

from .config import TrainerConfig, load_config
from .loader import ShardLoader, default_workers, make_loader
from .shardlist import ShardList, resolve_urls, worker_info

__all__ = ["ShardDataModule", "TrainerLoader", "EVAL_DROPPED"]

log = logging.getLogger("training_adapter")

EVAL_DROPPED = (
    "augment",
    "device_augment",
    "resampled",
    "class_weights",
    "epoch_batches",
    "drop_last",
    "transform",
    "batch_transform",
)
"""Training options the validation, test and predict loaders do not take from the data module's options
(evaluation reads every sample of its split once, as stored); ``eval_options`` sets theirs."""

Urls = str | os.PathLike | Sequence[str | os.PathLike]


class TrainerLoader:
    """A ``ShardLoader`` as Lightning's loops take it: iterable, sized, stateful, set to the trainer's epoch.

    ``loader`` is the ``ShardLoader`` (its ``classes``, ``mean``, ``std``, ``num_samples``, ``device``).
    Iterating sets the loader to the epoch Lightning is in (when a trainer is attached) at the first
    batch, not before: Lightning makes an iterator it never reads to check a loader is iterable.
    ``len`` is the batches of this rank's epoch before the trainer's ``limit_train_batches`` (``length``),
    to which Lightning applies that limit itself, as the loader's ``epoch_batches`` does.
    """

    def __init__(self, loader: ShardLoader, module: ShardDataModule, length: int | None = None) -> None:
        self.loader = loader
        self._module = module
        self._length = length

    def __iter__(self) -> Iterator[Any]:
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        epoch = self._module.trainer_epoch()
        if epoch is not None:
            self.loader.set_epoch(epoch)
        yield from self.loader

    def __len__(self) -> int:
        return len(self.loader) if self._length is None else self._length

    def state_dict(self) -> dict[str, Any]:
        """The loader's ``state_dict``: where it is in its epoch (Lightning saves it in each checkpoint)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The loader's ``load_state_dict``: its next pass is the rest of the saved epoch."""
        try:
            self.loader.load_state_dict(state)
        except OptionError as e:
            if "epoch_batches" not in str(e):
                raise
            raise OptionError(
                f"{e} (ShardDataModule sets epoch_batches from the trainer's limit_train_batches: resume with the "
                f"limit_train_batches of the interrupted run)"
            ) from None
        world, saved = worker_info().world, int(state["world"])
        if saved != world and (state.get("end") is not None or state.get("batches")):  # mid-epoch, other ranks
            log.warning(
                "resuming on %d ranks a checkpoint taken mid-epoch on %s: the loader yields the rest of epoch %s, each "
                "remaining sample once, but Lightning counts the epoch in the batches of the run that saved it: %s",
                world,
                saved,
                state.get("epoch"),
                "on fewer ranks it ends the epoch when the loader runs out and skips that epoch's end-of-epoch "
                "validation"
                if world < saved
                else "on more ranks it ends the epoch at its own count, before the loader's last batches are read",
            )


class ShardDataModule(pl.LightningDataModule):
    """``make_loader``'s loaders for Lightning's ``Trainer`` (see the module docstring and docs/guide/lightning.md).

    Args:
        urls: A shards folder or its index.json (the splits below are read from it), a pattern or a
            list of them (the training shards; then ``val_urls`` etc. name the others).
        batch_size: Samples per batch (``make_loader``'s); from the config when it sets one.
        val_urls: The validation shards; None: the ``val_split`` of ``urls``.
        test_urls: The test shards; None: the ``test_split`` of ``urls``.
        predict_urls: The shards to predict on; None: the ``predict_split`` of ``urls``.
        config: A trainer config (a path, or ``load_config``'s result) whose ``dataset:`` block gives
            ``train_urls``, ``val_urls``, ``augment`` and loader options; the arguments here override it.
        val_split: The split of ``urls`` the validation loader reads.
        test_split: The split of ``urls`` the test loader reads.
        predict_split: The split of ``urls`` the predict loader reads.
        val_batch_size: The evaluation loaders' batch size; None: ``batch_size``.
        device: ``"auto"``: batches on the trainer's root device, normalised there ahead of the step
            (``make_loader(device=...)``); a device name: that device; None: uint8 batches on the CPU,
            which Lightning moves.
        eval_options: ``make_loader`` options for the validation, test and predict loaders, over those
            of ``options`` they keep (all but ``EVAL_DROPPED``).
        **options: ``make_loader``'s other options (``num_workers``, ``seed``, ``augment``,
            ``return_keys``, ...), for the training loader and, all but ``EVAL_DROPPED``, the others.

    Raises:
        OptionError: No URLs, no batch size, an unknown option, or (when a loader is made) ranks that
            are not the trainer's.
    """

    def __init__(
        self,
        urls: Urls | None = None,
        *,
        batch_size: int | None = None,
        val_urls: Urls | None = None,
        test_urls: Urls | None = None,
        predict_urls: Urls | None = None,
        config: str | os.PathLike | TrainerConfig | None = None,
        val_split: str = "val",
        test_split: str = "test",
        predict_split: str = "test",
        val_batch_size: int | None = None,
        device: str | Any | None = None,
        eval_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        base: dict[str, Any] = {}
        if config is not None:
            ds = (config if isinstance(config, TrainerConfig) else load_config(Path(config))).dataset
            urls = ds.train_urls if urls is None else urls
            val_urls = ds.val_urls if val_urls is None else val_urls
            base = {**ds.loader, "augment": ds.augment}
        options = {**base, **options}
        if batch_size is None:
            batch_size = options.pop("batch_size", None)
        options.pop("batch_size", None)
        if urls is None:
            raise OptionError("ShardDataModule: no shards; pass urls (a shards folder, its index.json or patterns)")
        if batch_size is None:
            raise OptionError("ShardDataModule: no batch_size; pass batch_size= (or set it in the config)")
        for name in ("train", "split"):
            if name in options:
                raise OptionError(
                    f"ShardDataModule: {name}= is the data module's to set per loader (val_split=, test_split=, "
                    f"predict_split= name the evaluation splits)"
                )
        self.urls, self.batch_size = urls, batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.split_urls = {"val": val_urls, "test": test_urls, "predict": predict_urls}
        self.splits = {"val": val_split, "test": test_split, "predict": predict_split}
        self.device = device
        self.options = options
        self.eval_options = dict(eval_options or {})

    # --- what the model needs before training ------------------------------------------------------
    @cached_property
    def _train_shards(self) -> ShardList:
        return resolve_urls(self.urls, split="train")

    @property
    def classes(self) -> list[str] | None:
        """The class names of the training shards (label i names ``classes[i]``), from their index."""
        return self._train_shards.classes

    @property
    def mean(self) -> list[float] | None:
        """The training shards' pixel mean per channel (0-1 units; ``to_device``'s ``mean``), from their index."""
        return self.options.get("mean") or self._train_shards.mean

    @property
    def std(self) -> list[float] | None:
        """The training shards' pixel standard deviation per channel (0-1 units), from their index."""
        return self.options.get("std") or self._train_shards.std

    # --- Lightning's hooks --------------------------------------------------------------------------
    def train_dataloader(self) -> TrainerLoader:
        """The training loader (``make_loader(urls, train=True, ...)``), its epoch cut to the trainer's
        ``limit_train_batches``."""
        made = self._loader(self.urls, train=True, split="train", batch_size=self.batch_size, **self.options)
        length, limit = self._train_limit(made)
        if limit is None:
            return TrainerLoader(made, self)
        opts = {**self.options, "epoch_batches": limit}
        cut = self._loader(self.urls, train=True, split="train", batch_size=self.batch_size, **opts)
        return TrainerLoader(cut, self, length)  # Lightning's limit on this length gives the cut's

    def val_dataloader(self) -> TrainerLoader:
        """The validation loader: every sample of the validation split once across the ranks."""
        return self._eval("val")

    def test_dataloader(self) -> TrainerLoader:
        """The test loader: every sample of the test split once across the ranks."""
        return self._eval("test")

    def predict_dataloader(self) -> TrainerLoader:
        """The predict loader: every sample of ``predict_split`` (or ``predict_urls``) once across the ranks."""
        return self._eval("predict")

    # --- how -----------------------------------------------------------------------------------------
    def trainer_epoch(self) -> int | None:
        """The epoch of the attached trainer's fit loop (what Lightning gives its samplers' ``set_epoch``)."""
        trainer = self.trainer
        # current is a _ProcessedTracker (it has processed), typed as its base
        return None if trainer is None else int(trainer.fit_loop.epoch_progress.current.processed)  # type: ignore[attr-defined]

    def _train_limit(self, made: ShardLoader) -> tuple[int, int | None]:
        """``made``'s batches per epoch, and the batches the trainer's ``limit_train_batches`` leaves of them
        where fewer (Lightning's rule: an int is batches, a float a fraction of the length, rounded down)."""
        trainer = self.trainer
        limit = None if trainer is None else trainer.limit_train_batches
        try:
            length = len(made)
        except TypeError:  # shards without sample counts: no length to cut
            return 0, None
        if limit is None or isinstance(limit, bool):
            return length, None
        n = limit if isinstance(limit, int) else int(length * limit)
        return length, n if 0 < n < length else None

    def _eval(self, stage: str) -> TrainerLoader:
        urls = self.split_urls[stage]
        opts = {k: v for k, v in self.options.items() if k not in EVAL_DROPPED}
        opts.update(self.eval_options)
        split = self.splits[stage] if urls is None else None
        batch_size = opts.pop("batch_size", self.val_batch_size)
        loader = self._loader(
            self.urls if urls is None else urls, train=False, split=split, batch_size=batch_size, **opts
        )
        return TrainerLoader(loader, self)

    def _loader(self, urls: Urls, *, train: bool, split: str | None, batch_size: int, **opts: Any) -> ShardLoader:
        device = self._device()
        loader = make_loader(urls, train=train, split=split, batch_size=batch_size, device=device, **opts)
        trainer = self.trainer
        if trainer is not None:
            where = worker_info()
            if (where.rank, where.world) != (trainer.global_rank, trainer.world_size):
                raise OptionError(
                    f"ShardDataModule: the loader finds itself rank {where.rank} of {where.world} (RANK/WORLD_SIZE "
                    f"or torch.distributed), the trainer says rank {trainer.global_rank} of {trainer.world_size}: "
                    f"use a strategy that sets up torch.distributed (ddp, ddp_spawn, deepspeed, fsdp), or torchrun"
                )
            # the default num_workers shares the cores among LOCAL_WORLD_SIZE ranks, which torchrun sets and
            # Lightning's own launcher does not: share them among the trainer's devices on this machine instead
            fair = default_workers(usable_cpus(), trainer.num_devices)
            if "num_workers" not in opts and "LOCAL_WORLD_SIZE" not in os.environ and loader.num_workers > fair:
                loader = make_loader(
                    urls, train=train, split=split, batch_size=batch_size, device=device, num_workers=fair, **opts
                )
        return loader

    def _device(self) -> Any:
        if self.device != "auto":
            return self.device
        trainer = self.trainer
        return None if trainer is None else trainer.strategy.root_device
