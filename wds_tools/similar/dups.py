"""Near-duplicate images of a converted dataset (or across two), by the samples.npz perceptual hash and a check
of the stored pixels (``similar.near.near_clusters``; the stored pixels are read here, once per distinct ``.npy``).

``find_dups`` says, per cluster, its keys, splits, labels, group values and evidence, whether it crosses splits,
labels or groups, and lists the samples too flat to hash (docs/guide/inspect.md, Near-duplicates).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from ..errors import OptionError, ShardError, unwritable_file_error
from ..format.index import open_index, read_sample_table, sample_columns
from ..format.meta import npz_names, read_metadata
from ..format.npy import NPY_HEADER_BYTES
from ..format.phash import WINDOWS, colour_layout, flagged_alike, phash_batch
from ..storage.fsutil import atomic_write_bytes
from ..storage.transport import join, open_ranged
from .match import GRID
from .match import looks as looks_of
from .near import DEFAULT_THRESHOLD, MAX_THRESHOLD, clusters_of, find_pairs, near_clusters

__all__ = [
    "DEFAULT_THRESHOLD",
    "MAX_THRESHOLD",
    "find_pairs",
    "clusters_of",
    "Cluster",
    "DupsResult",
    "find_dups",
    "plot_dups",
    "duplicate_counts",
]


@dataclass
class _Dataset:
    """What ``find_dups`` reads of one converted folder."""

    root: str
    keys: list[str]
    hashes: np.ndarray
    splits: list[str]
    labels: list[str]
    group: str | None  # the metadata column a cluster should not cross
    groups: list[str | None] | None  # its value per sample (None: missing), or no column
    npy: tuple[list[str], np.ndarray, np.ndarray]  # (shard url per sample, npy offset, npy length): --plot
    side: int
    xxh3: np.ndarray  # samples.npz npy_xxh3: equal stored pixels

    def looks(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The colour layouts (``format.phash.colour_layout``) and looks (``similar.match.looks``) of samples
        ``rows``, from their stored pixels: one read per distinct ``.npy`` (by its XXH3-64), so N copies of one
        image cost one read."""
        rows = np.asarray(rows, np.int64)
        _, first, again = np.unique(self.xxh3[rows], return_index=True, return_inverse=True)
        read = rows[first].tolist()
        out = np.zeros((len(read), 2, 2, 2), np.int16)
        look = np.zeros((len(read), GRID, GRID), np.uint8)
        why = "to check it against a near-duplicate candidate"
        for part, pixels in _pixels_by_shard(self.npy[0], self.npy[1], self.keys, read, self.side, why):
            out[part] = colour_layout(pixels)
            look[part] = looks_of(pixels)
        again = np.asarray(again).reshape(-1)
        return out[again], look[again]


def _pixels_by_shard(
    urls: Sequence[str], offsets: np.ndarray, keys: Sequence[str], rows: Sequence[int], side: int, why: str
) -> Iterator[tuple[list[int], list[np.ndarray]]]:
    """(positions into ``rows``, those samples' stored pixels): up to 256 samples of one shard at a time
    (``urls``, ``offsets`` and ``keys``: each sample's shard, ``.npy`` offset and key)."""
    by_shard: dict[str, list[int]] = {}
    for k, r in enumerate(rows):
        by_shard.setdefault(urls[r], []).append(k)
    for url, ks in by_shard.items():
        for lo in range(0, len(ks), 256):
            part = [rows[k] for k in ks[lo : lo + 256]]
            pixels = stored_pixels(url, [int(offsets[r]) for r in part], [keys[r] for r in part], side, why)
            yield ks[lo : lo + 256], pixels


