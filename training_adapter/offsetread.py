"""Offset read: the index reader's read step, the stored pixels of index rows read by offset and checked.

Local shards are memory-mapped once per reader and checked in vectorised runs of one shard; object
storage is read in merged ranged GETs. The checks and why: docs/guide/loader-internals.md, Index reader.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch
import xxhash

from wds_tools.errors import ShardError
from wds_tools.format.npy import NPY_HEADER_BYTES, image_header
from wds_tools.storage.transport import is_local, read_ranges

from .indexplan import SampleIndex

__all__ = [
    "Gather",
    "Located",
    "Found",
    "Part",
    "LABEL_BYTES",
    "HEADER",
    "NAME_BYTES",
    "MERGE_GAP",
    "MERGE_MAX",
    "labels_differ",
    "label_digits",
]

log = logging.getLogger("training_adapter")

LABEL_BYTES = 9
"""The ``.cls`` bytes read for the label check: its digits (at most 9: a class index fits int32)."""
HEADER = 512
"""A tar header's bytes: the ``.npy`` member's header, whose name field (its first 100 bytes) holds
``<key>.npy``, lies this far before the offset the index gives (docs/FORMAT.md, Shards)."""
NAME_BYTES = 100
"""A ustar header's name field."""
_NPY = np.frombuffer(b".npy", np.uint8)
# Ranged reads from object storage: neighbouring samples of one shard (the bytes between them, tar
# headers and the small .cls/.json members, are about 2 KB) are read as one range of at most
# MERGE_MAX bytes; gaps larger than MERGE_GAP split a range.
MERGE_GAP = 64 << 10
"""Ranged reads: a gap between neighbouring samples larger than this many bytes splits a range."""
# Rows of one shard in a row of at least this many (eval order) are checked in vectorised steps.
VECTOR_RUN = 4
MERGE_MAX = 4 << 20
"""Ranged reads: neighbouring samples of one shard are read as one range of at most this many bytes."""


def _runs(shard: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal values in ``shard``."""
    cuts = (np.flatnonzero(shard[1:] != shard[:-1]) + 1).tolist()
    return list(zip([0, *cuts], [*cuts, len(shard)]))


def _windows(m: np.ndarray, length: int) -> np.ndarray:
    """[len(m) - length + 1, length]: every ``length``-byte window of ``m``, one per offset (a view)."""
    return np.lib.stride_tricks.as_strided(
        m, shape=(max(0, len(m) - length + 1), length), strides=(1, 1), writeable=False
    )


def label_digits(labels: np.ndarray) -> np.ndarray:
    """[k, LABEL_BYTES] uint8: each label in ASCII decimal, NUL after its digits."""
    return np.frombuffer(np.asarray(labels).astype(f"S{LABEL_BYTES}").tobytes(), np.uint8).reshape(-1, LABEL_BYTES)


_INSIDE = np.arange(LABEL_BYTES)[None, :] < np.arange(LABEL_BYTES + 1)[:, None]  # [length, byte]: byte < length


def labels_differ(got: np.ndarray, length: np.ndarray, want: np.ndarray) -> np.ndarray:
    """[k] bool: whether the .cls data ``got`` ([k, LABEL_BYTES], the first ``length`` bytes of
    each row its data) is not the label whose ``label_digits`` are ``want``, as the writer puts it
    (``b"3"``: so ``b"03"``, ``b"31"`` or ``b"3 "`` differ)."""
    inside = _INSIDE[np.clip(length, 0, LABEL_BYTES)]
    return ((got != want) & inside).any(axis=1) | (length != (want != 0).sum(axis=1))


_NONE = np.zeros(0, np.int64)  # a column the index lacks


class Part(NamedTuple):
    """Some of a batch's rows in one array: the array, their pixels' byte offsets in it, and its
    ``Gather._strided`` windows (None: copy row by row)."""

    data: np.ndarray
    offsets: np.ndarray
    windows: torch.Tensor | None


class Found(NamedTuple):
    """What ``Gather.locate`` found: the positions (into the rows asked for) of the rows read, and their pixels."""

    good: list[int]
    located: Located


class Located:
    """The stored pixels of a batch's rows, where they are: ``parts`` of (a 1-D uint8 array, the
    byte offsets of pixels in it, its ``Gather._strided`` windows or None), in batch order."""

    def __init__(self, parts: list[Part], nbytes: int) -> None:
        self.parts, self.nbytes = parts, nbytes

    def __len__(self) -> int:
        return sum(len(offsets) for _, offsets, _ in self.parts)

    def arrays(self, S: int) -> Iterator[np.ndarray]:
        """Each row's pixels as a [S, S, 3] view (for the augmentation, which reads them in place)."""
        n = self.nbytes
        for m, offsets, _ in self.parts:
            for o in offsets.tolist():
                yield m[o : o + n].reshape(S, S, 3)

    def copy_into(self, flat: np.ndarray) -> None:
        """Copy the rows into ``flat[:len(self)]`` ([k, S*S*3] uint8): a run with windows in one
        ``index_select`` (compiled, without the GIL), other rows one by one. (Reader threads make
        whole batches each, ``threads.in_order``: splitting one batch's copies over threads was
        slower on two cores.)"""
        k = 0  # the first row of flat for each part
        for m, offsets, windows in self.parts:
            self._copy(flat, m, offsets, windows, k)
            k += len(offsets)

    def _copy(
        self, flat: np.ndarray, m: np.ndarray, offsets: np.ndarray, windows: torch.Tensor | None, first: int
    ) -> None:
        if windows is not None and len(offsets) >= VECTOR_RUN:
            torch.index_select(
                windows, 0, torch.from_numpy(offsets), out=torch.from_numpy(flat[first : first + len(offsets)])
            )
            return
        n = self.nbytes
        for i, o in enumerate(offsets.tolist(), first):
            flat[i] = m[o : o + n]


