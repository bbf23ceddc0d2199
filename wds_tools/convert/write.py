"""Writing shards: samples become tar members in batches; a shard's batches are appended in plan order.

``encode_batch`` (worker side) makes a batch's tar fragment (fragment.py) and index fields, copying checked
pixels from a base or decoding the source; shard.py places and seals the fragments; ``write_shard`` drives
both for one whole shard in one process (``--workers 1``, one Ray task per shard).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import numpy as np
import xxhash
from PIL import Image

from ..format.npy import npy_header
from ..format.phash import phash_batch
from ..format.sample import label_i32
from ..format.sample import sample_json as json_bytes
from ..storage.transport import RangedFile, open_ranged
from .decode import Decoded, DecodeError, decode_image, decode_sizes
from .fragment import SLOT_BYTES, Member, Ranges, members_bytes, put_block, put_members, write_slots
from .runner import orphaned, shared_memory
from .scan import content_hasher, hash_mismatch, open_source, os_reason
from .shard import ShardAssembler
from .shardtasks import Encoded, Reuse, SampleRow, SampleTask, ShardTask, SpillRow

__all__ = [
    "Reuse",
    "SampleTask",
    "ShardTask",
    "SampleRow",
    "Encoded",
    "encode_batch",
    "encode_after_writes",
    "open_shard",
    "write_shard",
    "sample_json",
    "NARROW_SPAN",
    "narrow_warning",
]


def sample_json(
    s: SampleTask, width: int, height: int, fingerprint: str, dataset_version: str, classes_digest: str
) -> bytes:
    """A sample's .json (docs/FORMAT.md): every sample of a conversion has the same keys, so
    ``original_key`` is the key itself when it was not mapped, and ``meta`` is there for every
    sample when the conversion has metadata columns."""
    meta = {
        "key": s.key,
        "label": s.label_name,
        "source_path": s.source_path,
        "width": width,
        "height": height,
        "fingerprint": f"xxh3_128:{fingerprint}",
        "original_key": s.original_key if s.original_key is not None else s.key,
        "dataset_version": dataset_version,
        "classes_digest": classes_digest,
    }
    if s.meta is not None:
        meta["meta"] = dict(s.meta)
    return json_bytes(meta)


class _StoredPixels:
    """Open base shards (or spill files) on demand; one whose size differs from its record is refused."""

    def __init__(self) -> None:
        self.files: dict[str, RangedFile | str] = {}

    def read(self, r: Reuse, header: bytes) -> bytes | str:
        """The stored .npy, checked against ``r``, or why it cannot be used."""
        f = self.files.get(r.shard_path)
        if f is None:
            what = "spill file" if r.spilled else "base shard"
            try:
                f = open_ranged(r.shard_path)
                if f.size != r.shard_bytes:
                    f.close()
                    f = f"{what} is {f.size} bytes, its index says {r.shard_bytes}"
            except OSError as e:
                f = f"{what} unreadable: {e.strerror or e}"
            self.files[r.shard_path] = f
        if isinstance(f, str):
            return f
        try:
            data = f.read(r.npy_offset, r.npy_length)
        except OSError as e:
            return f"stored .npy unreadable: {e.strerror or e}"
        if len(data) != r.npy_length or data[: len(header)] != header:
            return "stored .npy does not match the index (size or header)"
        if xxhash.xxh3_64_intdigest(data) != r.npy_xxh3:
            return "stored .npy fails its checksum"
        return data

    def close(self) -> None:
        """Close the files opened."""
        for f in self.files.values():
            if not isinstance(f, str):
                f.close()


def _npy_checksum(header: bytes, flat: np.ndarray) -> int:
    h = xxhash.xxh3_64(header)
    h.update(flat.data)
    return h.intdigest()


NARROW_SPAN = 16
"""Stored pixels spanning fewer levels than this (a sixteenth of 0..255) are reported in errors.jsonl."""


def narrow_warning(key: str, path: str, line: int, lo: int, hi: int) -> dict:
    """errors.jsonl's line for a sample whose stored pixels span fewer than ``NARROW_SPAN`` levels."""
    return {
        "key": key,
        "path": path,
        "line": line,
        "stage": "pixels",
        "warning": f"the stored pixels span only {lo}..{hi}, less than a sixteenth of 0..255: a near-uniform "
        "image, or a range squeezed on decode (16-bit data without sBIT?); check the source",
    }


def _histogram(pixels: np.ndarray) -> np.ndarray:
    """Counts of each value per channel of uint8 [S, S, 3] pixels: [R 0..255, G 0..255, B 0..255]
    (Pillow counts them per band, in one pass in C: about half the time of ``np.bincount``)."""
    return np.array(Image.fromarray(pixels).histogram(), dtype=np.int64)


