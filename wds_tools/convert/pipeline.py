"""Convert a corpus into versioned shards: scan -> plan -> write (process pool) -> index."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Iterable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from . import write
from .decode import RESIZE_MODES, DecodeSettings, decoder_versions
from ..errors import IndexFormatError, OptionError, OutputExistsError, TooManyErrorsError, WdsToolsError
from ..format.fsutil import dumps_canonical
from ..format.index import (
    ERRORS_FILE, FORMAT_NAME, FORMAT_VERSION, INDEX_FILE, SAMPLE_COLUMNS, histogram_mean_std, parse_index_meta,
    read_npz, write_index,
)
from ..format.layout import url_pattern
from .plan import parse_shard_size, plan_split
from .reuse import Base, find_base
from .runner import EXECUTORS, make_runner, usable_cpus
from .storage import Store, is_remote, join
from .source import Source, SourceRow, read_source
from .write import SampleTask, ShardTask, fingerprint_files, scan_files

__all__ = ["convert", "ConvertResult", "parse_max_errors", "WORK_DIR"]

WORK_DIR = ".wds-tools-work"
_NO_PIXELS = ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])  # mean/std an index records for a split without pixels
_VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SCAN_CHUNK = 256  # rows per header-scan task
_HASH_CHUNK = 32  # rows per fingerprint task: whole files are read, so keep tasks small
_BUILD_RECORD_ONLY = ("source_path", "base")  # recorded in index.json, not part of what is built


@dataclass
class ConvertResult:
    """What a conversion did; the CLI prints it as text or JSON."""

    out_dir: str
    dataset_version: str
    size: int
    samples_written: int = 0
    failed: int = 0
    shards: int = 0
    shards_resumed: int = 0
    base: str | None = None  # the version whose pixels were reused
    decoded: int = 0  # samples decoded from source in this run
    reused: int = 0  # samples copied from the base, label unchanged
    relabeled: int = 0  # samples copied from the base with a new label
    removed: int = 0  # base samples absent from this version
    reuse_problems: list[dict] = field(default_factory=list)  # base samples that failed their check
    dry_run: bool = False
    seconds: float = 0.0
    images_per_second: float = 0.0
    splits: dict[str, dict] = field(default_factory=dict)
    errors_file: str | None = None
    max_errors_allowed: int = 0
    max_errors_exceeded: bool = False
    already_complete: bool = False

    def to_text(self) -> str:
        """What the run did (or would do), per split, with reuse and failure counts."""
        if self.already_complete:
            lines = [f"{self.out_dir} is already converted with these options; nothing to do."]
        elif self.dry_run:
            lines = [f"Dry run, nothing written: {self.out_dir} would hold "
                     f"{sum(s['samples'] for s in self.splits.values()):,} samples in {self.shards} shards"]
        else:
            resumed = f", {self.shards_resumed} kept from an interrupted run" if self.shards_resumed else ""
            lines = [f"Converted {self.samples_written:,} images into {self.shards} shards{resumed} in "
                     f"{self.out_dir} ({self.seconds:.1f} s, {self.images_per_second:,.1f} images/s)"]
        width = max([len(s) for s in self.splits] + [5])
        for name, sp in self.splits.items():
            lines.append(f"  {name:<{width}} {sp['samples']:>9,} samples {sp['shards']:>5} "
                         f"shard{'s' if sp['shards'] != 1 else ' '}  {sp['urls']}")
        if self.base is not None or self.dry_run:
            lines.append(f"  from base {self.base or '(none)'}: {self.reused:,} reused, {self.relabeled:,} "
                         f"relabeled, {self.decoded:,} decoded, {self.removed:,} removed")
        for p in self.reuse_problems[:5]:
            lines.append(f"  decoded again, base copy failed its check: {p['key']} in {p['base_shard']}: "
                         f"{p['error']}")
        if self.failed:
            where = f" (reasons in {self.errors_file})" if self.errors_file else ""
            lines.append(f"  failed: {self.failed}{where}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_max_errors(value: str | int | float) -> tuple[str, float]:
    """"25" -> at most 25 files; "1%" or "0.01" -> at most that fraction of the rows."""
    text = str(value).strip()
    try:
        if text.endswith("%"):
            frac = float(text[:-1]) / 100
        elif re.fullmatch(r"\d+", text):
            return "count", int(text)
        else:
            frac = float(text)
    except ValueError:
        raise OptionError(f"--max-errors {value!r}: expected a count (25), a fraction (0.01) or a percentage (1%)") from None
    if not 0.0 <= frac <= 1.0:
        raise OptionError(f"--max-errors {value!r}: a fraction must lie between 0 and 1 (0% to 100%)")
    return "fraction", frac


def _allowed_errors(max_errors: tuple[str, float], total: int) -> int:
    kind, v = max_errors
    return int(v) if kind == "count" else math.floor(v * total + 1e-9)


# ---------------------------------------------------------------- main side

def _spec(source: Source, *, version: str, size: int, resize: str, shard_size: int, seed: int,
          val_fraction: float, sanitize_keys: bool, settings: DecodeSettings) -> dict:
    """What determines the bytes of a conversion; equal specs give identical output."""
    return {
        "dataset_version": version, "size": size, "resize": resize, "decode": settings.to_dict(),
        "build": {"shard_size": shard_size, "seed": seed, "val_fraction": val_fraction,
                  "sanitize_keys": sanitize_keys,
                  "source": {"kind": source.kind, "rows": len(source.rows), "digest": source.digest()}},
    }


def _spec_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    diffs = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _spec_differences(a, b, f"{prefix}{k}.")
        elif a != b:
            diffs.append(f"{prefix}{k}: existing {a!r}, requested {b!r}")
    return diffs


def _read_meta(store: Store) -> dict:
    path = store.join(INDEX_FILE)
    try:
        return parse_index_meta(store.read_bytes(path), path)
    except IndexFormatError as e:
        raise OutputExistsError(f"{e}; nothing was changed") from None


def _prepare_dest(store: Store, spec: dict) -> tuple[str, dict | None]:
    """('complete', its index meta), ('resume', None) or ('fresh', None); refuse a folder made with
    other options or another source."""
    dest, run_file = store.root, store.join(WORK_DIR, "run.json")
    if store.exists(store.join(INDEX_FILE)):
        meta = _read_meta(store)
        old = {k: meta.get(k) for k in ("dataset_version", "size", "resize", "decode")}
        old["build"] = {k: v for k, v in meta.get("build", {}).items() if k not in _BUILD_RECORD_ONLY}
        diffs = _spec_differences(old, spec)
        if diffs:
            raise OutputExistsError(
                f"{dest} already holds a conversion made with other options or another source "
                f"({'; '.join(diffs[:6])}). Nothing was changed. Choose another --version or --out, "
                f"or remove {dest} to convert again."
            )
        return "complete", meta
    if store.exists(run_file):
        try:
            old = json.loads(store.read_bytes(run_file))
        except ValueError:
            old = {}
        diffs = _spec_differences(old, spec)
        if diffs:
            raise OutputExistsError(
                f"{dest} holds an unfinished conversion made with other options or another source "
                f"({'; '.join(diffs[:6])}). Run the original command again to finish it, or remove "
                f"{dest} to start over."
            )
        return "resume", None
    others = [name for name in store.names(dest) if name not in (ERRORS_FILE, WORK_DIR)]
    if others:
        raise OutputExistsError(
            f"{dest} exists and holds files wds-tools did not write ({', '.join(others[:5])}); "
            "nothing was changed. Choose another --version or --out, or remove the folder."
        )
    return "fresh", None


def _bar(total: int, desc: str, unit: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, smoothing=0.1,
                dynamic_ncols=True, leave=True)


def _write_errors(store: Store, failures: list[dict]) -> str | None:
    path = store.join(ERRORS_FILE)
    if not failures:
        store.remove(path)
        return None
    failures = sorted(failures, key=lambda e: (e["line"], e["key"]))
    data = "".join(json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n" for e in failures)
    store.write_bytes(path, data.encode())
    return path


def _task_digest(spec_digest: str, name: str, samples: Iterable[SampleTask]) -> str:
    h = hashlib.sha256(f"{spec_digest}\n{name}\n".encode())
    for s in samples:
        h.update(f"{s.key}\t{s.path}\t{s.source_path}\t{s.label}\t{s.label_name}\t{s.original_key}\n".encode())
    return h.hexdigest()


def _finished_meta(store: Store, task: ShardTask) -> dict | None:
    """The meta of a shard a previous run finished (and uploaded) with the same plan, else None."""
    try:
        meta = json.loads(store.read_bytes(join(task.work, task.name + ".json")))
        ok = (meta.get("digest") == task.digest
              and store.size(join(task.dest, task.name)) == meta["bytes"]
              and store.exists(join(task.work, task.name + ".npz")))
        return meta if ok else None
    except (OSError, ValueError, KeyError):
        return None


def _select_base(out: str, version: str, size: int, resize: str, settings: DecodeSettings,
                 reuse: bool, base: str | None) -> Base | None:
    if not reuse:
        if base is not None:
            raise OptionError("--from and --no-reuse contradict each other; pass one of them")
        return None
    if is_remote(out):  # reading a base's shards by offset is implemented for local folders only
        if base is not None:
            raise OptionError(f"--from {base}: reusing pixels from object storage is not supported; "
                              "convert with --no-reuse, or into a local --out")
        return None
    wanted = {"size": size, "resize": resize, "decode": settings.to_dict(),
              "decoder_versions": decoder_versions()}
    found = find_base(Path(out), version, wanted, base)
    return Base(found) if found is not None else None


def convert(
    source: str | os.PathLike,
    *,
    version: str,
    size: int,
    out: str | os.PathLike = "shards",
    workers: int | None = None,
    shard_size: str | int | None = None,
    resize: str = "center-crop",
    val_fraction: float = 0.1,
    seed: int = 0,
    sanitize_keys: bool = False,
    max_errors: str | int | float = "1%",
    decode: DecodeSettings = DecodeSettings(),
    reuse: bool = True,
    base: str | None = None,
    trust_mtime: bool = False,
    dry_run: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool = True,
) -> ConvertResult:
    """Convert ``source`` into ``out/version/size/<split>-NNNNNN.tar`` shards plus their index.

    When an earlier version with the same size and decode settings exists (``base`` names one;
    default: the newest), samples whose source bytes it already holds are copied from its
    shards instead of decoded (``reuse=False`` decodes everything). ``trust_mtime`` takes a
    source as unchanged when its path, size and mtime are. ``dry_run`` reports the plan and
    writes nothing. ``executor="ray"`` runs the shard tasks on a Ray cluster (``ray_address``;
    default: a local instance) with the same plan and bytes. Resumes an interrupted run with the same arguments; refuses a folder made
    with other options or another source. Bad source files are skipped and listed in errors.jsonl.
    """
    t0 = time.perf_counter()
    if not _VERSION_PATTERN.fullmatch(str(version)):
        raise OptionError(f"--version {version!r}: use letters, digits, '.', '_' or '-' (at most 64), e.g. v1")
    if not isinstance(size, int) or not 8 <= size <= 8192:
        raise OptionError(f"--size {size!r}: expected an integer between 8 and 8192 pixels, e.g. 224")
    if resize not in RESIZE_MODES:
        raise OptionError(f"--resize {resize!r}: expected one of {', '.join(RESIZE_MODES)}")
    if executor not in EXECUTORS:
        raise OptionError(f"--executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
    if workers is None and executor == "local":
        workers = usable_cpus()
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise OptionError(f"--workers {workers!r}: expected a positive integer")
    n_per_shard = parse_shard_size(shard_size, size)
    max_err = parse_max_errors(max_errors)

    src = read_source(source, val_fraction=val_fraction, seed=seed, sanitize_keys=sanitize_keys)
    dest = join(out, str(version), str(size))
    store = Store(dest)
    spec = _spec(src, version=version, size=size, resize=resize, shard_size=n_per_shard, seed=seed,
                 val_fraction=val_fraction, sanitize_keys=sanitize_keys, settings=decode)
    state, done_meta = _prepare_dest(store, spec)
    result = ConvertResult(out_dir=str(dest), dataset_version=version, size=size,
                           max_errors_allowed=_allowed_errors(max_err, len(src.rows)), dry_run=dry_run)
    if state == "complete":
        _result_from_index(result, store, done_meta)
        errors = store.join(ERRORS_FILE)
        result.errors_file = errors if store.exists(errors) else None
        if result.errors_file:
            result.failed = store.read_bytes(errors).count(b"\n")
        result.already_complete = True
        result.seconds = round(time.perf_counter() - t0, 3)
        return result
    base_index = _select_base(os.fspath(out), str(version), size, resize, decode, reuse, base)
    result.base = base_index.version if base_index is not None else None

    runner = make_runner(executor, workers, ray_address)  # before writing: a missing extra leaves nothing
    work = store.join(WORK_DIR)
    try:
        if not dry_run:
            store.makedirs(work)
            store.write_bytes(join(work, "run.json"), (dumps_canonical(spec) + "\n").encode())
        return _run(src, store, work, spec, runner, result, base_index, n_per_shard=n_per_shard,
                    seed=seed, size=size, resize=resize, settings=decode, trust_mtime=trust_mtime,
                    dry_run=dry_run, progress=progress, t0=t0)
    except BrokenProcessPool:
        runner.close(cancel=True)
        raise WdsToolsError(
            "a worker process died (killed, or out of memory?); finished shards are kept. "
            "Run the same command again to resume, with fewer --workers if memory is short."
        ) from None
    except BaseException:
        runner.close(cancel=True)
        raise
    finally:
        runner.close()


def _scan(rows: list[SourceRow], runner, base: Base | None, settings: DecodeSettings,
          trust_mtime: bool, progress: bool) -> tuple[list[str | None], list[tuple]]:
    """Check every source; with a base, also fingerprint it. Returns (errors, (fp, size, mtime))."""
    errors: list[str | None] = [None] * len(rows)
    stats: list[tuple] = [(None, 0, 0)] * len(rows)
    chunk = _SCAN_CHUNK if base is None else _HASH_CHUNK
    starts = list(range(0, len(rows), chunk))
    if base is None:
        fn, args = scan_files, [([r.path for r in rows[i:i + chunk]], settings) for i in starts]
    else:
        def item(r: SourceRow) -> tuple:
            return (r.path, *base.trusted_stat(r.source_path)) if trust_mtime else (r.path, None, None)
        fn, args = fingerprint_files, [([item(r) for r in rows[i:i + chunk]], settings) for i in starts]
    with _bar(len(rows), "scan" if base is None else "fingerprint", "file", progress) as bar:
        def on_result(j: int, out: list) -> None:
            for k, res in enumerate(out, starts[j]):
                if base is None:
                    errors[k] = res
                else:
                    err, fp, size, mtime = res
                    if err is None and fp is None:  # unchanged by --trust-mtime
                        fp = base.fingerprint_of(rows[k].source_path)
                    errors[k], stats[k] = err, (fp, size, mtime)
            bar.update(len(out))
        runner.map(fn, args, lambda n: None, on_result)
    return errors, stats


def _run(src: Source, store: Store, work: str, spec: dict, runner, result: ConvertResult,
         base: Base | None, *, n_per_shard: int, seed: int, size: int, resize: str,
         settings: DecodeSettings, trust_mtime: bool, dry_run: bool, progress: bool,
         t0: float) -> ConvertResult:
    rows = src.rows
    # 1. scan: header checks (and fingerprints when a base can be reused), so the plan only
    #    holds readable images
    scan, stats = _scan(rows, runner, base, settings, trust_mtime, progress)
    failures = [{"key": r.key, "path": r.source_path, "line": r.line, "stage": "scan", "error": err}
                for r, err in zip(rows, scan) if err is not None]
    if len(failures) > result.max_errors_allowed and not dry_run:
        errors_file = _write_errors(store, failures)
        store.rmtree(work)
        raise TooManyErrorsError(
            f"{len(failures)} of {len(rows)} source files are unreadable, more than --max-errors allows "
            f"({result.max_errors_allowed}); nothing was converted. The files and reasons are in "
            f"{errors_file}. First: {failures[0]['path']}: {failures[0]['error']}"
        )

    # 2. plan: a pure function of the good rows, whatever a base holds
    labels = src.label_index()
    spec_digest = hashlib.sha256(dumps_canonical(spec).encode()).hexdigest()
    by_split: dict[str, list[int]] = {}
    for i, (r, err) in enumerate(zip(rows, scan)):
        if err is None:
            by_split.setdefault(r.split, []).append(i)
    tasks: list[ShardTask] = []
    for split in sorted(by_split):
        members = by_split[split]
        for plan in plan_split(split, [(rows[i].key, labels[rows[i].label]) for i in members],
                               shard_size=n_per_shard, seed=seed):
            samples = []
            for i in (members[j] for j in plan.members):
                r, (fp, src_size, mtime) = rows[i], stats[i]
                samples.append(SampleTask(
                    r.key, r.path, r.source_path, labels[r.label], r.label, r.line, r.original_key,
                    reuse=base.reuse(fp, r.label) if base is not None and fp is not None else None,
                    src_size=src_size, src_mtime_ns=mtime))
            tasks.append(ShardTask(store.root, work, plan.name, split,
                                   _task_digest(spec_digest, plan.name, samples), size, resize,
                                   settings, tuple(samples)))
    if base is not None:
        result.removed = base.removed({r.key for r in rows})
    if dry_run:
        return _dry_run_result(result, tasks, failures, t0)

    # 3. write: shards a previous run finished are kept
    metas: dict[str, dict] = {}
    for t in tasks:
        meta = _finished_meta(store, t)
        if meta is not None:
            metas[t.name] = meta
    result.shards_resumed = len(metas)
    pending = [t for t in tasks if t.name not in metas]
    t_write = time.perf_counter()
    with _bar(sum(len(t.samples) for t in pending), "convert", "img", progress) as bar:
        def on_written(i: int, meta: dict) -> None:
            metas[pending[i].name] = meta
            if not runner.streams_progress:
                bar.update(len(pending[i].samples))
        runner.map(write.write_shard, [(t,) for t in pending], bar.update, on_written)
        bar.n = bar.total  # per-image messages may trail the last result; the work is done
        bar.refresh()
    write_seconds = time.perf_counter() - t_write
    for t in pending:
        counts = metas[t.name]["counts"]
        result.decoded += counts["decoded"]
        result.reused += counts["reused"]
        result.relabeled += counts["relabeled"]
        result.reuse_problems += metas[t.name]["reuse_problems"]

    # 4. index: written last, from the per-shard columns
    for t in tasks:
        failures += metas[t.name]["failed"]
    result.errors_file = _write_errors(store, failures)  # before the index, which names it
    meta = _assemble_index(store, work, tasks, metas, spec, src, settings, base, result.errors_file is not None)
    planned = {t.name for t in tasks}
    for name in store.names(store.root):  # leftovers of an interrupted run whose plan has since changed
        if (name.endswith(".tar") and name not in planned) or ".partial" in name:
            store.remove(store.join(name))
    store.rmtree(work)

    _result_from_index(result, store, meta)
    result.failed = len(failures)
    result.max_errors_exceeded = result.failed > result.max_errors_allowed
    written = result.decoded + result.reused + result.relabeled
    result.images_per_second = round(written / write_seconds, 2) if write_seconds > 0 and written else 0.0
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def _dry_run_result(result: ConvertResult, tasks: list[ShardTask], failures: list[dict],
                    t0: float) -> ConvertResult:
    """What a run would do: counts only, nothing written."""
    for t in tasks:
        for s in t.samples:
            if s.reuse is None:
                result.decoded += 1
            elif s.reuse.relabeled:
                result.relabeled += 1
            else:
                result.reused += 1
        sp = result.splits.setdefault(t.split, {"samples": 0, "shards": 0, "urls": ""})
        sp["samples"] += len(t.samples)
        sp["shards"] += 1
    for name, sp in result.splits.items():
        sp["urls"] = join(result.out_dir, url_pattern(name, sp["shards"]))
    result.samples_written = 0
    result.shards = len(tasks)
    result.failed = len(failures)
    result.max_errors_exceeded = result.failed > result.max_errors_allowed
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def _assemble_index(store: Store, work: str, tasks: list[ShardTask], metas: dict[str, dict],
                    spec: dict, src: Source, settings: DecodeSettings, base: Base | None,
                    has_errors: bool) -> dict:
    parts = []
    for shard_id, t in enumerate(tasks):
        part = join(work, t.name + ".npz")
        cols = read_npz(part, data=store.read_bytes(part))
        cols["shard"] = np.full(len(cols["key"]), shard_id, dtype="<u4")
        parts.append(cols)
    columns: dict[str, np.ndarray] = {}
    for name in SAMPLE_COLUMNS:
        if name in ("path_offsets", "path_data"):
            continue
        arrays = [p[name] for p in parts]
        if name == "key":
            width = max([a.dtype.itemsize for a in arrays] + [1])
            arrays = [a.astype(f"S{width}") for a in arrays]
        columns[name] = np.concatenate(arrays) if arrays else np.zeros(0, SAMPLE_COLUMNS[name])
    offsets, path_base = [np.zeros(1, "<u8")], 0
    for p in parts:
        offsets.append(p["path_offsets"][1:] + path_base)
        path_base += int(p["path_offsets"][-1])
    columns["path_offsets"] = np.concatenate(offsets).astype("<u8")
    columns["path_data"] = np.concatenate([p["path_data"] for p in parts] + [np.zeros(0, "u1")])
    if columns["fingerprint"].ndim == 1:
        columns["fingerprint"] = columns["fingerprint"].reshape(-1, 16)

    n_classes = len(src.classes)
    splits: dict[str, dict] = {}
    hist_by_split: dict[str, np.ndarray] = {}
    shard_entries = []
    for t, cols in zip(tasks, parts):
        meta = metas[t.name]
        shard_entries.append({"name": t.name, "split": t.split, "samples": meta["samples"],
                              "bytes": meta["bytes"], "sha256": meta["sha256"]})
        sp = splits.setdefault(t.split, {"samples": 0, "shards": 0, "class_counts": [0] * n_classes})
        sp["samples"] += meta["samples"]
        sp["shards"] += 1
        for label, count in zip(*np.unique(cols["label"], return_counts=True)):
            sp["class_counts"][int(label)] += int(count)
        hist_by_split[t.split] = hist_by_split.get(t.split, np.zeros(768, np.int64)) + np.array(meta["histogram"], np.int64)
    for split, sp in splits.items():
        sp["urls"] = url_pattern(split, sp["shards"])
        sp["mean"], sp["std"] = histogram_mean_std(hist_by_split[split], empty=_NO_PIXELS)
    stats_split = "train" if "train" in splits else None
    total_hist = hist_by_split["train"] if stats_split else sum(hist_by_split.values(), np.zeros(768, np.int64))
    mean, std = histogram_mean_std(total_hist, empty=_NO_PIXELS)
    class_counts = [sum(sp["class_counts"][c] for sp in splits.values()) for c in range(n_classes)]
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created_by": f"wds-tools {__version__}",
        **{k: spec[k] for k in ("dataset_version", "size", "resize", "decode")},
        "decoder_versions": decoder_versions(),
        "build": {**spec["build"], "source_path": src.path,  # as given: the same command elsewhere writes the same bytes
                  "base": base.version if base is not None else None},
        "sample": {"members": ["cls", "json", "npy"], "npy_dtype": "uint8",
                   "npy_shape": [spec["size"], spec["size"], 3]},
        "classes": src.classes,
        "class_counts": class_counts,
        "samples": int(len(columns["key"])),
        "mean": mean,
        "std": std,
        "stats_split": stats_split or "all",
        "splits": dict(sorted(splits.items())),
        "shards": shard_entries,
        "errors_file": ERRORS_FILE if has_errors else None,
    }
    return write_index(store.root, meta, columns, write_bytes=store.write_bytes)


def _result_from_index(result: ConvertResult, store: Store, meta: dict) -> None:
    """Fill ``result``'s totals from an index's meta."""
    result.samples_written = meta["samples"]
    result.shards = len(meta["shards"])
    result.splits = {name: {"samples": sp["samples"], "shards": sp["shards"],
                            "urls": store.join(sp["urls"])} for name, sp in meta["splits"].items()}
