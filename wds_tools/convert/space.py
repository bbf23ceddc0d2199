"""Disk space: what a conversion still needs, estimated from its plan, and the message when the disk
is full (the writers have removed their partial file by then; finished shards stay for a rerun)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

from ..errors import DiskFullError
from ..format.index import INDEX_FILE
from .outfolder import Target
from .plan import sample_bytes

__all__ = ["DISK_FULL_ERRNOS", "bytes_needed", "disk_full_error", "human_bytes"]

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errnos of a full disk or quota."""
_INDEX_PER_SAMPLE = 200  # samples.npz columns (~110 B), a DALI .idx line (~60 B), a path: measured ~170 B


def _pending(t: Target, n_rows: int) -> int:
    """Samples of ``t`` not yet in a finished shard (every row while it is not planned yet)."""
    if not t.tasks:
        return n_rows
    return sum(len(task.samples) for task in t.tasks if task.name not in t.metas)


def bytes_needed(todo: list[Target], n_rows: int) -> dict[str, int]:
    """Bytes each unfinished folder of ``todo`` still needs: its pending shards, its index, and (for
    the other sizes of a multi-size run, while the largest is written) their spilled pixels."""
    out: dict[str, int] = {}
    for i, t in enumerate(todo):
        if t.store.exists(t.store.join(INDEX_FILE)):
            continue
        n = _pending(t, n_rows)
        need = n * (sample_bytes(t.side) + _INDEX_PER_SAMPLE)
        if i > 0 and not todo[0].store.exists(todo[0].store.join(INDEX_FILE)):
            need += _pending(todo[0], n_rows) * (128 + 3 * t.side * t.side)  # its spill, written beside
        out[t.store.root] = need
    return out


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units, e.g. 1.5 GB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def disk_full_error(todo: list[Target], e: OSError, n_rows: int) -> DiskFullError:
    """One line: the folder, the space still needed (from the plan) and what is free, what to do."""
    needs = bytes_needed(todo, n_rows)
    current = next((t for t in todo if t.store.root in needs), todo[0])
    total = sum(needs.values())
    if current.store.remote:  # shards are staged locally before their upload
        where = tempfile.gettempdir()
        need = (
            f"room for one shard ({human_bytes(max(1, total // max(1, len(current.tasks))))} on average, "
            "estimated from its plan)"
        )
        what = f"the local staging folder {where} (shards for {current.store.root} are written there first)"
    else:
        where = current.store.root
        need = f"about {human_bytes(total)} more, estimated from its plan"
        if len(needs) > 1:
            need += " (" + ", ".join(f"{human_bytes(v)} for {k}" for k, v in needs.items()) + ")"
        what = where
    try:
        free = f"; {human_bytes(shutil.disk_usage(where).free)} free"
    except OSError:
        free = ""
    reason = os.strerror(e.errno) if e.errno else str(e)
    return DiskFullError(
        f"{reason} writing {what}: the conversion needs {need}{free}. The partial "
        "file was removed and finished shards are kept: free space (or use another --out) and run the same "
        "command again to resume."
    )
