"""``convert --dedup``: every cluster of near-duplicate images (known by construction: copies made with
PIL) lands in one split, joined with the groups it touches; an incremental version keeps the splits
and puts new copies with their cluster."""

from __future__ import annotations

import csv
import functools
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from wds_tools.convert import convert
from wds_tools.errors import SourceError
from wds_tools.format.index import load_index
from wds_tools.synth import jpeg_bytes, lesion_photo

S = 32


@functools.cache
def image_bytes(seed: int, copy: int) -> bytes:
    """Photo ``seed``; copy 0 is the original, 1 its mirror image, 2 turned 180 degrees, 3 recompressed."""
    im = lesion_photo(96, 96, seed % 3, 900 + seed)
    if copy == 1:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    elif copy == 2:
        im = im.transpose(Image.Transpose.ROTATE_180)
    elif copy == 3:
        im = Image.open(io.BytesIO(jpeg_bytes(im, 80))).convert("RGB")
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def write(root: Path, rows: list[tuple[str, int, int, str | None]], name: str = "m.csv") -> Path:
    """rows: (key, photo seed, copy, lesion or None); the manifest has a lesion column when any row has one."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    with open(root / name, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label", "lesion"])
        for key, seed, copy, lesion in rows:
            dest = root / "img" / f"{key}.png"
            if not dest.exists() or dest.read_bytes() != image_bytes(seed, copy):  # keep an unchanged file's mtime
                dest.write_bytes(image_bytes(seed, copy))
            w.writerow([key, f"img/{key}.png", ["a", "b"][seed % 2], lesion or ""])
    return root / name


def splits_of(folder: Path) -> dict[str, str]:
    idx = load_index(folder)
    return {k: idx.shards[int(s)]["split"] for k, s in zip(idx.samples.keys, idx.samples["shard"].tolist())}


def run(manifest: Path, out: Path, version: str, group: bool, **kw):
    return convert(
        manifest,
        version=version,
        size=S,
        out=out,
        workers=1,
        progress=False,
        dedup=True,
        group="lesion" if group else None,
        shard_size=8,
        **kw,
    )


@st.composite
def structures(draw):
    """Clusters of copies of distinct photos (1-3 members each), and per member a lesion (or none)."""
    sizes = draw(st.lists(st.integers(1, 3), min_size=3, max_size=9))
    rows = []
    for c, n in enumerate(sizes):
        for m in range(n):
            lesion = draw(st.one_of(st.none(), st.sampled_from(["L1", "L2", "L3", "L4", "L5"])))
            rows.append((f"p{c}c{m}", c, m, lesion))
    return rows


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(structures(), st.booleans(), st.sampled_from([0.3, 0.5]))
def test_every_cluster_and_group_lands_in_one_split(tmp_path_factory, rows, group, frac):
    root = tmp_path_factory.mktemp("dedup")
    r = run(write(root, rows), root / "out", "v1", group, val_fraction=frac)
    split = splits_of(root / "out" / "v1" / str(S))
    assert len(split) == len(rows) == r.samples_written
    for c in {seed for _, seed, _, _ in rows}:
        assert len({split[k] for k, s, _, _ in rows if s == c}) == 1, (c, split)
    if group:
        for lesion in {les for *_, les in rows if les}:
            assert len({split[k] for k, _, _, les in rows if les == lesion}) == 1, (lesion, split)
    meta = load_index(root / "out" / "v1" / str(S)).meta
    assert meta["build"]["dedup"] == 5 and meta["build"]["split_base"] is None


def test_without_dedup_copies_are_drawn_apart(tmp_path):
    """The control: the same corpus without --dedup splits some cluster (so the test above can fail)."""
    rows = [(f"p{c}c{m}", c, m, None) for c in range(12) for m in range(3)]
    manifest = write(tmp_path, rows)
    convert(manifest, version="v1", size=S, out=tmp_path / "out", workers=1, progress=False, val_fraction=0.5)
    split = splits_of(tmp_path / "out" / "v1" / str(S))
    assert any(len({split[f"p{c}c{m}"] for m in range(3)}) > 1 for c in range(12))
    run(manifest, tmp_path / "out", "v2", False, val_fraction=0.5)
    split = splits_of(tmp_path / "out" / "v2" / str(S))
    assert all(len({split[f"p{c}c{m}"] for m in range(3)}) == 1 for c in range(12))


@pytest.mark.parametrize("group", [False, True])
def test_an_incremental_version_keeps_splits_and_puts_new_copies_with_their_cluster(tmp_path, group):
    v1 = [(f"p{c}", c, 0, f"L{c}" if group else None) for c in range(10)]
    out = tmp_path / "out"
    run(write(tmp_path / "a", v1), out, "v1", group, val_fraction=0.5)
    first = splits_of(out / "v1" / str(S))
    assert set(first.values()) == {"train", "val"}
    # v2: every v1 row, plus a mirrored and a turned copy of each photo under new keys (and new lesion ids)
    v2 = v1 + [(f"p{c}m{m}", c, m, f"N{c}{m}" if group else None) for c in range(10) for m in (1, 2)]
    run(write(tmp_path / "b", v2), out, "v2", group, val_fraction=0.5)
    second = splits_of(out / "v2" / str(S))
    assert {k: second[k] for k in first} == first
    for c in range(10):
        assert second[f"p{c}m1"] == second[f"p{c}m2"] == first[f"p{c}"]
    assert load_index(out / "v2" / str(S)).meta["build"]["split_base"] == "v1"


def test_a_split_column_that_splits_a_cluster_is_refused(tmp_path):
    (tmp_path / "img").mkdir()
    with open(tmp_path / "m.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label", "split"])
        for key, copy, split in (("x0", 0, "train"), ("x1", 1, "val")):
            (tmp_path / "img" / f"{key}.png").write_bytes(image_bytes(7, copy))
            w.writerow([key, f"img/{key}.png", "a", split])
    with pytest.raises(SourceError, match=r"near-duplicate cluster of 'x0' \(--dedup\) is in 2 splits"):
        run(tmp_path / "m.csv", tmp_path / "out", "v1", False)


def test_the_summary_says_what_dedup_joined(tmp_path):
    rows = [("p0", 0, 0, None), ("p0m", 0, 1, None), ("p0t", 0, 2, None), ("p1", 1, 0, None), ("p2", 2, 0, None)]
    r = run(write(tmp_path, rows), tmp_path / "out", "v1", False)
    assert any("--dedup: 1 clusters of near-duplicates (within 5 bits) joined 3 samples" in n for n in r.notes)
    assert "--dedup: 1 clusters" in r.to_text()


def test_an_incremental_dedup_decodes_only_new_or_changed_sources(tmp_path, monkeypatch):
    import wds_tools.convert.dedup as dedup

    decoded = []
    real = dedup.decode_image
    monkeypatch.setattr(dedup, "decode_image", lambda data, *a, **k: decoded.append(1) or real(data, *a, **k))
    rows = [(f"p{c}", c, 0, None) for c in range(6)]
    out = tmp_path / "out"
    run(write(tmp_path / "a", rows), out, "v1", False, val_fraction=0.5)
    assert len(decoded) == 6
    decoded.clear()
    manifest = write(tmp_path / "a", rows + [("p0m", 0, 1, None)])  # one new copy; the others untouched
    run(manifest, out, "v2", False, val_fraction=0.5)
    assert len(decoded) == 1
    split = splits_of(out / "v2" / str(S))
    assert split["p0m"] == split["p0"] == splits_of(out / "v1" / str(S))["p0"]
