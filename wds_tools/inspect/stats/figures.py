"""The figures ``wds-tools stats`` reports (``StatsReport``, its ``to_dict`` the ``--json`` schema), and the
arithmetic that makes them from per-shard counts: balance, class drift, the epoch's split, ``--by``/``--group``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np

from ...dataset.splits import class_gaps, gap_warnings
from ...errors import OptionError
from ...format.meta import MetaValues
from ...ranks import deal
from .render import even_text, group_warnings, render_text

__all__ = [
    "SCHEMA",
    "Distribution",
    "distribute",
    "SplitStats",
    "StatsReport",
    "Breakdown",
    "GroupReport",
    "breakdown",
    "group_report",
    "plural",
    "cluster_warning",
]

# 2: "reader", "left_out"; the index reader's null shard counts (issue 25). 3 (issue 32): "metadata" (the index's
# columns), each distribution's "mode" (a split other than train modelled in evaluation: every sample once)
SCHEMA = "wds-tools-stats/3"
"""The ``--json`` schema name and version of ``stats``."""
TOP_DRIFT = 5  # shards named as deviating most, per split
_LISTS = "wds-tools dups lists them"


# ------------------------------------------------------------------ rank / worker arithmetic


READERS = ("index", "stream")  # the training loader's readers (make_loader's reader=) that stats models


@dataclass
class Distribution:
    """How one epoch of a split is dealt to ``world_size`` ranks × ``workers`` DataLoader workers by the
    training loader's ``reader`` (the model: docs/guide/inspect.md). ``worker_*`` are [rank][worker]; the index
    reader deals batches round-robin whatever the shard count: its ``*_shards`` and ``worker_samples`` are None."""

    world_size: int
    workers: int
    shards: int
    samples: int
    rank_shards: list[int] | None
    rank_samples: list[int]
    worker_shards: list[list[int]] | None
    worker_samples: list[list[int]] | None
    idle_workers: int  # readers (rank, worker) that get no shard (index reader: no sample at all)
    even_shards_below: int | None  # nearest shard counts n' with n' % (R × W) == 0
    even_shards_above: int | None
    warnings: list[str] = field(default_factory=list)
    reader: str = "stream"
    left_out: int = 0  # samples per epoch no rank reads in training (index reader: samples % R)
    mode: str = "train"  # "train" (make_loader(train=True)) or "eval" (train=False)

    def to_dict(self) -> dict:
        """The distribution as plain JSON types."""
        return asdict(self)


def distribute(
    shard_sample_counts: Sequence[int] | np.ndarray,
    world_size: int = 1,
    workers: int = 1,
    reader: str = "stream",
    *,
    evaluation: bool = False,
) -> Distribution:
    """Count what each rank and worker gets of an epoch: the streaming reader deals shards to ranks
    (i % R) and then to each rank's workers (j % W); the index reader deals samples (``Distribution``),
    in training or, with ``evaluation``, every sample once."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise OptionError(f"world_size {world_size!r}: expected an integer >= 1 (the number of ranks)")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise OptionError(f"workers {workers!r}: expected an integer >= 1 (DataLoader workers per rank)")
    if reader not in READERS:
        raise OptionError(f"reader {reader!r}: expected one of {', '.join(READERS)} (make_loader's reader=)")
    counts = np.asarray(shard_sample_counts, dtype=np.int64).reshape(-1)
    if reader == "index":
        return _deal_samples(counts, world_size, workers, evaluation)
    n, r, w = len(counts), world_size, workers
    slot = np.empty(n, dtype=np.int64)  # reader (rank, worker) of each shard, as rank * w + worker
    for rank_no, row in enumerate(deal(range(n), r, w)):
        for worker_no, positions in enumerate(row):
            slot[positions] = rank_no * w + worker_no
    rank = slot // w
    rank_shards = np.bincount(rank, minlength=r)
    rank_samples = np.bincount(rank, weights=counts, minlength=r).astype(np.int64)
    worker_shards = np.bincount(slot, minlength=r * w).reshape(r, w)
    worker_samples = np.bincount(slot, weights=counts, minlength=r * w).astype(np.int64).reshape(r, w)
    readers = r * w
    below = (n // readers) * readers or None
    above = -(-n // readers) * readers or readers
    idle = int((worker_shards == 0).sum())
    warnings = []
    if n < readers:
        no_rank = int((rank_shards == 0).sum())
        warnings.append(
            f"{plural(n, 'shard')} for {plural(r, 'rank')} × {plural(w, 'worker')} = {plural(readers, 'reader')}: "
            f"{plural(idle, 'reader')} get{'s' if idle == 1 else ''} no shard"
            f"{f' (ranks without any shard: {no_rank})' if no_rank else ''}; use at least {plural(readers, 'shard')}"
        )
    if n and rank_samples.min() != rank_samples.max():
        warnings.append(
            f"ranks get unequal sample counts per epoch ({int(rank_samples.min()):,} to "
            f"{int(rank_samples.max()):,}); with DDP the ranks fall out of step; use a shard count that "
            f"divides evenly ({even_text(below, above)}) with equal shards, or a fixed epoch length"
        )
    return Distribution(
        r,
        w,
        n,
        int(counts.sum()),
        rank_shards.tolist(),
        rank_samples.tolist(),
        worker_shards.tolist(),
        worker_samples.tolist(),
        idle,
        below,
        above,
        warnings,
        mode="eval" if evaluation else "train",
    )


def _deal_samples(counts: np.ndarray, r: int, w: int, evaluation: bool = False) -> Distribution:
    """The index reader's epoch (``training_adapter.indexplan.rank_rows``): in training every rank
    ``samples // R`` samples, the last ``samples % R`` of the permutation left out; in evaluation every
    sample once, the first ``samples % R`` ranks one more; each rank's batches dealt round-robin to its
    workers."""
    n, total = len(counts), int(counts.sum())
    per = total // r
    warnings = []
    idle = 0
    if evaluation:
        ranks = [per + (1 if i < total % r else 0) for i in range(r)]
        empty = sum(x == 0 for x in ranks)
        if total and empty:
            idle = empty * w
            warnings.append(
                f"{plural(total, 'sample')} for {plural(r, 'rank')}: {plural(empty, 'rank')} get{'s' if empty == 1 else ''} "
                "no sample in evaluation (each sample is read once, by one rank)"
            )
        elif min(ranks) < w:
            idle = sum(w - x for x in ranks if x < w)
            warnings.append(
                f"{plural(min(ranks), 'sample')} on the smallest rank for {plural(w, 'worker')}: some workers get no batch"
            )
        return Distribution(
            r, w, n, total, None, ranks, None, None, idle, None, None, warnings, "index", 0, mode="eval"
        )
    if total and per == 0:
        idle = r * w
        warnings.append(
            f"{plural(total, 'sample')} for {plural(r, 'rank')}: every rank gets no sample in training (the "
            f"index reader gives each rank samples // ranks); use at most {plural(total, 'rank')}"
        )
    elif per < w:  # fewer samples than workers: some worker gets no batch whatever the batch size
        idle = r * (w - per)
        warnings.append(
            f"{plural(per, 'sample')} per rank for {plural(w, 'worker')}: {plural(w - per, 'worker')} per rank get no batch"
        )
    return Distribution(
        r, w, n, total, None, [per] * r, None, None, idle, None, None, warnings, "index", total - per * r
    )


def plural(n: int, word: str) -> str:
    """``1 sample``, ``2 samples``, ``2 classes``."""
    return f"{n:,} {word if n == 1 else word + ('es' if word.endswith('s') else 's')}"


def cluster_warning(kind: str, n: int, threshold: int) -> str:
    """How many near-duplicate clusters cross splits (``kind`` ``cross_split``) or carry different labels."""
    if kind == "cross_split":
        return f"{plural(n, 'near-duplicate cluster')} {'crosses' if n == 1 else 'cross'} splits (leakage; within {threshold} bits)"
    return f"{plural(n, 'near-duplicate cluster')} {'carries' if n == 1 else 'carry'} different labels"


# ------------------------------------------------------------------ the report


@dataclass
class SplitStats:
    """Figures for one split; per-shard arrays are in shard order."""

    name: str
    shard_names: list[str]
    shard_samples: np.ndarray  # int64 [n]
    shard_bytes: np.ndarray  # int64 [n]
    shard_class_counts: np.ndarray  # int64 [n, classes]
    mean: list[float] | None
    std: list[float] | None
    distribution: Distribution

    @property
    def shards(self) -> int:
        """Number of shards in the split."""
        return len(self.shard_names)

    @property
    def samples(self) -> int:
        """Number of samples in the split."""
        return int(self.shard_samples.sum())

    @cached_property
    def class_counts(self) -> np.ndarray:
        """Samples per class in the split."""
        return self.shard_class_counts.sum(axis=0)

    @property
    def class_share(self) -> np.ndarray:
        """Share of each class in the split (zeros when it is empty)."""
        total = self.class_counts.sum()
        return self.class_counts / total if total else np.zeros(len(self.class_counts))

    @cached_property
    def _deviation(self) -> np.ndarray:
        """[shards, classes]: |class share in the shard - share in the split| (0 for an empty shard)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            share = self.shard_class_counts / self.shard_samples[:, None]
        return np.nan_to_num(np.abs(share - self.class_share[None, :]), nan=0.0)

    @property
    def drift(self) -> np.ndarray:
        """Per shard, the largest |class share - split share| in percentage points (NaN: empty shard)."""
        dev = self._deviation
        if dev.shape[1] == 0:
            return np.zeros(len(dev))
        return np.where(self.shard_samples > 0, dev.max(axis=1) * 100, np.nan)

    @property
    def drift_class(self) -> np.ndarray:
        """Per shard, the class whose share deviates most from the split's."""
        dev = self._deviation
        return dev.argmax(axis=1) if dev.shape[1] else np.zeros(len(dev), dtype=np.int64)

    def to_dict(self, classes: list[str]) -> dict:
        """The split's figures as plain JSON types, classes named by ``classes``."""
        s, b = self.shard_samples, self.shard_bytes
        drift, drift_class = self.drift, self.drift_class
        worst = [
            i for i in np.argsort(-np.nan_to_num(drift, nan=-1.0), kind="stable")[:TOP_DRIFT] if not np.isnan(drift[i])
        ]
        return {
            "shards": self.shards,
            "samples": self.samples,
            "bytes": int(b.sum()),
            "samples_per_shard": _spread(s),
            "bytes_per_shard": {k: v for k, v in _spread(b).items() if k in ("min", "median", "max")},
            "class_counts": self.class_counts.tolist(),
            "class_share": [round(float(x), 6) for x in self.class_share],
            "class_drift": {
                "max_pp": _round(np.nanmax(drift)) if np.isfinite(drift).any() else None,
                "median_pp": _round(np.nanmedian(drift)) if np.isfinite(drift).any() else None,
                "worst": [
                    {"shard": self.shard_names[i], "pp": _round(drift[i]), "class": classes[int(drift_class[i])]}
                    for i in worst
                ],
            },
            "mean": self.mean,
            "std": self.std,
            "distribution": self.distribution.to_dict(),
            "per_shard": [
                {
                    "name": n,
                    "samples": int(s[i]),
                    "bytes": int(b[i]),
                    "drift_pp": None if np.isnan(drift[i]) else _round(drift[i]),
                    "drift_class": None if np.isnan(drift[i]) else classes[int(drift_class[i])],
                }
                for i, n in enumerate(self.shard_names)
            ],
        }


def _round(x: float | np.floating, nd: int = 3) -> float:
    return round(float(x), nd)


def _spread(a: np.ndarray) -> dict:
    if len(a) == 0:
        return {"min": 0, "median": 0, "max": 0, "imbalance": None, "cv": None}
    mn, mx, mean = int(a.min()), int(a.max()), float(a.mean())
    return {
        "min": mn,
        "median": float(np.median(a)),
        "max": mx,
        "imbalance": _round(mx / mn, 4) if mn > 0 else None,
        "cv": _round(a.std() / mean, 4) if mean > 0 else None,
    }


@dataclass
class StatsReport:
    """What ``wds-tools stats`` prints; ``to_dict`` is the stable ``--json`` schema (``SCHEMA``)."""

    source: str  # "index" or "scan"
    path: str
    root: str
    index: str | None
    dataset_version: str | None
    size: int | None
    classes: list[str]
    splits: dict[str, SplitStats]
    shard_bytes: int
    index_bytes: int
    mean: list[float] | None
    std: list[float] | None
    stats_split: str | None
    world_size: int
    workers: int
    seconds: float = 0.0
    by: Breakdown | None = None  # --by COL: class counts per value of a metadata column
    groups: GroupReport | None = None  # build.group (or --group COL): groups in more than one split
    notes: list[str] = field(default_factory=list)  # about the whole report (a pattern naming part of a split)
    duplicates: dict | None = None  # similar.dups.duplicate_counts: near-duplicate clusters (format 3 indexes)
    reader: str = "stream"  # the training loader's reader modelled: "index" or "stream" (READERS)
    metadata: list[dict] | None = None  # the index's metadata columns [{name, type}]; None: --scan (not read)
    partial: bool = False  # the spec names part of a split: no class is said to lack a split

    @property
    def samples(self) -> int:
        """Number of samples in all splits."""
        return sum(sp.samples for sp in self.splits.values())

    @property
    def shards(self) -> int:
        """Number of shards in all splits."""
        return sum(sp.shards for sp in self.splits.values())

    @property
    def class_gaps(self) -> list[str]:
        """A warning for each class with samples but none in train or none in val (``dataset.splits``), unless
        the spec names only part of a split."""
        if self.partial:
            return []
        counts = {name: sp.class_counts.tolist() for name, sp in self.splits.items()}
        hint = (
            "a split drawn per group keeps each group whole, so a class held by few groups can land whole in "
            "one split (docs/guide/clinical.md)"
            if self.groups is not None
            else ""
        )
        return gap_warnings(class_gaps(self.classes, counts), hint)

    @property
    def warnings(self) -> list[str]:
        """Classes without train or val samples, notes on the whole report, then each split's distribution
        warnings, then the groups'."""
        return (
            self.class_gaps
            + self.notes
            + [f"{name}: {w}" for name, sp in self.splits.items() for w in sp.distribution.warnings]
            + (self.groups.warnings if self.groups is not None else [])
            + self._duplicate_warnings()
        )

    def _duplicate_warnings(self) -> list[str]:
        d = self.duplicates
        if not d:
            return []
        if "skipped" in d:
            return [f"near-duplicates not counted: {d['skipped']}"]
        out = []
        if d["cross_split"]:
            example = " ".join(d["cross_split_keys"][0])
            out.append(f"{cluster_warning('cross_split', d['cross_split'], d['threshold'])}, e.g. {example}: {_LISTS}")
        if d["label_conflict"]:
            out.append(f"{cluster_warning('label_conflict', d['label_conflict'], d['threshold'])}: {_LISTS}")
        if d.get("flat"):
            out.append(
                f"{plural(d['flat'], 'sample')} too flat to hash (flat or smooth "
                f"pictures), whose near-duplicates the hashes may miss, e.g. {' '.join(d['flat_keys'][:5])}: " + _LISTS
            )
        return out

    def to_dict(self) -> dict:
        """The stable ``--json`` schema (``SCHEMA``)."""
        extra = {k: v.to_dict() for k, v in (("by", self.by), ("groups", self.groups)) if v is not None}
        return {
            "schema": SCHEMA,
            "source": self.source,
            "path": self.path,
            "root": self.root,
            "index": self.index,
            "dataset_version": self.dataset_version,
            "size": self.size,
            "classes": self.classes,
            "samples": self.samples,
            "shards": self.shards,
            "bytes": {
                "shards": self.shard_bytes,
                "index": self.index_bytes,
                "total": self.shard_bytes + self.index_bytes,
            },
            "mean": self.mean,
            "std": self.std,
            "stats_split": self.stats_split,
            "world_size": self.world_size,
            "workers": self.workers,
            "reader": self.reader,
            "metadata": self.metadata,
            "splits": {name: sp.to_dict(self.classes) for name, sp in self.splits.items()},
            **extra,  # only when asked for (--by) or the set has a group column
            **(
                {"duplicates": {k: v for k, v in self.duplicates.items() if k not in ("cross_split_keys", "flat_keys")}}
                if self.duplicates is not None
                else {}
            ),  # format version 3 on
            "warnings": self.warnings,
            "seconds": round(self.seconds, 4),
        }

    def to_text(self) -> str:
        """The report as text (``render.render_text`` of ``to_dict``)."""
        text = render_text(self.to_dict(), self.notes, self.class_gaps)
        d = self.duplicates
        if d is not None and d.get("clusters"):  # none: nothing to say (--json has the zeros)
            text += (
                f"\nnear-duplicates (within {d['threshold']} bits): {d['clusters']:,} "
                f"{'cluster' if d['clusters'] == 1 else 'clusters'}, {d['cross_split']:,} "
                f"{'crosses' if d['cross_split'] == 1 else 'cross'} splits, {d['label_conflict']:,} "
                f"{'carries' if d['label_conflict'] == 1 else 'carry'} different labels"
            )
        return text


# ------------------------------------------------------------------ per-sample metadata (--by, --group)


@dataclass
class Breakdown:
    """Samples per (value of ``column``, class) per split; ``values`` sorted, None (missing) last."""

    column: str
    type: str
    values: list
    counts: dict[str, np.ndarray]  # split -> int64 [values, classes]

    def to_dict(self) -> dict:
        """The breakdown as plain JSON types."""
        return {
            "column": self.column,
            "type": self.type,
            "values": self.values,
            "splits": {s: c.tolist() for s, c in self.counts.items()},
        }


@dataclass
class GroupReport:
    """How the groups of ``column`` fall into splits."""

    column: str
    groups: int
    in_several: list[dict] = field(default_factory=list)  # {"group": value, "splits": {split: samples}}

    def to_dict(self) -> dict:
        """The groups as plain JSON types."""
        return {"column": self.column, "groups": self.groups, "in_several_splits": self.in_several}

    @property
    def warnings(self) -> list[str]:
        """One warning per group found in more than one split."""
        return group_warnings(self.column, self.in_several)


def breakdown(
    values: MetaValues, labels: np.ndarray, row_split: np.ndarray, splits: list[str], n_classes: int
) -> Breakdown:
    """Samples per (value of the column, class) in each split; missing values counted last."""
    ids, distinct = values.factorize()
    n = len(distinct)
    slot = np.where(ids < 0, n, ids)  # missing last
    counts = {}
    for j, s in enumerate(splits):
        mine = row_split == j
        flat = np.bincount(slot[mine] * n_classes + labels[mine], minlength=(n + 1) * n_classes)
        counts[s] = flat.reshape(n + 1, n_classes)
    has_missing = bool(values.missing.any())
    if not has_missing:
        counts = {s: c[:n] for s, c in counts.items()}
    return Breakdown(values.column.name, values.column.type, distinct + ([None] if has_missing else []), counts)


def group_report(values: MetaValues, row_split: np.ndarray, splits: list[str]) -> GroupReport:
    """The groups of the column and those found in more than one split, with their samples per split."""
    ids, distinct = values.factorize()
    present = ids >= 0
    pairs = ids[present] * len(splits) + row_split[present]
    counts = np.bincount(pairs, minlength=len(distinct) * len(splits)).reshape(len(distinct), len(splits))
    several = np.flatnonzero((counts > 0).sum(axis=1) > 1)
    return GroupReport(
        values.column.name,
        len(distinct),
        [
            {"group": distinct[g], "splits": {splits[j]: int(counts[g, j]) for j in np.flatnonzero(counts[g])}}
            for g in several.tolist()
        ],
    )
