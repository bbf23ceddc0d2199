"""Shared fixtures: small real corpora written as real JPEG files."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from wds_tools.synth import jpeg_bytes, photo_like


def write_manifest(path: Path, rows: list[dict], fields=("key", "path", "label", "split")) -> Path:
    fields = [f for f in fields if any(f in r for r in rows)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def make_images(root: Path, n: int, *, classes=("a", "b", "c"), size=(96, 72), seed=0) -> list[dict]:
    """n small photo-like JPEGs under root/img/; returns manifest rows (no split column)."""
    rows = []
    (root / "img").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        rel = f"img/s{i:04d}.jpg"
        (root / rel).write_bytes(jpeg_bytes(photo_like(*size, seed=seed * 7919 + i), quality=90))
        rows.append({"key": f"s{i:04d}", "path": rel, "label": classes[i % len(classes)]})
    return rows


def convert_images(root: Path, n: int, *, size: int, shard_size: int, val_every: int | None = None,
                   **convert_options) -> Path:
    """n photo-like JPEGs under root/c converted (one worker) into root/out/v1/<size>, which is returned.

    ``val_every``: every so many rows go to val (from row 0); otherwise ``convert_options`` may set
    ``val_fraction``.
    """
    from wds_tools.convert import convert

    rows = make_images(root / "c", n)
    if val_every:
        for i, r in enumerate(rows):
            r["split"] = "val" if i % val_every == 0 else "train"
    convert(write_manifest(root / "c" / "m.csv", rows), version="v1", size=size, out=root / "out",
            shard_size=shard_size, workers=1, progress=False, **convert_options)
    return root / "out" / "v1" / str(size)


@pytest.fixture
def interrupt_writes(monkeypatch):
    """interrupt_writes(n): in-process conversions write n shards, then get a KeyboardInterrupt.

    Returns the list the written shard names are appended to; call ``.restore()`` on it
    (or let the fixture end) to write normally again.
    """
    import wds_tools.write as write_mod

    real = write_mod.write_shard

    class Written(list):
        def restore(self) -> None:
            monkeypatch.setattr(write_mod, "write_shard", real)

    def arm(n: int) -> Written:
        written = Written()

        def flaky(task):
            if len(written) == n:
                raise KeyboardInterrupt
            written.append(task.name)
            return real(task)

        monkeypatch.setattr(write_mod, "write_shard", flaky)
        return written

    return arm


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A manifest of 40 good JPEGs in 3 classes, splits from the key hash."""
    root = tmp_path / "corpus"
    rows = make_images(root, 40)
    return write_manifest(root / "manifest.csv", rows)
