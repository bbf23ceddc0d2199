"""Shard statistics: balance, class drift, the rank/worker split of an epoch, mean/std and size.

``compute_stats``: ``collect`` (from the index, or with ``scan`` the tars, local or a URL) -> ``figures`` (the
figures and their arithmetic; ``to_dict`` is the ``--json`` schema) -> ``render`` (text) and ``plot`` (a PNG,
the ``plot`` extra).
"""

from __future__ import annotations

import os
import time

from ...cpus import usable_cpus
from ...dataset.resolve import Shards, resolve_target
from ...errors import OptionError
from ...similar import dups
from ...storage.transport import readable_by_offset
from .collect import from_index, from_scan
from .figures import READERS, StatsReport, distribute

__all__ = ["compute_stats", "model_reader"]


def compute_stats(
    path: str | os.PathLike | None = None,
    *,
    out: str | os.PathLike = "shards",
    world_size: int = 1,
    workers: int | None = None,
    reader: str = "auto",
    scan: bool = False,
    by: str | None = None,
    group: str | None = None,
    allow_mixed: bool = False,
    progress: bool = False,
) -> StatsReport:
    """Statistics of converted shards: balance, class drift, the rank/worker split of an epoch, mean/std, size.

    A pattern naming part of a split is reported on, with a note naming the shards it leaves out.

    Args:
        path: A shards folder, its index.json or a shard pattern, local or a URL; None: the newest
            version under ``out``.
        out: The root folder searched for the newest version when ``path`` is None.
        world_size: The ranks (processes) of the training run whose epoch split is modelled.
        workers: DataLoader workers per rank in that model; None: the usable CPUs.
        reader: The training reader modelled: ``"index"`` (samples dealt to ranks, batches to
            workers), ``"stream"`` (whole shards dealt to ranks and workers) or ``"auto"``: the one
            ``make_loader`` picks, the index reader where an index lists the shards and they can
            be read by offset (``model_reader``).
        scan: Read the tars instead of the index (needed when there is none; it reads every byte;
            shards of several folders are read as one set).
        by: A metadata column by which each split's class counts are broken down (needs the index).
        group: A column whose groups found in more than one split are reported; None: the
            index's ``build.group`` (needs the index).
        allow_mixed: Read shards of different datasets as one set (with ``scan`` only: one index
            cannot describe them); refused by default.
        progress: Show the near-duplicate search's progress on stderr when it runs long.

    Returns:
        A ``StatsReport``; its ``to_dict()`` is the ``--json`` schema.

    Raises:
        OptionError: ``world_size`` or ``workers`` out of range, ``by``/``group`` with ``scan``, a
            spec naming no shards, or shards of different datasets without ``allow_mixed``.
        IndexFormatError: No readable index where one is needed (an unfinished conversion's folder
            among them).
        ShardError: A shard is missing or unreadable (with ``scan``).
    """
    t0 = time.perf_counter()
    workers = usable_cpus() if workers is None else workers
    if reader not in ("auto", *READERS):
        raise OptionError(f"reader {reader!r}: expected auto, {', '.join(READERS)} (make_loader's reader=)")
    distribute([], world_size, workers)  # validate before any reading
    if scan and (by is not None or group is not None):
        raise OptionError(
            f"{'--by' if by is not None else '--group'} reads the index's metadata columns; "
            "it cannot be combined with --scan"
        )
    target = resolve_target(path, out=out, scan=scan, allow_mixed=allow_mixed)
    reader = model_reader(target, scan) if reader == "auto" else reader
    if scan:
        report = from_scan(target, world_size, workers, reader)
    else:
        report = from_index(target, world_size, workers, by, group, reader)
        if target.index_base is not None and not target.selected:  # near-duplicates (issue 24): format 3 on
            report.duplicates = dups.duplicate_counts(target.index_base, limit=dups.STATS_LIMIT, progress=progress)
    # a part of a split is a legitimate question (which shards are these?); the report says it is a part
    report.partial = bool(target.gaps)
    report.notes = [
        f"the spec {g.describe(where=False)}: shard and sample figures are of the named "
        f"shards only (mean/std are the index's)"
        for g in target.gaps
    ]
    report.seconds = time.perf_counter() - t0
    return report


def model_reader(target: Shards, scan: bool) -> str:
    """The reader ``make_loader(reader="auto")`` uses for these shards (``training_adapter.loader``):
    the index reader when an index.json lists them and every URL can be read by offset, else
    streaming. ``scan`` (the tars read without the index) models streaming, as a loader given only
    the tars would read them."""
    if not scan and target.info is not None and all(readable_by_offset(u) for u in target.urls):
        return "index"
    return "stream"
