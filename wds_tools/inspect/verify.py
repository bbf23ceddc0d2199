"""Prove a converted set is intact: index.json against itself, samples.npz against index.json, and
every shard's bytes against both (the bytes are the ground truth).

Data flow: ``verify_meta`` (index.json: fields, types, shard names confined to the folder, splits,
URL patterns) -> ``verify_table`` (samples.npz streamed in row blocks: order, ranges, counts, keys)
-> ``verify_shards`` (each shard once, on a small thread pool: size, sha256, member table, .npy
headers and XXH3-64, labels and .json metadata against its rows, pixel sums) -> this module, which
compares the totals: counts, class names, image size and mean/std recomputed from the pixels.
``quick`` reads headers, .cls and .json only (no sha256, pixels or mean/std); without an index
(``scan``) the tars are checked against each other. Every file is reached through
``format.layout``: local paths, ``s3://`` and other fsspec URLs, ``http(s)://``. A shard name in the
index that would lead outside the folder is reported and never opened.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..format.cpus import usable_cpus
from ..format.layout import Shards, basename, exists, file_size, join, list_tars, resolve_target
from ..format.npy import NPY_HEADER_BYTES, image_header, image_side_or_none
from ..format.npy import describe as describe_npy
from ..format.tar import BLOCK, scan_file, split_name, walk_headers
from .verify_meta import IndexFacts, check_counts, check_index, mean_std, stats_problems
from .verify_metadata import check_columns
from .verify_report import INDEX, MAX_PER_KIND, PROBLEM_KINDS, SCHEMA, Problem, VerifyReport, capped
from .verify_shards import Context, ShardJob, ShardResult, check_shard
from ..format.sample import MEMBERS, MEMBERS_V1
from .verify_table import TableFacts, row_columns, file_digest, open_columns, scan_table

__all__ = ["SCHEMA", "PROBLEM_KINDS", "Problem", "VerifyReport", "verify"]



# ------------------------------------------------------------------ entry point

def verify(path: str | os.PathLike | None = None, *, out: str | os.PathLike = "shards", quick: bool = False,
           scan: bool = False, threads: int | None = None, stats: bool = True, allow_mixed: bool = False,
           progress: bool = False) -> VerifyReport:
    """Check every shard named by PATH (folder, index.json, shard pattern, local or a URL; None: the
    newest version under ``out``) and the index listing them. ``stats=False``: do not recompute
    mean/std from the pixels (about a third of a full verify's CPU); ``progress`` draws a bar on stderr.
    Shards of different datasets are refused unless ``allow_mixed`` (then only with ``scan``, which
    checks the tars of several folders as one set); a pattern naming part of a split is checked,
    with a warning naming the shards it leaves out."""
    t0 = time.perf_counter()
    target = resolve_target(path, out=out, scan=scan, strict=False, allow_mixed=allow_mixed)
    # twice the cores: while one thread waits for the disk another hashes (cold cache, 2 cores,
    # 1 MiB reads: 0.72 of cat's speed on 2 threads, 0.86 on 4)
    threads = threads or 2 * usable_cpus()
    if scan or target.meta is None:
        report = _verify_scan(target, quick, threads)
    else:
        report = _verify_index(target, quick, threads, progress, stats)
    report.warnings[:0] = [f"the spec {g.describe(where=False)}: only the named shards were checked"
                           for g in target.gaps]
    report.seconds = time.perf_counter() - t0
    return report


# ------------------------------------------------------------------ against the index

def _verify_index(target: Shards, quick: bool, threads: int, progress: bool, stats: bool) -> VerifyReport:
    meta, base = target.meta, target.index_base
    report = VerifyReport(target.spec, base, target.index_file, "quick" if quick else "full")
    facts, problems = check_index(meta)
    report.problems += problems
    table, usable, tf, categories = None, set(), None, None
    if facts.samples_name is not None:
        url = join(base, facts.samples_name)
        report.problems += _samples_file(url, facts, quick)
        table, problems = open_columns(url, facts.samples_name)
        report.problems += problems
    try:
        if table is not None:
            rows, usable = table.check_format(facts.columns)
            report.problems += table.problems
            categories = None
            if facts.metadata is not None:
                ok, found, problems = check_columns(table, rows, facts.metadata)
                report.problems += problems
                categories = found if ok else None
            if "key" in usable:
                tf, problems = scan_table(table, rows, usable, facts, categories)
                report.problems += problems
        if tf is not None:
            report.problems += check_counts(facts, tf.rows, tf.per_shard, tf.labels, tf.labels_by_split,
                                            "samples.npz")
        else:  # no readable table: the counts can only agree with the shard list
            listed = [s.samples or 0 for s in facts.shards]
            report.problems += check_counts(facts, sum(listed), np.array(listed, np.int64), None, None,
                                            "shards[].samples")
        jobs = _jobs(target, facts, tf, report)
        ctx = Context(table, usable, tf.paths_ok if tf else False, _reference_header(facts, tf), facts.classes, quick,
                      stats, facts.metadata if table is not None and categories is not None else None,
                      categories or {}, facts.members, facts.dataset)
        results = _run(jobs, ctx, threads, progress)
    except OSError as e:  # samples.npz could not be read on
        report.problems.append(Problem(facts.samples_name or INDEX, "index", f"cannot read samples.npz: {e}"))
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
    if jobs and (tf is None or tf.ranges is None or not set(row_columns(facts.members)) <= usable):
        report.warnings.append("samples.npz rows could not be matched to the shards (see the problems): member "
                               "tables and sample contents were not compared")
    report.problems += _class_names(facts, results)
    report.problems += _sizes(facts, results)
    report.problems += _pixel_stats(facts, target, jobs, results, not quick and stats)
    if not quick and not stats:
        report.warnings.append("mean/std not recomputed from the pixels (stats=False / --no-stats): top-level "
                               "mean/std only compared with splits.train")
    if facts.errors_file is not None and not exists(join(base, facts.errors_file)):
        report.problems.append(Problem(INDEX, "field", f"errors_file names {facts.errors_file}, which is not in "
                                                       f"{base}"))
    return report


def _samples_file(url: str, facts: IndexFacts, quick: bool) -> list[Problem]:
    """samples.npz's size, and its sha256 unless quick (read in chunks, never whole)."""
    name = facts.samples_name
    try:
        size = file_size(url)
        if facts.samples_bytes is not None and size != facts.samples_bytes:
            return [Problem(name, "index", f"{size:,} bytes, index.json says {facts.samples_bytes}")]
        digest = None if quick else file_digest(url)
    except FileNotFoundError:
        return []  # open_columns names it
    except OSError as e:
        return [Problem(name, "index", f"cannot read {url}: {e.strerror or e}")]
    if digest is not None and facts.samples_sha256 is not None and digest != facts.samples_sha256:
        return [Problem(name, "index", f"sha256 {digest[:16]}..., index.json says {str(facts.samples_sha256)[:16]}...")]
    return []


def _jobs(target: Shards, facts: IndexFacts, tf: TableFacts | None, report: VerifyReport) -> list[ShardJob]:
    """The shards to read: those the spec names whose name is safe (the others are problems already)."""
    chosen = set(target.names or []) if target.selected else None
    jobs = []
    for s in facts.shards:
        if s.name is None or (chosen is not None and s.name not in chosen):
            continue
        rows = tf.ranges[s.pos] if tf is not None and tf.ranges is not None else None
        jobs.append(ShardJob(join(target.index_base, s.name), s.name, s.pos, s.bytes, s.sha256, rows))
    if not target.selected:  # (a store that cannot list, http, is not looked at)
        indexed = {s.name for s in facts.shards if s.name}
        extra = [n for n in list_tars(target.index_base) or [] if n not in indexed]
        if extra:
            report.warnings.append(f"{len(extra)} tar file(s) in the folder are not in the index "
                                   f"(not checked): {', '.join(extra[:10])}")
    return jobs


def _reference_header(facts: IndexFacts, tf: TableFacts | None) -> bytes | None:
    """The .npy header members are compared with: of the size samples.npz's npy_length says when
    uniform (a wrong ``size`` is then one problem, not one per sample), else of ``size``."""
    side = (tf.npy_size if tf is not None else None) or facts.size or (facts.npy_shape or [None])[0]
    return image_header(side) if side else None


def _run(jobs: list[ShardJob], ctx: Context, threads: int, progress: bool) -> list[ShardResult]:
    from tqdm import tqdm

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(jobs)))) as ex, \
            tqdm(total=len(jobs), desc="verify", unit="shard", disable=not progress, dynamic_ncols=True) as bar:
        results = []
        for r in ex.map(lambda j: check_shard(j, ctx), jobs):
            results.append(r)
            bar.update()
    return results


