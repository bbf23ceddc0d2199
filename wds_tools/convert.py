"""Convert a corpus into versioned shards: scan -> plan -> write (process pool) -> index."""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue as queue_mod
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import xxhash

from . import __version__
from .decode import RESIZE_MODES, DecodeSettings, DecodeError, decode_image, decoder_versions, probe_image
from .errors import OptionError, OutputExistsError, WdsToolsError
from .fsutil import atomic_write_bytes, atomic_write_json, dumps_canonical
from .index import (
    ERRORS_FILE, FORMAT_NAME, FORMAT_VERSION, INDEX_FILE, SAMPLE_COLUMNS, SAMPLES_FILE,
    load_index, pack_strings, read_npz, write_index, write_npz,
)
from .plan import parse_shard_size, plan_split, url_pattern
from .source import Source, SourceRow, read_source
from .tarwrite import ShardWriter, npy_header

__all__ = ["convert", "ConvertResult", "TooManyErrorsError", "parse_max_errors", "WORK_DIR"]

WORK_DIR = ".wds-tools-work"
_VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SCAN_CHUNK = 256


class TooManyErrorsError(WdsToolsError):
    """More source files failed than --max-errors allows."""


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
    decoded: int = 0
    seconds: float = 0.0
    images_per_second: float = 0.0
    splits: dict[str, dict] = field(default_factory=dict)
    errors_file: str | None = None
    max_errors_allowed: int = 0
    max_errors_exceeded: bool = False
    already_complete: bool = False

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


# ---------------------------------------------------------------- worker side

_progress: Callable[[int], None] | None = None
_parent_pid: int | None = None


def _init_worker(q) -> None:
    global _progress, _parent_pid
    _progress = q.put
    _parent_pid = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _noop() -> None:
    """Submitted once per worker so the pool starts every process up front."""


def _orphaned() -> bool:
    """True in a pool worker whose parent has died (kill -9): stop rather than race a rerun."""
    return _parent_pid is not None and os.getppid() != _parent_pid


def _scan_chunk(paths: list[str], settings: DecodeSettings) -> list[str | None]:
    """Check that each file exists, is non-empty and has a readable image header."""
    out: list[str | None] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise DecodeError("empty file")
                probe_image(f, settings)  # reads only as far as the header
            out.append(None)
        except FileNotFoundError:
            out.append("missing file")
        except PermissionError:
            out.append("unreadable file: permission denied")
        except IsADirectoryError:
            out.append("is a directory, not a file")
        except OSError as e:
            out.append(f"unreadable file: {e.strerror or e}")
        except DecodeError as e:
            out.append(str(e))
    return out


@dataclass(frozen=True)
class _Sample:
    key: str
    path: str
    source_path: str
    label: int
    label_name: str
    line: int
    original_key: str | None


@dataclass(frozen=True)
class _ShardTask:
    dest: str
    work: str
    name: str
    split: str
    digest: str
    size: int
    resize: str
    settings: DecodeSettings
    samples: tuple[_Sample, ...]


