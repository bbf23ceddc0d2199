"""Where the figures of ``wds-tools stats`` come from: the index (index.json and two columns of
samples.npz, plus metadata columns for ``--by``/``--group``) or, with ``--scan``, the tars
themselves, local or through a URL (``storage.transport``). Each fills a ``report.StatsReport``.
"""

from __future__ import annotations

import difflib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...cpus import usable_cpus
from ...dataset.resolve import Shards
from ...errors import IndexFormatError, OptionError, ShardError
from ...format.index import histogram_mean_std, read_sample_table
from ...format.meta import npz_names, read_metadata
from ...format.model import IndexMeta
from ...format.names import shard_split
from ...format.npy import NPY_HEADER_BYTES, image_side_or_none
from ...format.sample import read_label_i32
from ...format.tar import CHUNK, TarWalker, scan_file
from ...storage.transport import basename, exists, file_size, join
from .figures import SplitStats, StatsReport, breakdown, distribute, group_report

__all__ = ["from_index", "from_scan", "check_column"]


# ------------------------------------------------------------------ from the index


def from_index(
    target: Shards,
    world_size: int,
    workers: int,
    by: str | None = None,
    group: str | None = None,
    reader: str = "stream",
) -> StatsReport:
    """The report from index.json and two columns of samples.npz (and the metadata ``by``/``group`` name)."""
    info, base, index_file = target.info, target.index_base, target.index_file
    if info is None or base is None or index_file is None:  # (resolve_target without scan needs the index)
        raise IndexFormatError(f"{target.spec}: no index.json lists these shards; pass --scan to read the tars")
    shards = info.shards
    for name, option in ((by, "--by"), (group, "--group")):
        if name is not None:
            check_column(info, name, option)
    group = group if group is not None else info.group
    wanted = [n for n in (by, group) if n is not None]
    arrays = [a for i, c in enumerate(info.metadata) if c.name in wanted for a in npz_names(i, c.type)]
    table = read_sample_table(base, info, ("label", "shard", *arrays))  # its size, sha256, and rows against the index
    label, shard = table.label, table.shard
    n_shards, n_classes = len(shards), len(info.classes)
    counts = np.bincount(shard * n_classes + label, minlength=n_shards * n_classes).reshape(n_shards, n_classes)
    chosen = set(target.names or ()) if target.selected else None
    per_split: dict[str, list[int]] = {}
    for s in shards:
        if chosen is None or s.name in chosen:
            per_split.setdefault(s.split, []).append(s.pos)
    splits = {}
    for name, pos in sorted(per_split.items()):
        samples = np.array([shards[i].samples for i in pos], dtype=np.int64)
        sp = info.splits.get(name)
        splits[name] = SplitStats(
            name,
            [shards[i].name for i in pos],
            samples,
            np.array([shards[i].bytes for i in pos], dtype=np.int64),
            counts[np.array(pos, dtype=np.int64)],
            list(sp.mean) if sp else None,
            list(sp.std) if sp else None,
            distribute(samples, world_size, workers, reader, evaluation=name != "train"),
        )
    index_bytes = info.samples_file.bytes
    try:
        index_bytes += file_size(index_file)
    except OSError:
        pass
    report = StatsReport(
        "index",
        target.spec,
        base,
        index_file,
        info.dataset_version,
        info.size,
        list(info.classes),
        splits,
        sum(int(sp.shard_bytes.sum()) for sp in splits.values()),
        index_bytes,
        list(info.mean),
        list(info.std),
        info.stats_split,
        world_size,
        workers,
        reader=reader,
        metadata=[c.to_dict() for c in info.metadata],
    )
    if wanted:
        values = read_metadata(table.columns, info.metadata, wanted, join(base, info.samples_file.name))
        names = list(splits)
        split_of = np.array(
            [
                names.index(s.split) if s.split in splits and (chosen is None or s.name in chosen) else -1
                for s in shards
            ],
            np.int64,
        )
        row_split = split_of[shard]
        mine = np.flatnonzero(row_split >= 0)
        if by is not None:
            report.by = breakdown(values[by].take(mine), label[mine], row_split[mine], names, n_classes)
        if group is not None:
            report.groups = group_report(values[group].take(mine), row_split[mine], names)
    return report


