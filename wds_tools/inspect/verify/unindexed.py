"""The tars without an index, checked against each other: tar structure, complete samples, one
.npy header shared by all (the most common valid one is the reference), every key once."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...dataset.resolve import Shards
from ...format.npy import NPY_HEADER_BYTES, image_side_or_none
from ...format.sample import MEMBERS, MEMBERS_V1
from ...format.tar import BLOCK, scan_file, split_name, walk_headers
from ...storage.transport import basename, file_size
from .problems import MAX_PER_KIND, Problem, VerifyReport, capped, duplicate_keys
from .shards import header_problem, read_problem, walk_problems

__all__ = ["verify_scan"]


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
    except OSError as e:
        return _ScanResult(name, [read_problem(name, url, e)], [], {}, 0, 0)
    problems = walk_problems(name, walker)
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
            what = (
                f"sample {stem} has members {', '.join('.' + e for e in exts)}; expected .cls, .i32, .json, .npy once "
            )
            what += "each (format version 1: .cls, .json, .npy)"
            problems.append(Problem(name, "incomplete_sample", what, key=stem, offset=first.offset - BLOCK))
    return _ScanResult(name, capped(problems), order, headers, size, read)


def verify_scan(target: Shards, quick: bool, threads: int) -> VerifyReport:
    """Check the tars of ``target`` against each other: structure, .npy headers, unique keys."""
    report = VerifyReport(target.spec, target.folder or target.spec, None, "scan-quick" if quick else "scan")
    report.warnings.append("no index used: file sizes and sha256 cannot be checked, only the tars' structure")
    # several folders (allowed with scan): a shard is named by its URL, as names repeat across folders
    shard_label = basename if target.folder is not None else str
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(target.urls)))) as ex:
        results = list(ex.map(lambda u: _check_scan(u, quick, shard_label(u)), target.urls))
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
        report.problems += [
            header_problem(r.name, m, h, reference, None) for h, m in r.headers.items() if h != reference
        ]
        for k in r.keys:
            where.setdefault(k, []).append(r.name)
    dups = [(k, v) for k, v in where.items() if len(v) > 1]
    rest_in = dups[MAX_PER_KIND][1][0] if len(dups) > MAX_PER_KIND else ""
    report.problems += duplicate_keys(dups, len(dups), "occurs in {n} samples", rest_in)
    report.shards = len(results)
    return report
