"""Gather: the index reader's read step, the stored pixels of index rows read by offset.

Local shards are memory-mapped once per process (read-only pages shared with the page cache). The
rows of a batch are taken in runs of one shard: each run's bounds, NPY headers and (checked) labels
are compared in a few vectorised steps, then each sample is copied once from the mapping into the
batch, or lent to the augmentation as a view of the mapping. Object storage is read with one set
of concurrent ranged GETs per batch, neighbouring samples of a shard merged into one range.

With ``check`` (``make_loader``'s ``check_samples``, on by default) every sample is also compared
with the index: its whole ``.npy`` member with ``npy_xxh3`` (a flipped pixel), and its ``.cls``
bytes with the ``label`` column (a changed digit; the index reader takes labels from the index,
so a shard whose ``.cls`` says otherwise does not match its index, and other readers of the same
shard would train on other labels). A sample that fails is a ``ShardError`` naming the shard, the
byte offset and the key, or, with ``skip``, left out of its batch and logged.
"""

from __future__ import annotations

import logging
import mmap

import numpy as np
import xxhash

from wds_tools.errors import ShardError
from wds_tools.format.layout import read_ranges
from wds_tools.format.npy import NPY_HEADER_BYTES, image_header

from .indexread import SampleIndex

__all__ = ["Gather", "LABEL_BYTES", "MERGE_GAP", "MERGE_MAX", "labels_differ"]

log = logging.getLogger("training_adapter")

# The .cls bytes read for the label check: its digits (at most 9: a class index fits int32).
LABEL_BYTES = 9
# Ranged reads from object storage: neighbouring samples of one shard (the bytes between them, tar
# headers and the small .cls/.json members, are about 2 KB) are read as one range of at most
# MERGE_MAX bytes; gaps larger than MERGE_GAP split a range.
MERGE_GAP = 64 << 10
# Rows of one shard in a row of at least this many (eval order) are checked in vectorised steps.
VECTOR_RUN = 4
MERGE_MAX = 4 << 20