class Gather:
    """Reads rows' stored pixels by offset (docs/guide/loader-internals.md). ``bytes_read`` counts the
    bytes of the samples asked for (NPY headers and pixels), for subset accounting."""

    def __init__(self, index: SampleIndex, *, labels: bool = False, pixels: bool = False, skip: bool = False) -> None:
        # an index without the columns (never written by wds-tools 1) has nothing to compare with
        self.labels = labels and index.cls_offset is not None and index.cls_length is not None
        self.pixels = pixels and index.npy_xxh3 is not None
        # the columns the checks read (empty where the index lacks them: then they are off)
        self._xxh3: np.ndarray = index.npy_xxh3 if index.npy_xxh3 is not None else _NONE
        self._cls_offset: np.ndarray = index.cls_offset if index.cls_offset is not None else _NONE
        self._cls_length: np.ndarray = index.cls_length if index.cls_length is not None else _NONE
        self.index, self.skip = index, skip
        self._header_bytes = image_header(index.size)
        self.header = np.frombuffer(self._header_bytes, np.uint8)
        self.want = NPY_HEADER_BYTES + index.sample_bytes
        self._maps: dict[int, np.ndarray] = {}
        self._windows: dict[int, torch.Tensor] = {}  # torch windows of pixel bytes, for index_select
        self._views: dict[tuple[int, int], np.ndarray] = {}  # numpy windows of header and .cls bytes
        self._cls_want: np.ndarray | None = None
        # the name check: the bytes of a header's name field compared (the longest key's name and a NUL)
        self._name_bytes = min(NAME_BYTES, index.key.dtype.itemsize + len(_NPY) + 1)
        self._key_len: np.ndarray | None = None  # each row's key length, once
        self._exact: bool | None = None  # whether runs may take the exact-bytes test first (_index_plain)
        self._bounded: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # _run_exact's windows
        self.bytes_read = 0
        self.skipped = 0  # samples left out (skip)

    def __getstate__(self) -> dict:  # mappings do not pickle (spawned workers map again)
        return {**self.__dict__, "_maps": {}, "_windows": {}, "_views": {}, "_bounded": {}}

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

    def _local(self, rows: np.ndarray) -> Found:
        """Positions (into ``rows``) of the good rows, and where their pixels are in the mappings.

        Runs of ``VECTOR_RUN`` or more rows of one shard (eval order) are checked in a few
        vectorised steps; shorter runs (shuffled rows) one row at a time, which costs less there."""
        idx, want = self.index, self.want
        shard, off = idx.shard[rows], idx.offset[rows]
        good: list[int] = []
        parts: list[Part] = []
        bad: dict[int, ShardError] = {}
        for a, b in _runs(shard):
            s = int(shard[a])
            m = self._map(s)
            if b - a >= VECTOR_RUN:
                self._check_run(s, m, rows[a:b], off[a:b], a, bad)
            else:
                for i in range(a, b):
                    self._check_one(m, int(rows[i]), int(off[i]), i, bad)
            if not self.pixels and not any(a <= i < b for i in bad):  # the common case, without a loop
                good.extend(range(a, b))
                parts.append(Part(m, off[a:b] + NPY_HEADER_BYTES, self._strided(s) if b - a >= VECTOR_RUN else None))
                continue
            mine = []
            for i, start in enumerate(off[a:b].tolist(), a):
                if i in bad:
                    continue
                if self.pixels and xxhash.xxh3_64_intdigest(m[start : start + want].data) != int(self._xxh3[rows[i]]):
                    bad[i] = self._problem(rows[i], "checksum")
                    continue
                good.append(i)
                mine.append(start + NPY_HEADER_BYTES)
            if mine:
                parts.append(Part(m, np.array(mine, np.int64), self._strided(s) if len(mine) >= VECTOR_RUN else None))
        if bad:
            self._drop(bad)
        return Found(good, Located(parts, idx.sample_bytes))

    def _strided(self, shard: int) -> torch.Tensor:
        """Shard ``shard``'s mapping as a tensor of every ``sample_bytes`` window, one per byte
        offset (no copy): ``index_select`` of pixel offsets gathers a run into a batch in one call."""
        t = self._windows.get(shard)
        if t is None:
            m, n = self._maps[shard], self.index.sample_bytes
            t = self._windows[shard] = torch.as_strided(torch.from_numpy(m), (len(m) - n + 1, n), (1, 1))
        return t

    def _check_run(self, s: int, m: np.ndarray, run: np.ndarray, o: np.ndarray, a: int, bad: dict) -> None:
        """Bounds, NPY headers and (``labels``) member names and .cls bytes of a run of rows of shard ``s``,
        vectorised; problems go into ``bad`` by position (``a`` + position in the run). A run whose bytes
        are exactly as the writer puts them (``_run_exact``, the common case) has none; any other is
        checked field by field, below."""
        if self._run_exact(s, m, run, o):
            return
        idx = self.index
        fits = o + self.want <= len(m)
        every = fits.all()
        if not every:
            for i in np.flatnonzero(~fits):
                bad[a + i] = self._problem(run[i], "short", have=len(m) - int(o[i]))
            o = np.where(fits, o, 0)
        heads = self._window(s, m, NPY_HEADER_BYTES)[o] if every or len(m) >= NPY_HEADER_BYTES else None
        wrong = fits.copy() if heads is None else ~(heads == self.header).all(axis=1) & fits
        for i in np.flatnonzero(wrong):
            bad[a + i] = self._problem(run[i], "header")
        if self.labels:
            at = o - HEADER
            named = at >= 0
            names = self._window(s, m, self._name_bytes)[np.where(named, at, 0)]
            want, used = self.names_want(run)
            for i in np.flatnonzero(~(((names == want) | ~used).all(axis=1) & named) & fits & ~wrong):
                bad[a + i] = self._problem(run[i], "name", got=names[i].tobytes())
                wrong[i] = True
            co, length = self._cls_offset[run], self._cls_length[run]
            inside = co + LABEL_BYTES <= len(m)
            if not inside.all():
                co = np.where(inside, co, 0)
            if self._cls_want is None:  # every row's label as its .cls should read, once
                self._cls_want = label_digits(idx.label)
            cls = self._window(s, m, LABEL_BYTES)[co]
            for i in np.flatnonzero(labels_differ(cls, length, self._cls_want[run]) & fits & ~wrong):
                bad[a + i] = self._problem(run[i], "label", got=cls[i, : max(0, int(length[i]))].tobytes())

    def _index_plain(self) -> bool:
        """Whether the index's own columns allow ``_run_exact``: every .npy at least a tar header into its
        shard and, with ``labels``, every .cls offset not negative (a negative index would wrap) and every
        .cls length its label's digit count (otherwise ``labels_differ`` reports it whatever the bytes)."""
        idx = self.index
        if len(idx) == 0 or int(idx.offset.min()) < HEADER:
            return False
        if not self.labels:
            return True
        if self._cls_want is None:  # every row's label as its .cls should read, once
            self._cls_want = label_digits(idx.label)
        return int(self._cls_offset.min()) >= 0 and bool((self._cls_length == (self._cls_want != 0).sum(axis=1)).all())

    def _run_exact(self, s: int, m: np.ndarray, run: np.ndarray, o: np.ndarray) -> bool:
        """Whether a run of rows of shard ``s`` passes every check of ``_check_run``, by comparing whole
        fields with what the writer puts there, as bytes (a few array ops per run, not per field): each
        .npy fits in the shard, its header is ``image_header``, its tar header's name field is
        ``<key>.npy`` NUL-padded (over all ``_name_bytes``, the NULs after the one ``names_want`` ends
        with included) and, with ``labels``, the ``LABEL_BYTES`` at its .cls are the label's digits
        NUL-padded (the tar padding after them included). So True only where ``_check_run`` finds no
        problem; False where it may, and then it looks field by field (and always where the index's
        columns do not allow it, ``_index_plain``)."""
        if self._exact is None:
            self._exact = self._index_plain()
        if not self._exact:
            return False
        heads, names, cls = self._bounded.get(s) or self._bound(s, m)
        k = len(run)
        try:  # a row past a window's end raises: the .npy (or .cls) does not fit in the shard
            if heads[o].tobytes() != self._header_bytes * k:
                return False
            if not self.labels:
                return True
            W = self._name_bytes
            want = np.strings.add(self.index.key.take(run), b".npy").astype(f"S{W}")  # NUL-padded, cut at W
            if names[o - HEADER].tobytes() != want.tobytes():
                return False
            assert self._cls_want is not None  # _index_plain made it
            return cls[self._cls_offset.take(run)].tobytes() == self._cls_want.take(run, axis=0).tobytes()
        except IndexError:
            return False

    def _bound(self, s: int, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard ``s``'s windows for ``_run_exact``: NPY headers, one per offset whose whole .npy fits in
        ``m``; name fields; ``LABEL_BYTES`` at a .cls."""
        fits = m[: max(0, len(m) - self.want + NPY_HEADER_BYTES)]
        self._bounded[s] = w = (
            _windows(fits, NPY_HEADER_BYTES),
            self._window(s, m, self._name_bytes),
            self._window(s, m, LABEL_BYTES),
        )
        return w

    def _name_is(self, m: np.ndarray, r: int, o: int) -> bool:
        """Whether the tar header before row ``r``'s ``.npy`` (at ``o`` in ``m``) names ``<key>.npy`` (and
        its NUL): one row, in bytes (``names_want``'s arrays cost more for one row than the read)."""
        name = (bytes(self.index.key[r]) + b".npy\0")[:NAME_BYTES]
        h = o - HEADER
        return h >= 0 and m[h : h + len(name)].tobytes() == name

    def names_want(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([k, name bytes] uint8, [k, name bytes] bool): the name field each row's ``.npy`` header holds as
        the writer puts it, ``<key>.npy`` then NULs (as far as ``_name_bytes``), and which of those bytes
        to compare (the name and the NUL that ends it, as ``_name_is``)."""
        idx, W = self.index, self._name_bytes
        if self._key_len is None:
            self._key_len = np.strings.str_len(idx.key).astype(np.int64)
        keys = np.ascontiguousarray(idx.key[rows])
        k, L = len(keys), keys.dtype.itemsize
        want = np.zeros((k, W), np.uint8)
        want[:, : min(L, W)] = keys.view(np.uint8).reshape(k, L)[:, :W]
        pos = self._key_len[rows][:, None] + np.arange(len(_NPY))
        fits = pos < W
        want[np.nonzero(fits)[0], pos[fits]] = np.broadcast_to(_NPY, pos.shape)[fits]
        return want, np.arange(W) < self._key_len[rows][:, None] + len(_NPY) + 1

    def _window(self, s: int, m: np.ndarray, length: int) -> np.ndarray:
        w = self._views.get((s, length))
        if w is None:
            w = self._views[s, length] = _windows(m, length)
        return w

    def _check_one(self, m: np.ndarray, r: int, o: int, i: int, bad: dict, base: int = 0) -> None:
        """The same checks for one row ``r`` at position ``i``, its .npy at ``o`` in ``m`` (which holds the
        shard's bytes from ``base`` on)."""
        idx = self.index
        if o + self.want > len(m):
            bad[i] = self._problem(r, "short", have=len(m) - o)
        elif m[o : o + NPY_HEADER_BYTES].tobytes() != self._header_bytes:
            bad[i] = self._problem(r, "header")
        elif self.labels and not self._name_is(m, r, o):
            bad[i] = self._problem(
                r, "name", got=m[max(0, o - HEADER) : max(0, o - HEADER) + self._name_bytes].tobytes()
            )
        elif self.labels:
            co, length = int(self._cls_offset[r]) - base, int(self._cls_length[r])
            got = m[co : co + length].tobytes() if 0 <= length <= LABEL_BYTES else b""
            if got != b"%d" % idx.label[r]:
                bad[i] = self._problem(r, "label", got=got)

    def _drop(self, bad: dict[int, ShardError]) -> None:
        """Raise the first problem, or with ``skip`` log each (the caller leaves them out)."""
        if not self.skip:
            raise bad[min(bad)]
        for i in sorted(bad):
            log.warning("leaving out a damaged sample (on_error='skip'): %s", bad[i])
        self.skipped += len(bad)

    def _problem(self, row: int | np.integer, kind: str, *, have: int = 0, got: bytes = b"") -> ShardError:
        idx = self.index
        r = int(row)
        url, key = idx.urls[int(idx.shard[r])], idx.key_str(r)
        at = int(idx.offset[r])
        if kind == "short":
            what = (
                f"the shard ends {max(have, 0)} bytes into its {self.want}-byte .npy; it is shorter than its "
                f"index says (truncated copy?)"
            )
        elif kind == "header":
            what = f"no .npy header of a {idx.size} px image where the index points; the shard does not match its index"
        elif kind == "name":
            at = max(0, at - HEADER)
            named = got.split(b"\0", 1)[0].decode(errors="replace")
            what = (
                f"the tar header in front of its .npy names {named!r}, "
                f"not {idx.key_str(r) + '.npy'!r}: the shard is not the one its index was written with (another "
                f"version's or conversion's shard copied over it?); wds-tools verify lists every such sample"
            )
        elif kind == "checksum":
            what = (
                "its pixels do not match their checksum in the index (npy_xxh3): the shard is damaged "
                "(wds-tools verify lists every such sample)"
            )
        else:
            at = int(self._cls_offset[r])
            label = int(idx.label[r])
            name = f" ({idx.classes[label]})" if 0 <= label < len(idx.classes) else ""
            what = (
                f"its .cls is {got!r}, the index's label is {label}{name}: the shard does not match its index "
                f"(wds-tools verify lists every such sample)"
            )
        return ShardError(f"{url}: byte {at}: sample {key!r}: {what}", url=url, offset=at)

    # --- either -------------------------------------------------------------------------------
    def _remote(self, rows: np.ndarray) -> bool:
        return len(rows) > 0 and not is_local(self.index.urls[int(self.index.shard[rows[0]])])

    def locate(self, rows: Sequence[int] | np.ndarray, scratch: np.ndarray | None = None) -> Found:
        """Positions (into ``rows``) of the rows read, and their pixels: in the mappings (local), or
        in rows of ``scratch`` ([len(rows), S*S*3] uint8, made when None) read into (remote)."""
        rows = np.asarray(rows, np.int64)
        if self._remote(rows):
            if scratch is None:
                scratch = np.empty((len(rows), self.index.sample_bytes), np.uint8)
            good = self._read_remote(rows, scratch)
            flat = scratch.reshape(-1)
            offsets = np.arange(len(good), dtype=np.int64) * self.index.sample_bytes
            return Found(good, Located([Part(flat, offsets, None)] if good else [], self.index.sample_bytes))
        found = self._local(rows)
        self.bytes_read += len(rows) * self.want
        return found

    def read(self, rows: Sequence[int] | np.ndarray, out: np.ndarray) -> list[int]:
        """The pixels of ``rows`` into ``out[:k]`` ([len(rows), S*S*3] uint8), k = the rows read;
        returns their positions in ``rows`` (all of them unless ``skip`` left some out)."""
        rows = np.asarray(rows, np.int64)
        good, located = self.locate(rows, out)
        if not self._remote(rows):  # read from object storage into ``out`` itself; local: in the mappings
            located.copy_into(out)
        return good

    # --- object storage -----------------------------------------------------------------------
    def spans(self, rows: np.ndarray) -> list[list[int]]:
        """The byte ranges ``rows`` are read in from object storage: [shard, start, end, first
        position, last position + 1] each; neighbours of one shard (rows in file order) merged."""
        idx = self.index
        shard, npy = idx.shard[rows], idx.offset[rows]
        start = self._cls_offset[rows] if self.labels else npy  # labels checked: from the .cls on
        end = npy + self.want
        spans: list[list[int]] = []
        for i in range(len(rows)):
            s, a, b = int(shard[i]), int(start[i]), int(end[i])
            last = spans[-1] if spans else None
            if last and last[0] == s and 0 <= a - last[2] <= MERGE_GAP and b - last[1] <= MERGE_MAX:
                last[2], last[4] = b, i + 1
            else:
                spans.append([s, a, b, i, i + 1])
        return spans

    def _read_remote(self, rows: np.ndarray, out: np.ndarray) -> list[int]:
        idx, want = self.index, self.want
        npy = idx.offset[rows]
        spans = self.spans(rows)
        urls = [idx.urls[s] for s, *_ in spans]
        try:
            blobs = read_ranges(urls, [sp[1] for sp in spans], [sp[2] for sp in spans])
        except OSError as e:
            raise ShardError(f"{urls[0]}: ranged read failed: {e}", url=urls[0]) from None
        good: list[int] = []
        bad: dict[int, ShardError] = {}
        for (_s, a, b, first, stop), blob, url in zip(spans, blobs, urls):
            if isinstance(blob, BaseException) or len(blob) != b - a:
                got = f"failed: {blob}" if isinstance(blob, BaseException) else f"gave {len(blob)} of {b - a} bytes"
                for i in range(first, stop):
                    bad[i] = ShardError(
                        f"{url}: byte {int(npy[i])}: sample {idx.key_str(int(rows[i]))!r}: the ranged read {got}",
                        url=url,
                        offset=int(npy[i]),
                    )
                continue
            data = np.frombuffer(blob, np.uint8)  # the shard's bytes from a (with labels: from the .cls on)
            for i in range(first, stop):
                r, at = int(rows[i]), int(npy[i]) - a
                member = data[at : at + want]
                self._check_one(data, r, at, i, bad, base=a)
                if i not in bad and self.pixels and xxhash.xxh3_64_intdigest(member.data) != int(self._xxh3[r]):
                    bad[i] = self._problem(r, "checksum")
                if i not in bad:
                    out[len(good)] = member[NPY_HEADER_BYTES:]
                    good.append(i)
        if bad:
            self._drop(bad)
        self.bytes_read += len(rows) * want
        return good
