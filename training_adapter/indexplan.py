"""Index plan: each epoch planned from samples.npz; ``offsetread`` then reads every batch by offset.

samples.npz -> ``select`` (a subset) -> ``epoch_order`` (a permutation or class-weighted draws, pure in
seed and epoch) -> ``deal`` (to ranks, batches and workers, pure).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import xxhash

from wds_tools.errors import IndexFormatError, OptionError, ShardError
from wds_tools.format.index import read_samples_checked
from wds_tools.format.meta import MetaValues, column_names, read_metadata
from wds_tools.format.model import IndexMeta, ShardInfo
from wds_tools.format.npy import NPY_HEADER_BYTES
from wds_tools.storage.transport import is_local, join, readable_by_offset

__all__ = [
    "SampleIndex",
    "DamagedShard",
    "Subset",
    "ClassWeights",
    "select",
    "check_subset",
    "check_weights",
    "class_shares",
    "epoch_order",
    "deal",
    "rank_rows",
    "read_sample_index",
    "readable_by_offset",
]

# samples.npz columns a subset filter may name, beside "label" (index or class name) and "key"
_FILTER_COLUMNS = ("width", "height", "src_size", "shard")

Subset: TypeAlias = "float | Collection[str] | Mapping[str, Any] | Callable[[dict[str, np.ndarray]], Any] | None"
"""What ``subset=`` takes: a fraction, keys, ``{column: value(s)}`` or a function of the columns (None: all)."""
ClassWeights: TypeAlias = "str | Mapping[int | str, float]"
"""What ``class_weights=`` takes: ``"balanced"`` or ``{class (index or name): weight}``."""


class DamagedShard(NamedTuple):
    """A shard the loader cannot read as its index says: its position in the URLs, and why."""

    position: int
    problem: str


@dataclass
class SampleIndex:
    """The rows of one split the loader reads: where each sample's pixels are, its label and key."""

    urls: list[str]  # shard URLs, by position
    shard_bytes: list[int]  # each shard's size as the index records it
    shard: np.ndarray  # [n] position in urls
    offset: np.ndarray  # [n] file offset of the .npy member (its NPY header)
    label: np.ndarray  # [n] int64
    key: np.ndarray  # [n] |S
    size: int  # S: the stored side
    classes: list[str]
    columns: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # for subset filters
    npy_xxh3: np.ndarray | None = field(default=None, repr=False)  # [n] xxh3-64 of each .npy member
    cls_offset: np.ndarray | None = field(default=None, repr=False)  # [n] file offset of the .cls member's data
    cls_length: np.ndarray | None = field(default=None, repr=False)  # [n] its length
    metadata: dict[str, MetaValues] = field(default_factory=dict, repr=False)  # format 2: the manifest's columns

    def __len__(self) -> int:
        return len(self.shard)

    @property
    def sample_bytes(self) -> int:
        """The bytes of one sample's stored pixels (S * S * 3)."""
        return self.size * self.size * 3

    @classmethod
    def from_table(
        cls, columns: Mapping[str, np.ndarray], info: IndexMeta, urls: list[str], names: list[str], where: str
    ) -> SampleIndex:
        """The rows of the shards ``names`` (file names in the index, read from ``urls``), in the order
        the index lists them."""
        by_name = {s.name: s for s in info.shards}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise OptionError(f"{where}: shard {unknown[0]} is not in the index")
        shard_col = columns["shard"].astype(np.int64)
        _check_shard_column(shard_col, columns["key"], info.shards, where)
        pos = np.full(len(info.shards), -1, np.int64)
        for j, n in enumerate(names):
            pos[by_name[n].pos] = j
        shard_of_row = pos[shard_col]
        rows = np.flatnonzero(shard_of_row >= 0)
        rows = rows[np.lexsort((columns["npy_offset"][rows], shard_of_row[rows]))]  # shard order, then file order
        size = info.size
        bad = np.flatnonzero(columns["npy_length"][rows] != NPY_HEADER_BYTES + size * size * 3)
        if len(bad):
            raise ShardError(
                f"{where}: sample {columns['key'][rows[bad[0]]].decode()!r} has an .npy of "
                f"{int(columns['npy_length'][rows[bad[0]]])} bytes; the index's size {size} needs "
                f"{NPY_HEADER_BYTES + size * size * 3}",
                url=where,
            )
        return cls(
            urls=list(urls),
            shard_bytes=[by_name[n].bytes for n in names],
            shard=shard_of_row[rows],
            offset=columns["npy_offset"][rows].astype(np.int64),
            label=columns["label"][rows].astype(np.int64),
            key=columns["key"][rows],
            size=size,
            classes=list(info.classes),
            columns={c: columns[c][rows] for c in _FILTER_COLUMNS if c in columns},
            npy_xxh3=columns["npy_xxh3"][rows] if "npy_xxh3" in columns else None,
            cls_offset=columns["cls_offset"][rows].astype(np.int64) if "cls_offset" in columns else None,
            cls_length=columns["cls_length"][rows].astype(np.int64) if "cls_length" in columns else None,
            metadata={n: v.take(rows) for n, v in read_metadata(columns, info.metadata, where=where).items()},
        )

    def key_str(self, i: int) -> str:
        """Row ``i``'s sample key."""
        return self.key[i].decode()

    def damaged_shards(self) -> list[DamagedShard]:
        """Each local shard that is missing or not the size its index says (remote shards are
        checked by the ranged reads themselves)."""
        bad = []
        for i, (url, want) in enumerate(zip(self.urls, self.shard_bytes)):
            if not is_local(url):
                continue
            try:
                got = os.path.getsize(url)
            except OSError as e:
                bad.append(DamagedShard(i, f"{url}: cannot read the shard: {e}"))
                continue
            if got != want:
                bad.append(
                    DamagedShard(
                        i,
                        f"{url} is {got:,} bytes; its index says {want:,}: the shard does not "
                        f"match its index (re-copy or re-convert it; wds-tools verify names "
                        f"what differs)",
                    )
                )
        return bad


