"""Convert a corpus into versioned shards: scan -> plan -> write -> index, for one size or several.

Several sizes share the scan and one read and decode of each source: the largest size's shards
are written first, its decode also yields the other sizes' pixels (spilled, see spill.py), and
each other size is then written from them in its own plan order.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import READ_ONLY_ERRNOS, TooManyErrorsError, WdsToolsError, read_only_error
from ..format.index import ERRORS_FILE, WORK_DIR, read_sample_table
from ..format.sample import classes_digest
from ..progress import progress as show_progress
from ..similar.near import DEFAULT_THRESHOLD
from ..storage.fsutil import dumps_canonical
from ..storage.objects import Store
from ..storage.transport import join
from ..version import __version__
from . import sourcecache as hashes
from .decode import decoder_versions
from .dedup import known_hashes, near_rows
from .indexwrite import errors_order, write_errors
from .lock import FolderLock, lock_folders, release_all
from .outfolder import Target, finished_meta, prepare_dest, select_base, spec, task_digest
from .plan import plan_split
from .publish import ErrorGate, clean_after_index, clean_complete_folder, finish_size
from .reuse import Base
from .runner import Runner, make_runner
from .scan import Check, Checked, Scanned, SourceStat, check_sources, scan_files
from .schedule import shared_bytes, write_shards
from .source import Source, SourceRow, dedup_notes, read_source, with_other_extensions
from .space import DISK_FULL_ERRNOS, disk_full_error
from .spill import SPILL_DIR, load_spill
from .splitbase import find_split_base
from .summary import ConvertResult, ConvertResults, base_text, count, dry_run_result, result_from_index
from .write import SampleTask, ShardTask

if TYPE_CHECKING:
    from .options import ConvertOptions

__all__ = ["convert_with"]

_SCAN_CHUNK = 256  # rows per header-scan or stat task at most
_HASH_CHUNK = 32  # rows per fingerprint task at most when files are read whole
_LISTED_FAILURES = 10  # failures the summary names (result.first_failures)


def convert_with(source: str | os.PathLike, opts: ConvertOptions) -> ConvertResult | ConvertResults:
    """``convert`` with its options already made and checked: one result per size, as ``convert`` returns."""
    t0 = time.perf_counter()
    version = opts.version
    split_base = (
        find_split_base(opts.out_root, version, opts.sides, opts.base, opts.group)
        if opts.draws_units and not opts.resplit
        else None
    )
    near = None
    if opts.dedup:  # the split base's stored hashes spare the decode of unchanged sources
        wanted = {
            "size": opts.sides[0],
            "resize": opts.resize,
            "decode": opts.decode.to_dict(),
            "decoder_versions": decoder_versions(),
        }
        known = known_hashes(opts.out_root, split_base.version, wanted) if split_base is not None else None
        near = near_rows(opts.sides[0], opts.resize, opts.decode, DEFAULT_THRESHOLD, known)
    src = read_source(source, opts, split_base=split_base, near=near)
    stores = [Store(join(opts.out_root, version, str(side))) for side in opts.sides]
    # one writer per folder, taken before the folder's state is read; a dry run writes nothing
    try:
        locks = [] if opts.dry_run else lock_folders(stores)
    except OSError as e:
        if e.errno not in READ_ONLY_ERRNOS:
            raise
        return _read_only(src, opts, stores, e, t0)
    try:
        targets = []
        held: list[FolderLock | None] = list(locks) or [None] * len(opts.sides)
        for side, store, lock in zip(opts.sides, stores, held):
            # a complete folder an interrupted run left unclean is cleaned by any run
            unclean = clean_complete_folder(store) if lock is not None else False
            t = _target(src, opts, side, store)
            t.result.notes += src.notes  # nothing silent: manifest rows on several lines, quotes kept as written
            if src.dedup is not None:  # nothing silent: what --dedup changed
                t.result.notes += dedup_notes(src)
            if lock is not None and lock.taken_over is not None and t.state != "fresh":
                t.result.notes.append(f"resumed the conversion of {lock.taken_over.describe()}, which was interrupted")
            targets.append(t)
            if unclean:
                _cleaned(t, src, out=opts.out_root, version=version)
        for t in targets:
            if t.state == "complete":
                _already_complete(t, src, t0)
        todo = [t for t in targets if t.state != "complete"]
        if todo:
            _convert_todo(src, todo, opts, t0)
    finally:
        release_all(locks)
    return _results([t.result for t in targets], t0)


def _results(results: list[ConvertResult], t0: float) -> ConvertResult | ConvertResults:
    """One result per size, as ``convert`` returns them."""
    return results[0] if len(results) == 1 else ConvertResults(results, round(time.perf_counter() - t0, 3))


def _target(src: Source, opts: ConvertOptions, side: int, store: Store) -> Target:
    """One size of the conversion: its spec, its folder's state (``prepare_dest``), its result begun."""
    sp = spec(src, opts, side)
    state, done_meta = prepare_dest(store, sp)  # a folder not there yet is fresh
    result = ConvertResult(
        out_dir=str(store.root),
        dataset_version=opts.version,
        size=side,
        max_errors_allowed=opts.allowed_errors(len(src.rows)),
        dry_run=opts.dry_run,
        checksum=opts.checksum,
        resplit=opts.resplit,
        skipped=list(src.skipped),
    )
    return Target(side, store, sp, state, done_meta, result, opts.samples_per_shard(side))


