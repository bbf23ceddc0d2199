"""Test helpers: hand-built shard sets (real tars + a matching index) with chosen sizes and labels."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import xxhash

from wds_tools.format.index import FORMAT_NAME, FORMAT_VERSION, write_index
from wds_tools.format.names import url_pattern
from wds_tools.format.npy import npy_header
from wds_tools.format.packed import pack_strings
from wds_tools.format.phash import FLAT_RULES, phash
from wds_tools.format.sample import MEMBERS, classes_digest, column_prefix, label_i32
from wds_tools.format.tarwrite import ShardWriter


def build_dataset(
    dest: Path,
    splits: dict[str, list[list[int]]],
    *,
    classes=("a", "b", "c"),
    size: int = 4,
    seed: int = 0,
    index: bool = True,
) -> Path:
    """Write ``<split>-NNNNNN.tar`` shards holding samples with the given labels, and their index."""
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    header = npy_header((size, size, 3))
    rows, shards, split_meta, pixels_by_split = [], [], {}, {}
    for split, shard_labels in splits.items():
        pixels_by_split[split] = []
        for j, labels in enumerate(shard_labels):
            name = f"{split}-{j:06d}.tar"
            w = ShardWriter(str(dest / name))
            for t, label in enumerate(labels):
                key = f"{split}{j}x{t:03d}"
                px = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                pixels_by_split[split].append(px.reshape(-1, 3))
                meta = {
                    "key": key,
                    "label": classes[label],
                    "source_path": f"img/{key}.jpg",
                    "width": 10,
                    "height": 10,
                    "fingerprint": "xxh3_128:" + "0" * 32,
                    "original_key": key,
                    "dataset_version": "t",
                    "classes_digest": classes_digest(classes),
                }
                c = w.add(f"{key}.cls", str(label).encode())
                i32 = w.add(f"{key}.i32", label_i32(label))
                js = w.add(f"{key}.json", json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())
                npy = w.add(f"{key}.npy", header, px.tobytes())
                rows.append(
                    (
                        key,
                        label,
                        len(shards),
                        *c,
                        *i32,
                        *js,
                        *npy,
                        xxhash.xxh3_64_intdigest(header + px.tobytes()),
                        f"img/{key}.jpg",
                        phash(px),
                    )
                )
            nbytes, sha = w.close()
            shards.append({"name": name, "split": split, "samples": len(labels), "bytes": nbytes, "sha256": sha})
        counts = np.bincount([lab for ls in shard_labels for lab in ls], minlength=len(classes)).tolist()
        mean, std = _mean_std(pixels_by_split[split])
        split_meta[split] = {
            "samples": sum(map(len, shard_labels)),
            "shards": len(shard_labels),
            "urls": url_pattern(split, len(shard_labels)),
            "class_counts": counts,
            "mean": mean,
            "std": std,
        }
    if not index:
        return dest
    n = len(rows)
    cols = {
        "key": np.array([r[0].encode() for r in rows], dtype="S"),
        "label": np.array([r[1] for r in rows], dtype="<i4"),
        "shard": np.array([r[2] for r in rows], dtype="<u4"),
        "fingerprint": np.zeros((n, 16), "u1"),
        "width": np.full(n, 10, "<u4"),
        "height": np.full(n, 10, "<u4"),
        "src_size": np.full(n, 1000, "<u8"),
        "npy_xxh3": np.array([r[11] for r in rows], dtype="<u8"),
        "phash": np.array([r[13] for r in rows], dtype="<u8"),
    }
    for j, member in enumerate(MEMBERS):
        cols[f"{column_prefix(member)}_offset"] = np.array([r[3 + 2 * j] for r in rows], dtype="<u8")
        cols[f"{column_prefix(member)}_length"] = np.array([r[4 + 2 * j] for r in rows], dtype="<u8")
    cols["path_offsets"], cols["path_data"] = pack_strings([r[12] for r in rows])
    stats_split = "train" if "train" in splits else "all"
    mean, std = _mean_std(
        pixels_by_split["train"] if "train" in splits else [p for ps in pixels_by_split.values() for p in ps]
    )
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "dataset_version": "t",
        "size": size,
        "resize": "center-crop",
        "sample": {"members": list(MEMBERS), "npy_dtype": "uint8", "npy_shape": [size, size, 3]},
        "classes": list(classes),
        "classes_digest": classes_digest(classes),
        "samples": n,
        "class_counts": np.bincount(cols["label"], minlength=len(classes)).tolist(),
        "mean": mean,
        "std": std,
        "stats_split": stats_split,
        "splits": split_meta,
        "shards": shards,
        "errors_file": None,
        "phash_flat_rules": FLAT_RULES,  # as the converter writes it
    }
    write_index(dest, meta, cols)
    return dest


def _mean_std(pixels: list[np.ndarray]) -> tuple[list[float], list[float]]:
    a = np.concatenate(pixels).astype(np.float64)
    return ([round(float(x) / 255, 6) for x in a.mean(axis=0)], [round(float(x) / 255, 6) for x in a.std(axis=0)])


def copy_tars(src: Path, dest: Path) -> Path:
    """The shards of ``src`` without its index."""
    dest.mkdir(parents=True)
    for p in src.glob("*.tar"):
        shutil.copy(p, dest / p.name)
    return dest


def rewrite_tar(path: Path, edit) -> None:
    """Rewrite a tar as ustar with ``edit([(TarInfo, bytes), ...])``'s member list."""
    with tarfile.open(path) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    members = edit(members)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for m, data in members:
            m.size = len(data)
            tf.addfile(m, io.BytesIO(data))


def member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data
