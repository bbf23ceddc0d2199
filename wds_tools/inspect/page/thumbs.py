"""Thumbnails for the page: which samples (a fixed-seed draw per class), their stored pixels read from
the shards by offset (``similar.dups.stored_pixels``: only the samples shown are read), scaled and
encoded as JPEG data URIs, within a byte budget so that the page stays small whatever the dataset.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ...cpus import usable_cpus
from ...similar.dups import stored_pixels

__all__ = [
    "THUMB_PX",
    "THUMB_BYTES",
    "Thumb",
    "Budget",
    "Pixels",
    "read_places",
    "draw_per_class",
    "encode",
    "thumbs_of",
]

THUMB_PX = 112
"""Side of a thumbnail in pixels (a stored image scaled down, never up)."""
THUMB_BYTES = 6_000_000
"""Bytes of data URIs the page holds at most: thumbnails past it are named, not shown (the page stays
under ``page.MAX_PAGE_BYTES`` with its charts and tables)."""
_QUALITY = 80  # JPEG quality of a thumbnail: a data URI of 2-3.4 KB for the demo's pictures, 6 KB for noise


@dataclass
class Thumb:
    """One sample as the page shows it: its key, a data URI (None: over the budget), its hover text."""

    key: str
    src: str | None
    title: str
    caption: str = ""


@dataclass
class Budget:
    """The data URI bytes left; counts what it refused."""

    left: int = field(default_factory=lambda: THUMB_BYTES)
    shown: int = 0
    refused: int = 0

    def take(self, uri: str) -> str | None:
        """``uri`` if it fits, else None (and it is counted as refused)."""
        if len(uri) > self.left:
            self.refused += 1
            return None
        self.left -= len(uri)
        self.shown += 1
        return uri


@dataclass
class Pixels:
    """Where one converted folder's samples' pixels are: shard URL per shard position, each sample's
    shard and ``.npy`` offset, and the image side."""

    shard_urls: list[str]
    shard: np.ndarray  # per row
    npy_offset: np.ndarray  # per row
    side: int
    keys: np.ndarray  # |S per row

    def key(self, row: int) -> str:
        """Row ``row``'s key."""
        return self.keys[row].decode("ascii")

    def read(self, rows: Sequence[int], why: str) -> dict[int, np.ndarray]:
        """The stored pixels of ``rows`` (row -> [side, side, 3] uint8), read by offset."""
        rows = list(dict.fromkeys(int(r) for r in rows))
        places = [(self.shard_urls[int(self.shard[r])], int(self.npy_offset[r]), self.key(r)) for r in rows]
        return dict(zip(rows, read_places(places, self.side, why)))


def read_places(places: Sequence[tuple[str, int, str]], side: int, why: str) -> list[np.ndarray]:
    """The stored pixels of samples given as (shard URL, ``.npy`` offset, key), in order: read by offset
    (``similar.dups.stored_pixels``, which names a missing or cut shard), a shard per thread."""
    by_url: dict[str, list[int]] = {}
    for i, (url, _, _) in enumerate(places):
        by_url.setdefault(url, []).append(i)

    def one(item: tuple[str, list[int]]) -> list[tuple[int, np.ndarray]]:
        url, idx = item
        idx = sorted(idx, key=lambda i: places[i][1])  # forward reads
        got = stored_pixels(url, [places[i][1] for i in idx], [places[i][2] for i in idx], side, why)
        return list(zip(idx, got))

    out: list[np.ndarray | None] = [None] * len(places)
    if by_url:
        with ThreadPoolExecutor(max_workers=min(8, 2 * usable_cpus(), len(by_url))) as ex:
            for pairs in ex.map(one, sorted(by_url.items())):
                for i, px in pairs:
                    out[i] = px
    return [px for px in out if px is not None]


def draw_per_class(labels: np.ndarray, n_classes: int, per_class: int, seed: int) -> list[np.ndarray]:
    """Per class, up to ``per_class`` rows: the first of a ``seed``-fixed random order of all rows
    (``numpy.random.default_rng(seed).permutation``), in that order. The same index and seed give the
    same rows."""
    n = len(labels)
    order = np.random.default_rng(seed).permutation(n)
    ranked = order[np.argsort(labels[order], kind="stable")]  # by class, each class in the drawn order
    starts = np.searchsorted(labels[ranked], np.arange(n_classes + 1))
    return [ranked[starts[c] : min(starts[c] + per_class, starts[c + 1])] for c in range(n_classes)]


def encode(pixels: np.ndarray) -> str:
    """A JPEG data URI of ``pixels`` scaled to ``THUMB_PX`` (never up)."""
    from PIL import Image

    im = Image.fromarray(pixels)
    if im.width > THUMB_PX:
        im = im.resize((THUMB_PX, THUMB_PX), Image.Resampling.BILINEAR, reducing_gap=2.0)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=_QUALITY, optimize=True)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def thumbs_of(
    keys: Sequence[str],
    images: Sequence[np.ndarray],
    titles: Sequence[str],
    budget: Budget,
    captions: Sequence[str] = (),
) -> list[Thumb]:
    """Thumbnails of these images, in order, as far as ``budget`` lasts (the rest keep their key and title)."""
    return [
        Thumb(k, budget.take(encode(px)), titles[i], captions[i] if i < len(captions) else "")
        for i, (k, px) in enumerate(zip(keys, images, strict=True))
    ]