def _read_only(
    src: Source, opts: ConvertOptions, stores: list[Store], e: OSError, t0: float
) -> ConvertResult | ConvertResults:
    """The folders cannot be written (not even the lock): "nothing to do" when every one is complete with
    these options, read without writing a byte; else the one-line refusal naming the folder."""
    results = []
    for side, store in zip(opts.sides, stores):
        t = _target(src, opts, side, store)
        if t.state != "complete":
            raise read_only_error(store.root, e, "write the conversion") from None
        _already_complete(t, src, t0)
        t.result.notes.append("the folder is read-only: read, nothing written")
        results.append(t.result)
    return _results(results, t0)


def _convert_todo(src: Source, todo: list[Target], opts: ConvertOptions, t0: float) -> None:
    for t in todo:
        t.base = select_base(opts, t.side, decoder_versions())
        t.result.base = t.base.version if t.base is not None else None
        t.result.base_rule = None if t.base is None else "from" if opts.base is not None else "newest"
        if t.base is not None and opts.progress:  # said before the work, as the summary's first line says it
            print(f"convert {opts.version}/{t.side}: {base_text(t.base.version, t.result.base_rule)}", file=sys.stderr)
    # the runner before anything is written: a missing extra (Ray) leaves nothing behind
    runner = make_runner(opts.executor, opts.workers, opts.ray_address, shared_bytes(opts.workers or 1))
    try:
        if not opts.dry_run:
            for t in todo:
                t.store.makedirs(t.work)
                t.store.write_bytes(join(t.work, "run.json"), (dumps_canonical(t.spec) + "\n").encode())
        _run(src, todo, runner, opts, t0)
    except BrokenProcessPool:
        runner.close(cancel=True)
        raise WdsToolsError(
            "a worker process died (killed, or out of memory?); finished shards are kept. "
            "Run the same command again to resume, with fewer --workers if memory is short."
        ) from None
    except OSError as e:
        runner.close(cancel=True)
        if e.errno in DISK_FULL_ERRNOS:
            raise disk_full_error(todo, e, len(src.rows)) from None
        if e.errno in READ_ONLY_ERRNOS:
            raise read_only_error(todo[0].store.root, e, "write the conversion") from None
        raise
    except BaseException:
        runner.close(cancel=True)
        raise
    finally:
        runner.close()


def _cleaned(t: Target, src: Source, *, out: str, version: str) -> None:
    """``t``'s folder was complete but unclean (a run killed after its index.json) and has been cleaned."""
    t.result.notes.append(
        f"removed what an interrupted run left after writing the index ({WORK_DIR}/, temporary files)"
    )
    if t.state == "complete" and not t.store.remote and any(r.content_hash for r in src.rows):
        # the same source: save the manifest-hash pairs the killed run may not have saved
        assert t.done_meta is not None  # a complete folder has its index meta
        clean_after_index(t.store, src, t.done_meta, out=out, version=version)


