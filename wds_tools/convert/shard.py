"""A shard's files on the converter's side: fragments placed and appended in plan order, sealed, completed.

``ShardAssembler`` places each batch after the ones before it; ``seal_shard`` (any process) hashes, syncs and
renames (uploads) the tar; ``complete`` writes its sample columns and meta, the resume marker, last.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..format.index import SAMPLE_COLUMNS, write_npz
from ..format.packed import pack_strings
from ..format.phash import WINDOWS
from ..format.sample import MEMBERS, column_prefix
from ..format.tarwrite import ShardWriter, seal
from ..storage.fsutil import dumps_canonical
from ..storage.objects import Store
from ..storage.transport import join
from .shardtasks import Encoded, SampleRow, ShardTask
from .spill import SpillWriter, Staged, sync_into_place

__all__ = ["ShardAssembler", "SealJob", "seal_shard"]


class SealJob(NamedTuple):
    """A shard whose bytes are all written, to be hashed, synced and put in place (``seal_shard``)."""

    tmp: str  # the tar under its temporary name
    tar: Staged  # where it goes
    nbytes: int
    spills: tuple[tuple[str, Staged], ...]  # the same for its spill files: (temporary name, where it goes)


def seal_shard(job: SealJob) -> str:
    """Hash the tar (read back: the bytes as the filesystem holds them), fsync it and its spill files and
    rename (upload) them into place; return the tar's sha256 hex. Runs on any worker."""
    sha = seal(job.tmp, job.tar.path, job.nbytes)
    job.tar.done()
    for tmp, staged in job.spills:
        sync_into_place(tmp, staged)
    return sha


class ShardAssembler:
    """Append a shard's fragments in plan order; ``end`` finishes the bytes, ``seal_shard`` puts them in
    place, and ``complete`` writes the shard's columns and meta (``finish`` does the three here)."""

    def __init__(self, task: ShardTask) -> None:
        self.task = task
        self.store = Store(task.dest)
        self.tar = Staged(self.store, self.store.join(task.name))
        self.writer = ShardWriter(self.tar.path, digest=False)
        self.spills: dict[int, SpillWriter] = {}
        try:
            for side, folder in task.spill:
                self.spills[side] = SpillWriter(folder, task.name)
        except BaseException:  # a full disk may refuse the next file: remove those made
            self.abort()
            raise
        self.rows: list[SampleRow] = []
        self.failed: list[dict] = []
        self.narrow: list[dict] = []
        self.failed_stat: dict[str, list[int]] = {}
        self.problems: list[dict] = []
        self.counts = {"decoded": 0, "reused": 0, "relabeled": 0}
        self.hist = np.zeros(768, dtype=np.int64)
        self.decodes = 0

    def append(self, enc: Encoded, data: memoryview | None = None) -> None:
        """Add a batch's members to the tar, after those of the batches before it, with one write (its
        spill blocks to their files); ``data``: the batch's bytes where they are not in ``enc.data``."""
        if data is None:
            data = memoryview(enc.data if enc.data is not None else b"")
        base = self.writer.append(data[: enc.nbytes]) if enc.nbytes else self.writer.offset
        pos = enc.nbytes
        for side, n in enc.spill_nbytes.items():
            self.spills[side].append(enc.spilled[side], data[pos : pos + n])
            pos += n
        self._record(enc, base)

    def place(self, enc: Encoded) -> list[tuple[str, int, int, int]]:
        """Give a batch its place after the batches before it, for another process to write there:
        (file, offset in it, offset in the batch's bytes, length) of each of its byte ranges."""
        base = self.writer.reserve(enc.nbytes)
        out = [(self.writer.tmp, base, 0, enc.nbytes)] if enc.nbytes else []
        pos = enc.nbytes
        for side, n in enc.spill_nbytes.items():
            spill = self.spills[side]
            out.append((spill.tmp, spill.reserve(enc.spilled[side]), pos, n))
            pos += n
        self._record(enc, base)
        return out

    def _record(self, enc: Encoded, base: int) -> None:
        for row in enc.rows:  # placed is the last field
            self.rows.append(SampleRow(*row[:-1], tuple((base + off, n) for off, n in row.placed)))
        self.hist += enc.hist
        self.failed += enc.failed
        self.narrow += enc.narrow
        self.failed_stat.update(enc.failed_stat)
        self.problems += enc.problems
        for k, v in enc.counts.items():
            self.counts[k] += v
        self.decodes += enc.decodes

    def end(self) -> SealJob:
        """Every batch is placed: finish the tar's and spill files' bytes, unsynced, under their
        temporary names (the ranges left to others must be written before ``seal_shard``); return what
        ``seal_shard`` does with them."""
        nbytes = self.writer.end()
        spills = tuple(job for spill in self.spills.values() if (job := spill.end()) is not None)
        return SealJob(self.writer.tmp, self.tar, nbytes, spills)

    def complete(self, job: SealJob, sha: str) -> dict:
        """The shard is sealed: write its spill tables, its columns, then its meta; return the meta."""
        task, store = self.task, self.store
        try:
            for spill in self.spills.values():
                spill.write_table()
        finally:
            self.cleanup()
        store.write_bytes(join(task.work, task.name + ".npz"), write_npz(_rows_to_columns(self.rows)))
        meta = {
            "name": task.name,
            "split": task.split,
            "digest": task.digest,
            "bytes": job.nbytes,
            "sha256": sha,
            "samples": len(self.rows),
            "failed": self.failed,
            "narrow": self.narrow,
            "failed_stat": self.failed_stat,
            "histogram": self.hist.tolist(),
            "counts": self.counts,
            "reuse_problems": self.problems,
            "decodes": self.decodes,
        }
        store.write_bytes(join(task.work, task.name + ".json"), (dumps_canonical(meta) + "\n").encode())
        return meta

    def finish(self) -> dict:
        """End, seal and complete the shard in this process; return its meta."""
        job = self.end()
        return self.complete(job, seal_shard(job))

    def abort(self) -> None:
        """Remove the unfinished tar and spill files."""
        self.writer.abort()
        for spill in self.spills.values():
            spill.abort()
        self.cleanup()

    def cleanup(self) -> None:
        """Remove staging folders."""
        self.tar.cleanup()
        for spill in self.spills.values():
            spill.file.cleanup()


