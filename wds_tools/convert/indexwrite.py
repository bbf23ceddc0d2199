"""Build one size's index from its shards' work files: errors.jsonl, then samples.npz, the sidecars and
index.json assembled from the per-shard columns and metas (publish.py decides when), and the
quick-check stats of the sources written.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..format.index import (
    ERRORS_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_FILE,
    SAMPLE_COLUMNS,
    histogram_mean_std,
    read_npz,
    write_index,
)
from ..format.meta import encode_columns
from ..format.model import IndexMeta, parse
from ..format.names import url_pattern
from ..format.phash import FLAT_RULES, WINDOWS
from ..format.sample import MEMBERS, classes_digest
from ..storage.objects import Store
from ..storage.transport import join
from .reuse import Base
from .source import Source
from .write import ShardTask

__all__ = ["write_errors", "errors_order", "assemble_index", "source_stats"]

_NO_PIXELS = ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])  # mean/std an index records for a split without pixels


def errors_order(entries: list[dict], folder: bool) -> list[dict]:
    """errors.jsonl's entries as written: a manifest's in (line, key) order; an image folder's without
    ``line`` (a file's position in the walk, which names nothing a user can open), in (path, key) order."""
    if not folder:
        return sorted(entries, key=lambda e: (e["line"], e["key"]))
    return sorted(({k: v for k, v in e.items() if k != "line"} for e in entries), key=lambda e: (e["path"], e["key"]))


def write_errors(store: Store, failures: list[dict], *, folder: bool = False) -> str | None:
    """Write errors.jsonl, one failure a line in source order (``errors_order``; ``folder``: the source is
    an image folder); remove it when there are none. Its path or None."""
    path = store.join(ERRORS_FILE)
    if not failures:
        store.remove(path)
        return None
    failures = errors_order(failures, folder)
    data = "".join(json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n" for e in failures)
    store.write_bytes(path, data.encode())
    return path


def assemble_index(
    store: Store,
    work: str,
    tasks: list[ShardTask],
    metas: dict[str, dict],
    spec: dict,
    src: Source,
    base: Base | None,
    has_errors: bool,
    provenance: dict,
) -> IndexMeta:
    """Write samples.npz, the sidecars and index.json from the shards' columns and metas; returns the index.

    ``provenance``: {"version": wds-tools version, "decoder_versions": {...}}, recorded as given.
    """
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
    if "phash" in columns and columns["phash"].ndim == 1:
        columns["phash"] = columns["phash"].reshape(-1, WINDOWS)
    if src.metadata:  # typed columns, taken from the manifest rows of the samples written
        row_of = {r.key: r for r in src.rows}
        columns.update(encode_columns(src.metadata, [row_of[k.decode()].meta or () for k in columns["key"].tolist()]))

    n_classes = len(src.classes)
    splits: dict[str, dict] = {}
    hist_by_split: dict[str, np.ndarray] = {}
    shard_entries = []
    for t, cols in zip(tasks, parts):
        meta = metas[t.name]
        shard_entries.append(
            {
                "name": t.name,
                "split": t.split,
                "samples": meta["samples"],
                "bytes": meta["bytes"],
                "sha256": meta["sha256"],
            }
        )
        sp = splits.setdefault(t.split, {"samples": 0, "shards": 0, "class_counts": [0] * n_classes})
        sp["samples"] += meta["samples"]
        sp["shards"] += 1
        for label, count in zip(*np.unique(cols["label"], return_counts=True)):
            sp["class_counts"][int(label)] += int(count)
        hist_by_split[t.split] = hist_by_split.get(t.split, np.zeros(768, np.int64)) + np.array(
            meta["histogram"], np.int64
        )
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
        "created_by": f"wds-tools {provenance['version']}",
        **{k: spec[k] for k in ("dataset_version", "size", "resize", "decode")},
        "decoder_versions": provenance["decoder_versions"],
        "build": {
            **spec["build"],
            "source_path": src.path,  # as given: the same command elsewhere writes the same bytes
            "base": base.version if base is not None else None,
        },
        "sample": {"members": list(MEMBERS), "npy_dtype": "uint8", "npy_shape": [spec["size"], spec["size"], 3]},
        "classes": src.classes,
        "classes_digest": classes_digest(src.classes),  # as each sample's .json has it
        "class_counts": class_counts,
        "samples": int(len(columns["key"])),
        "mean": mean,
        "std": std,
        "stats_split": stats_split or "all",
        "splits": dict(sorted(splits.items())),
        "shards": shard_entries,
        "errors_file": ERRORS_FILE if has_errors else None,
        "phash_flat_rules": FLAT_RULES,  # which rules flagged the phash column's too-flat samples
    }
    if src.metadata:
        meta["metadata"] = [c.to_dict() for c in src.metadata]
    return parse(write_index(store.root, meta, columns, write_bytes=store.write_bytes), store.join(INDEX_FILE))


def source_stats(store: Store, work: str, tasks: list[ShardTask], src: Source) -> dict[str, tuple[int, int, bytes]]:
    """{absolute path: (size, mtime_ns, fingerprint)} of every written sample of a local source, from
    the shards' work columns: what ``hashes.save_stats`` keeps for the next version's quick check."""
    path_of = {r.key: r.path for r in src.rows}
    out: dict[str, tuple[int, int, bytes]] = {}
    cwd = os.getcwd()  # os.path.abspath asks for it once per path
    for t in tasks:
        part = join(work, t.name + ".npz")
        cols = read_npz(part, data=store.read_bytes(part), names=["key", "src_size", "src_mtime_ns", "fingerprint"])
        fingerprints = cols["fingerprint"].tobytes()  # 16 bytes a row
        sizes, mtimes = cols["src_size"].tolist(), cols["src_mtime_ns"].tolist()
        for i, k in enumerate(cols["key"].tolist()):
            path, mtime = path_of.get(k.decode()), mtimes[i]
            if path is not None and mtime and "://" not in path:  # URLs have no mtime here
                absolute = os.path.normpath(path if os.path.isabs(path) else os.path.join(cwd, path))
                out[absolute] = (sizes[i], mtime, fingerprints[16 * i : 16 * i + 16])
    return out
