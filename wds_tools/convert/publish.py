"""Finish one size's folder in an order a kill at any point leaves resumable: the --max-errors gate
while its shards are written (``ErrorGate``), then errors.jsonl and the index (built by indexwrite.py),
then the clean-up (``clean_after_index``); docs/guide/converter-internals.md, "Finishing a folder".
"""

from __future__ import annotations

import re

from ..errors import TooManyErrorsError, WdsToolsError
from ..format.index import INDEX_FILE, WORK_DIR, read_sample_table
from ..format.model import IndexMeta
from ..storage.objects import Store
from . import sourcecache as hashes
from .indexwrite import assemble_index, source_stats, write_errors
from .outfolder import Target, read_meta
from .source import Source
from .summary import count

__all__ = ["ErrorGate", "finish_size", "clean_after_index", "clean_complete_folder", "needs_cleaning"]

_TEMPORARY = re.compile(r"(\.partial-\d+$)|(\.tmp-\d+$)")  # ShardWriter and atomic_write_bytes names


class ErrorGate:
    """Stops a size's conversion as soon as its failures pass --max-errors (no index is written)."""

    def __init__(self, t: Target, src: Source, scan_failures: list[dict]) -> None:
        self.t, self.total, self.scan = t, len(src.rows), list(scan_failures)
        self.folder = src.kind == "image-folder"

    def failures(self) -> list[dict]:
        """The scan's failures, then those of each finished shard in plan order."""
        out = list(self.scan)
        for task in self.t.tasks:
            meta = self.t.metas.get(task.name)
            if meta is not None:
                out += meta["failed"]
        return out

    def check(self) -> None:
        """Raise ``TooManyErrorsError`` (after writing errors.jsonl) when past the limit."""
        allowed = self.t.result.max_errors_allowed
        failures = self.failures()
        if len(failures) <= allowed:
            return
        store, t = self.t.store, self.t
        errors = write_errors(store, failures, folder=self.folder)
        done = sum(1 for task in t.tasks if task.name in t.metas)
        decode = len(failures) - len(self.scan)
        first = min(failures, key=lambda e: (e["line"], e["key"]))
        raise TooManyErrorsError(
            f"{len(failures)} of {count(self.total, 'source file')} failed ({len(self.scan)} unreadable at the scan, "
            f"{decode} at decoding so far), more than --max-errors allows ({allowed}). Stopped with {done} of "
            f"{count(len(t.tasks), 'shard')} of {store.root} written and no {INDEX_FILE}; the files and reasons are in "
            f"{errors}. First: {first['path']}: {first['error']}. Repair those files and run the same command "
            "again (the shards holding them are made again), or accept them with a higher --max-errors: the "
            "shards written are kept, and only the rest is decoded."
        )


def finish_size(t: Target, src: Source, failures: list[dict], *, out: str, version: str, provenance: dict) -> IndexMeta:
    """Write errors.jsonl and the index (the folder is then complete), then clean up; returns the index.

    ``provenance``: {"version": wds-tools version, "decoder_versions": {...}}, recorded as given.
    """
    store = t.store
    t.result.errors_file = write_errors(store, failures, folder=src.kind == "image-folder")  # before the index
    info = assemble_index(
        store, t.work, t.tasks, t.metas, t.spec, src, t.base, t.result.errors_file is not None, provenance
    )
    if not store.remote:  # the quick check's mtimes, outside the format (hashes.py); from the work columns
        hashes.save_stats(out, version, source_stats(store, t.work, t.tasks, src))
    clean_after_index(store, src, info, out=out, version=version)
    return info


def needs_cleaning(store: Store) -> bool:
    """A complete folder that an interrupted run left unclean (work folder or temporary files)."""
    return store.exists(store.join(INDEX_FILE)) and any(
        name == WORK_DIR or _TEMPORARY.search(name) for name in store.names(store.root)
    )


def clean_after_index(store: Store, src: Source | None, info: IndexMeta, *, out: str, version: str) -> None:
    """After index.json (``info``): record manifest-hash pairs (when ``src`` is the folder's source), remove
    leftovers, then the work folder (last: its presence tells a later run that this step did not
    finish)."""
    if src is not None and not store.remote and any(r.content_hash for r in src.rows):
        _save_hash_pairs(out, version, src, store, info)
    planned = {s.name for s in info.shards}
    for name in store.names(store.root):  # leftovers of interrupted runs, and shards of an older plan
        if (name.endswith(".tar") and name not in planned) or _TEMPORARY.search(name):
            store.remove(store.join(name))
    store.rmtree(store.join(WORK_DIR))


def clean_complete_folder(store: Store) -> bool:
    """Any run that finds a complete folder unclean (killed after its index.json) removes the leftovers,
    whatever its own options; returns whether it had to. The hash pairs need the source: see
    ``clean_after_index``, which the run with the folder's own options calls."""
    if not needs_cleaning(store):
        return False
    try:
        info = read_meta(store)
    except (WdsToolsError, OSError):  # not an index to act on: touch nothing
        return False
    clean_after_index(store, None, info, out="", version="")
    return True


def _save_hash_pairs(out: str, version: str, src: Source, store: Store, info: IndexMeta) -> None:
    """Record (manifest hash, fingerprint) of every written sample whose row has a hash (hashes.py)."""
    cols = read_sample_table(store.root, info, ["key", "fingerprint"])
    fp_of = {k.decode(): cols["fingerprint"][i].tobytes() for i, k in enumerate(cols["key"])}
    hashes.save_pairs(
        out, version, {r.content_hash: fp_of[r.key] for r in src.rows if r.content_hash is not None and r.key in fp_of}
    )
