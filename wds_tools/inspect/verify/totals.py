"""The totals against index.json: its counts against samples.npz's, and the class names, image size and
mean/std against what the shards read hold (the sums ``shards.check_shard`` returns per shard)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from ...dataset.resolve import Shards
from ...format.model import Partial
from .problems import INDEX, Problem, capped
from .shards import ShardJob, ShardResult

__all__ = ["check_counts", "check_class_names", "check_sizes", "check_pixel_stats", "mean_std", "STATS_TOLERANCE"]

STATS_TOLERANCE = 2e-6
"""mean/std are stored rounded to 6 decimals; a float path may differ in the last one."""


def check_counts(
    index: Partial,
    rows: int,
    per_shard: np.ndarray | None,
    labels: np.ndarray | None,
    labels_by_split: dict[str, np.ndarray] | None,
    source: str,
) -> list[Problem]:
    """Every count in index.json against the counts ``source`` gives: ``rows`` samples, ``per_shard``
    rows by shard position, ``labels`` samples by class, ``labels_by_split`` the same per split."""
    problems = []

    def bad(message: str) -> None:
        problems.append(Problem(INDEX, "count", message))

    if index.samples is not None and index.samples != rows:
        bad(f"samples is {index.samples:,}; {source} has {rows:,}")
    splits = {k: v for k, v in index.splits.items() if v is not None} if index.shards_ok else {}
    if per_shard is not None:
        for s in index.shards:
            got = int(per_shard[s.pos]) if s is not None and s.pos < len(per_shard) else 0
            if s is not None and s.samples != got:
                bad(f"shards[{s.pos}].samples ({s.name!r}) is {s.samples:,}; {source} has {got:,} for this shard")
        for name, sp in splits.items():
            got = int(sum(per_shard[s.pos] for s in index.shards if s and s.split == name and s.pos < len(per_shard)))
            if sp.samples != got:
                bad(f"splits.{name}.samples is {sp.samples:,}; {source} has {got:,} in its shards")
    if labels is not None:
        problems += _count_diff("class_counts", index.class_counts, labels, index.classes, source)
    for name, sp in splits.items():
        by_label = (labels_by_split or {}).get(name)
        if by_label is not None:
            problems += _count_diff(f"splits.{name}.class_counts", sp.class_counts, by_label, index.classes, source)
    return problems


def _count_diff(
    path: str, stated: tuple[int, ...] | None, counted: np.ndarray, classes: tuple[str, ...] | None, source: str
) -> list[Problem]:
    if stated is None:
        return []
    if classes is not None and len(stated) != len(classes):
        return [Problem(INDEX, "count", f"{path} has {len(stated)} entries; classes has {len(classes)} names")]
    got = counted.tolist()
    got += [0] * (len(stated) - len(got))
    out = []
    if sum(got[len(stated) :]):
        out.append(
            f"{path} counts no label {len(stated)} or above; {source} has {sum(got[len(stated) :]):,} such samples"
        )
    for i, (a, b) in enumerate(zip(stated, got)):
        if a != b:
            name = f" ({classes[i]!r})" if classes is not None else ""
            out.append(f"{path}[{i}]{name} is {a:,}; {source} has {b:,} samples with label {i}")
    return [Problem(INDEX, "count", m) for m in out]


def check_class_names(index: Partial, results: list[ShardResult]) -> list[Problem]:
    """``classes`` against the class names the samples' .json carry: a label whose samples all name
    another class is one problem about ``classes``; otherwise the odd samples are named."""
    classes = index.classes
    if classes is None:
        return []
    names: dict[int, Counter] = {}
    for r in results:
        for label, c in r.names.items():
            names.setdefault(label, Counter()).update(c)
    problems = []
    for label, c in sorted(names.items()):
        if classes[label] in c:
            continue
        said, n = c.most_common(1)[0]
        hint = f" (that is classes[{classes.index(said)}]: reordered?)" if said in classes else ""
        said_by = f"the .json of the {sum(c.values()):,} sample(s) with label {label} say {said!r}{hint}"
        problems.append(Problem(INDEX, "class_name", f"classes[{label}] is {classes[label]!r}, but {said_by}"))
    odd = [p for r in results for label, p in r.misnamed if classes[label] in names.get(label, ())]
    return problems + capped(odd)


def check_sizes(index: Partial, results: list[ShardResult]) -> list[Problem]:
    """``size`` against the side every .npy header of the shards read says."""
    sides: set[int] = set().union(*(r.sides for r in results))
    if index.size is not None and len(sides) == 1 and index.size not in sides:
        return [Problem(INDEX, "image_size", f"size is {index.size}; every .npy header says {sides.pop()} px")]
    return []


def check_pixel_stats(
    index: Partial, target: Shards, jobs: list[ShardJob], results: list[ShardResult], summed: bool
) -> list[Problem]:
    """mean/std of every split and of ``stats_split``, recomputed from the pixels when every byte of
    every shard was read and ``summed``; otherwise top-level mean/std against ``splits.train`` only."""
    if not summed or target.selected or not index.shards_ok:
        return _stats_cross_check(index)
    done = {j.pos: r.pixels for j, r in zip(jobs, results)}
    sums: dict[str, list[list[int]]] = {}
    incomplete: set[str] = set()
    for s in index.shards:
        if s is None:
            continue
        px = done.get(s.pos)
        if px is None:
            incomplete.add(s.split)
            continue
        acc = sums.setdefault(s.split, [[0] * 3, [0] * 3, [0] * 3])
        for a, b in zip(acc, px):
            for c in range(3):
                a[c] += b[c]
    problems = []
    for name, sp in index.splits.items():
        if sp is None or name in incomplete or name not in sums:
            continue
        n = sum(s is not None and s.split == name for s in index.shards)
        got = mean_std(*sums[name])
        problems += _stats_problems(f"splits.{name}.", (sp.mean, sp.std), got, f"the pixels of its {n} shard(s)")
    which = [n for n in index.splits if index.stats_of in (n, "all")]
    if which and all(n in sums and n not in incomplete for n in which):
        total = [[sum(sums[n][k][c] for n in which) for c in range(3)] for k in range(3)]
        got = mean_std(*total)
        problems += _stats_problems("", (index.mean, index.std), got, f"the pixels of split {index.stats_of}")
    return problems  # (a split with a shard not read whole is not recomputed: that shard is a problem already)


def _stats_cross_check(index: Partial) -> list[Problem]:
    train = index.splits.get("train")
    if index.stats_split != "train" or train is None:
        return []
    got = (list(train.mean), list(train.std))
    return _stats_problems("", (index.mean, index.std), got, "splits.train.mean/std (stats_split is train)")


def mean_std(count: list[int], s1: list[int], s2: list[int]) -> tuple[list[float], list[float]]:
    """index.json's mean/std from each channel's pixel count, sum and sum of squares: the converter's
    ``histogram_mean_std`` exactly (its histogram products are these integers, exact in float64);
    zeros for a split without pixels, as the converter writes."""
    if not all(count):
        return [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    mean = [float(a) / n for a, n in zip(s1, count)]
    std = [math.sqrt(max(float(b) / n - m * m, 0.0)) for b, n, m in zip(s2, count, mean)]
    return [round(x / 255, 6) for x in mean], [round(x / 255, 6) for x in std]


def _stats_problems(
    path: str, stated: tuple[Any, Any], got: tuple[list[float], list[float]], what: str
) -> list[Problem]:
    """``path``.mean/std (``stated``) against the values recomputed from ``what``."""
    problems = []
    for key, told, value in (("mean", stated[0], got[0]), ("std", stated[1], got[1])):
        if told is not None and any(abs(a - b) > STATS_TOLERANCE for a, b in zip(told, value)):
            problems.append(Problem(INDEX, "pixel_stats", f"{path}{key} is {list(told)}; {what} give {value}"))
    return problems
