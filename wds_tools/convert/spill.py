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

import numpy as np

from ..format.index import SAMPLE_COLUMNS, read_npz, write_npz
from ..format.packed import pack_strings, unpack_strings
from ..format.tarwrite import partial_path
from ..format.transport import join
from .storage import Store

__all__ = ["SPILL_DIR", "Staged", "SpillWriter", "load_spill"]

SPILL_DIR = "spill"  # in a size's work folder


class Staged:
    """A file written locally: in place (renamed when done) or staged and uploaded (object storage)."""

    def __init__(self, store: Store, final: str):
        self.store, self.final = store, final
        self.staging = tempfile.mkdtemp(prefix="wds-tools-") if store.remote else None
        self.path = os.path.join(self.staging, os.path.basename(final)) if self.staging else final

    def done(self) -> None:
        if self.staging:  # object storage: the file appears whole, or not at all
            self.store.upload(self.path, self.final)

    def cleanup(self) -> None:
        if self.staging:
            shutil.rmtree(self.staging, ignore_errors=True)


class SpillWriter:
    """The pixels a shard's samples gave another size of the run: one file of .npy members, and its table."""

    def __init__(self, folder: str, name: str):
        self.store = Store(folder)
        self.store.makedirs(folder)
        self.file = Staged(self.store, join(folder, name + ".npys"))
        self.table = join(folder, name + ".npz")
        self.tmp = partial_path(self.file.path)
        self.f = open(self.tmp, "wb")
        self.rows: list[tuple] = []
        self.offset = 0

    def append(self, rows: list[tuple]) -> None:
        for key, path, fp, width, height, src_size, mtime, npy_x, npy in rows:
            self.f.write(npy)
            self.rows.append((key, fp, width, height, src_size, mtime, self.offset, len(npy), npy_x, path))
            self.offset += len(npy)

    def finish(self) -> None:
        if not self.rows:  # nothing of this shard was needed: keep what an interrupted run spilled for it
            self.abort()
            return
        self.f.flush()
        os.fsync(self.f.fileno())  # as a shard is: renamed only once its bytes are on disk
        self.f.close()
        os.replace(self.tmp, self.file.path)
        self.file.done()
        cols: dict[str, np.ndarray] = {
            "key": np.array([r[0].encode() for r in self.rows] or [b""], dtype="S")[:len(self.rows)],
            "fingerprint": np.frombuffer(b"".join(r[1] for r in self.rows), dtype="u1").reshape(-1, 16),
        }
        for j, name in enumerate(("width", "height", "src_size", "src_mtime_ns", "npy_offset",
                                  "npy_length", "npy_xxh3"), 2):
            cols[name] = np.array([r[j] for r in self.rows], dtype=SAMPLE_COLUMNS.get(name, "<i8"))  # mtime: <i8
        cols["path_offsets"], cols["path_data"] = pack_strings([r[9] for r in self.rows])
        cols["bytes"] = np.array([self.offset], dtype="<u8")
        self.store.write_bytes(self.table, write_npz(cols))

    def abort(self) -> None:
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


def load_spill(store: Store, folder: str) -> dict[str, tuple]:
    """key -> (source_path, fingerprint, width, height, src_size, mtime_ns, file, file bytes,
    npy offset, npy length, npy xxh3) of every spilled sample whose table is complete."""
    out: dict[str, tuple] = {}
    for name in store.names(folder):
        if not name.endswith(".npz") or name.startswith("."):
            continue
        table, blob = join(folder, name), join(folder, name[:-4] + ".npys")
        try:
            cols = read_npz(table, data=store.read_bytes(table))
        except Exception:  # unreadable: those samples are decoded again
            continue
        paths = unpack_strings(cols["path_offsets"], cols["path_data"])
        nbytes = int(cols["bytes"][0])
        for i, key in enumerate(cols["key"]):
            path = paths[i]
            out[key.decode()] = (path, cols["fingerprint"][i].tobytes(), int(cols["width"][i]),
                                 int(cols["height"][i]), int(cols["src_size"][i]), int(cols["src_mtime_ns"][i]),
                                 blob, nbytes, int(cols["npy_offset"][i]), int(cols["npy_length"][i]),
                                 int(cols["npy_xxh3"][i]))
    return out
