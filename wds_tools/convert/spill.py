"""Spill: the pixels a multi-size run decodes for its other sizes while it writes the largest one.

Each sample is decoded once for all sizes; the smaller sizes' pixels go to spill files in their work
folders, from which their shards are then written as from a base (docs/guide/converter-internals.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import NamedTuple

import numpy as np

from ..format.index import SAMPLE_COLUMNS, read_npz, write_npz
from ..format.packed import pack_strings, unpack_strings
from ..format.tarwrite import partial_path, write_at
from ..signals import reraise_interruption
from ..storage.objects import Store
from ..storage.transport import join
from .shardtasks import Reuse, SpillRow

__all__ = ["SPILL_DIR", "Staged", "Spilled", "SpillWriter", "load_spill", "sync_into_place"]

SPILL_DIR = "spill"
"""The folder, in a size's work folder, of the other sizes' pixels a multi-size conversion spills."""


class Spilled(NamedTuple):
    """A spilled sample as ``load_spill`` finds it: its source's path, size and mtime when it was decoded,
    and where its pixels sit."""

    source_path: str
    src_nbytes: int
    src_mtime_ns: int
    reuse: Reuse


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


def sync_into_place(tmp: str, staged: Staged) -> None:
    """fsync the finished file ``tmp``, rename it to ``staged.path`` and upload it when staged."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, staged.path)
    staged.done()


class SpillWriter:
    """The pixels a shard's samples gave another size of the run: one file of .npy members, and its table."""

    def __init__(self, folder: str, name: str) -> None:
        self.store = Store(folder)
        self.store.makedirs(folder)
        self.file = Staged(self.store, join(folder, name + ".npys"))
        self.table = join(folder, name + ".npz")
        self.tmp = partial_path(self.file.path)
        self.fd: int | None = os.open(
            self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666
        )
        self.rows: list[tuple[SpillRow, int]] = []  # (row, offset)
        self.offset = 0

    def reserve(self, rows: list[SpillRow]) -> int:
        """Place the rows' .npy members after those before them, to be written by another process at
        the offset returned (``write_at`` on the file ``tmp``)."""
        start = self.offset
        for row in rows:
            self.rows.append((row, self.offset))
            self.offset += row.npy_length
        return start

    def append(self, rows: list[SpillRow], data: bytes | memoryview) -> None:
        """Write the rows' .npy members, ``data``: theirs one after the other."""
        if len(data) != sum(r.npy_length for r in rows):
            raise ValueError(f"{len(data)} bytes for the spill of {len(rows)} samples")
        if self.fd is None:
            raise ValueError(f"{self.tmp} is closed")
        write_at(self.fd, data, self.reserve(rows))

    def end(self) -> tuple[str, Staged] | None:
        """Close the spill file, unsynced, under its temporary name: (that name, where it goes), for
        ``sync_into_place``; None when it is empty (removed: what an interrupted run spilled for this
        shard is kept)."""
        if not self.rows:
            self.abort()
            return None
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
        return self.tmp, self.file

    def write_table(self) -> None:
        """Write the table of the spill file, once the file is in place; nothing when it was empty."""
        rows = [r for r, _ in self.rows]
        if not rows:
            return
        cols: dict[str, np.ndarray] = {
            "key": np.array([r.key.encode() for r in rows] or [b""], dtype="S")[: len(rows)],
            "fingerprint": np.frombuffer(b"".join(r.fingerprint for r in rows), dtype="u1").reshape(-1, 16),
        }
        values = {
            "width": [r.width for r in rows],
            "height": [r.height for r in rows],
            "src_size": [r.src_nbytes for r in rows],
            "src_mtime_ns": [r.src_mtime_ns for r in rows],
            "npy_offset": [off for _, off in self.rows],
            "npy_length": [r.npy_length for r in rows],
            "npy_xxh3": [r.npy_xxh3 for r in rows],
        }
        for name, column in values.items():  # in this order: the table's bytes
            cols[name] = np.array(column, dtype=SAMPLE_COLUMNS.get(name, "<i8"))  # mtime: <i8
        cols["path_offsets"], cols["path_data"] = pack_strings([r.source_path for r in rows])
        cols["bytes"] = np.array([self.offset], dtype="<u8")
        self.store.write_bytes(self.table, write_npz(cols))

    def abort(self) -> None:
        """Close and remove the unfinished spill file."""
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
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
            pixels = Reuse(
                blob,
                nbytes,
                int(cols["npy_offset"][i]),
                int(cols["npy_length"][i]),
                int(cols["npy_xxh3"][i]),
                int(cols["width"][i]),
                int(cols["height"][i]),
                cols["fingerprint"][i].tobytes(),
                relabeled=False,
                spilled=True,
            )
            out[key.decode()] = Spilled(paths[i], int(cols["src_size"][i]), int(cols["src_mtime_ns"][i]), pixels)
    return out
