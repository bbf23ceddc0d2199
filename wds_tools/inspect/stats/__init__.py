"""Shard statistics: balance, class drift, the rank/worker split of an epoch, mean/std and size.

``compute_stats`` is the entry point. Data flow: ``sources`` (the index, or with ``scan`` the tars,
local or through a URL) -> ``report`` (the figures and their arithmetic, ``distribute`` among them;
``to_dict`` is the ``--json`` schema) -> ``render`` (text) and ``plot`` (a PNG, with the ``plot``
extra).
"""

from __future__ import annotations

import os
import time

from ...errors import OptionError
from ...format.cpus import usable_cpus
from ...format.resolve import resolve_target
from .. import dups
from .report import StatsReport, distribute
from .sources import from_index, from_scan

__all__ = ["compute_stats"]


def compute_stats(
    path: str | os.PathLike | None = None,
    *,
    out: str | os.PathLike = "shards",
    world_size: int = 1,
    workers: int | None = None,
    scan: bool = False,
    by: str | None = None,
    group: str | None = None,
    allow_mixed: bool = False,
) -> StatsReport:
    """Statistics of a shards folder, index file or shard pattern, local or a URL (None: the newest
    version under ``out``).

    ``scan`` reads the tars instead of the index (needed when there is none; it reads every byte;
    shards of several folders are read as one set). Shards of different datasets are refused
    unless ``allow_mixed`` (then only with ``scan``: one index cannot describe them). A pattern
    naming part of a split is reported on, with a warning naming the shards it leaves out.
    ``by`` breaks each split's class counts down by a metadata column; the groups of ``group`` (default:
    the index's ``build.group``) found in more than one split are reported (both need the index).
    """
    t0 = time.perf_counter()
    workers = usable_cpus() if workers is None else workers
    distribute([], world_size, workers)  # validate before any reading
    if scan and (by is not None or group is not None):
        raise OptionError(
            f"{'--by' if by is not None else '--group'} reads the index's metadata columns; "
            "it cannot be combined with --scan"
        )
    target = resolve_target(path, out=out, scan=scan, allow_mixed=allow_mixed)
    if scan:
        report = from_scan(target, world_size, workers)
    else:
        report = from_index(target, world_size, workers, by, group)
        if target.index_base is not None and not target.selected:  # near-duplicates (issue 24): format 3 on
            report.duplicates = dups.duplicate_counts(target.index_base, limit=dups.STATS_LIMIT)
    # a part of a split is a legitimate question (which shards are these?); the report says it is a part
    report.notes = [
        f"the spec {g.describe(where=False)}: shard and sample figures are of the named "
        f"shards only (mean/std are the index's)"
        for g in target.gaps
    ]
    report.seconds = time.perf_counter() - t0
    return report
