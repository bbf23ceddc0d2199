"""Packed strings: N UTF-8 strings stored as ``offsets`` (uint64 [N + 1]) and ``data`` (uint8).

samples.npz stores the source paths this way (``path_offsets``, ``path_data``) and each string
metadata column its category names (docs/FORMAT.md); the converter's caches reuse it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["pack_strings", "unpack_strings"]


def pack_strings(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 strings -> (offsets uint64 [N+1], data uint8)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype="<u8")
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return offsets, np.frombuffer(b"".join(encoded), dtype="u1")


def unpack_strings(offsets: np.ndarray, data: np.ndarray, *, errors: str = "strict") -> list[str]:
    """(offsets, data) -> the strings (``pack_strings`` reversed); ``offsets[i:j + 1]`` gives rows i..j-1.

    ``data`` is read in place (no copy of the whole array), so one row of a large table is cheap.
    """
    buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    bounds = np.asarray(offsets).tolist()
    return [bytes(buf[a:b]).decode("utf-8", errors) for a, b in zip(bounds[:-1], bounds[1:])]
