"""Prove a converted set is intact: index.json against itself, samples.npz against index.json, and every
shard's bytes against both (the bytes are the ground truth).

index.json (``format.model.salvage``: every problem) -> ``table`` (samples.npz in row blocks) -> ``shards``
(each shard once, on a thread pool) -> ``totals`` (counts, class names, mean/std from the pixels);
``problems`` holds the report. How each step works: docs/guide/inspect.md, "How verify works".
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...cpus import usable_cpus
from ...dataset.resolve import Shards, resolve_target
from ...errors import IndexFormatError
from ...format.model import Partial, salvage
from ...progress import progress as show_progress
from ...similar.dups import find_dups
from ...storage.transport import exists, join, list_tars
from .problems import INDEX, Problem, VerifyReport
from .shards import Context, ShardJob, ShardResult, check_shard, reference_header
from .table import TableFacts, check_samples_file, metadata_values, open_columns, row_columns, scan_table
from .totals import check_class_names, check_counts, check_pixel_stats, check_sizes
from .unindexed import verify_scan

__all__ = ["verify"]


# ------------------------------------------------------------------ entry point


def verify(
    path: str | os.PathLike | None = None,
    *,
    out: str | os.PathLike = "shards",
    quick: bool = False,
    scan: bool = False,
    workers: int | None = None,
    stats: bool = True,
    allow_mixed: bool = False,
    progress: bool = False,
    no_leakage: bool = False,
    phash: bool = False,
) -> VerifyReport:
    """Check every shard named by ``path`` and the index listing them; the bytes are the ground truth.

    A pattern naming part of a split is checked, with a warning naming the shards it leaves out.
    Problems found are returned in the report, not raised.

    Args:
        path: A shards folder, its index.json or a shard pattern, local or a URL; None: the newest
            version under ``out``.
        out: The root folder searched for the newest version when ``path`` is None.
        quick: Read headers, ``.cls`` and ``.json`` only (no sha256, pixels or mean/std).
        scan: Check the tars against each other without the index (also where there is none).
        workers: Threads checking shards at once; None: twice the usable CPUs.
        stats: Recompute mean/std from the pixels (about a third of a full verify's CPU).
        allow_mixed: Check shards of different datasets as one set (with ``scan`` only); refused by
            default.
        progress: Show progress on stderr (``wds_tools.progress``: a bar on a terminal, plain
            lines elsewhere).
        no_leakage: Report as a problem each near-duplicate cluster (``similar.dups``, default
            threshold) with samples in more than one split; samples too flat to hash, which no
            cluster holds, in a warning.
        phash: Also recompute each sample's perceptual hashes (samples.npz ``phash``) from its pixels
            and report those that differ (full mode; about doubles a full verify's time).

    Returns:
        A ``VerifyReport``: its ``problems`` (empty when the set is intact), warnings and counts.

    Raises:
        IndexFormatError: The index cannot be read where one is needed (an unfinished conversion's
            folder among them).
        OptionError: A spec naming no shards, or shards of different datasets without ``allow_mixed``.
    """
    t0 = time.perf_counter()
    target = resolve_target(path, out=out, scan=scan, strict=False, allow_mixed=allow_mixed)
    # twice the cores: while one thread waits for the disk another hashes (cold cache, 2 cores,
    # 1 MiB reads: 0.72 of cat's speed on 2 threads, 0.86 on 4)
    threads = workers or 2 * usable_cpus()
    if scan or target.raw is None:
        report = verify_scan(target, quick, threads)
        report.warnings += [
            f"{option} needs the index, which a scan does not read: not checked"
            for option, asked in (("--phash", phash), ("--no-leakage", no_leakage))
            if asked
        ]
    else:
        report = _verify_index(target, quick, threads, progress, stats, phash)
        if no_leakage and target.index_base is not None:
            try:
                problems, notes = _leakage(target.index_base, progress)
            except IndexFormatError as e:  # the index or table the search reads checked: reported above
                if not report.problems:
                    raise
                problems, notes = [], [f"--no-leakage: not checked: {e}"]
            report.problems += problems
            report.warnings += notes
    report.warnings[:0] = [
        f"the spec {g.describe(where=False)}: only the named shards were checked" for g in target.gaps
    ]
    report.seconds = time.perf_counter() - t0
    return report


def _leakage(folder: str, progress: bool = False) -> tuple[list[Problem], list[str]]:
    """One problem per near-duplicate cluster that crosses splits; a warning naming the samples too flat
    to hash (checked against none)."""
    found = find_dups(folder, progress=progress)
    notes = [f"--no-leakage: {found.flat_text()}"] if found.flat else []
    problems = []
    for c in (c for c in found.clusters if c.cross_split):
        splits = ", ".join(sorted({m["split"] for m in c.members}))
        what = f"near-duplicates within {found.threshold} bits in splits {splits}: "
        what += " ".join(f"{m['key']} ({m['split']})" for m in c.members[:8])
        what += f" and {len(c.members) - 8} more" if len(c.members) > 8 else ""
        problems.append(Problem(INDEX, "leakage", what, key=c.members[0]["key"]))
    return problems, notes


# ------------------------------------------------------------------ against the index


def _verify_index(
    target: Shards, quick: bool, threads: int, progress: bool, stats: bool, phash: bool = False
) -> VerifyReport:
    raw, base = target.raw, target.index_base
    if raw is None or base is None:  # (verify comes here only when the spec has an index)
        raise IndexFormatError(f"{target.spec}: no index.json lists these shards; pass --scan to check the tars")
    report = VerifyReport(target.spec, base, target.index_file, "quick" if quick else "full")
    index, found = salvage(raw)  # every problem, and what is usable despite them
    report.problems += [
        Problem(INDEX, p.kind, p.message + ("; it is not read" * (p.kind == "shard_name" and p.path != "errors_file")))
        for p in found
    ]
    table, tf, categories = None, None, None
    usable: set[str] = set()
    if index.samples_name is not None:
        url = join(base, index.samples_name)
        report.problems += check_samples_file(url, index, quick)
        table, problems = open_columns(url, index.samples_name)
        report.problems += problems
    try:
        if table is not None:
            rows, usable = table.check_format(index.format_version, index.metadata or ())
            report.problems += table.problems
            if index.metadata is not None:
                categories, problems = metadata_values(table, usable, index.metadata)
                report.problems += problems
            if "key" in usable:
                tf, problems = scan_table(table, rows, usable, index, categories)
                report.problems += problems
        if tf is not None:
            report.problems += check_counts(index, tf.rows, tf.per_shard, tf.labels, tf.labels_by_split, "samples.npz")
        else:  # no readable table: the counts can only agree with the shard list
            listed = [s.samples if s is not None else 0 for s in index.shards]
            report.problems += check_counts(
                index, sum(listed), np.array(listed, np.int64), None, None, "shards[].samples"
            )
        jobs = _jobs(target, base, index, tf, report)
        ctx = Context(
            table,
            usable,
            tf.paths_ok if tf else False,
            reference_header(index, tf),
            index.classes,
            quick,
            stats,
            index.metadata if table is not None and categories is not None else None,
            categories or {},
            index.members,
            _dataset(index),
            phash and not quick,
        )
        results = _run(jobs, ctx, threads, progress)
    except OSError as e:  # samples.npz could not be read on
        report.problems.append(Problem(index.samples_name or INDEX, "index", f"cannot read samples.npz: {e}"))
        return report
    finally:
        if table is not None:
            table.close()
    for job, r in zip(jobs, results):
        report.problems += r.problems
        report.bytes_read += r.bytes_read
        report.samples += r.samples
        report.bytes += job.bytes or 0
    report.shards = len(jobs)
    if jobs and (tf is None or tf.ranges is None or not set(row_columns(index.members)) <= usable):
        report.warnings.append(
            "samples.npz rows could not be matched to the shards (see the problems): member "
            "tables and sample contents were not compared"
        )
    report.problems += check_class_names(index, results)
    report.problems += check_sizes(index, results)
    report.problems += check_pixel_stats(index, target, jobs, results, not quick and stats)
    if not quick and not stats:
        report.warnings.append(
            "mean/std not recomputed from the pixels (stats=False / --no-stats): top-level "
            "mean/std only compared with splits.train"
        )
    if phash and quick:
        report.warnings.append("perceptual hashes not rechecked (--phash): a quick verify reads no pixels")
    elif phash and table is not None and "phash" not in usable:
        report.warnings.append(
            "perceptual hashes not rechecked (--phash): samples.npz has no usable phash column (format "
            "version 1 or 2 has none; wds-tools dups computes them from the pixels)"
        )
    if index.errors_file is not None and not exists(join(base, index.errors_file)):
        report.problems.append(
            Problem(INDEX, "field", f"errors_file names {index.errors_file}, which is not in {base}")
        )
    return report


def _dataset(index: Partial) -> dict[str, str] | None:
    """The .json fields that name the dataset (version 2 on), as every sample must hold them; None: not
    compared."""
    if index.format_version == 1 or index.dataset_version is None or index.classes_digest is None:
        return None
    return {"dataset_version": index.dataset_version, "classes_digest": index.classes_digest}


def _jobs(target: Shards, base: str, index: Partial, tf: TableFacts | None, report: VerifyReport) -> list[ShardJob]:
    """The shards to read: those the spec names whose name is safe (the others are problems already); the
    size and sha256 of an entry with a problem are not compared."""
    chosen = set(target.names or []) if target.selected else None
    jobs = []
    for pos, (name, s) in enumerate(zip(index.shard_names, index.shards)):
        if name is None or (chosen is not None and name not in chosen):
            continue
        rows = tf.ranges[pos] if tf is not None and tf.ranges is not None else None
        jobs.append(ShardJob(join(base, name), name, pos, s.bytes if s else None, s.sha256 if s else None, rows))
    if not target.selected:  # (a store that cannot list, http, is not looked at)
        indexed = {n for n in index.shard_names if n}
        extra = [n for n in list_tars(base) or [] if n not in indexed]
        if extra:
            report.warnings.append(
                f"{len(extra)} tar file(s) in the folder are not in the index (not checked): {', '.join(extra[:10])}"
            )
    return jobs


def _run(jobs: list[ShardJob], ctx: Context, threads: int, progress: bool) -> list[ShardResult]:
    with (
        ThreadPoolExecutor(max_workers=max(1, min(threads, len(jobs)))) as ex,
        show_progress(len(jobs), "verify", "shard", enabled=progress) as bar,
    ):
        results = []
        for r in ex.map(lambda j: check_shard(j, ctx), jobs):
            results.append(r)
            bar.update()
    return results