def stored_pixels(url: str, offsets: list[int], keys: list[str], side: int, why: str) -> list[np.ndarray]:
    """The stored pixels [side, side, 3] of the samples (``keys``) whose ``.npy`` members start at ``offsets``
    in shard ``url`` (after its ``NPY_HEADER_BYTES`` header). A shard that cannot be opened or read, or that ends before a
    sample's pixels do, is a ``ShardError`` naming it, the sample and ``why`` it was read."""
    n = side * side * 3
    try:
        f = open_ranged(url)
    except OSError as e:
        raise ShardError(
            f"{url}: cannot open it to read the pixels of {keys[0]!r} ({why}): {e.strerror or e}", url=url
        ) from None
    try:
        out = []
        for offset, key in zip(offsets, keys):
            try:
                data = f.read(offset + NPY_HEADER_BYTES, n)
            except OSError as e:
                raise ShardError(
                    f"{url}: cannot read the pixels of {key!r} ({why}): {e.strerror or e}", url=url, offset=offset
                ) from None
            if len(data) != n:
                raise ShardError(
                    f"{url}: the pixels of {key!r} end at byte {offset + NPY_HEADER_BYTES + len(data)}, {n - len(data)} bytes "
                    f"short ({why}): the shard is cut short; wds-tools verify checks it",
                    url=url,
                    offset=offset,
                )
            out.append(np.frombuffer(data, np.uint8).reshape(side, side, 3))
        return out
    finally:
        f.close()


def _load(spec: str | os.PathLike, group: str | None) -> _Dataset:
    folder, info = open_index(spec)
    group = group if group is not None else info.group
    have = [c.name for c in info.metadata]
    if group is not None and group not in have:
        raise OptionError(
            f"--group {group}: {folder} has no metadata column {group!r} (it has: {', '.join(have) or 'none'})"
        )
    # only the columns used here (the file is checked whole: its size and sha256)
    names = ["key", "label", "shard", "npy_offset", "npy_length", "npy_xxh3"]
    stored = flagged_alike(info, sample_columns(info.format_version))  # else hashed here, from the pixels
    names += ["phash"] if stored else []
    if group is not None:
        names += npz_names(have.index(group), info.metadata[have.index(group)].type)
    table = read_sample_table(folder, info, names)
    cols, keys = table.columns, table.keys
    shard_of = table.shard
    shard_urls = [join(folder, sh.name) for sh in info.shards]  # each shard's once, shared by its samples
    urls = [shard_urls[s] for s in shard_of.tolist()]
    if stored:
        hashes = cols["phash"].astype(np.uint64).reshape(len(keys), WINDOWS)
    else:  # versions 1 and 2, and a version 3 table written before index.json recorded phash_flat_rules
        hashes = np.zeros((len(keys), WINDOWS), np.uint64)
        every = range(len(keys))
        for part, px in _pixels_by_shard(urls, cols["npy_offset"], keys, every, info.size, "for its perceptual hash"):
            hashes[part] = phash_batch(px)
    groups = None
    if group is not None:
        v = read_metadata(cols, info.metadata, [group], join(folder, info.samples_file.name))[group]
        groups = [None if v.missing[i] else str(v.value(i)) for i in range(len(v))]
    return _Dataset(
        folder,
        keys,
        hashes,
        [info.shards[s].split for s in shard_of.tolist()],
        [info.classes[x] for x in table.label.tolist()],
        group,
        groups,
        (urls, cols["npy_offset"], cols["npy_length"]),
        info.size,
        cols["npy_xxh3"],
    )


@dataclass
class Cluster:
    """Near-duplicate samples, with what they say about the splits, labels and groups."""

    members: list[dict]  # {"key", "split", "label", "group", "dataset"} per sample
    max_distance: int
    cross_split: bool
    label_conflict: bool
    cross_group: bool
    representative: dict = field(default_factory=dict)  # {"key", "dataset"}: the sample the others passed against
    pairs: list[dict] = field(default_factory=list)  # {"a", "a_dataset", "b", "b_dataset", "distance", "score"}

    def to_dict(self) -> dict:
        """The cluster as plain JSON types."""
        return {
            "size": len(self.members),
            "max_distance": self.max_distance,
            "cross_split": self.cross_split,
            "label_conflict": self.label_conflict,
            "cross_group": self.cross_group,
            "representative": self.representative,
            "members": self.members,
            "pairs": self.pairs,
        }


