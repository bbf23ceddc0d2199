"""Splits that stay put across versions: which earlier version a grouped (or stratified, or
deduplicated) conversion follows, and the split each of its units had there
(docs/guide/converter-internals.md, "Splits that stay put").
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final, Literal

import numpy as np

from ..errors import IndexFormatError, OptionError
from ..format.index import INDEX_FILE, WORK_DIR, DatasetIndex, indexes_newest_first, load_index
from ..format.meta import value_text
from ..format.model import load_json, parse
from ..storage.transport import is_remote
from .plan import Unit

__all__ = ["SplitBase", "base_units", "find_split_base", "recorded_split_base"]


class _Missing(Enum):
    """No split base recorded (a recorded None means: the run had none)."""

    MISSING = 0


_MISSING: Final = _Missing.MISSING


@dataclass(frozen=True)
class SplitBase:
    """The version whose split units keep their split, and those units."""

    version: str
    splits: dict[Unit, str]  # the units the base holds in exactly one split


def base_units(index: DatasetIndex, group: str | None) -> dict[Unit, str]:
    """Each unit of ``index`` found in exactly one split -> that split; groups are read from the base's
    metadata column named ``group`` when it has one (else every row is a unit of its own key)."""
    s = index.samples
    splits = np.array([sh.split for sh in index.info.shards] + [""], dtype=object)
    row_split = splits[np.minimum(s["shard"].astype(np.int64), len(splits) - 1)]
    values = index.metadata.get(group) if group is not None else None
    found: dict[Unit, set] = {}
    for i, key in enumerate(s.keys):
        v = values.value(i) if values is not None else None
        unit = ("g", value_text(v)) if v is not None else ("k", key)
        found.setdefault(unit, set()).add(row_split[i])
    return {u: next(iter(where)) for u, where in found.items() if len(where) == 1}


def recorded_split_base(
    out: str | os.PathLike, version: str, sides: Sequence[int]
) -> str | None | Literal[_Missing.MISSING]:
    """The split base (a version name, or None) an earlier run of this very conversion used (its
    index.json, or the run.json of an unfinished run), so that running the command again gives the
    same splits; ``_MISSING`` if none."""
    for side in sides:
        folder = Path(out) / version / str(side)
        for path in (folder / INDEX_FILE, folder / WORK_DIR / "run.json"):  # the index, or the run's spec
            try:  # a damaged index is not trusted (convert then refuses it)
                data = path.read_bytes()
                raw = parse(load_json(data, path), path).raw if path.name == INDEX_FILE else json.loads(data)
                build = raw.get("build")
            except (OSError, ValueError, AttributeError, IndexFormatError):
                continue
            if isinstance(build, dict) and "split_base" in build:
                return build["split_base"]
    return _MISSING


def find_split_base(
    out: str | os.PathLike, version: str, sides: Sequence[int], explicit: str | None, group: str | None
) -> SplitBase | None:
    """The version whose units keep their split: the one an earlier run of this conversion recorded,
    else ``explicit`` (--from), else the newest other version under ``out`` (any size). None for an
    object-store ``out`` or when there is none."""
    if is_remote(out):
        return None
    name = recorded_split_base(out, version, sides)
    if name is _MISSING:
        name = explicit
    elif name is None:
        return None
    if name is not None:  # the version's index at a requested size, else at any size that reads
        folders = [Path(out) / name / str(side) for side in sides]
        folders += [p.parent for p in sorted((Path(out) / name).glob(f"*/{INDEX_FILE}")) if p.parent not in folders]
        folders = [f for f in folders if (f / INDEX_FILE).exists()]
        if not folders:
            raise OptionError(f"--from {name}: no finished conversion under {Path(out) / name} (no {INDEX_FILE})")
        index = None
        for folder in folders:
            try:
                index = load_index(folder)
                break
            except IndexFormatError:
                if folder == folders[-1]:
                    raise
    else:
        index = None
        for folder in indexes_newest_first(out):
            if folder.parent.name == version:
                continue
            try:
                index = load_index(folder)
                break
            except Exception:  # noqa: BLE001 - an unreadable neighbour is no base, and no reason to fail
                continue
        if index is None:
            return None
    assert index is not None  # found, or the last folder's error was raised
    return SplitBase(Path(index.root).parent.name, base_units(index, group))