def _sample_json(s: _Sample, width: int, height: int, fingerprint: str) -> bytes:
    meta = {"key": s.key, "label": s.label_name, "source_path": s.source_path,
            "width": width, "height": height, "fingerprint": f"xxh3_128:{fingerprint}"}
    if s.original_key is not None:
        meta["original_key"] = s.original_key
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _write_shard(task: _ShardTask) -> dict:
    """Decode a shard's samples and write the tar, its columns and its meta (in that order)."""
    header = npy_header((task.size, task.size, 3))
    rows: list[tuple] = []
    failed: list[dict] = []
    hist = np.zeros(768, dtype=np.int64)
    channel = np.tile(np.array([0, 256, 512], dtype=np.uint16), task.size * task.size)
    pending = 0
    with ShardWriter(os.path.join(task.dest, task.name)) as w:
        for s in task.samples:
            if _orphaned():
                raise SystemExit(1)
            try:
                with open(s.path, "rb") as f:
                    st = os.fstat(f.fileno())
                    data = f.read()
                dec = decode_image(data, task.size, task.resize, task.settings)
            except (OSError, DecodeError) as e:
                reason = str(e) if isinstance(e, DecodeError) else f"unreadable file: {e.strerror or e}"
                failed.append({"key": s.key, "path": s.source_path, "line": s.line,
                               "stage": "decode", "error": reason})
            else:
                fp = xxhash.xxh3_128_digest(data)
                flat = dec.pixels.reshape(-1)
                hist += np.bincount(flat + channel, minlength=768)
                npy_hash = xxhash.xxh3_64(header)
                npy_hash.update(flat)
                cls_off, cls_len = w.add(f"{s.key}.cls", str(s.label).encode())
                json_off, json_len = w.add(f"{s.key}.json", _sample_json(s, dec.width, dec.height, fp.hex()))
                npy_off, npy_len = w.add(f"{s.key}.npy", header, flat.data)
                rows.append((s.key, s.label, fp, dec.width, dec.height, st.st_size, st.st_mtime_ns,
                             cls_off, cls_len, json_off, json_len, npy_off, npy_len,
                             npy_hash.intdigest(), s.source_path))
            pending += 1
            if _progress is not None and pending >= 8:
                _progress(pending)
                pending = 0
        nbytes, sha = w.close()
    if _progress is not None and pending:
        _progress(pending)
    cols = _rows_to_columns(rows)
    atomic_write_bytes(os.path.join(task.work, task.name + ".npz"), write_npz(cols))
    meta = {"name": task.name, "split": task.split, "digest": task.digest, "bytes": nbytes,
            "sha256": sha, "samples": len(rows), "failed": failed, "histogram": hist.tolist()}
    atomic_write_json(os.path.join(task.work, task.name + ".json"), meta)
    return meta


def _rows_to_columns(rows: list[tuple]) -> dict[str, np.ndarray]:
    names = ["key", "label", "fingerprint", "width", "height", "src_size", "src_mtime_ns",
             "cls_offset", "cls_length", "json_offset", "json_length", "npy_offset", "npy_length",
             "npy_xxh3"]
    cols: dict[str, np.ndarray] = {}
    for j, name in enumerate(names):
        values = [r[j] for r in rows]
        if name == "key":
            cols[name] = np.array([v.encode() for v in values], dtype="S") if values else np.zeros(0, "S1")
        elif name == "fingerprint":
            cols[name] = np.frombuffer(b"".join(values), dtype="u1").reshape(len(values), 16)
        else:
            cols[name] = np.array(values, dtype=SAMPLE_COLUMNS[name])
    cols["shard"] = np.zeros(len(rows), dtype="<u4")
    cols["path_offsets"], cols["path_data"] = pack_strings([r[14] for r in rows])
    return cols


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


def _prepare_dest(dest: Path, spec: dict) -> str:
    """'complete', 'resume' or 'fresh'; refuse a folder made with other options or another source."""
    work = dest / WORK_DIR
    if (dest / INDEX_FILE).exists():
        meta = load_index(dest).meta
        old = {k: meta.get(k) for k in ("dataset_version", "size", "resize", "decode")}
        old["build"] = {k: v for k, v in meta.get("build", {}).items() if k != "source_path"}
        diffs = _spec_differences(old, spec)
        if diffs:
            raise OutputExistsError(
                f"{dest} already holds a conversion made with other options or another source "
                f"({'; '.join(diffs[:6])}). Nothing was changed. Choose another --version or --out, "
                f"or remove {dest} to convert again."
            )
        return "complete"
    if (work / "run.json").exists():
        try:
            old = json.loads((work / "run.json").read_text())
        except ValueError:
            old = {}
        diffs = _spec_differences(old, spec)
        if diffs:
            raise OutputExistsError(
                f"{dest} holds an unfinished conversion made with other options or another source "
                f"({'; '.join(diffs[:6])}). Run the original command again to finish it, or remove "
                f"{dest} to start over."
            )
        return "resume"
    if dest.exists():
        others = sorted(p.name for p in dest.iterdir() if p.name not in (ERRORS_FILE, WORK_DIR))
        if others:
            raise OutputExistsError(
                f"{dest} exists and holds files wds-tools did not write ({', '.join(others[:5])}); "
                "nothing was changed. Choose another --version or --out, or remove the folder."
            )
    return "fresh"