def count(n: int, word: str) -> str:
    """``n`` and ``word``, plural unless n is 1: "1 cluster", "12 clusters"."""
    return f"{n:,} {word if n == 1 else word + 's'}"


FLAT_LISTED = 10
"""Samples too flat to hash that the text output names (``--json`` lists all)."""


@dataclass
class DupsResult:
    """``find_dups``' answer: the clusters, worst first, their counts by flag, the candidate pairs checked, and
    the samples too flat to hash (searched by their bits as they are)."""

    paths: list[str]
    threshold: int
    samples: int
    clusters: list[Cluster] = field(default_factory=list)
    group: str | None = None
    flat: list[dict] = field(default_factory=list)  # {"key", "split", "label", "group", "dataset"} per sample
    places: dict[tuple[int, str], tuple[str, int, int]] = field(default_factory=dict, repr=False)  # for --plot
    checked: int = 0  # candidate pairs of distinct looks checked on their pixels (similar.match)
    passed: int = 0  # of which passed

    def counts(self) -> dict[str, int]:
        """Clusters, samples in them, clusters per flag, and samples too flat to hash."""
        return {
            "clusters": len(self.clusters),
            "samples_in_clusters": sum(len(c.members) for c in self.clusters),
            "cross_split": sum(c.cross_split for c in self.clusters),
            "label_conflict": sum(c.label_conflict for c in self.clusters),
            "cross_group": sum(c.cross_group for c in self.clusters),
            "flat": len(self.flat),
        }

    def to_dict(self) -> dict:
        """The result as plain JSON types (``--json``)."""
        return {
            "paths": self.paths,
            "threshold": self.threshold,
            "samples": self.samples,
            "group": self.group,
            **self.counts(),
            "checked": self.checked,
            "passed": self.passed,
            "cluster_list": [c.to_dict() for c in self.clusters],
            "flat_list": self.flat,
        }

    def flat_text(self) -> str:
        """The line that names the samples too flat to hash ("" when there is none)."""
        if not self.flat:
            return ""
        shown = ", ".join(
            (f"{m['dataset']}:" if len(self.paths) > 1 else "") + m["key"] for m in self.flat[:FLAT_LISTED]
        )
        more = f" and {len(self.flat) - FLAT_LISTED:,} more (--json lists all)" if len(self.flat) > FLAT_LISTED else ""
        return (
            f"{count(len(self.flat), 'sample')} too flat to hash (a flat picture, or a smooth one with too little "
            f"detail: docs/FORMAT.md), searched by their hashes as they are, which a copy may not share: {shown}{more}"
        )

    def to_text(self, limit: int = 20) -> str:
        """A summary line, the samples too flat to hash, then up to ``limit`` clusters, worst first."""
        c = self.counts()
        lines = [
            f"{' vs '.join(self.paths)}: {count(self.samples, 'sample')}, "
            f"{count(c['clusters'], 'near-duplicate cluster')} within {self.threshold} bits "
            f"({count(c['samples_in_clusters'], 'sample')}): {c['cross_split']:,} "
            f"{'crosses' if c['cross_split'] == 1 else 'cross'} splits (leakage), {c['label_conflict']:,} "
            f"{'carries' if c['label_conflict'] == 1 else 'carry'} different labels"
            + (
                f", {c['cross_group']:,} {'crosses' if c['cross_group'] == 1 else 'cross'} the group column {self.group}"
                if self.group
                else ""
            )
            + f"; {count(self.checked, 'candidate pair')} checked on the pixels, {self.passed:,} passed"
        ]
        if self.flat:
            lines.append(f"  {self.flat_text()}")
        for k, cl in enumerate(self.clusters[:limit]):
            flags = [
                name
                for name, on in (
                    ("CROSS-SPLIT", cl.cross_split),
                    ("LABEL-CONFLICT", cl.label_conflict),
                    ("CROSS-GROUP", cl.cross_group),
                )
                if on
            ]
            lines.append(
                f"  cluster {k + 1}: {len(cl.members)} samples, max distance {cl.max_distance}"
                + (f"  [{' '.join(flags)}]" if flags else "")
            )
            rep = (cl.representative.get("dataset"), cl.representative.get("key"))
            evidence = {(p["a_dataset"], p["a"]): p for p in cl.pairs}
            for m in cl.members:
                where = f"{m['dataset']}:" if len(self.paths) > 1 else ""
                grp = f" {self.group}={m['group']}" if self.group else ""
                ev = evidence.get((m["dataset"], m["key"]))
                said = (
                    "  (representative)"
                    if (m["dataset"], m["key"]) == rep
                    else f"  {ev['distance']} bits, score {ev['score']:.2f}"
                    if ev
                    else ""
                )
                lines.append(f"    {where}{m['key']}  split={m['split']} label={m['label']}{grp}{said}")
        if len(self.clusters) > limit:
            lines.append(f"  ... and {count(len(self.clusters) - limit, 'more cluster')} (--json lists all)")
        return "\n".join(lines)