def _rows_to_columns(rows: list[SampleRow]) -> dict[str, np.ndarray]:
    """A shard's sample columns, kept in its work folder until the index is assembled. They hold
    ``src_mtime_ns`` too: the index leaves it out, the quick-check cache takes it (hashes.py)."""
    names = ["key", "label", "fingerprint", "width", "height", "src_size", "src_mtime_ns", "npy_xxh3", "phash"]
    fields = dict(zip(SampleRow._fields, zip(*rows))) if rows else dict.fromkeys(SampleRow._fields, ())
    cols: dict[str, np.ndarray] = {}
    for name in names:
        values = fields[name]
        if name == "key":
            cols[name] = np.array([v.encode() for v in values], dtype="S") if values else np.zeros(0, "S1")
        elif name == "fingerprint":
            cols[name] = np.frombuffer(b"".join(values), dtype="u1").reshape(len(values), 16)
        elif name == "phash":
            cols[name] = np.array(values, dtype="<u8").reshape(len(values), WINDOWS)
        else:
            cols[name] = np.array(values, dtype=SAMPLE_COLUMNS.get(name, "<i8"))
    placed = np.array(fields["placed"], dtype="<u8").reshape(len(rows), len(MEMBERS), 2)  # (offset, length)
    for j, ext in enumerate(MEMBERS):
        prefix = column_prefix(ext)
        cols[f"{prefix}_offset"] = np.ascontiguousarray(placed[:, j, 0])
        cols[f"{prefix}_length"] = np.ascontiguousarray(placed[:, j, 1])
    cols["shard"] = np.zeros(len(rows), dtype="<u4")
    cols["path_offsets"], cols["path_data"] = pack_strings(list(fields["source_path"]))
    return cols