def _span(hist: np.ndarray) -> tuple[int, int]:
    """The lowest and highest value of any channel, read off a sample's histogram."""
    seen = hist.reshape(3, 256) > 0
    return int(seen.argmax(axis=1).min()), 255 - int(seen[:, ::-1].argmax(axis=1).min())


def _phashes(pixels: list[np.ndarray]) -> list[tuple[int, ...]]:
    """``format.phash`` of each of stored images [S, S, 3], in one call. ``encode_batch`` hashes each image
    alone, right after its decode: in a conversion that costs 0.6 of hashing the batch at its end, whose
    pixels have left the cache by then (a batch's call costs half of one per image on pixels that stay
    in the cache)."""
    return [tuple(h) for h in phash_batch(pixels).tolist()]


def encode_batch(task: ShardTask, start: int, stop: int, slot: int | None = None) -> Encoded:
    """Samples ``start:stop`` of ``task``: copy checked pixels from where ``reuse`` says, else decode
    the source (and the ``also`` sides from the same bytes, for their spill). The fragment goes to
    slot ``slot`` of the pool's shared memory when it fits there, else into ``Encoded.data``."""
    header = npy_header((task.side, task.side, 3))
    npy_len = len(header) + task.side * task.side * 3
    out = Encoded()
    stored = _StoredPixels()
    members: list[Member] = []
    spills: dict[int, list[memoryview]] = {}  # side -> the pixels of its spilled rows
    try:
        for s in task.samples[start:stop]:
            if orphaned():
                raise SystemExit(1)
            got = None
            if s.reuse is not None and s.reuse.npy_length == npy_len:
                got = stored.read(s.reuse, header)
                if isinstance(got, str):
                    where = os.path.basename(s.reuse.shard_path)
                    out.problems.append({"key": s.key, "base_shard": where, "error": got})
                    got = None
            sides = ([] if got is not None else [task.side]) + list(s.also)
            pictures, fp, src_nbytes, mtime, reason = _decode(s, sides, task, out)
            row: SampleRow | None = None
            pixels: np.ndarray | None = None  # [S, S, 3], stored as given
            if isinstance(got, bytes):
                r = s.reuse
                assert r is not None  # got comes from it
                pixels = np.frombuffer(got, dtype=np.uint8, offset=len(header)).reshape(task.side, task.side, 3)
                known = r.phash
                row = SampleRow(
                    s.key,
                    s.label,
                    r.fingerprint,
                    r.width,
                    r.height,
                    s.src_nbytes,
                    s.src_mtime_ns,
                    r.npy_xxh3,
                    s.source_path,
                    known if known is not None else (),
                )
                kind = "decoded" if r.spilled else "relabeled" if r.relabeled else "reused"
                out.counts[kind] += 1
            elif reason is not None or isinstance(pictures.get(task.side), DecodeError):
                error = reason if reason is not None else str(pictures[task.side])
                out.failed.append(
                    {"key": s.key, "path": s.source_path, "line": s.line, "stage": "decode", "error": error}
                )
                out.failed_stat[s.key] = [s.src_nbytes, s.src_mtime_ns]  # a rerun redoes the shard if it changes
            else:
                dec = pictures[task.side]
                assert isinstance(dec, Decoded) and fp is not None  # no reason, no error: decoded
                pixels = np.ascontiguousarray(dec.pixels)
                row = SampleRow(
                    s.key,
                    s.label,
                    fp,
                    dec.width,
                    dec.height,
                    src_nbytes,
                    mtime,
                    _npy_checksum(header, pixels.reshape(-1)),
                    s.source_path,
                )
                out.counts["decoded"] += 1
            if row is not None:
                assert pixels is not None  # set with row
                if not row.phash:  # hashed while the pixels are in the cache (bench_convert.py --overhead)
                    row = row._replace(phash=_phashes([pixels])[0])
                hist = _histogram(pixels)
                lo, hi = _span(hist)
                if hi - lo < NARROW_SPAN:
                    out.narrow.append(narrow_warning(s.key, s.source_path, s.line, lo, hi))
                out.hist += hist
                js = sample_json(
                    s, row.width, row.height, row.fingerprint.hex(), task.dataset_version, task.classes_digest
                )
                members.append(
                    Member(s.key.encode(), str(s.label).encode(), label_i32(s.label), js, header, _bytes_of(pixels))
                )
                out.rows.append(row)
            for side in s.also:
                other = pictures.get(side)
                if isinstance(other, Decoded) and fp is not None:
                    spill_row, spill_pixels = _spill_row(s, side, other, fp, src_nbytes, mtime)
                    out.spilled.setdefault(side, []).append(spill_row)
                    spills.setdefault(side, []).append(spill_pixels)
    finally:
        stored.close()
    _lay_out(out, members, spills, slot)
    return out


_sample_values = operator.attrgetter(*(f.name for f in fields(SampleTask)))