class _Runner:
    """Runs functions in-process (workers=1) or in a spawn process pool, with progress."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self.queue = None
        if workers > 1:
            ctx = get_context("spawn")
            self.queue = ctx.Queue()
            self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                            initargs=(self.queue,))
            # The pool spawns a process only when a task finds no idle one; start them all now,
            # while the source is scanned, instead of one by one during the first shards.
            for _ in range(workers):
                self.pool.submit(_noop)

    def map(self, fn, args_list: list[tuple], on_progress: Callable[[int], None],
            on_result: Callable[[int, object], None]) -> None:
        """Call fn(*args) for each, at most 2 x workers in flight; results in completion order."""
        global _progress
        if self.pool is None:
            _progress = on_progress
            try:
                for i, args in enumerate(args_list):
                    on_result(i, fn(*args))
            finally:
                _progress = None
            return
        todo = iter(enumerate(args_list))
        running: dict[Future, int] = {}

        def fill() -> None:
            while len(running) < 2 * self.workers:
                nxt = next(todo, None)
                if nxt is None:
                    return
                running[self.pool.submit(fn, *nxt[1])] = nxt[0]

        fill()
        while running:
            done, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
            self._drain(on_progress)
            for fut in done:
                i = running.pop(fut)
                on_result(i, fut.result())
            fill()
        self._drain(on_progress)

    def _drain(self, on_progress: Callable[[int], None]) -> None:
        while True:
            try:
                on_progress(self.queue.get_nowait())
            except queue_mod.Empty:
                return

    def close(self, cancel: bool = False) -> None:
        if self.pool is None:
            return
        if cancel:  # interrupted: stop the workers now instead of letting their shards finish
            for proc in list(getattr(self.pool, "_processes", {}).values()):
                proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=cancel)
        self.pool = None


def _bar(total: int, desc: str, unit: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, smoothing=0.1,
                dynamic_ncols=True, leave=True)


def _mean_std(hist: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and std in [0, 1] units from a [3, 256] histogram."""
    hist = hist.reshape(3, 256).astype(np.float64)
    v = np.arange(256, dtype=np.float64)
    n = hist.sum(axis=1)
    if not n.all():
        return [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    mean = (hist @ v) / n
    var = (hist @ (v * v)) / n - mean * mean
    std = np.sqrt(np.maximum(var, 0.0))
    return [round(float(x) / 255, 6) for x in mean], [round(float(x) / 255, 6) for x in std]


def _write_errors(dest: Path, failures: list[dict]) -> str | None:
    path = dest / ERRORS_FILE
    if not failures:
        if path.exists():
            path.unlink()
        return None
    failures = sorted(failures, key=lambda e: (e["line"], e["key"]))
    data = "".join(json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n" for e in failures)
    atomic_write_bytes(path, data.encode())
    return str(path)


def _task_digest(spec_digest: str, name: str, samples: Iterable[_Sample]) -> str:
    h = hashlib.sha256(f"{spec_digest}\n{name}\n".encode())
    for s in samples:
        h.update(f"{s.key}\t{s.path}\t{s.source_path}\t{s.label}\t{s.label_name}\t{s.original_key}\n".encode())
    return h.hexdigest()


def _finished_meta(task: _ShardTask) -> dict | None:
    """The meta of a shard a previous run finished with the same plan, else None."""
    try:
        meta = json.loads(Path(task.work, task.name + ".json").read_text())
        ok = (meta.get("digest") == task.digest
              and os.path.getsize(os.path.join(task.dest, task.name)) == meta["bytes"]
              and os.path.exists(os.path.join(task.work, task.name + ".npz")))
        return meta if ok else None
    except (OSError, ValueError, KeyError):
        return None


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
    progress: bool = True,
) -> ConvertResult:
    """Convert ``source`` into ``out/version/size/<split>-NNNNNN.tar`` shards plus their index.

    Resumes an interrupted run with the same arguments; refuses a folder made with other
    options or another source. Bad source files are skipped and listed in errors.jsonl.
    """
    t0 = time.perf_counter()
    if not _VERSION_PATTERN.fullmatch(str(version)):
        raise OptionError(f"--version {version!r}: use letters, digits, '.', '_' or '-' (at most 64), e.g. v1")
    if not isinstance(size, int) or not 8 <= size <= 8192:
        raise OptionError(f"--size {size!r}: expected an integer between 8 and 8192 pixels, e.g. 224")
    if resize not in RESIZE_MODES:
        raise OptionError(f"--resize {resize!r}: expected one of {', '.join(RESIZE_MODES)}")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not isinstance(workers, int) or workers < 1:
        raise OptionError(f"--workers {workers!r}: expected a positive integer")
    n_per_shard = parse_shard_size(shard_size, size)
    max_err = parse_max_errors(max_errors)

    src = read_source(source, val_fraction=val_fraction, seed=seed, sanitize_keys=sanitize_keys)
    dest = Path(out) / str(version) / str(size)
    spec = _spec(src, version=version, size=size, resize=resize, shard_size=n_per_shard, seed=seed,
                 val_fraction=val_fraction, sanitize_keys=sanitize_keys, settings=decode)
    state = _prepare_dest(dest, spec)
    result = ConvertResult(out_dir=str(dest), dataset_version=version, size=size,
                           max_errors_allowed=_allowed_errors(max_err, len(src.rows)))
    if state == "complete":
        return _result_from_index(result, dest, t0)

    work = dest / WORK_DIR
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_json(work / "run.json", spec)
    runner = _Runner(workers)
    try:
        return _run(src, dest, work, spec, runner, result, n_per_shard=n_per_shard, seed=seed,
                    size=size, resize=resize, settings=decode, progress=progress, t0=t0)
    except BaseException:
        runner.close(cancel=True)
        raise
    finally:
        runner.close()


def _run(src: Source, dest: Path, work: Path, spec: dict, runner: _Runner, result: ConvertResult, *,
         n_per_shard: int, seed: int, size: int, resize: str, settings: DecodeSettings,
         progress: bool, t0: float) -> ConvertResult:
    rows = src.rows
    # 1. scan: cheap header checks, so the plan only holds readable images
    scan: list[str | None] = [None] * len(rows)
    chunks = [(i, [r.path for r in rows[i:i + _SCAN_CHUNK]]) for i in range(0, len(rows), _SCAN_CHUNK)]
    with _bar(len(rows), "scan", "file", progress) as bar:
        def on_scan(j: int, out: list) -> None:
            start = chunks[j][0]
            scan[start:start + len(out)] = out
            bar.update(len(out))
        runner.map(_scan_chunk, [(paths, settings) for _, paths in chunks], lambda n: None, on_scan)
    failures = [{"key": r.key, "path": r.source_path, "line": r.line, "stage": "scan", "error": err}
                for r, err in zip(rows, scan) if err is not None]
    if len(failures) > result.max_errors_allowed:
        errors_file = _write_errors(dest, failures)
        shutil.rmtree(work, ignore_errors=True)
        raise TooManyErrorsError(
            f"{len(failures)} of {len(rows)} source files are unreadable, more than --max-errors allows "
            f"({result.max_errors_allowed}); nothing was converted. The files and reasons are in "
            f"{errors_file}. First: {failures[0]['path']}: {failures[0]['error']}"
        )

    # 2. plan: pure function of the good rows
    labels = src.label_index()
    spec_digest = hashlib.sha256(dumps_canonical(spec).encode()).hexdigest()
    by_split: dict[str, list[SourceRow]] = {}
    for r, err in zip(rows, scan):
        if err is None:
            by_split.setdefault(r.split, []).append(r)
    tasks: list[_ShardTask] = []
    for split in sorted(by_split):
        members = by_split[split]
        for plan in plan_split(split, [(r.key, labels[r.label]) for r in members],
                               shard_size=n_per_shard, seed=seed):
            samples = tuple(
                _Sample(r.key, r.path, r.source_path, labels[r.label], r.label, r.line, r.original_key)
                for r in (members[i] for i in plan.members)
            )
            tasks.append(_ShardTask(str(dest), str(work), plan.name, split,
                                    _task_digest(spec_digest, plan.name, samples), size, resize,
                                    settings, samples))

    # 3. write: shards a previous run finished are kept
    metas: dict[str, dict] = {}
    for t in tasks:
        meta = _finished_meta(t)
        if meta is not None:
            metas[t.name] = meta
    result.shards_resumed = len(metas)
    pending = [t for t in tasks if t.name not in metas]
    t_write = time.perf_counter()
    with _bar(sum(len(t.samples) for t in pending), "convert", "img", progress) as bar:
        runner.map(_write_shard, [(t,) for t in pending], bar.update,
                   lambda i, meta: metas.__setitem__(pending[i].name, meta))
        bar.n = bar.total  # per-image messages may trail the last result; the work is done
        bar.refresh()
    write_seconds = time.perf_counter() - t_write
    result.decoded = sum(len(t.samples) for t in pending)

    # 4. index: written last, from the per-shard columns
    for t in tasks:
        failures += metas[t.name]["failed"]
    _assemble_index(dest, work, tasks, metas, spec, src, settings)
    result.errors_file = _write_errors(dest, failures)
    planned = {t.name for t in tasks}
    for p in dest.iterdir():  # leftovers of an interrupted run whose plan has since changed
        if (p.suffix == ".tar" and p.name not in planned) or ".partial" in p.name:
            p.unlink()
    shutil.rmtree(work, ignore_errors=True)

    result = _result_from_index(result, dest, t0)
    result.failed = len(failures)
    result.max_errors_exceeded = result.failed > result.max_errors_allowed
    result.images_per_second = round(result.decoded / write_seconds, 2) if write_seconds > 0 and result.decoded else 0.0
    result.already_complete = False
    return result


def _assemble_index(dest: Path, work: Path, tasks: list[_ShardTask], metas: dict[str, dict],
                    spec: dict, src: Source, settings: DecodeSettings) -> None:
    parts = []
    for shard_id, t in enumerate(tasks):
        cols = read_npz(work / (t.name + ".npz"))
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
    offsets, base = [np.zeros(1, "<u8")], 0
    for p in parts:
        offsets.append(p["path_offsets"][1:] + base)
        base += int(p["path_offsets"][-1])
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
        sp["mean"], sp["std"] = _mean_std(hist_by_split[split])
    stats_split = "train" if "train" in splits else None
    total_hist = hist_by_split["train"] if stats_split else sum(hist_by_split.values(), np.zeros(768, np.int64))
    mean, std = _mean_std(total_hist)
    class_counts = [sum(sp["class_counts"][c] for sp in splits.values()) for c in range(n_classes)]
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created_by": f"wds-tools {__version__}",
        **{k: spec[k] for k in ("dataset_version", "size", "resize", "decode")},
        "decoder_versions": decoder_versions(),
        "build": {**spec["build"], "source_path": str(Path(src.path).resolve())},
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
        "errors_file": None,
    }
    failed = sum(len(m["failed"]) for m in metas.values())
    if failed or (dest / ERRORS_FILE).exists():
        meta["errors_file"] = ERRORS_FILE
    write_index(dest, meta, columns)


def _result_from_index(result: ConvertResult, dest: Path, t0: float) -> ConvertResult:
    meta = load_index(dest).meta
    result.samples_written = meta["samples"]
    result.shards = len(meta["shards"])
    result.splits = {name: {"samples": sp["samples"], "shards": sp["shards"],
                            "urls": str(dest / sp["urls"])} for name, sp in meta["splits"].items()}
    result.errors_file = str(dest / ERRORS_FILE) if (dest / ERRORS_FILE).exists() else None
    if result.errors_file:
        with open(result.errors_file, encoding="utf-8") as f:
            result.failed = sum(1 for _ in f)
    result.already_complete = True
    result.seconds = round(time.perf_counter() - t0, 3)
    return result