def _class_names(facts: IndexFacts, results: list[ShardResult]) -> list[Problem]:
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
        hint = (f" (that is classes[{facts.classes.index(said)}]: reordered?)" if said in facts.classes else "")
        problems.append(Problem(INDEX, "class_name", f"classes[{label}] is {facts.classes[label]!r}, but the .json "
                                f"of the {sum(c.values()):,} sample(s) with label {label} say {said!r}{hint}"))
    odd = [p for r in results for label, p in r.misnamed if facts.classes[label] in names.get(label, ())]
    return problems + capped(odd)


def _sizes(facts: IndexFacts, results: list[ShardResult]) -> list[Problem]:
    sides = set().union(*(r.sides for r in results)) if results else set()
    if facts.size is not None and len(sides) == 1 and facts.size not in sides:
        return [Problem(INDEX, "image_size", f"size is {facts.size}; every .npy header says {sides.pop()} px")]
    return []


def _pixel_stats(facts: IndexFacts, target: Shards, jobs: list[ShardJob], results: list[ShardResult],
                 summed: bool) -> list[Problem]:
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
        problems += stats_problems(f"splits.{name}.", sp["mean"], sp["std"], mean_std(*sums[name]),
                                   f"the pixels of its {sum(s.split == name for s in facts.shards)} shard(s)")
    which = [n for n in facts.splits if facts.stats_of in (n, "all")]
    if which and all(n in sums and n not in incomplete for n in which):
        total = [[sum(sums[n][k][c] for n in which) for c in range(3)] for k in range(3)]
        problems += stats_problems("", facts.mean, facts.std, mean_std(*total),
                                   f"the pixels of split {facts.stats_of}")
    return problems  # (a split with a shard not read whole is not recomputed: that shard is a problem already)


