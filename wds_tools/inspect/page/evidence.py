"""The page's two sections about pairs of samples: near-duplicate clusters (``similar.dups.find_dups``),
cross-split ones first, and the changes against the version this one was built from
(``inspect.diff.diff_versions``), each with the thumbnails of the samples it names."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ...format.index import SampleTable, open_index, read_sample_table
from ...format.model import IndexMeta
from ...similar.dups import STATS_LIMIT, find_dups
from ...storage.transport import exists, join, parent
from ..diff import diff_versions
from ..stats.figures import cluster_warning
from .facts import Warn
from .thumbs import Budget, Pixels, Thumb, read_places, thumbs_of

__all__ = [
    "MAX_CLUSTERS",
    "MAX_MEMBERS",
    "MAX_EVIDENCE_ROWS",
    "MAX_CHANGES",
    "DUPS_LIMIT",
    "folder_pixels",
    "dups_section",
    "built_from",
    "versions_section",
]

MAX_CLUSTERS = 24
"""Near-duplicate clusters shown, cross-split ones first; the page counts the rest."""
MAX_MEMBERS = 8
"""Samples of a cluster shown side by side."""
MAX_EVIDENCE_ROWS = 20
"""Rows of a cluster's evidence table (a list of pairs)."""
MAX_CHANGES = 24
"""Samples shown per kind of change against the earlier version (added, removed, relabelled, changed)."""
DUPS_LIMIT = STATS_LIMIT
"""Samples up to which the page searches near-duplicates unless told (``dups``: None); the search takes
about a minute per million samples, more than the page's own budget."""


def folder_pixels(folder: str, info: IndexMeta, table: SampleTable) -> Pixels:
    """Where a converted folder's samples' pixels are (columns ``key``, ``shard``, ``npy_offset``)."""
    return Pixels([join(folder, s.name) for s in info.shards], table.shard, table.npy_offset, info.size, table["key"])


def _evidence(d: dict) -> tuple[list[tuple[str, str]], list[dict]]:
    """(name, value) of each scalar field of a cluster's ``to_dict()``; a table per list of objects: a field the
    near-duplicate search adds shows without a change here."""
    fields, tables = [], []
    for name, value in d.items():
        if name in ("members",):
            continue
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            head = list(dict.fromkeys(k for x in value for k in x))
            tables.append(
                {
                    "name": name,
                    "head": head,
                    "rows": [[_text(x.get(k)) for k in head] for x in value[:MAX_EVIDENCE_ROWS]],
                    "left_out": max(0, len(value) - MAX_EVIDENCE_ROWS),
                }
            )
        else:
            fields.append((name, _text(value)))
    return fields, tables


