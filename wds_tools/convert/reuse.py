"""Incremental conversion: pick a base version and find which samples' pixels it already holds."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import OptionError
from ..format.index import INDEX_FILE, DatasetIndex, indexes_newest_first, load_index
from ..format.model import IndexMeta
from ..format.phash import flagged_alike
from ..signals import reraise_interruption
from .decode import recorded_decode
from .write import Reuse

__all__ = ["Base", "find_base", "base_incompatibilities"]

# What must match for stored pixels to equal a fresh decode.
_PIXEL_FIELDS = ("size", "resize", "decode", "decoder_versions")


def base_incompatibilities(info: IndexMeta, wanted: dict) -> list[str]:
    """Differences that make a version's pixels (``info``: its index.json) unusable for another: size, resize,
    decode, decoder."""
    decode = recorded_decode(dict(info.decode.raw) if info.decode is not None else None)
    have = {"size": info.size, "resize": info.resize, "decode": decode, "decoder_versions": info.decoder_versions}
    return [f"{k}: {have[k]!r} there, {wanted[k]!r} here" for k in _PIXEL_FIELDS if have[k] != wanted[k]]


def find_base(out: Path, version: str, wanted: dict, explicit: str | None) -> DatasetIndex | None:
    """The version to reuse pixels from: ``explicit`` (--from), else the newest compatible one.

    "Newest" is the most recently written index.json among OUT/*/SIZE other than ``version``.
    """
    side = str(wanted["size"])
    if explicit is not None:
        path = out / explicit / side
        if not (path / INDEX_FILE).exists():
            raise OptionError(f"--from {explicit}: no finished conversion at {path} (no {INDEX_FILE})")
        base = load_index(path)
        diffs = base_incompatibilities(base.info, wanted)
        if diffs:
            raise OptionError(
                f"--from {explicit}: its pixels were made differently ({'; '.join(diffs)}); "
                "reusing them would not equal a fresh conversion. Pass --no-reuse to decode everything."
            )
        return base
    for path in indexes_newest_first(out, side):
        if path.parent.name == version:
            continue
        try:
            base = load_index(path)
        except Exception as e:  # an unreadable neighbour is no base, and no reason to fail
            reraise_interruption(e)
            continue
        if not base_incompatibilities(base.info, wanted):
            return base
    return None


@dataclass
class Base:
    """Lookups into a base index by source fingerprint and by source path."""

    index: DatasetIndex
    stats: dict[str, tuple[int, int, bytes]] = field(default_factory=dict)  # hashes.load_stats of its version

    @property
    def version(self) -> str:
        """The base's dataset version."""
        return self.index.info.dataset_version or ""

    @cached_property
    def by_fingerprint(self) -> dict[bytes, int]:
        """Source fingerprint -> the base's first row with it."""
        fps = self.index.samples["fingerprint"]
        out: dict[bytes, int] = {}
        for i in range(len(fps)):
            out.setdefault(fps[i].tobytes(), i)
        return out

    @cached_property
    def by_source_path(self) -> dict[str, int]:
        """Source path as the manifest wrote it -> the base's row."""
        s = self.index.samples
        return {s.source_path(i): i for i in range(len(s))}

    def trusted_stat(self, path: str, source_path: str) -> tuple[int, int, bytes] | None:
        """(size, mtime_ns, fingerprint) recorded for a source, for the quick check; None if unknown.

        From the base version's stat cache (``hashes.load_stats``: by absolute path, outside the
        format), else, for a version-1 base, from its samples.npz ``src_mtime_ns`` (by source path).
        """
        if "://" in path:  # URLs have no mtime here: always read
            return None
        found = self.stats.get(os.path.abspath(path))
        if found is not None:
            return found if found[1] else None
        s = self.index.samples
        if "src_mtime_ns" not in s.columns:
            return None
        i = self.by_source_path.get(source_path)
        if i is None or not int(s["src_mtime_ns"][i]):
            return None
        return int(s["src_size"][i]), int(s["src_mtime_ns"][i]), s["fingerprint"][i].tobytes()

    def reuse(self, fingerprint: bytes, label_name: str, key: str) -> Reuse | None:
        """Where the pixels of a source with this fingerprint are stored, or None.

        ``relabeled`` follows ``wds-tools diff``: the same key with the same source bytes and another
        label. Pixels found under another key (a new key, or one whose bytes changed: several keys
        may share a file) are reused, never relabeled.
        """
        s, idx = self.index.samples, self.index
        i = s.key_positions.get(key)
        same_key = i is not None and s["fingerprint"][i].tobytes() == fingerprint
        if not same_key:
            i = self.by_fingerprint.get(fingerprint)
            if i is None:
                return None
        assert i is not None  # found by key or by fingerprint
        shard = idx.info.shards[int(s["shard"][i])]
        return Reuse(
            shard_path=str(Path(idx.root) / shard.name),
            shard_bytes=shard.bytes,
            npy_offset=int(s["npy_offset"][i]),
            npy_length=int(s["npy_length"][i]),
            npy_xxh3=int(s["npy_xxh3"][i]),
            width=int(s["width"][i]),
            height=int(s["height"][i]),
            fingerprint=fingerprint,
            relabeled=same_key and idx.classes[int(s["label"][i])] != label_name,
            phash=tuple(int(x) for x in s["phash"][i]) if flagged_alike(idx.info, s.columns) else None,
        )

    def removed(self, keys: set[str]) -> int:
        """Base samples whose key is absent from the new version."""
        return sum(1 for k in self.index.samples.keys if k not in keys)

    def by_key(self, keys: list[str], fingerprints: np.ndarray, labels: list[str]) -> dict[str, int]:
        """The new version's samples against the base by key, by ``wds-tools diff``'s rule: added,
        removed, changed (other source bytes), relabeled (same bytes, other label), unchanged."""
        s, classes = self.index.samples, self.index.classes
        pos, fps, lab = s.key_positions, s["fingerprint"], s["label"]
        out = {"added": 0, "removed": 0, "changed": 0, "relabeled": 0, "unchanged": 0}
        for key, fp, label in zip(keys, fingerprints, labels):
            i = pos.get(key)
            kind = (
                "added"
                if i is None
                else "changed"
                if fps[i].tobytes() != fp.tobytes()
                else "relabeled"
                if classes[int(lab[i])] != label
                else "unchanged"
            )
            out[kind] += 1
        out["removed"] = self.removed(set(keys))
        return out