def _check_shard_column(shard: np.ndarray, keys: np.ndarray, entries: Sequence[ShardInfo], where: str) -> None:
    """Refuse a samples.npz whose ``shard`` column does not fit the index.json beside it: a row naming no
    shard it lists, or a shard whose rows are not the samples it says (an entry removed shifts the others)."""
    n = len(entries)
    fix = (
        "the two files are not of one conversion (an edited index.json?): wds-tools verify lists what differs; "
        "copy the folder again, or convert again"
    )
    bad = np.flatnonzero((shard < 0) | (shard >= n))
    if len(bad):
        r = int(bad[0])
        raise IndexFormatError(
            f"{where} and the index.json beside it disagree: {len(bad)} row(s) name a shard past the {n} that "
            f"index.json lists (first: row {r}, sample {keys[r].decode(errors='replace')!r}, shard {int(shard[r])}); "
            f"{fix}"
        )
    rows = np.bincount(shard, minlength=n)
    for i, e in enumerate(entries):
        if e.samples != rows[i]:
            raise IndexFormatError(
                f"{where} and the index.json beside it disagree: index.json's shards[{i}] ({e.name}) holds "
                f"{e.samples} samples, samples.npz has {int(rows[i])} rows for shard {i}; {fix}"
            )


# --- which samples ---------------------------------------------------------------------------
def _key_fraction(keys: np.ndarray) -> np.ndarray:
    """A stable number in [0, 1) per key (xxh3-64 of the key bytes), for fractional subsets."""
    return np.fromiter((xxhash.xxh3_64_intdigest(k, seed=0x5B5E7) for k in keys), np.uint64, len(keys)) / 2.0**64