def _text(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(_text(x) for x in v)
    return "" if v is None else str(v)


def dups_section(
    folder: str, info: IndexMeta, dups: bool | None, budget: Budget, *, progress: bool = False
) -> tuple[dict, list[Warn]]:
    """Near-duplicate clusters with their samples side by side and the evidence, cross-split ones first;
    or why the search was not run and how to run it. ``dups``: None searches sets of format version 3 up
    to ``DUPS_LIMIT`` samples, True always, False never."""
    n, version = info.samples, info.format_version
    how = f"wds-tools report {folder} --dups (or wds-tools dups {folder})"
    if dups is False:
        return {"skipped": f"not searched (--no-dups); {how} searches them"}, []
    if dups is None and version < 3:
        return {
            "skipped": f"not searched: this index (format version {version}) holds no perceptual hashes, so the "
            f"search would read every sample's pixels; {how} runs it"
        }, []
    if dups is None and n > DUPS_LIMIT:
        return {
            "skipped": f"not searched: {n:,} samples, more than the page searches by default ({DUPS_LIMIT:,}; the "
            f"search takes about a minute per million samples); {how} runs it"
        }, []
    res = find_dups(folder, progress=progress)
    counts = res.counts()
    ordered = sorted(res.clusters, key=lambda cl: not cl.cross_split)  # stable: find_dups' order within
    side = info.size
    shown = []
    for k, cl in enumerate(ordered[:MAX_CLUSTERS]):
        members = cl.members[:MAX_MEMBERS]
        places = [(*res.places[(m["dataset"], m["key"])][:2], m["key"]) for m in members]
        images = read_places(places, side, "for the near-duplicates' thumbnails")
        titles = [
            f"{m['key']} · {m['split']} · {m['label']}" + (f" · {m['group']}" if m["group"] else "") for m in members
        ]
        fields, tables = _evidence(cl.to_dict())
        shown.append(
            {
                "number": k + 1,
                "size": len(cl.members),
                "cross_split": cl.cross_split,
                "label_conflict": cl.label_conflict,
                "cross_group": cl.cross_group,
                "thumbs": thumbs_of(
                    [m["key"] for m in members],
                    images,
                    titles,
                    budget,
                    [f"{m['split']} · {m['label']}" for m in members],
                ),
                "members_left_out": len(cl.members) - len(members),
                "fields": fields,
                "tables": tables,
            }
        )
    warns = [
        Warn("duplicates", cluster_warning(kind, counts[kind], res.threshold))
        for kind in ("cross_split", "label_conflict")
        if counts[kind]
    ]
    return {
        "skipped": None,
        "threshold": res.threshold,
        "group": res.group,
        "counts": counts,
        "clusters": shown,
        "clusters_left_out": max(0, len(ordered) - MAX_CLUSTERS),
        "flat": [m["key"] for m in res.flat[:20]],
    }, warns


def built_from(folder: str, info: IndexMeta) -> str | None:
    """The folder of the version this one was built from (``build.base``: its pixels were copied from
    it), as OUT/<base>/<size> beside this one; None when the index names none."""
    base = info.build.base if info.build is not None else None
    if not base:
        return None
    return join(parent(parent(folder.rstrip("/"))), base, str(info.size))


@dataclass
class _Side:
    """One version of the comparison: where its samples' pixels are, and their classes."""

    folder: str
    info: IndexMeta
    table: SampleTable
    pixels: Pixels

    def rows(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        key = self.table["key"]
        hit = np.flatnonzero(np.isin(key, np.array([k.encode() for k in keys], dtype=key.dtype)))
        return {self.table.key(r): r for r in hit.tolist()}

    def label(self, row: int) -> str:
        return self.info.classes[int(self.table.label[row])]


def _side(folder: str, info: IndexMeta | None = None, table: SampleTable | None = None) -> _Side:
    """A version's side: read checked from its folder, or the one the page is of (``info``, ``table``)."""
    if info is None or table is None:
        folder, info = open_index(folder)
        table = read_sample_table(folder, info, ("key", "label", "shard", "npy_offset"))
    return _Side(folder, info, table, folder_pixels(folder, info, table))


def versions_section(
    folder: str, info: IndexMeta, table: SampleTable, against: str | os.PathLike | None, budget: Budget
) -> tuple[dict, list[Warn]]:
    """Added, removed, relabelled and changed samples against ``against`` (default: the version this one
    was built from, ``built_from``), with thumbnails; or why there is nothing to compare with."""
    old = os.fspath(against) if against is not None else built_from(folder, info)
    if old is None:
        return {
            "skipped": "this version was not built from another (its index names no base version); "
            "--against OLD compares it with one"
        }, []
    if against is None and not exists(join(old, "index.json")):
        return {
            "skipped": f"built from {info.build and info.build.base}, whose folder {old} holds no index.json: "
            "not compared (--against OLD names another folder)"
        }, []
    res = diff_versions(old, folder)
    a, b = _side(old), _side(folder, info, table)
    shown: dict[str, list[Thumb]] = {}

    def grid(which: _Side, keys: list[str], captions: list[str] | None = None) -> list[Thumb]:
        rows = which.rows(keys)
        order = [rows[k] for k in keys]
        images = which.pixels.read(order, "for the changes' thumbnails")
        titles = [f"{k} · {which.label(r)}" for k, r in zip(keys, order)]
        caps = [f"{k} · {c}" for k, c in zip(keys, captions or [which.label(r) for r in order])]
        return thumbs_of(keys, [images[r] for r in order], titles, budget, caps)

    side_note = ""
    if a.info.size != info.size:  # (a base has the same size; --against may name another)
        side_note = f"{a.folder} holds {a.info.size} px images, this version {info.size} px"
    shown["added"] = grid(b, res.added[:MAX_CHANGES])
    shown["removed"] = grid(a, res.removed[:MAX_CHANGES])
    relabelled = res.relabeled[:MAX_CHANGES]
    ra, rb = a.rows(relabelled), b.rows(relabelled)
    shown["relabelled"] = grid(b, relabelled, [f"{a.label(ra[k])} → {b.label(rb[k])}" for k in relabelled])
    changed = res.changed[:MAX_CHANGES]
    pairs = list(zip(grid(a, changed), grid(b, changed)))
    return {
        "skipped": None,
        "old": res.old,
        "new": res.new,
        "counts": {
            "added": len(res.added),
            "removed": len(res.removed),
            "relabelled": len(res.relabeled),
            "changed": len(res.changed),
            "unchanged": res.unchanged,
        },
        "shown": shown,
        "changed": pairs,
        "note": side_note,
    }, []