def _already_complete(t: Target, src: Source, t0: float) -> None:
    result, store = t.result, t.store
    assert t.done_meta is not None  # a complete folder has its index meta
    result_from_index(result, store, t.done_meta, drawn=not src.split_given)
    errors = store.join(ERRORS_FILE)
    result.errors_file = errors if store.exists(errors) else None
    if result.errors_file:
        lines = [json.loads(line) for line in store.read_bytes(errors).splitlines() if line.strip()]
        result.narrow_pixels = [e for e in lines if e.get("stage") == "pixels"]
        failed = [e for e in lines if e.get("stage") != "pixels"]
        result.failed, result.failures = len(failed), failed[:_LISTED_FAILURES]  # as errors.jsonl has them
    result.already_complete = True
    result.seconds = round(time.perf_counter() - t0, 3)


def _scan(
    rows: list[SourceRow],
    runner: Runner,
    base: Base | None,
    pairs: dict[str, bytes],
    opts: ConvertOptions,
) -> tuple[list[str | None], list[SourceStat], dict[str, int]]:
    """Check every source; with a base, also decide which are unchanged (reading as few as it can).

    Returns (error or None, the source's stat per row, counts).
    """
    errors: list[str | None] = [None] * len(rows)
    stats: list[SourceStat] = [SourceStat(None, 0, 0)] * len(rows)
    counts = {"unchanged_by_stat": 0, "unchanged_by_hash": 0, "sources_read": 0}
    checksum = opts.checksum
    fn: Callable[..., list[Scanned]] | Callable[..., list[Checked]]
    items: list[str] | list[Check]
    if base is None:
        fn, most = scan_files, _SCAN_CHUNK
        items = [r.path for r in rows]
    else:
        checks: list[Check] = []
        quick: dict[int, bytes] = {}
        for k, r in enumerate(rows):
            by_hash = not checksum and r.content_hash is not None and r.content_hash in pairs
            trusted = None
            if not checksum and r.content_hash is None:
                found = base.trusted_stat(r.path, r.source_path)
                if found is not None:
                    trusted, quick[k] = (found[0], found[1]), found[2]
            checks.append(Check(r.path, trusted, by_hash, r.content_hash))
        fn, items = check_sources, checks
        # files read whole make slow tasks: keep those small, stat-only ones large
        most = (
            _HASH_CHUNK
            if checksum or sum(1 for c in checks if c.stat_only or c.trusted) < len(checks) // 2
            else _SCAN_CHUNK
        )
    chunk = max(1, min(most, -(-len(rows) // (4 * runner.workers))))  # every worker gets some
    starts = list(range(0, len(rows), chunk))
    with show_progress(len(rows), "scan" if base is None else "compare", "file", enabled=opts.progress) as bar:

        def on_result(j: int, out: Sequence[Scanned | Checked]) -> None:
            for k, res in enumerate(out, starts[j]):
                if isinstance(res, Scanned):
                    errors[k], stats[k] = res.error, SourceStat(None, res.src_nbytes, res.src_mtime_ns)
                    continue
                fp = res.fingerprint
                if res.error is None and not res.read:
                    content_hash = rows[k].content_hash
                    if checks[k].stat_only and content_hash is not None:
                        fp = pairs[content_hash]
                        counts["unchanged_by_hash"] += 1
                    else:
                        fp = quick[k]
                        counts["unchanged_by_stat"] += 1
                elif res.read:
                    counts["sources_read"] += 1
                errors[k], stats[k] = res.error, SourceStat(fp, res.src_nbytes, res.src_mtime_ns)
            bar.update(len(out))

        runner.map(fn, [(items[i : i + chunk], opts.decode) for i in starts], on_result)
    return errors, stats, counts


def _run(src: Source, todo: list[Target], runner: Runner, opts: ConvertOptions, t0: float) -> None:
    rows = src.rows
    # 1. scan: header checks (and, against a base, which sources are unchanged), shared by all sizes
    scan_base = next((t.base for t in todo if t.base is not None), None)
    pairs = {}
    if scan_base is not None and not opts.checksum and any(r.content_hash for r in rows):
        pairs = hashes.load_pairs(opts.out_root, scan_base.version)
    scan, stats, counts = _scan(rows, runner, scan_base, pairs, opts)
    scan = [r.error if r.error is not None else err for r, err in zip(rows, scan)]  # a template's empty cell
    scan = with_other_extensions(src, scan)  # a missing images/x.jpg names images/x.png beside it
    failures = [
        {"key": r.key, "path": r.source_path, "line": r.line, "stage": "scan", "error": err}
        for r, err in zip(rows, scan)
        if err is not None
    ]
    for t in todo:
        if t.base is not None:
            for k, v in counts.items():
                setattr(t.result, k, v)
    allowed = todo[0].result.max_errors_allowed
    if len(failures) > allowed and not opts.dry_run:
        names = []
        for t in todo:
            names.append(write_errors(t.store, failures, folder=src.kind == "image-folder"))
            if not [n for n in t.store.names(t.work) if n != "run.json" and not n.startswith("run.json.tmp")]:
                t.store.rmtree(t.work)  # nothing to resume: the folder may be used for a corrected manifest
        raise TooManyErrorsError(
            f"{len(failures)} of {count(len(rows), 'source file')} are unreadable, more than --max-errors allows "
            f"({allowed}); nothing was converted. The files and reasons are in {', '.join(map(str, names))}. "
            f"First: {failures[0]['path']}: {failures[0]['error']}"
        )

    # 2. plan: a pure function of the good rows per size, whatever a base holds
    good = [i for i, err in enumerate(scan) if err is None]
    for t in todo:
        t.tasks = _plan(src, good, stats, t, opts)
        if t.base is not None:
            t.result.removed = t.base.removed({r.key for r in rows})
    if opts.dry_run:
        for t in todo:
            dry_run_result(t.result, t.tasks, failures, t0, src.kind == "image-folder")
        return

    # 3. write: the largest size first; its decodes also give the other sizes' pixels
    for t in todo:
        t.metas = {task.name: m for task in t.tasks if (m := finished_meta(t.store, task)) is not None}
    first, others = todo[0], todo[1:]
    for t in todo:  # pixels an interrupted multi-size run already decoded for a size are kept
        t.tasks = _with_spill(t, rows, stats)
    if others:
        need = {
            o.side: {s.key for task in o.tasks if task.name not in o.metas for s in task.samples if s.reuse is None}
            for o in others
        }
        spill = tuple((o.side, join(o.work, SPILL_DIR)) for o in others if need[o.side])
        first.tasks = (
            [
                replace(
                    task,
                    spill=spill,
                    samples=tuple(
                        replace(s, also=tuple(side for side, _ in spill if s.key in need[side])) for s in task.samples
                    ),
                )
                for task in first.tasks
            ]
            if spill
            else first.tasks
        )
        first.result.shared_decode = [o.side for o in others]
    _write(first, src, runner, failures, opts, t0)
    for o in others:
        o.tasks = _with_spill(o, rows, stats)
        o.result.shared_decode = [first.side]
        _write(o, src, runner, failures, opts, t0)


def _with_spill(t: Target, rows: list[SourceRow], stats: list[SourceStat]) -> list[ShardTask]:
    """``t``'s tasks, where a sample the base does not hold copies the pixels spilled for it, if its
    source still has the path, size and mtime it had when it was decoded (a later run may find it changed)."""
    now = {r.key: (r.source_path, stats[i].src_nbytes, stats[i].src_mtime_ns) for i, r in enumerate(rows)}
    spilled = load_spill(t.store, join(t.work, SPILL_DIR))

    def pixels(s: SampleTask) -> SampleTask:
        sp = spilled.get(s.key) if s.reuse is None else None
        if sp is None or now.get(s.key) != (sp.source_path, sp.src_nbytes, sp.src_mtime_ns):
            return s
        return replace(s, reuse=sp.reuse, src_nbytes=sp.src_nbytes, src_mtime_ns=sp.src_mtime_ns)

    return [replace(task, samples=tuple(map(pixels, task.samples))) for task in t.tasks] if spilled else t.tasks


def _plan(src: Source, good: list[int], stats: list[SourceStat], t: Target, opts: ConvertOptions) -> list[ShardTask]:
    rows, labels = src.rows, src.label_index()
    spec_digest = hashlib.sha256(dumps_canonical(t.spec).encode()).hexdigest()
    by_split: dict[str, list[int]] = {}
    for i in good:
        by_split.setdefault(rows[i].split, []).append(i)
    tasks: list[ShardTask] = []
    for split in sorted(by_split):
        members = by_split[split]
        for plan in plan_split(
            split, [(rows[i].key, labels[rows[i].label]) for i in members], shard_size=t.shard_samples, seed=opts.seed
        ):
            samples = []
            for i in (members[j] for j in plan.members):
                r, (fp, src_nbytes, mtime) = rows[i], stats[i]
                samples.append(
                    SampleTask(
                        r.key,
                        r.path,
                        r.source_path,
                        labels[r.label],
                        r.label,
                        r.line,
                        r.original_key,
                        reuse=t.base.reuse(fp, r.label, r.key) if t.base is not None and fp is not None else None,
                        src_nbytes=src_nbytes,
                        src_mtime_ns=mtime,
                        content_hash=r.content_hash,
                        meta=src.meta_items(r),
                    )
                )
            tasks.append(
                ShardTask(
                    t.store.root,
                    t.work,
                    plan.name,
                    split,
                    task_digest(spec_digest, plan.name, samples),
                    t.side,
                    opts.resize,
                    opts.decode,
                    tuple(samples),
                    dataset_version=t.spec["dataset_version"],
                    classes_digest=classes_digest(src.classes),
                )
            )
    return tasks


def _write(t: Target, src: Source, runner: Runner, scan_failures: list[dict], opts: ConvertOptions, t0: float) -> None:
    """Write ``t``'s pending shards (those a previous run finished are kept), then its index."""
    result, store = t.result, t.store
    result.shards_resumed = len(t.metas)
    result.samples_resumed = sum(m["samples"] for m in t.metas.values())
    pending = [task for task in t.tasks if task.name not in t.metas]
    gate = ErrorGate(t, src, scan_failures)
    gate.check()  # the shards kept from an earlier run may already hold too many failures

    def done(task: ShardTask, meta: dict) -> None:
        t.metas[task.name] = meta
        gate.check()

    t_write = time.perf_counter()
    label = f"convert {t.side}" + (
        f"+{'+'.join(str(side) for side, _ in pending[0].spill)}" if pending and pending[0].spill else ""
    )
    with show_progress(sum(len(task.samples) for task in pending), label, "img", enabled=opts.progress) as bar:
        write_shards(pending, runner, done, bar.update)
    write_seconds = time.perf_counter() - t_write
    for task in pending:
        meta = t.metas[task.name]
        for k in ("decoded", "reused", "relabeled"):
            setattr(result, k, getattr(result, k) + meta["counts"][k])
        result.decodes += meta.get("decodes", 0)
        result.reuse_problems += meta["reuse_problems"]

    # 4. index: written last, from the per-shard columns; then the clean-up (finish.py)
    failures = gate.failures()
    narrow = [w for task in t.tasks for w in t.metas[task.name].get("narrow", [])]
    result.narrow_pixels = errors_order(narrow, src.kind == "image-folder")
    provenance = {"version": __version__, "decoder_versions": decoder_versions()}  # looked up here: the
    info = finish_size(
        t,
        src,
        failures + result.narrow_pixels,
        out=opts.out_root,  # golden test pins
        version=opts.version,
        provenance=provenance,
    )
    result_from_index(result, store, info, drawn=not src.split_given)
    if t.base is not None:  # the version against its base by key, as `wds-tools diff` counts
        cols = read_sample_table(store.root, info, ["key", "fingerprint", "label"])
        result.by_key = t.base.by_key(cols.keys, cols["fingerprint"], [info.classes[i] for i in cols.label.tolist()])
        result.removed = result.by_key["removed"]
    result.count_failures(failures, src.kind == "image-folder")
    written = result.decoded + result.reused + result.relabeled
    result.images_per_second = round(written / write_seconds, 2) if write_seconds > 0 and written else 0.0
    result.seconds = round(time.perf_counter() - t0, 3)