def select(index: SampleIndex, subset: Subset) -> np.ndarray:
    """Row numbers of ``subset``: None (all), a fraction in (0, 1] (the same samples every epoch and
    run: those whose key hashes below it), keys (a list or set of strings), a mapping
    ``{column: value or list of values}`` over ``label`` (class index or name), ``key``, the
    numeric columns and the metadata columns (``"localization": ["back"]``; None selects missing
    values; also named ``meta.<name>``), or a function of the columns dict returning a boolean mask."""
    n = len(index)
    subset = check_subset(subset)
    if subset is None:
        return np.arange(n)
    if isinstance(subset, (int, float)):
        return np.flatnonzero(_key_fraction(index.key) < subset) if subset < 1 else np.arange(n)
    if callable(subset):
        mask = np.asarray(subset(_filter_columns(index)))
        if mask.dtype != bool or mask.shape != (n,):
            raise OptionError(
                f"subset: the function must return a boolean array of {n} values, got {mask.dtype} {mask.shape}"
            )
        return np.flatnonzero(mask)
    if isinstance(subset, Mapping):
        cols = _filter_columns(index)
        mask = np.ones(n, bool)
        for name, want in subset.items():
            if name not in cols:
                raise OptionError(f"subset: no column {name!r}; the index has {', '.join(sorted(cols))}")
            values = list(want) if isinstance(want, (list, tuple, set, frozenset)) else [want]
            if name == "label":
                try:
                    values = [_class_index(index, v, "subset") for v in values]
                except OptionError as e:
                    if "label" not in index.metadata:
                        raise
                    raise OptionError(
                        f"{e}. 'label' names the classes; the metadata column 'label' is "
                        f"'meta.label': subset={{'meta.label': {values!r}}}"
                    ) from None
            elif name == "key":
                values = [str(v).encode() for v in values]
            elif name not in _OWN and name.removeprefix("meta.") in index.metadata:
                try:
                    mask &= index.metadata[name.removeprefix("meta.")].mask(values)
                except TypeError as e:
                    raise OptionError(f"subset: {e}") from None
                continue
            mask &= np.isin(cols[name], values)
        return np.flatnonzero(mask)
    wanted = {str(k).encode() for k in subset}  # keys (check_subset)
    mask = np.isin(index.key, np.array(sorted(wanted), dtype=index.key.dtype) if wanted else index.key[:0])
    missing = sorted(wanted - set(index.key[mask].tolist()))
    if missing:
        raise OptionError(f"subset: {len(missing)} key(s) are not in this split, e.g. {missing[0].decode()!r}")
    return np.flatnonzero(mask)


def check_subset(subset: Any) -> Subset:
    """``subset`` if it is of a kind ``select`` takes (a fraction in (0, 1], keys, a mapping, a function, None)."""
    if subset is None or callable(subset) or isinstance(subset, (Mapping, list, tuple, set, frozenset, np.ndarray)):
        return subset
    if isinstance(subset, float) or (isinstance(subset, int) and not isinstance(subset, bool) and subset == 1):
        if not 0 < subset <= 1:
            raise OptionError(f"subset={subset!r}: a fraction must be in (0, 1]")
        return subset
    raise OptionError(
        f"subset={subset!r}: expected a fraction, a list of keys, a {{column: values}} mapping "
        f"or a function of the columns"
    )


_OWN = ("label", "key", *_FILTER_COLUMNS)  # a metadata column of the same name is meta.<name>


def _filter_columns(index: SampleIndex) -> dict[str, np.ndarray]:
    """What a subset names: our columns, then each metadata column by name (unless one of ours has it)
    and as meta.<name> (strings as objects, None where missing; numbers with NaN where missing)."""
    meta = {}
    for name, values in index.metadata.items():
        meta[f"meta.{name}"] = values.array()
        if name not in _OWN:
            meta.setdefault(name, meta[f"meta.{name}"])
    return {"label": index.label, "key": index.key, **index.columns, **meta}


def _class_index(index: SampleIndex, value: int | str, what: str) -> int:
    """A class given by name (``"mel"``, ``"07"``; integer classes are named ``"0"``, ``"1"``, ...) or index."""
    if isinstance(value, str):
        if value in index.classes:
            return index.classes.index(value)
        if not (value.isascii() and value.isdigit()):
            raise OptionError(f"{what}: no class {value!r}; the index has {', '.join(index.classes)}")
    i = int(value)
    if index.classes and not 0 <= i < len(index.classes):
        raise OptionError(f"{what}: class index {i} out of range 0..{len(index.classes) - 1}")
    return i


def class_shares(index: SampleIndex, weights: ClassWeights, rows: np.ndarray) -> np.ndarray:
    """Each class's share of an epoch (sums to 1) from ``"balanced"`` or ``{class: weight}``
    (classes by index or name; a class not named gets no share)."""
    n_classes = max(len(index.classes), int(index.label.max()) + 1 if len(index.label) else 0)
    present = np.bincount(index.label[rows], minlength=n_classes) > 0
    check_weights(weights)
    if isinstance(weights, str):
        w = present.astype(np.float64)
    else:
        w = np.zeros(n_classes)
        for c, v in weights.items():
            w[_class_index(index, c, "class_weights")] = float(v)
        empty = [index.classes[i] if i < len(index.classes) else str(i) for i in np.flatnonzero((w > 0) & ~present)]
        if empty:
            raise OptionError(f"class_weights: class {empty[0]!r} has a weight but no sample in this split/subset")
    if not w.sum() > 0:
        raise OptionError("class_weights: every class present has weight 0")
    return w / w.sum()