def _ranks(datasets: list[_Dataset]) -> np.ndarray:
    """Each sample's place in the order of (dataset, key): which of equal samples names a cluster."""
    keys = [(d, k) for d, ds in enumerate(datasets) for k in ds.keys]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    out = np.empty(len(keys), np.int64)
    out[order] = np.arange(len(keys))
    return out


def _iter_members(datasets: list[_Dataset], index: list[int]) -> Iterator[tuple[int, int]]:
    """(dataset, row) of each position into the datasets' samples laid end to end."""
    n0 = len(datasets[0].keys)
    for x in index:
        yield (0, x) if x < n0 else (1, x - n0)


def find_dups(
    path: str | os.PathLike,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    across: str | os.PathLike | None = None,
    group: str | None = None,
    progress: bool = False,
) -> DupsResult:
    """Near-duplicate clusters of a converted folder, or (``across``) those spanning it and another.

    ``group``: the metadata column whose values a cluster should not cross (default: the conversion's
    ``--group``, if any). With ``across``, only clusters holding samples of both datasets are listed.
    ``threshold``: 0 to ``MAX_THRESHOLD`` bits (else ``OptionError``). Samples too flat to hash are
    listed in ``flat``. ``progress``: show the search's progress on stderr when it runs long.
    """
    from .near import check_threshold

    check_threshold(threshold)  # before reading anything
    datasets = [_load(path, group)]
    if across is not None:
        datasets.append(_load(across, group))
    gname = datasets[0].group
    found = near_clusters(
        datasets[0].hashes,
        threshold,
        datasets[1].hashes if across is not None else None,
        looks=lambda side, rows: datasets[side].looks(rows),
        rank=_ranks(datasets),
        progress=progress,
    )
    res = DupsResult([d.root for d in datasets], threshold, sum(len(d.keys) for d in datasets), group=gname)
    res.checked, res.passed = found.candidates, found.passed
    places = res.places

    def member(dset: int, r: int) -> dict:
        ds = datasets[dset]
        return {
            "key": ds.keys[r],
            "split": ds.splits[r],
            "label": ds.labels[r],
            "group": ds.groups[r] if ds.groups is not None else None,
            "dataset": dset,
        }

    res.flat = sorted(
        (member(dset, r) for dset, r in _iter_members(datasets, found.flat.tolist())),
        key=lambda m: (m["dataset"], m["key"]),
    )

    def where(x: int) -> tuple[int, str]:
        dset, r = next(_iter_members(datasets, [x]))
        return dset, datasets[dset].keys[r]

    for members, worst, rep, evidence in zip(found.clusters, found.max_distance, found.representative, found.pairs):
        rows = []
        for dset, r in _iter_members(datasets, members.tolist()):
            rows.append(member(dset, r))
            ds = datasets[dset]
            places[(dset, ds.keys[r])] = (ds.npy[0][r], int(ds.npy[1][r]), int(ds.npy[2][r]))
        rows.sort(key=lambda m: (m["dataset"], m["key"]))
        groups = {m["group"] for m in rows if m["group"] is not None}
        rep_dset, rep_key = where(rep)
        pairs = []
        for e in evidence.tolist():
            (ad, ak), (bd, bk) = where(e[0]), where(e[1])
            pairs.append(
                {
                    "a": ak,
                    "a_dataset": ad,
                    "b": bk,
                    "b_dataset": bd,
                    "distance": int(e[2]),
                    "score": round(float(e[3]), 4),
                }
            )
        pairs.sort(key=lambda x: (x["a_dataset"], x["a"]))
        res.clusters.append(
            Cluster(
                rows,
                worst,
                cross_split=len({m["split"] for m in rows}) > 1,
                label_conflict=len({m["label"] for m in rows}) > 1,
                cross_group=gname is not None
                and (len(groups) > 1 or (len(groups) == 1 and any(m["group"] is None for m in rows))),
                representative={"key": rep_key, "dataset": rep_dset},
                pairs=pairs,
            )
        )
    res.clusters.sort(
        key=lambda cl: (-(cl.cross_split + cl.label_conflict + cl.cross_group), -len(cl.members), cl.members[0]["key"])
    )
    return res


