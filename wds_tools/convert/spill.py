"""Spill: the pixels a multi-size run decodes for its other sizes while it writes the largest one.

A run with ``--size 224,384`` writes the 384 shards first; each sample is decoded once for both
sizes (see ``decode_sizes``) and its 224 pixels are appended to a spill file in 224's work folder,
one file of .npy members plus a table per 384 shard. The 224 shards, whose plan and order differ,
are then written by copying checked pixels from the spill, as an incremental run copies from a
base. Spill files live until that size's index is written; they are resume state like the rest of
the work folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import NamedTuple

import numpy as np

from ..format.index import SAMPLE_COLUMNS, read_npz, write_npz
from ..format.packed import pack_strings, unpack_strings
from ..format.tarwrite import partial_path
from ..format.transport import join
from ..signals import reraise_interruption
from .storage import Store

__all__ = ["SPILL_DIR", "Staged", "SpillRow", "Spilled", "SpillWriter", "load_spill"]

SPILL_DIR = "spill"
"""The folder, in a size's work folder, of the other sizes' pixels a multi-size conversion spills."""


class SpillRow(NamedTuple):
    """A sample's pixels at another size of the run, as ``encode_batch`` hands them to ``SpillWriter``."""

    key: str
    source_path: str
    fingerprint: bytes
    width: int  # the source image's, as its .json records them
    height: int
    src_nbytes: int  # the source file's size and mtime when it was decoded
    src_mtime_ns: int
    npy_xxh3: int
    npy: bytes  # header and pixels


class Spilled(NamedTuple):
    """A spilled sample as ``load_spill`` finds it: its source when decoded, and where its .npy sits."""

    source_path: str
    fingerprint: bytes
    width: int
    height: int
    src_nbytes: int
    src_mtime_ns: int
    file: str  # the spill file
    file_bytes: int
    npy_offset: int
    npy_length: int
    npy_xxh3: int


class Staged:
    """A file written locally: in place (renamed when done) or staged and uploaded (object storage)."""

    def __init__(self, store: Store, final: str) -> None:
        self.store, self.final = store, final
        self.staging = tempfile.mkdtemp(prefix="wds-tools-") if store.remote else None
        self.path = os.path.join(self.staging, os.path.basename(final)) if self.staging else final

    def done(self) -> None:
        """The file is written: upload it when staged."""
        if self.staging:  # object storage: the file appears whole, or not at all
            self.store.upload(self.path, self.final)

    def cleanup(self) -> None:
        """Remove the staging folder, if any."""
        if self.staging:
            shutil.rmtree(self.staging, ignore_errors=True)


class SpillWriter:
    """The pixels a shard's samples gave another size of the run: one file of .npy members, and its table."""

    def __init__(self, folder: str, name: str) -> None:
        self.store = Store(folder)
        self.store.makedirs(folder)
        self.file = Staged(self.store, join(folder, name + ".npys"))
        self.table = join(folder, name + ".npz")
        self.tmp = partial_path(self.file.path)
        self.f = open(self.tmp, "wb")
        self.rows: list[tuple[SpillRow, int, int]] = []  # (row without its .npy, offset, length)
        self.offset = 0

    def append(self, rows: list[SpillRow]) -> None:
        """Write the rows' .npy members to the spill file."""
        for row in rows:
            self.f.write(row.npy)
            self.rows.append((row._replace(npy=b""), self.offset, len(row.npy)))
            self.offset += len(row.npy)

    def finish(self) -> None:
        """Rename the spill file into place (upload it) and write its table; nothing when it is empty."""
        if not self.rows:  # nothing of this shard was needed: keep what an interrupted run spilled for it
            self.abort()
            return
        self.f.flush()
        os.fsync(self.f.fileno())  # as a shard is: renamed only once its bytes are on disk
        self.f.close()
        os.replace(self.tmp, self.file.path)
        self.file.done()
        rows = [r for r, _, _ in self.rows]
        cols: dict[str, np.ndarray] = {
            "key": np.array([r.key.encode() for r in rows] or [b""], dtype="S")[: len(rows)],
            "fingerprint": np.frombuffer(b"".join(r.fingerprint for r in rows), dtype="u1").reshape(-1, 16),
        }
        values = {
            "width": [r.width for r in rows],
            "height": [r.height for r in rows],
            "src_size": [r.src_nbytes for r in rows],
            "src_mtime_ns": [r.src_mtime_ns for r in rows],
            "npy_offset": [off for _, off, _ in self.rows],
            "npy_length": [n for _, _, n in self.rows],
            "npy_xxh3": [r.npy_xxh3 for r in rows],
        }
        for name, column in values.items():  # in this order: the table's bytes
            cols[name] = np.array(column, dtype=SAMPLE_COLUMNS.get(name, "<i8"))  # mtime: <i8
        cols["path_offsets"], cols["path_data"] = pack_strings([r.source_path for r in rows])
        cols["bytes"] = np.array([self.offset], dtype="<u8")
        self.store.write_bytes(self.table, write_npz(cols))

    def abort(self) -> None:
        """Close and remove the unfinished spill file."""
        if not self.f.closed:
            try:
                self.f.close()
            except OSError:  # disk full: flushing on close fails again; the file goes anyway
                pass
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass
        self.file.cleanup()


def load_spill(store: Store, folder: str) -> dict[str, Spilled]:
    """key -> every spilled sample whose table is complete."""
    out: dict[str, Spilled] = {}
    for name in store.names(folder):
        if not name.endswith(".npz") or name.startswith("."):
            continue
        table, blob = join(folder, name), join(folder, name[:-4] + ".npys")
        try:
            cols = read_npz(table, data=store.read_bytes(table))
        except Exception as e:  # unreadable: those samples are decoded again
            reraise_interruption(e)
            continue
        paths = unpack_strings(cols["path_offsets"], cols["path_data"])
        nbytes = int(cols["bytes"][0])
        for i, key in enumerate(cols["key"]):
            path = paths[i]
            out[key.decode()] = Spilled(
                path,
                cols["fingerprint"][i].tobytes(),
                int(cols["width"][i]),
                int(cols["height"][i]),
                int(cols["src_size"][i]),
                int(cols["src_mtime_ns"][i]),
                blob,
                nbytes,
                int(cols["npy_offset"][i]),
                int(cols["npy_length"][i]),
                int(cols["npy_xxh3"][i]),
            )
    return out