def _runs(shard: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal values in ``shard``."""
    cuts = (np.flatnonzero(shard[1:] != shard[:-1]) + 1).tolist()
    return list(zip([0, *cuts], [*cuts, len(shard)]))


def _bytes_at(m: np.ndarray, offsets: np.ndarray, length: int) -> np.ndarray:
    """[k, length]: ``length`` bytes of ``m`` at each offset (every ``offset + length <= len(m)``)."""
    if len(m) < length:
        return np.empty((0, length), np.uint8)
    every = np.lib.stride_tricks.as_strided(m, shape=(len(m) - length + 1, length), strides=(1, 1), writeable=False)
    return every[offsets]


def labels_differ(got: np.ndarray, length: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[k] bool: whether the .cls data ``got`` ([k, LABEL_BYTES], the first ``length`` bytes of
    each row its data) is not ``labels`` in ASCII decimal, as the writer puts it (``b"3"``: so
    ``b"03"``, ``b"31"`` or ``b"3 "`` differ)."""
    want = np.frombuffer(np.asarray(labels).astype(f"S{LABEL_BYTES}").tobytes(), np.uint8).reshape(-1, LABEL_BYTES)
    digits = (want != 0).sum(axis=1)
    inside = np.arange(LABEL_BYTES) < np.minimum(length, LABEL_BYTES)[:, None]
    return ((got != want) & inside).any(axis=1) | (length != digits)


class Gather:
    """Reads rows' stored pixels by offset (see the module docstring). ``bytes_read`` counts the
    bytes of the samples asked for (NPY headers and pixels), for subset accounting."""

    def __init__(self, index: SampleIndex, *, labels: bool = False, pixels: bool = False, skip: bool = False):
        # an index without the columns (never written by wds-tools 1) has nothing to compare with
        self.labels = labels and index.cls_offset is not None and index.cls_length is not None
        self.pixels = pixels and index.npy_xxh3 is not None
        self.index, self.skip = index, skip
        self._header_bytes = image_header(index.size)
        self.header = np.frombuffer(self._header_bytes, np.uint8)
        self.want = NPY_HEADER_BYTES + index.sample_bytes
        self._maps: dict[int, np.ndarray] = {}
        self.bytes_read = 0
        self.skipped = 0  # samples left out (skip)

    def __getstate__(self) -> dict:  # mappings do not pickle (spawned workers map again)
        return {**self.__dict__, "_maps": {}}

    # --- local shards ---------------------------------------------------------------------------
    def _map(self, shard: int) -> np.ndarray:
        arr = self._maps.get(shard)
        if arr is None:
            url = self.index.urls[shard]
            try:
                with open(url, "rb") as f:
                    # copy-on-write: writable for torch.from_numpy, never written, shared with the page cache
                    arr = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), np.uint8)
            except (OSError, ValueError) as e:  # ValueError: an empty file
                raise ShardError(f"{url}: cannot map the shard: {e}", url=url) from None
            self._maps[shard] = arr
        return arr

    def _local(self, rows: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
        """Positions (into ``rows``) of the good rows and each one's pixels, a view of its mapping.

        Runs of ``VECTOR_RUN`` or more rows of one shard (eval order) are checked in a few
        vectorised steps; shorter runs (shuffled rows) one row at a time, which costs less there."""
        idx, want = self.index, self.want
        shard, off = idx.shard[rows], idx.offset[rows]
        good: list[int] = []
        views: list[np.ndarray] = []
        bad: dict[int, ShardError] = {}
        for a, b in _runs(shard):
            m = self._map(int(shard[a]))
            if b - a >= VECTOR_RUN:
                self._check_run(m, rows[a:b], off[a:b], a, bad)
            else:
                for i in range(a, b):
                    self._check_one(m, int(rows[i]), int(off[i]), i, bad)
            for i, start in enumerate(off[a:b].tolist(), a):
                if i in bad:
                    continue
                if self.pixels and xxhash.xxh3_64_intdigest(m[start:start + want]) != int(idx.npy_xxh3[rows[i]]):
                    bad[i] = self._problem(rows[i], "checksum")
                    continue
                good.append(i)
                views.append(m[start + NPY_HEADER_BYTES:start + want])
        if bad:
            good, views = self._drop(bad, good, views)
        return good, views

    def _check_run(self, m: np.ndarray, run: np.ndarray, o: np.ndarray, a: int, bad: dict) -> None:
        """Bounds, NPY headers and (``labels``) .cls bytes of a run of rows of one shard, vectorised;
        problems go into ``bad`` by position (``a`` + position in the run)."""
        idx = self.index
        fits = o + self.want <= len(m)
        if not fits.all():
            for i in np.flatnonzero(~fits):
                bad[a + i] = self._problem(run[i], "short", have=len(m) - int(o[i]))
            o = np.where(fits, o, 0)
        wrong = ~(_bytes_at(m, o, NPY_HEADER_BYTES) == self.header).all(axis=1) & fits
        for i in np.flatnonzero(wrong):
            bad[a + i] = self._problem(run[i], "header")
        if self.labels:
            co, length = idx.cls_offset[run], idx.cls_length[run]
            cls = _bytes_at(m, np.where(fits & (co + LABEL_BYTES <= len(m)), co, 0), LABEL_BYTES)
            for i in np.flatnonzero(labels_differ(cls, length, idx.label[run]) & fits & ~wrong):
                bad[a + i] = self._problem(run[i], "label", got=cls[i, :max(0, int(length[i]))].tobytes())

    def _check_one(self, m: np.ndarray, r: int, o: int, i: int, bad: dict) -> None:
        """The same checks for one row ``r`` at position ``i``."""
        idx = self.index
        if o + self.want > len(m):
            bad[i] = self._problem(r, "short", have=len(m) - o)
        elif m[o:o + NPY_HEADER_BYTES].tobytes() != self._header_bytes:
            bad[i] = self._problem(r, "header")
        elif self.labels:
            co, length = int(idx.cls_offset[r]), int(idx.cls_length[r])
            got = m[co:co + length].tobytes() if 0 <= length <= LABEL_BYTES else b""
            if got != b"%d" % idx.label[r]:
                bad[i] = self._problem(r, "label", got=got)

    def _drop(self, bad: dict[int, ShardError], good: list[int], views: list) -> tuple[list[int], list]:
        """Raise the first problem, or with ``skip`` log each and keep the rest."""
        if not self.skip:
            raise bad[min(bad)]
        for i in sorted(bad):
            log.warning("leaving out a damaged sample (on_error='skip'): %s", bad[i])
        self.skipped += len(bad)
        return good, views

    def _problem(self, r, kind: str, *, have: int = 0, got: bytes = b"") -> ShardError:
        idx = self.index
        r = int(r)
        url, key = idx.urls[int(idx.shard[r])], idx.key_str(r)
        at = int(idx.offset[r])
        if kind == "short":
            what = (f"the shard ends {max(have, 0)} bytes into its {self.want}-byte .npy; it is shorter than its "
                    f"index says (truncated copy?)")
        elif kind == "header":
            what = f"no .npy header of a {idx.size} px image where the index points; the shard does not match its index"
        elif kind == "checksum":
            what = ("its pixels do not match their checksum in the index (npy_xxh3): the shard is damaged "
                    "(wds-tools verify lists every such sample)")
        else:
            at = int(idx.cls_offset[r])
            label = int(idx.label[r])
            name = f" ({idx.classes[label]})" if 0 <= label < len(idx.classes) else ""
            what = (f"its .cls is {got!r}, the index's label is {label}{name}: the shard does not match its index "
                    f"(wds-tools verify lists every such sample)")
        return ShardError(f"{url}: byte {at}: sample {key!r}: {what}", url=url, offset=at)

    # --- either -------------------------------------------------------------------------------
    def _remote(self, rows) -> bool:
        return len(rows) > 0 and "://" in self.index.urls[int(self.index.shard[rows[0]])]

    def views(self, rows, scratch: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
        """Positions (into ``rows``) of the rows read and their pixels [S*S*3]: views of the
        mappings (local), or rows of ``scratch`` read into (remote)."""
        rows = np.asarray(rows, np.int64)
        if self._remote(rows):
            good = self._read_remote(rows, scratch)
            return good, list(scratch[:len(good)])
        good, views = self._local(rows)
        self.bytes_read += len(rows) * self.want
        return good, views

    def read(self, rows, out: np.ndarray) -> list[int]:
        """The pixels of ``rows`` into ``out[:k]`` ([len(rows), S*S*3] uint8), k = the rows read;
        returns their positions in ``rows`` (all of them unless ``skip`` left some out)."""
        rows = np.asarray(rows, np.int64)
        if self._remote(rows):
            return self._read_remote(rows, out)
        good, views = self._local(rows)
        for i, v in enumerate(views):
            out[i] = v
        self.bytes_read += len(rows) * self.want
        return good

    # --- object storage -----------------------------------------------------------------------
    def _read_remote(self, rows: np.ndarray, out: np.ndarray) -> list[int]:
        idx, want = self.index, self.want
        shard, npy = idx.shard[rows], idx.offset[rows]
        start = idx.cls_offset[rows] if self.labels else npy  # labels checked: from the .cls on
        end = npy + want
        # merge neighbours of one shard (rows in file order) into ranges
        spans: list[list[int]] = []  # [shard, start, end, first position, last position + 1]
        for i in range(len(rows)):
            s, a, b = int(shard[i]), int(start[i]), int(end[i])
            last = spans[-1] if spans else None
            if last and last[0] == s and 0 <= a - last[2] <= MERGE_GAP and b - last[1] <= MERGE_MAX:
                last[2], last[4] = b, i + 1
            else:
                spans.append([s, a, b, i, i + 1])
        urls = [idx.urls[s] for s, *_ in spans]
        try:
            blobs = read_ranges(urls, [sp[1] for sp in spans], [sp[2] for sp in spans])
        except OSError as e:
            raise ShardError(f"{urls[0]}: ranged read failed: {e}", url=urls[0]) from None
        good: list[int] = []
        bad: dict[int, ShardError] = {}
        for (s, a, b, first, stop), blob, url in zip(spans, blobs, urls):
            if isinstance(blob, BaseException) or len(blob) != b - a:
                got = f"failed: {blob}" if isinstance(blob, BaseException) else f"gave {len(blob)} of {b - a} bytes"
                for i in range(first, stop):
                    bad[i] = ShardError(f"{url}: byte {int(npy[i])}: sample {idx.key_str(int(rows[i]))!r}: the "
                                        f"ranged read {got}", url=url, offset=int(npy[i]))
                continue
            data = np.frombuffer(blob, np.uint8)
            for i in range(first, stop):
                r, at = int(rows[i]), int(npy[i]) - a
                member = data[at:at + want]
                if not np.array_equal(member[:NPY_HEADER_BYTES], self.header):
                    bad[i] = self._problem(r, "header")
                    continue
                if self.labels:
                    c, length = int(idx.cls_offset[r]) - a, idx.cls_length[r:r + 1]
                    cls = data[c:c + LABEL_BYTES]
                    if labels_differ(cls[None], length, idx.label[r:r + 1])[0]:
                        bad[i] = self._problem(r, "label", got=cls[:max(0, int(length[0]))].tobytes())
                        continue
                if self.pixels and xxhash.xxh3_64_intdigest(member) != int(idx.npy_xxh3[r]):
                    bad[i] = self._problem(r, "checksum")
                    continue
                out[len(good)] = member[NPY_HEADER_BYTES:]
                good.append(i)
        if bad:
            self._drop(bad, good, [])
        self.bytes_read += len(rows) * want
        return good