def check_column(info: IndexMeta, name: str, option: str) -> None:
    """Refuse a column the index's metadata does not have, listing those it has (with a close match)."""
    names = [c.name for c in info.metadata]
    if name in names:
        return
    columns = (info.build.columns if info.build else None) or {}
    role = next((r for r in ("label", "key", "path", "split") if columns.get(r) == name), None)
    listed = f"Its metadata columns: {', '.join(names)}." if names else "It has no metadata columns."
    if role == "label":
        raise OptionError(
            f"{option} {name!r}: {name!r} is this conversion's label column (--label), whose classes "
            f"are the table's columns already; name a metadata column. {listed}"
        )
    if role is not None:
        raise OptionError(
            f"{option} {name!r}: {name!r} is this conversion's {role} column (--{role}), not metadata. {listed}"
        )
    if not names:
        raise OptionError(
            f"{option} {name!r}: this index has no metadata columns (it was converted from a plain "
            "key,path,label manifest, or in format version 1)"
        )
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise OptionError(f"{option} {name!r}: the index has no metadata column {name!r}{hint} {listed}")


# ------------------------------------------------------------------ from the tars


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
        return (
            NPY_HEADER_BYTES
            if name.endswith(".npy")
            else (-1 if name.endswith((".cls", ".json")) else 8 if name.endswith(".i32") else 0)
        )

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
                    arr = np.frombuffer(chunk[lo - base : hi - base], dtype=np.uint8)
                    phase = (lo - m.offset - NPY_HEADER_BYTES) % 3
                    np.add(hist, np.bincount(arr + _channels()[phase : phase + len(arr)], minlength=768), out=hist)
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
            raise ShardError(
                f"{url}: member {m.name} holds {m.data[:8]!r}, but the sample's .cls says {last_cls}; "
                "run `wds-tools verify` for a full report"
            )
        elif m.name.endswith(".json") and last_cls is not None and last_cls not in names:
            try:
                names[last_cls] = str(json.loads(m.data)["label"])
            except (ValueError, KeyError, TypeError):
                pass
        elif m.name.endswith(".npy") and size is None and m.data:
            size = image_side_or_none(m.data)
    return _ShardScan(basename(url), walker.pos, labels, names, hist, size)


def from_scan(target: Shards, world_size: int, workers: int, reader: str = "stream") -> StatsReport:
    """The report from the tars themselves (every byte read once; no index needed)."""
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
        counts = np.array(
            [np.bincount(np.array(s.labels, dtype=np.int64), minlength=n_classes) for s in group], dtype=np.int64
        ).reshape(len(group), n_classes)
        hists[name] = sum((s.hist for s in group), np.zeros(768, np.int64))
        mean, std = histogram_mean_std(hists[name])
        splits[name] = SplitStats(
            name,
            [s.name for s in group],
            samples,
            np.array([s.bytes for s in group], dtype=np.int64),
            counts,
            mean,
            std,
            distribute(samples, world_size, workers, reader, evaluation=name != "train"),
        )
    stats_split = "train" if "train" in hists else "all"
    total = hists["train"] if "train" in hists else sum(hists.values(), np.zeros(768, np.int64))
    mean, std = histogram_mean_std(total)
    sizes = {s.size for s in scans if s.size is not None}
    return StatsReport(
        "scan",
        target.spec,
        target.folder or target.spec,
        None,
        None,
        sizes.pop() if len(sizes) == 1 else None,
        classes,
        splits,
        sum(s.bytes for s in scans),
        0,
        mean,
        std,
        stats_split,
        world_size,
        workers,
        reader=reader,
    )
