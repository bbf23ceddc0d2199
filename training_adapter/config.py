"""Trainer config: the ``dataset:`` block of a YAML or TOML trainer config, turned into loaders."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from wds_tools.errors import ExtraNotInstalledError, OptionError, install_hint

from .augment import AugmentConfig
from .loader import LoaderOptions, ShardLoader, make_loader
from .options import declared

__all__ = ["DatasetConfig", "TrainerConfig", "load_config", "LOADER_KEYS"]

LOADER_KEYS = frozenset(name for name, o in declared(LoaderOptions).items() if o.config)
"""``make_loader`` options a ``dataset`` block may set (``train_urls``, ``val_urls`` and ``augment`` apart)."""


@dataclass
class DatasetConfig:
    """The ``dataset:`` block: shard URLs, loader options and augmentation settings."""

    train_urls: str | list[str]
    val_urls: str | list[str] | None = None
    loader: dict = field(default_factory=dict)
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def train_loader(self, **overrides: Any) -> ShardLoader:
        """``make_loader(train_urls, train=True, ...)`` with this block's options."""
        return make_loader(self.train_urls, train=True, augment=self.augment, **{**self.loader, **overrides})

    def val_loader(self, **overrides: Any) -> ShardLoader:
        """``make_loader(val_urls, train=False, ...)`` with this block's options (no augmentation, and
        no resampling or class weights: validation sees each sample of its subset once)."""
        if self.val_urls is None:
            raise OptionError("dataset.val_urls is not set in the config")
        opts = {
            k: v
            for k, v in {**self.loader, **overrides}.items()
            if k not in ("device_augment", "resampled", "class_weights")
        }
        return make_loader(self.val_urls, train=False, **opts)


@dataclass
class TrainerConfig:
    """A whole trainer config: ``dataset`` parsed, everything else as read (``raw``)."""

    path: str
    dataset: DatasetConfig
    raw: dict


def _resolve(url: str, base: Path) -> str:
    """A relative local pattern/folder is taken relative to the config file; URLs pass through."""
    scheme = urlparse(url).scheme
    if len(scheme) > 1 or os.path.isabs(os.path.expanduser(url)):
        return os.path.expanduser(url)
    return str(base / url)


def _read(p: Path) -> dict:
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OptionError(f"config {p}: no such file") from None
    if p.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise OptionError(f"config {p}: not valid TOML: {e}") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ExtraNotInstalledError(
                f"reading a YAML config needs pyyaml: {install_hint('train', 'pyyaml')}"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise OptionError(f"config {p}: not valid YAML: {e}") from None
        return data if data is not None else {}
    raise OptionError(f"config {p}: unknown extension {p.suffix!r}; expected .yaml, .yml or .toml")


def load_config(path: str | os.PathLike) -> TrainerConfig:
    """Read a trainer config (.yaml/.yml/.toml) whose ``dataset`` block names the shards.

    The block holds ``train_urls`` (required), ``val_urls``, ``augment`` (``AugmentConfig`` fields)
    and any of ``make_loader``'s options in ``LOADER_KEYS``; relative local URLs are taken relative
    to the config file. Other top-level keys are kept, unread, in ``raw``.

    Args:
        path: The config file; ``.yaml``/``.yml`` needs PyYAML (the ``train`` extra).

    Returns:
        A ``TrainerConfig``; ``config.dataset.train_loader()`` and ``val_loader()`` make the loaders.

    Raises:
        OptionError: No such file, invalid YAML or TOML, no ``dataset`` block or ``train_urls``, or
            an unknown or malformed setting.
        ExtraNotInstalledError: A YAML config without PyYAML installed.
    """
    p = Path(path)
    data = _read(p)
    if not isinstance(data, dict):
        raise OptionError(f"config {p}: expected a mapping at the top level")
    block = data.get("dataset")
    if not isinstance(block, dict):
        raise OptionError(
            f"config {p}: no 'dataset' block; add one with train_urls (and val_urls), e.g. "
            f"train_urls: shards/v1/224/train-{{000000..000041}}.tar"
        )
    if "train_urls" not in block:
        raise OptionError(
            f"config {p}: dataset.train_urls is missing; a WebDataset pattern, a shards folder or its index.json"
        )
    unknown = sorted(set(block) - LOADER_KEYS - {"train_urls", "val_urls", "augment"})
    if unknown:
        raise OptionError(
            f"config {p}: unknown dataset setting {', '.join(map(repr, unknown))}; expected "
            f"train_urls, val_urls, augment or {', '.join(sorted(LOADER_KEYS))}"
        )
    base = p.resolve().parent

    def urls(v: object, name: str) -> str | list[str]:
        if isinstance(v, str):
            return _resolve(v, base)
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            return [_resolve(x, base) for x in v]
        raise OptionError(f"config {p}: dataset.{name}={v!r}: expected a URL pattern or a list of them")

    augment = block.get("augment") or {}
    if not isinstance(augment, dict):
        raise OptionError(f"config {p}: dataset.augment must be a mapping of settings")
    ds = DatasetConfig(
        train_urls=urls(block["train_urls"], "train_urls"),
        val_urls=urls(block["val_urls"], "val_urls") if block.get("val_urls") is not None else None,
        loader={k: v for k, v in block.items() if k in LOADER_KEYS},
        augment=AugmentConfig.from_dict(augment),
    )
    return TrainerConfig(str(p), ds, data)
