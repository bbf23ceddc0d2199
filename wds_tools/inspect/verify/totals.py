"""The totals over every shard read, against index.json: class names, image size, and mean/std
recomputed from the pixels (the sums ``shards.check_shard`` returns per shard)."""

from __future__ import annotations

from collections import Counter

from ...format.resolve import Shards
from .index_file import IndexFacts, mean_std, stats_problems
from .report import INDEX, Problem, capped
from .shards import ShardJob, ShardResult

__all__ = ["check_class_names", "check_sizes", "check_pixel_stats"]


def check_class_names(facts: IndexFacts, results: list[ShardResult]) -> list[Problem]:
    """``classes`` against the class names the samples' .json carry: a label whose samples all name
    another class is one problem about ``classes``; otherwise the odd samples are named."""
    if facts.classes is None:
        return []
    names: dict[int, Counter] = {}
    for r in results:
        for label, c in r.names.items():
            names.setdefault(label, Counter()).update(c)
    problems = []
    for label, c in sorted(names.items()):
        if facts.classes[label] in c:
            continue
        said, n = c.most_common(1)[0]
        hint = f" (that is classes[{facts.classes.index(said)}]: reordered?)" if said in facts.classes else ""
        problems.append(
            Problem(
                INDEX,
                "class_name",
                f"classes[{label}] is {facts.classes[label]!r}, but the .json "
                f"of the {sum(c.values()):,} sample(s) with label {label} say {said!r}{hint}",
            )
        )
    odd = [p for r in results for label, p in r.misnamed if facts.classes[label] in names.get(label, ())]
    return problems + capped(odd)


def check_sizes(facts: IndexFacts, results: list[ShardResult]) -> list[Problem]:
    """``size`` against the side every .npy header of the shards read says."""
    sides = set().union(*(r.sides for r in results)) if results else set()
    if facts.size is not None and len(sides) == 1 and facts.size not in sides:
        return [Problem(INDEX, "image_size", f"size is {facts.size}; every .npy header says {sides.pop()} px")]
    return []


def check_pixel_stats(
    facts: IndexFacts, target: Shards, jobs: list[ShardJob], results: list[ShardResult], summed: bool
) -> list[Problem]:
    """mean/std of every split and of ``stats_split``, recomputed from the pixels when every byte of
    every shard was read and ``summed``; otherwise top-level mean/std against ``splits.train`` only."""
    if not summed or target.selected or not facts.shards_ok:
        return _stats_cross_check(facts)
    done = {j.pos: r.pixels for j, r in zip(jobs, results)}
    sums: dict[str, list] = {}
    incomplete: set[str] = set()
    for s in facts.shards:
        if s.split is None:
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
    for name, sp in facts.splits.items():
        if name in incomplete or name not in sums:
            continue
        problems += stats_problems(
            f"splits.{name}.",
            sp["mean"],
            sp["std"],
            mean_std(*sums[name]),
            f"the pixels of its {sum(s.split == name for s in facts.shards)} shard(s)",
        )
    which = [n for n in facts.splits if facts.stats_of in (n, "all")]
    if which and all(n in sums and n not in incomplete for n in which):
        total = [[sum(sums[n][k][c] for n in which) for c in range(3)] for k in range(3)]
        problems += stats_problems("", facts.mean, facts.std, mean_std(*total), f"the pixels of split {facts.stats_of}")
    return problems  # (a split with a shard not read whole is not recomputed: that shard is a problem already)


def _stats_cross_check(facts: IndexFacts) -> list[Problem]:
    train = facts.splits.get("train")
    if facts.stats_split != "train" or not train:
        return []
    return stats_problems(
        "",
        facts.mean,
        facts.std,
        (train["mean"] or facts.mean, train["std"] or facts.std),
        "splits.train.mean/std (stats_split is train)",
    )