def pack_samples(samples: Sequence[SampleTask]) -> tuple[tuple, ...]:
    """Samples as tuples of their fields: a pool call pickles and unpickles those about six times faster
    than the dataclasses (``encode_after_writes`` makes them again)."""
    return tuple(map(_sample_values, samples))


def encode_after_writes(
    writes: Sequence[tuple[int, Ranges]], task: ShardTask, packed: Sequence[tuple], slot: int | None
) -> Encoded:
    """``write_slots(writes)`` (batches placed since the last call, whose slots the converter wants
    back), then ``encode_batch`` of the samples ``packed`` (``pack_samples``) of ``task`` (whose own
    samples are left out): one call to a pool worker for both."""
    write_slots(writes)
    samples = tuple(SampleTask(*values) for values in packed)
    return encode_batch(replace(task, samples=samples), 0, len(samples), slot)


def _bytes_of(pixels: np.ndarray) -> memoryview:
    """The bytes of C-order uint8 pixels, without a copy."""
    return pixels.reshape(-1).data


def _lay_out(out: Encoded, members: list[Member], spills: dict[int, list[memoryview]], slot: int | None) -> None:
    """Lay out the batch's members, then its spill blocks, in the slot when they fit, else in ``out.data``;
    set the rows' places (from the fragment's start) and the lengths."""
    nbytes = sum(members_bytes(m) for m in members)
    blocks = {side: sum(len(npy_header((side, side, 3))) + len(px) for px in spills[side]) for side in sorted(spills)}
    total = nbytes + sum(blocks.values())
    shared = shared_memory() if slot is not None else None
    if shared is not None and slot is not None and total <= SLOT_BYTES:
        whole = memoryview(shared)
        buf = whole[slot * SLOT_BYTES : slot * SLOT_BYTES + total]
        out.slot = slot
    else:
        out.data = bytearray(total)
        whole = buf = memoryview(out.data)
    try:
        pos = 0
        for i, m in enumerate(members):
            pos, placed = put_members(buf, pos, m)
            out.rows[i] = out.rows[i]._replace(placed=placed)
        for side, pixels in ((side, spills[side]) for side in blocks):
            head = npy_header((side, side, 3))
            for px in pixels:
                pos = put_block(buf, pos, (head, px))
    finally:
        buf.release()
        whole.release()
    out.nbytes, out.spill_nbytes = nbytes, blocks


def _decode(
    s: SampleTask, sides: list[int], task: ShardTask, out: Encoded
) -> tuple[dict[int, Decoded | DecodeError], bytes | None, int, int, str | None]:
    """Read the source once and decode it at ``sides``: (pictures by side, fp, nbytes, mtime, reason)."""
    if not sides:
        return {}, None, 0, 0, None
    pictures: dict[int, Decoded | DecodeError]
    try:
        f, src_nbytes, mtime = open_source(s.path)
        with f:
            data = f.read()
        check = content_hasher(s.content_hash)
        if check is not None:
            check.update(data)
            mismatch = hash_mismatch(s.content_hash, check)
            if mismatch:
                raise DecodeError(mismatch)
        if len(sides) == 1:  # the reference itself
            try:
                pictures = {sides[0]: decode_image(data, sides[0], task.resize, task.settings)}
            except DecodeError as e:
                pictures = {sides[0]: e}
            out.decodes += 1
        else:
            pictures, n = decode_sizes(data, sides, task.resize, task.settings)
            out.decodes += n
    except OSError as e:
        return {}, None, 0, 0, os_reason(e)
    except DecodeError as e:
        return {}, None, 0, 0, str(e)
    return pictures, xxhash.xxh3_128_digest(data), src_nbytes, mtime, None


def _spill_row(
    s: SampleTask, side: int, dec: Decoded, fp: bytes, src_nbytes: int, mtime: int
) -> tuple[SpillRow, memoryview]:
    """A sample's row in the spill of another side, and its pixels there."""
    header = npy_header((side, side, 3))
    flat = np.ascontiguousarray(dec.pixels).reshape(-1)
    row = SpillRow(
        s.key,
        s.source_path,
        fp,
        dec.width,
        dec.height,
        src_nbytes,
        mtime,
        _npy_checksum(header, flat),
        len(header) + len(flat),
    )
    return row, flat.data


def open_shard(task: ShardTask) -> ShardAssembler:
    """Start writing a shard (the tests interrupt conversions here)."""
    return ShardAssembler(task)


def write_shard(task: ShardTask, batch: int = 16, on_samples: Callable[[int], None] | None = None) -> dict:
    """Write one whole shard in this process, ``batch`` samples at a time (``on_samples``: the samples of
    each batch written); returns its meta."""
    shard = open_shard(task)
    try:
        for start in range(0, len(task.samples), batch):
            shard.append(encode_batch(task, start, start + batch))
            if on_samples is not None:
                on_samples(len(task.samples[start : start + batch]))
        return shard.finish()
    except BaseException:
        shard.abort()
        raise