def check_weights(weights: Any) -> ClassWeights | None:
    """``weights`` if ``"balanced"``, a ``{class: weight >= 0}`` mapping or None (classes are checked against
    the index by ``class_shares``)."""
    if weights is None or weights == "balanced":
        return weights
    if not isinstance(weights, Mapping):
        raise OptionError(f"class_weights={weights!r}: expected 'balanced' or a {{class: weight}} mapping")
    for c, v in weights.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise OptionError(f"class_weights[{c!r}]={v!r}: expected a number >= 0")
    return weights


# --- in which order --------------------------------------------------------------------------
def _largest_remainder(total: int, shares: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total``, as close as possible to ``total * shares``."""
    exact = total * shares
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


def epoch_order(
    rows: np.ndarray,
    labels: np.ndarray,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    shares: np.ndarray | None = None,
    draws: int | None = None,
) -> np.ndarray:
    """The epoch's sequence of rows: ``rows`` in order or permuted by (seed, epoch); with ``shares``,
    ``draws`` (default ``len(rows)``) rows whose class counts are ``shares`` of it, each class's rows
    drawn in fresh random passes (all of a small class, as often as needed, then part of it), then
    permuted; with ``draws`` and no shares, ``draws`` rows drawn with replacement."""
    rng = np.random.default_rng([seed, epoch, 0x1D5])
    if shares is None:
        if draws is not None:
            return rows[rng.integers(len(rows), size=draws)] if len(rows) else rows[:0]
        return rng.permutation(rows) if shuffle else rows
    total = len(rows) if draws is None else draws
    counts = _largest_remainder(total, shares)
    cls = labels[rows]
    parts = []
    for c in np.flatnonzero(counts):
        mine = rows[cls == c]
        full, rest = divmod(int(counts[c]), len(mine))
        parts += [rng.permutation(mine) for _ in range(full)]
        parts.append(rng.permutation(mine)[:rest])
    return rng.permutation(np.concatenate(parts)) if parts else rows[:0]


def rank_rows(order: np.ndarray, rank: int, world: int, *, cover: bool = False) -> np.ndarray:
    """Rank ``rank``'s rows of ``order``: every ``world``-th one from ``rank``; all ranks the same count
    (the last ``len % world`` rows left out) unless ``cover`` (evaluation: every row once across the
    ranks, the first ``len % world`` ranks one more)."""
    if world == 1:
        return order
    mine = order[rank::world]
    return mine if cover else mine[: len(order) // world]


def deal(
    order: np.ndarray,
    *,
    batch_size: int,
    rank: int,
    world: int,
    num_workers: int,
    drop_last: bool,
    max_batches: int | None = None,
    cover: bool = False,
) -> list[list[np.ndarray]]:
    """Each worker's batches of this rank: the rank's rows (``rank_rows``) cut into batches in order;
    batch j goes to worker ``j % num_workers`` (the DataLoader then yields them in order j)."""
    mine = rank_rows(order, rank, world, cover=cover)
    nb = len(mine) // batch_size if drop_last else math.ceil(len(mine) / batch_size)
    if max_batches is not None:
        nb = min(nb, max_batches)
    batches = [mine[j * batch_size : (j + 1) * batch_size] for j in range(nb)]
    return [batches[w::num_workers] for w in range(num_workers)]


def read_sample_index(base: str, info: IndexMeta, urls: list[str], names: list[str]) -> SampleIndex:
    """The SampleIndex of shards ``names`` (read from ``urls``) from the samples.npz beside index.json
    at ``base`` (a folder, or an http(s)/fsspec URL)."""
    where = join(base, info.samples_file.name)
    wanted = [
        "key",
        "label",
        "shard",
        "npy_offset",
        "npy_length",
        "npy_xxh3",
        "cls_offset",
        "cls_length",
        *_FILTER_COLUMNS[:3],
        *column_names(info.metadata),
    ]
    return SampleIndex.from_table(read_samples_checked(base, info, wanted), info, urls, names, where)