def plot_dups(
    result: DupsResult, dest: str | os.PathLike, *, clusters: int = 12, per_row: int = 8, thumb: int = 112
) -> int:
    """Draw the first ``clusters`` clusters (worst first), one row each, into a PNG; returns the rows drawn."""
    shown = result.clusters[:clusters]
    label_h = 30
    sheet = Image.new(
        "RGB", (max(1, per_row) * (thumb + 4) + 4, max(1, len(shown)) * (thumb + label_h + 8) + 4), (255, 255, 255)
    )
    draw = ImageDraw.Draw(sheet)
    for row, cl in enumerate(shown):
        y = 4 + row * (thumb + label_h + 8)
        for col, m in enumerate(cl.members[:per_row]):
            url, offset, length = result.places[(m["dataset"], m["key"])]
            side = int(round(((length - NPY_HEADER_BYTES) / 3) ** 0.5))
            pixels = stored_pixels(url, [offset], [m["key"]], side, "for the contact sheet")[0]
            x = 4 + col * (thumb + 4)
            sheet.paste(Image.fromarray(pixels).resize((thumb, thumb)), (x, y))
            colour = (200, 0, 0) if cl.cross_split or cl.label_conflict else (0, 0, 0)
            draw.text((x, y + thumb + 2), m["key"][:18], fill=colour)
            draw.text((x, y + thumb + 14), f"{m['split']} {m['label']}"[:18], fill=colour)
    png = io.BytesIO()
    sheet.save(png, "PNG")
    try:
        atomic_write_bytes(dest, png.getvalue())  # never a half-written file at dest
    except OSError as e:  # a read-only mount, a missing folder: one line, no traceback
        raise unwritable_file_error(str(dest), e, "the contact sheet") from None
    return len(shown)


STATS_LIMIT = 200_000  # samples up to which ``stats`` counts near-duplicates (a few seconds; README)


def duplicate_counts(
    folder: str, *, threshold: int = DEFAULT_THRESHOLD, limit: int | None = STATS_LIMIT, progress: bool = False
) -> dict | None:
    """Near-duplicate cluster counts of a converted folder (``stats``); None when its samples.npz has no
    ``phash`` column (format versions 1 and 2: ``wds-tools dups`` computes it); ``{"threshold",
    "skipped"}`` for a set of more than ``limit`` samples (the search then takes a minute or more).
    ``progress``: show the search's progress on stderr when it runs long."""
    folder_, info = open_index(folder)
    if info.format_version < 3:
        return None
    n = info.samples
    if limit is not None and n > limit:
        return {
            "threshold": threshold,
            "skipped": f"{n:,} samples, more than stats counts near-duplicates for ({limit:,}): run wds-tools dups",
        }
    c = find_dups(folder_, threshold=threshold, progress=progress)
    return {
        "threshold": threshold,
        **c.counts(),
        "cross_split_keys": [[m["key"] for m in cl.members] for cl in c.clusters if cl.cross_split][:10],
        "flat_keys": [m["key"] for m in c.flat[:FLAT_LISTED]],
    }