def _stats_cross_check(facts: IndexFacts) -> list[Problem]:
    train = facts.splits.get("train")
    if facts.stats_split != "train" or not train:
        return []
    return stats_problems("", facts.mean, facts.std, (train["mean"] or facts.mean, train["std"] or facts.std),
                          "splits.train.mean/std (stats_split is train)")


# ------------------------------------------------------------------ without an index

def _capture_npy(name: str) -> int:
    return NPY_HEADER_BYTES if name.endswith(".npy") else 0


@dataclass
class _ScanResult:
    name: str
    problems: list[Problem]
    keys: list[str]
    headers: dict[bytes, str]  # distinct .npy headers -> first member with it
    bytes: int
    bytes_read: int


def _check_scan(url: str, quick: bool, name: str) -> _ScanResult:
    try:
        if quick:
            walker = walk_headers(url, _capture_npy)
            size, read = walker.pos, len(walker.members) * BLOCK
        else:
            file_size(url)  # a missing file is named as such before a stream (gopen) would hide it
            walker = scan_file(url, _capture_npy)
            size = read = walker.pos
    except FileNotFoundError:
        return _ScanResult(name, [Problem(name, "missing", f"{url} does not exist")], [], {}, 0, 0)
    except OSError as e:
        return _ScanResult(name, [Problem(name, "unreadable", f"cannot read {url}: {e.strerror or e}")],
                           [], {}, 0, 0)
    problems = []
    if walker.error:
        kind = "truncated" if walker.error.startswith("truncated") else "tar_header"
        problems.append(Problem(name, kind, walker.error, offset=walker.error_offset))
    groups: dict[str, list] = {}
    order: list[str] = []
    headers: dict[bytes, str] = {}
    for m in walker.members:
        stem, ext = split_name(m.name)
        stem, ext = (m.name, "") if stem is None else (stem, ext)  # a name without an extension
        if stem not in groups:
            groups[stem] = []
            order.append(stem)
        groups[stem].append((ext, m))
        if ext == "npy":
            headers.setdefault(m.data, m.name)
    last = order[-1] if walker.error and order else None
    for stem in order:
        exts = [e for e, _ in groups[stem]]
        if sorted(exts) not in (sorted(MEMBERS), sorted(MEMBERS_V1)) and stem != last:
            first = groups[stem][0][1]
            problems.append(Problem(name, "incomplete_sample", f"sample {stem} has members "
                                    f"{', '.join('.' + e for e in exts)}; expected .cls, .i32, .json, .npy once "
                                    "each (format version 1: .cls, .json, .npy)",
                                    key=stem, offset=first.offset - BLOCK))
    return _ScanResult(name, capped(problems), order, headers, size, read)


def _verify_scan(target: Shards, quick: bool, threads: int) -> VerifyReport:
    report = VerifyReport(target.spec, target.folder or target.spec, None, "scan-quick" if quick else "scan")
    report.warnings.append("no index used: file sizes and sha256 cannot be checked, only the tars' structure")
    # several folders (allowed with scan): a shard is named by its URL, as names repeat across folders
    name = basename if target.folder is not None else str
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(target.urls)))) as ex:
        results = list(ex.map(lambda u: _check_scan(u, quick, name(u)), target.urls))
    # the .npy header most samples share is the reference (|u1 [S, S, 3])
    counts: Counter = Counter()
    for r in results:
        counts.update(r.headers.keys())
    valid = [h for h, _ in counts.most_common() if image_side_or_none(h) is not None]
    reference = valid[0] if valid else None
    where: dict[str, list[str]] = {}
    for r in results:
        report.problems += r.problems
        report.bytes += r.bytes
        report.bytes_read += r.bytes_read
        report.samples += len(r.keys)
        for h, member in r.headers.items():
            if h != reference:
                expected = describe_npy(reference) if reference else "dtype |u1, shape [S, S, 3]"
                report.problems.append(Problem(r.name, "npy_header", f"{member}: the header says {describe_npy(h)}; "
                                               f"expected {expected}", key=split_name(member)[0]))
        for k in r.keys:
            where.setdefault(k, []).append(r.name)
    dups = [(k, v) for k, v in where.items() if len(v) > 1]
    for k, shards in dups[:MAX_PER_KIND]:
        for name in sorted(set(shards)):
            report.problems.append(Problem(name, "duplicate_key", f"key {k} occurs in {len(shards)} samples "
                                           f"({', '.join(sorted(set(shards)))})", key=k))
    if len(dups) > MAX_PER_KIND:
        report.problems.append(Problem(dups[MAX_PER_KIND][1][0], "duplicate_key",
                                       f"... and {len(dups) - MAX_PER_KIND} more duplicated keys"))
    report.shards = len(results)
    return report
