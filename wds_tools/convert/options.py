"""A conversion's options as one object: ``ConvertOptions``, validated once when it is made and
passed whole from ``convert`` through the pipeline."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..cpus import usable_cpus
from ..errors import OptionError
from .decode import RESIZE_MODES, DecodeSettings
from .manifest import Columns
from .plan import parse_shard_size
from .runner import EXECUTORS
from .summary import parse_max_errors

__all__ = ["ConvertOptions", "parse_sizes"]

_VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def parse_sizes(value: int | str | Sequence[int | str]) -> list[int]:
    """224, "224", "224,384" or [224, 384] -> the distinct sides in pixels, largest first."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    sides = []
    for item in items:
        try:
            side = int(str(item).strip()) if not isinstance(item, bool) else None
        except ValueError:
            side = None
        if side is None or not 8 <= side <= 8192:
            raise OptionError(f"--size {value!r}: expected integers between 8 and 8192 pixels, e.g. 224 or 224,384")
        sides.append(side)
    if not sides:
        raise OptionError(f"--size {value!r}: expected at least one size, e.g. 224")
    return sorted(set(sides), reverse=True)


@dataclass(frozen=True)
class ConvertOptions:
    """Every option of ``convert`` but the source, with its keyword names and defaults.

    Made once per conversion; ``__post_init__`` checks every value and fills the parsed forms
    (``sides``, ``max_errors_rule``, ``shard_samples``, ``columns``, ``out_root``), so nothing downstream
    validates again. ``workers=None`` becomes the usable CPUs for the local executor.
    """

    version: str
    size: int | str | Sequence[int]
    out: str | os.PathLike = "shards"
    workers: int | None = None
    shard_size: str | int | None = None
    resize: str = "center-crop"
    val_fraction: float = 0.1
    seed: int = 0
    sanitize_keys: bool = False
    key: str = "key"
    label: str = "label"
    path: str = "path"
    split: str | None = None
    group: str | None = None
    stratify: bool = False
    resplit: bool = False  # with group/stratify: draw every unit's split afresh, no split base
    dedup: bool = False  # --dedup: near-duplicate clusters join their groups before splits are drawn
    max_errors: str | int | float = "1%"
    decode: DecodeSettings = DecodeSettings()
    reuse: bool = True
    base: str | None = None
    checksum: bool = False
    dry_run: bool = False
    executor: str = "local"
    ray_address: str | None = None
    progress: bool = True
    sides: tuple[int, ...] = field(init=False)  # the sizes, largest first
    max_errors_rule: tuple[str, float] = field(init=False)  # parse_max_errors
    shard_samples: tuple[tuple[int, int], ...] = field(init=False)  # (side, samples per shard)
    columns: Columns = field(init=False)
    out_root: str = field(init=False)  # ``out`` as a string

    def __post_init__(self) -> None:
        """Check every option, in the order the CLI reports the first bad one, and fill the parsed forms."""
        if not _VERSION_PATTERN.fullmatch(str(self.version)):
            raise OptionError(f"--version {self.version!r}: use letters, digits, '.', '_' or '-' (at most 64), e.g. v1")
        sides = parse_sizes(self.size)
        if self.resize not in RESIZE_MODES:
            raise OptionError(f"--resize {self.resize!r}: expected one of {', '.join(RESIZE_MODES)}")
        if self.executor not in EXECUTORS:
            raise OptionError(f"--executor {self.executor!r}: expected one of {', '.join(EXECUTORS)}")
        workers = self.workers
        if workers is None and self.executor == "local":
            workers = usable_cpus()
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise OptionError(f"--workers {workers!r}: expected a positive integer")
        shard_samples = tuple((side, parse_shard_size(self.shard_size, side)) for side in sides)
        rule = parse_max_errors(self.max_errors)
        columns = Columns(key=self.key, label=self.label, path=self.path, split=self.split, group=self.group)
        for name, value in (
            ("sides", tuple(sides)),
            ("workers", workers),
            ("shard_samples", shard_samples),
            ("max_errors_rule", rule),
            ("columns", columns),
            ("out_root", os.fspath(self.out)),
        ):
            object.__setattr__(self, name, value)  # frozen: set once, here

    def samples_per_shard(self, side: int) -> int:
        """Samples per shard of the folder at ``side`` pixels (--shard-size)."""
        return dict(self.shard_samples)[side]
