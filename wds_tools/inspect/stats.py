"""Shard statistics: balance, class drift, the rank/worker split of an epoch, mean/std and size.

``compute_stats`` reads only index.json and two columns of samples.npz (or, with ``scan``, the
tars themselves), local or through a URL (``format.layout``), and returns a ``StatsReport``; ``distribute`` is the pure rank/worker
arithmetic; ``plot_stats`` draws a report when matplotlib (the ``plot`` extra) is installed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from ..errors import ExtraNotInstalledError, IndexFormatError, OptionError, ShardError
from ..format.cpus import usable_cpus
from ..format.index import histogram_mean_std
from ..format.layout import Shards, basename, exists, file_size, join, read_samples, resolve_target, shard_split
from ..format.ranks import deal
from ..format.npy import NPY_HEADER_BYTES, image_side_or_none
from ..format.sample import read_label_i32
from ..format.meta import read_metadata
from ..format.tar import CHUNK, TarWalker, scan_file
from .stats_meta import Breakdown, GroupReport, breakdown, check_column, group_report, metadata_arrays
from .stats_meta import render_text as render_metadata

__all__ = ["SCHEMA", "Distribution", "distribute", "SplitStats", "StatsReport", "compute_stats",
           "plot_stats", "require_matplotlib"]

SCHEMA = "wds-tools-stats/1"
TOP_DRIFT = 5  # shards named as deviating most, per split
TEXT_CLASSES = 20  # classes listed in the text table; --json has them all


# ------------------------------------------------------------------ rank / worker arithmetic

@dataclass
class Distribution:
    """How one epoch of a split is dealt to ``world_size`` ranks × ``workers`` DataLoader workers.

    Shard i goes to rank i % R (webdataset's ``split_by_node``); the j-th shard of a rank goes to
    its worker j % W (``split_by_worker``): ``format.ranks.deal``. ``worker_*`` are [rank][worker].
    """

    world_size: int
    workers: int
    shards: int
    samples: int
    rank_shards: list[int]
    rank_samples: list[int]
    worker_shards: list[list[int]]
    worker_samples: list[list[int]]
    idle_workers: int  # readers (rank, worker) that get no shard
    even_shards_below: int | None  # nearest shard counts n' with n' % (R × W) == 0
    even_shards_above: int
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in _DISTRIBUTION_KEYS}


_DISTRIBUTION_KEYS = ("world_size", "workers", "shards", "samples", "rank_shards", "rank_samples",
                      "worker_shards", "worker_samples", "idle_workers", "even_shards_below",
                      "even_shards_above", "warnings")


def distribute(shard_sample_counts: Sequence[int], world_size: int = 1, workers: int = 1) -> Distribution:
    """Deal shards to ranks (i % R) and then to each rank's workers (j % W); count what each gets."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise OptionError(f"world_size {world_size!r}: expected an integer >= 1 (the number of ranks)")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise OptionError(f"workers {workers!r}: expected an integer >= 1 (DataLoader workers per rank)")
    counts = np.asarray(shard_sample_counts, dtype=np.int64).reshape(-1)
    n, r, w = len(counts), world_size, workers
    slot = np.empty(n, dtype=np.int64)  # reader (rank, worker) of each shard, as rank * w + worker
    for rank_no, row in enumerate(deal(range(n), r, w)):
        for worker_no, positions in enumerate(row):
            slot[positions] = rank_no * w + worker_no
    rank = slot // w
    rank_shards = np.bincount(rank, minlength=r)
    rank_samples = np.bincount(rank, weights=counts, minlength=r).astype(np.int64)
    worker_shards = np.bincount(slot, minlength=r * w).reshape(r, w)
    worker_samples = np.bincount(slot, weights=counts, minlength=r * w).astype(np.int64).reshape(r, w)
    readers = r * w
    below = (n // readers) * readers or None
    above = -(-n // readers) * readers or readers
    idle = int((worker_shards == 0).sum())
    warnings = []
    if n < readers:
        no_rank = int((rank_shards == 0).sum())
        warnings.append(
            f"{_n(n, 'shard')} for {_n(r, 'rank')} × {_n(w, 'worker')} = {_n(readers, 'reader')}: "
            f"{_n(idle, 'reader')} get{'s' if idle == 1 else ''} no shard"
            f"{f' (ranks without any shard: {no_rank})' if no_rank else ''}; use at least {_n(readers, 'shard')}"
        )
    if n and rank_samples.min() != rank_samples.max():
        warnings.append(
            f"ranks get unequal sample counts per epoch ({int(rank_samples.min()):,} to "
            f"{int(rank_samples.max()):,}); with DDP the ranks fall out of step; use a shard count that "
            f"divides evenly ({_even_text(below, above)}) with equal shards, or a fixed epoch length"
        )
    return Distribution(r, w, n, int(counts.sum()), rank_shards.tolist(), rank_samples.tolist(),
                        worker_shards.tolist(), worker_samples.tolist(), idle, below, above, warnings)


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'s' if count != 1 else ''}"


def _even_text(below: int | None, above: int) -> str:
    return f"{above}" if below in (None, above) else f"{below} or {above}"


# ------------------------------------------------------------------ the report

@dataclass
class SplitStats:
    """Figures for one split; per-shard arrays are in shard order."""

    name: str
    shard_names: list[str]
    shard_samples: np.ndarray  # int64 [n]
    shard_bytes: np.ndarray  # int64 [n]
    shard_class_counts: np.ndarray  # int64 [n, classes]
    mean: list[float] | None
    std: list[float] | None
    distribution: Distribution

    @property
    def shards(self) -> int:
        return len(self.shard_names)

    @property
    def samples(self) -> int:
        return int(self.shard_samples.sum())

    @cached_property
    def class_counts(self) -> np.ndarray:
        return self.shard_class_counts.sum(axis=0)

    @property
    def class_share(self) -> np.ndarray:
        total = self.class_counts.sum()
        return self.class_counts / total if total else np.zeros(len(self.class_counts))

    @cached_property
    def _deviation(self) -> np.ndarray:
        """[shards, classes]: |class share in the shard - share in the split| (0 for an empty shard)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            share = self.shard_class_counts / self.shard_samples[:, None]
        return np.nan_to_num(np.abs(share - self.class_share[None, :]), nan=0.0)

    @property
    def drift(self) -> np.ndarray:
        """Per shard, the largest |class share - split share| in percentage points (NaN: empty shard)."""
        dev = self._deviation
        if dev.shape[1] == 0:
            return np.zeros(len(dev))
        return np.where(self.shard_samples > 0, dev.max(axis=1) * 100, np.nan)

    @property
    def drift_class(self) -> np.ndarray:
        dev = self._deviation
        return dev.argmax(axis=1) if dev.shape[1] else np.zeros(len(dev), dtype=np.int64)

    def to_dict(self, classes: list[str]) -> dict:
        s, b = self.shard_samples, self.shard_bytes
        drift, drift_class = self.drift, self.drift_class
        worst = [i for i in np.argsort(-np.nan_to_num(drift, nan=-1.0), kind="stable")[:TOP_DRIFT]
                 if not np.isnan(drift[i])]
        return {
            "shards": self.shards,
            "samples": self.samples,
            "bytes": int(b.sum()),
            "samples_per_shard": _spread(s),
            "bytes_per_shard": {k: v for k, v in _spread(b).items() if k in ("min", "median", "max")},
            "class_counts": self.class_counts.tolist(),
            "class_share": [round(float(x), 6) for x in self.class_share],
            "class_drift": {
                "max_pp": _round(np.nanmax(drift)) if np.isfinite(drift).any() else None,
                "median_pp": _round(np.nanmedian(drift)) if np.isfinite(drift).any() else None,
                "worst": [{"shard": self.shard_names[i], "pp": _round(drift[i]),
                           "class": classes[int(drift_class[i])]} for i in worst],
            },
            "mean": self.mean,
            "std": self.std,
            "distribution": self.distribution.to_dict(),
            "per_shard": [{"name": n, "samples": int(s[i]), "bytes": int(b[i]),
                           "drift_pp": None if np.isnan(drift[i]) else _round(drift[i]),
                           "drift_class": None if np.isnan(drift[i]) else classes[int(drift_class[i])]}
                          for i, n in enumerate(self.shard_names)],
        }


def _round(x, nd: int = 3) -> float:
    return round(float(x), nd)


def _spread(a: np.ndarray) -> dict:
    if len(a) == 0:
        return {"min": 0, "median": 0, "max": 0, "imbalance": None, "cv": None}
    mn, mx, mean = int(a.min()), int(a.max()), float(a.mean())
    return {"min": mn, "median": float(np.median(a)), "max": mx,
            "imbalance": _round(mx / mn, 4) if mn > 0 else None,
            "cv": _round(a.std() / mean, 4) if mean > 0 else None}


@dataclass
class StatsReport:
    """What ``wds-tools stats`` prints; ``to_dict`` is the stable ``--json`` schema (``SCHEMA``)."""

    source: str  # "index" or "scan"
    path: str
    root: str
    index: str | None
    dataset_version: str | None
    size: int | None
    classes: list[str]
    splits: dict[str, SplitStats]
    shard_bytes: int
    index_bytes: int
    mean: list[float] | None
    std: list[float] | None
    stats_split: str | None
    world_size: int
    workers: int
    seconds: float = 0.0
    by: Breakdown | None = None  # --by COL: class counts per value of a metadata column
    groups: GroupReport | None = None  # build.group (or --group COL): groups in more than one split
    notes: list[str] = field(default_factory=list)  # about the whole report (a pattern naming part of a split)

    @property
    def samples(self) -> int:
        return sum(sp.samples for sp in self.splits.values())

    @property
    def shards(self) -> int:
        return sum(sp.shards for sp in self.splits.values())

    @property
    def warnings(self) -> list[str]:
        return self.notes + [f"{name}: {w}" for name, sp in self.splits.items() for w in sp.distribution.warnings] \
            + (self.groups.warnings if self.groups is not None else [])

    def to_dict(self) -> dict:
        extra = {k: v.to_dict() for k, v in (("by", self.by), ("groups", self.groups)) if v is not None}
        return {
            "schema": SCHEMA,
            "source": self.source,
            "path": self.path,
            "root": self.root,
            "index": self.index,
            "dataset_version": self.dataset_version,
            "size": self.size,
            "classes": self.classes,
            "samples": self.samples,
            "shards": self.shards,
            "bytes": {"shards": self.shard_bytes, "index": self.index_bytes,
                      "total": self.shard_bytes + self.index_bytes},
            "mean": self.mean,
            "std": self.std,
            "stats_split": self.stats_split,
            "world_size": self.world_size,
            "workers": self.workers,
            "splits": {name: sp.to_dict(self.classes) for name, sp in self.splits.items()},
            **extra,  # only when asked for (--by) or the set has a group column
            "warnings": self.warnings,
            "seconds": round(self.seconds, 4),
        }

    def to_text(self) -> str:
        return _render_text(self)


# ------------------------------------------------------------------ computing it

def compute_stats(path: str | os.PathLike | None = None, *, out: str | os.PathLike = "shards",
                  world_size: int = 1, workers: int | None = None, scan: bool = False, by: str | None = None,
                  group: str | None = None, allow_mixed: bool = False) -> StatsReport:
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
        raise OptionError(f"{'--by' if by is not None else '--group'} reads the index's metadata columns; "
                          "it cannot be combined with --scan")
    target = resolve_target(path, out=out, scan=scan, allow_mixed=allow_mixed)
    if scan:
        report = _from_scan(target, world_size, workers)
    else:
        report = _from_index(target, world_size, workers, by, group)
    # a part of a split is a legitimate question (which shards are these?); the report says it is a part
    report.notes = [f"the spec {g.describe(where=False)}: shard and sample figures are of the named "
                    f"shards only (mean/std are the index's)" for g in target.gaps]
    report.seconds = time.perf_counter() - t0
    return report


def _from_index(target: Shards, world_size: int, workers: int, by: str | None = None,
                group: str | None = None) -> StatsReport:
    meta, base = target.meta, target.index_base
    classes = list(meta.get("classes", []))
    shards = meta["shards"]
    for name, option in ((by, "--by"), (group, "--group")):
        if name is not None:
            check_column(meta, name, option)
    build = meta.get("build") if isinstance(meta.get("build"), dict) else {}
    group = group if group is not None else build.get("group")
    wanted = [n for n in (by, group) if n is not None]
    where = join(base, meta["samples_file"]["name"])
    cols = read_samples(where, ("label", "shard", *metadata_arrays(meta, wanted)))
    label = cols["label"].astype(np.int64)
    shard = cols["shard"].astype(np.int64)
    n_shards, n_classes = len(shards), len(classes)
    if len(label) and (label.min() < 0 or label.max() >= n_classes or shard.max() >= n_shards):
        raise IndexFormatError(f"{target.index_file}: samples.npz has labels or shard numbers "
                               "outside the index's classes/shards; the index is damaged (run verify)")
    counts = np.bincount(shard * n_classes + label, minlength=n_shards * n_classes).reshape(n_shards, n_classes)
    chosen = set(target.names) if target.selected else None
    per_split: dict[str, list[int]] = {}
    for i, s in enumerate(shards):
        if chosen is None or s["name"] in chosen:
            per_split.setdefault(s["split"], []).append(i)
    splits = {}
    for name, pos in sorted(per_split.items()):
        pos_a = np.array(pos, dtype=np.int64)
        samples = np.array([shards[i]["samples"] for i in pos], dtype=np.int64)
        sp_meta = meta.get("splits", {}).get(name, {})
        splits[name] = SplitStats(
            name, [shards[i]["name"] for i in pos], samples,
            np.array([shards[i]["bytes"] for i in pos], dtype=np.int64), counts[pos_a],
            sp_meta.get("mean"), sp_meta.get("std"), distribute(samples, world_size, workers))
    index_bytes = meta.get("samples_file", {}).get("bytes", 0)
    try:
        index_bytes += file_size(target.index_file)
    except OSError:
        pass
    report = StatsReport(
        "index", target.spec, base, target.index_file, meta.get("dataset_version"),
        meta.get("size"), classes, splits, sum(int(sp.shard_bytes.sum()) for sp in splits.values()),
        index_bytes, meta.get("mean"), meta.get("std"), meta.get("stats_split"), world_size, workers)
    if wanted:
        values = read_metadata(cols, meta, wanted, where)
        names = list(splits)
        split_of = np.array([names.index(s["split"]) if s["split"] in splits and (chosen is None or s["name"] in
                             chosen) else -1 for s in shards], np.int64)
        row_split = split_of[shard]
        mine = np.flatnonzero(row_split >= 0)
        if by is not None:
            report.by = breakdown(values[by].take(mine), label[mine], row_split[mine], names, n_classes)
        if group is not None:
            report.groups = group_report(values[group].take(mine), row_split[mine], names)
    return report


@dataclass
class _ShardScan:
    name: str
    bytes: int
    labels: list[int]
    label_names: dict[int, str]
    hist: np.ndarray  # [768]: R, G, B value counts
    size: int | None


@lru_cache(maxsize=1)
def _channels() -> np.ndarray:
    """0, 256, 512 repeated over a chunk: pixel byte + this = its bin in an R|G|B histogram."""
    return np.tile(np.array([0, 256, 512], dtype=np.uint16), CHUNK // 3 + 2)


def _scan_shard(url: str) -> _ShardScan:
    """Read one tar: labels, label names, pixel histogram (every byte is read once)."""
    hist = np.zeros(768, dtype=np.int64)

    def capture(name: str) -> int:
        return NPY_HEADER_BYTES if name.endswith(".npy") else (-1 if name.endswith((".cls", ".json")) else
                                                               8 if name.endswith(".i32") else 0)

    walker = TarWalker(capture)
    done = 0  # members before this one are fully counted

    def count_pixels(base: int, chunk: memoryview) -> int:
        """Add the pixels of every .npy member overlapping ``chunk`` (at file offset ``base``)."""
        end = base + len(chunk)
        i = done
        while i < len(walker.members):
            m = walker.members[i]
            if m.name.endswith(".npy") and m.size > NPY_HEADER_BYTES:
                lo, hi = max(m.offset + NPY_HEADER_BYTES, base), min(m.offset + m.size, end)
                if lo < hi:
                    arr = np.frombuffer(chunk[lo - base:hi - base], dtype=np.uint8)
                    phase = (lo - m.offset - NPY_HEADER_BYTES) % 3
                    np.add(hist, np.bincount(arr + _channels()[phase:phase + len(arr)], minlength=768), out=hist)
                if m.offset + m.size > end:
                    break  # it goes on in the next chunk
            i += 1
        return i

    def on_chunk(part: memoryview) -> None:
        nonlocal done
        done = count_pixels(walker.pos - len(part), part)

    try:
        scan_file(url, on_chunk=on_chunk, walker=walker)
    except OSError as e:
        raise ShardError(f"cannot read shard {url}: {e.strerror or e}") from None
    if walker.error:
        raise ShardError(f"{url}: {walker.error}; run `wds-tools verify` for a full report")
    labels: list[int] = []
    names: dict[int, str] = {}
    size = None
    last_cls = None
    for m in walker.members:
        if m.name.endswith(".cls"):
            try:
                last_cls = int(m.data.decode("ascii"))
            except ValueError:
                raise ShardError(f"{url}: member {m.name} holds {m.data[:20]!r}, not a class number") from None
            labels.append(last_cls)
        elif m.name.endswith(".i32") and read_label_i32(m.data) != last_cls:  # format version 2: the label as int32
            raise ShardError(f"{url}: member {m.name} holds {m.data[:8]!r}, but the sample's .cls says {last_cls}; "
                             "run `wds-tools verify` for a full report")
        elif m.name.endswith(".json") and last_cls is not None and last_cls not in names:
            try:
                names[last_cls] = str(json.loads(m.data)["label"])
            except (ValueError, KeyError, TypeError):
                pass
        elif m.name.endswith(".npy") and size is None and m.data:
            size = image_side_or_none(m.data)
    return _ShardScan(basename(url), walker.pos, labels, names, hist, size)


def _from_scan(target: Shards, world_size: int, workers: int) -> StatsReport:
    paths = target.urls
    missing = [p for p in paths if not exists(p)]
    if missing:
        raise ShardError(f"{len(missing)} shard(s) missing, first: {missing[0]}; run `wds-tools verify`")
    with ThreadPoolExecutor(max_workers=min(len(paths), usable_cpus()) or 1) as ex:
        scans = list(ex.map(_scan_shard, paths))
    if target.folder is None:  # several folders (allowed with --scan): a shard is named by its URL
        for s, p in zip(scans, paths):
            s.name = p
    n_classes = max((max(s.labels) + 1 for s in scans if s.labels), default=0)
    names: dict[int, str] = {}
    for s in scans:
        for k, v in s.label_names.items():
            names.setdefault(k, v)
    classes = [names.get(i, str(i)) for i in range(n_classes)]
    by_split: dict[str, list[_ShardScan]] = {}
    for s in scans:
        by_split.setdefault(shard_split(basename(s.name)), []).append(s)
    splits = {}
    hists = {}
    for name, group in sorted(by_split.items()):
        samples = np.array([len(s.labels) for s in group], dtype=np.int64)
        counts = np.array([np.bincount(np.array(s.labels, dtype=np.int64), minlength=n_classes)
                           for s in group], dtype=np.int64).reshape(len(group), n_classes)
        hists[name] = sum((s.hist for s in group), np.zeros(768, np.int64))
        mean, std = histogram_mean_std(hists[name])
        splits[name] = SplitStats(name, [s.name for s in group], samples,
                                  np.array([s.bytes for s in group], dtype=np.int64), counts, mean, std,
                                  distribute(samples, world_size, workers))
    stats_split = "train" if "train" in hists else "all"
    total = hists["train"] if "train" in hists else sum(hists.values(), np.zeros(768, np.int64))
    mean, std = histogram_mean_std(total)
    sizes = {s.size for s in scans if s.size is not None}
    return StatsReport("scan", target.spec, target.folder or target.spec, None, None,
                       sizes.pop() if len(sizes) == 1 else None, classes, splits,
                       sum(s.bytes for s in scans), 0, mean, std, stats_split, world_size, workers)


# ------------------------------------------------------------------ text and plot

def _mb(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:,.1f} {unit}"
    return f"{n} B"


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.3f}" if abs(x) < 10 else f"{x:,.1f}"
    return f"{int(x):,}"


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(widths[c]) if c == 0 else cell.rjust(widths[c])
                               for c, cell in enumerate(r)).rstrip() for r in rows]


def _render_text(r: StatsReport) -> str:
    d = r.to_dict()
    lines = []
    what = (f"{r.dataset_version}, {r.size} px" if r.dataset_version else
            (f"{r.size} px" if r.size else "size unknown"))
    src = f"index {r.index}" if r.source == "index" else f"scan of {r.shards} tars (no index used)"
    lines.append(f"{r.root}  ({what}; from the {src})")
    lines.append(f"  {r.samples:,} samples in {r.shards:,} shards; {_mb(d['bytes']['total'])} on disk "
                 f"({_mb(r.shard_bytes)} shards + {_mb(r.index_bytes)} index)")
    if r.mean:
        lines.append(f"  mean {' '.join(f'{x:.4f}' for x in r.mean)}   std {' '.join(f'{x:.4f}' for x in r.std)}"
                     f"   (R G B, 0-1, over {r.stats_split})")
    lines += [f"  warning: {n}" for n in r.notes]
    for name, sp in d["splits"].items():
        dist = sp["distribution"]
        lines.append("")
        lines.append(f"{name}: {sp['samples']:,} samples in {sp['shards']:,} shard{'s' if sp['shards'] != 1 else ''}, "
                     f"{_mb(sp['bytes'])}")
        s, b = sp["samples_per_shard"], sp["bytes_per_shard"]
        imb = "-" if s["imbalance"] is None else f"{s['imbalance']:.3f}"
        cv = "-" if s["cv"] is None else f"{s['cv']:.4f}"
        lines += _table([["per shard", "min", "median", "max", "max/min", "cv"],
                         ["samples", _num(s["min"]), _num(s["median"]), _num(s["max"]), imb, cv],
                         ["bytes", _num(b["min"]), _num(b["median"]), _num(b["max"]), "", ""]])
        drift = sp["class_drift"]
        rows = [["class", "samples", "share"]]
        for c, (count, share) in enumerate(zip(sp["class_counts"], sp["class_share"])):
            if c < TEXT_CLASSES:
                rows.append([r.classes[c], f"{count:,}", f"{share * 100:.2f}%"])
        lines += _table(rows)
        if len(r.classes) > TEXT_CLASSES:
            lines.append(f"  ... {len(r.classes) - TEXT_CLASSES} more classes (all in --json)")
        if drift["max_pp"] is not None:
            worst = ", ".join(f"{w['shard']} {w['pp']:.1f} pp ({w['class']})" for w in drift["worst"])
            lines.append(f"  class drift per shard: max {drift['max_pp']:.2f} pp, median "
                         f"{drift['median_pp']:.2f} pp; most: {worst}")
        if sp["mean"]:
            lines.append(f"  mean {' '.join(f'{x:.4f}' for x in sp['mean'])}   "
                         f"std {' '.join(f'{x:.4f}' for x in sp['std'])}")
        rs, rn = dist["rank_shards"], dist["rank_samples"]
        ws = [x for row in dist["worker_shards"] for x in row]
        wn = [x for row in dist["worker_samples"] for x in row]
        lines.append(f"  per epoch with {dist['world_size']} rank(s) × {dist['workers']} worker(s):")
        lines += _table([["", "shards min", "max", "samples min", "max"],
                         ["per rank", _num(min(rs)), _num(max(rs)), _num(min(rn)), _num(max(rn))],
                         ["per worker", _num(min(ws)), _num(max(ws)), _num(min(wn)), _num(max(wn))]], "    ")
        lines.append(f"    shard counts that divide evenly over {dist['world_size'] * dist['workers']} "
                     f"readers: {_even_text(dist['even_shards_below'], dist['even_shards_above'])}")
        for w in dist["warnings"]:
            lines.append(f"  warning: {w}")
    lines += render_metadata(r.by, r.groups, r.classes, TEXT_CLASSES)
    return "\n".join(lines)


def plot_stats(report: StatsReport, path: str | os.PathLike) -> str:
    """Draw samples per shard and class share per shard (a heatmap) for each split into ``path``."""
    mpl = require_matplotlib()
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(report.splits.values())
    if not splits:
        raise ShardError(f"{report.root}: no shards to plot")
    fig, axes = plt.subplots(2, len(splits), figsize=(6 * len(splits), 7), squeeze=False,
                             gridspec_kw={"height_ratios": [1, 2]})
    for col, sp in enumerate(splits):
        ax = axes[0][col]
        ax.bar(np.arange(sp.shards), sp.shard_samples, width=1.0, color="#4c72b0")
        ax.set_title(f"{sp.name}: samples per shard")
        ax.set_xlabel("shard")
        ax.set_ylabel("samples")
        ax = axes[1][col]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.nan_to_num(sp.shard_class_counts / sp.shard_samples[:, None])
        im = ax.imshow(share.T, aspect="auto", interpolation="nearest", cmap="viridis")
        ax.set_title(f"{sp.name}: class share per shard")
        ax.set_xlabel("shard")
        ax.set_ylabel("class")
        if len(report.classes) <= 30:
            ax.set_yticks(range(len(report.classes)), report.classes)
        fig.colorbar(im, ax=ax, label="share of the shard")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def require_matplotlib():
    """matplotlib, or a message naming the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise ExtraNotInstalledError(
            "--plot needs matplotlib, which is not installed; install the plot extra: "
            "pip install 'wds-tools[plot]'"
        ) from None
    return matplotlib
