"""Sidecar index files for other readers, from index.json and samples.npz alone (docs/FORMAT.md, "Index
files for other readers"): ``<split>.wids.json`` for webdataset's ``wids.ShardListDataset``, ``<shard>.idx``
for NVIDIA DALI's webdataset reader. No shard is read: samples.npz holds every member's offset and length.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from .model import IndexMeta
from .sample import MEMBERS, column_prefix

__all__ = ["dali_name", "wids_shard_list", "dali_index", "sidecar_files"]

DALI_VERSION = "v1.2"


def dali_name(shard: str) -> str:
    """``train-000000.tar`` -> ``train-000000.idx``, the name wds2idx gives by default."""
    return shard[: -len(".tar")] + ".idx" if shard.endswith(".tar") else shard + ".idx"


def wids_shard_list(info: IndexMeta, split: str) -> dict:
    """The wids dataset description of ``split``: shard URLs relative to the index's folder."""
    return {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": f"{info.dataset_version or ''}/{info.size}/{split}",
        "shardlist": [{"url": s.name, "nsamples": s.samples, "filesize": s.bytes} for s in info.split_shards(split)],
    }


def dali_index(columns: Mapping[str, np.ndarray], shard: int, members: tuple[str, ...] = MEMBERS) -> str:
    """The wds2idx v1.2 text of shard number ``shard`` (its position in index.json's ``shards``);
    ``members``: a sample's member extensions in file order (``IndexMeta.members``)."""
    rows = np.flatnonzero(columns["shard"] == shard)
    rows = rows[np.argsort(columns["cls_offset"][rows], kind="stable")]
    lines = [f"{DALI_VERSION} {len(rows)}"]
    # the columns of this shard's rows as Python values, once (indexing numpy row by row costs ~10x)
    keys = [k.decode() for k in columns["key"][rows].tolist()]
    places = [
        (m, columns[f"{c}_offset"][rows].tolist(), columns[f"{c}_length"][rows].tolist())
        for m, c in zip(members, map(column_prefix, members))
    ]
    for i, key in enumerate(keys):
        lines.append(" ".join(f"{m} {offsets[i]} {lengths[i]} {key}.{m}" for m, offsets, lengths in places))
    return "\n".join(lines) + "\n"


def sidecar_files(
    info: IndexMeta, columns: Mapping[str, np.ndarray], *, wids: bool = True, dali: bool = True
) -> dict[str, bytes]:
    """File name -> bytes of every sidecar of one converted folder (``info``: its index.json)."""
    out: dict[str, bytes] = {}
    if wids:
        for split in info.splits:
            text = json.dumps(wids_shard_list(info, split), indent=1, sort_keys=True) + "\n"
            out[f"{split}.wids.json"] = text.encode()
    if dali:
        for s in info.shards:
            out[dali_name(s.name)] = dali_index(columns, s.pos, info.members).encode()
    return out
