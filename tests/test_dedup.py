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
    """Photo ``seed``; copy 0 is the original, 1 its mirror image, 2 turned 180 degrees, 3 recompressed, 4 its
    grey with the opposite colours (Cb and Cr mirrored about 128: no near-duplicate, FORMAT.md, Colour
    agreement), 5 greyscale."""
    im = lesion_photo(384, 384, seed % 3, 900 + seed)  # 6x6 colour cells: detail enough to hash (FORMAT.md)
    if copy == 4:
        y, cb, cr = im.convert("YCbCr").split()
        im = Image.merge("YCbCr", (y, cb.point(lambda v: 255 - v), cr.point(lambda v: 255 - v))).convert("RGB")
    elif copy == 5:
        im = im.convert("L").convert("RGB")
    elif copy == 1:
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
    # v1's splits are kept by default: --dedup cannot join what v1 holds in two splits without moving it
    with pytest.raises(SourceError, match=r"--dedup would move a sample that v1 holds: .* pass --resplit"):
        run(manifest, tmp_path / "out", "v2", False, val_fraction=0.5)
    run(manifest, tmp_path / "out", "v2", False, val_fraction=0.5, resplit=True)
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
    assert any("--dedup: 1 cluster of near-duplicates (within 5 bits) joined 3 samples' groups" in n for n in r.notes)
    assert "--dedup: 1 cluster of" in r.to_text() and "too flat" not in r.to_text()


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
    # the new copy, and p0 (unchanged) again for its colour layout only because the hashes put it in a
    # cluster with the copy (docs/FORMAT.md, Colour agreement); the four others not
    assert len(decoded) == 2
    split = splits_of(out / "v2" / str(S))
    assert split["p0m"] == split["p0"] == splits_of(out / "v1" / str(S))["p0"]


def test_a_copy_that_would_move_a_group_of_the_base_is_refused(tmp_path):
    """The issue: v2 adds one sample, a copy of a val image filed under a train group; the whole val group of
    v1 moved to train with no warning (and v2 had no val split), while the summary said "groups that v1 holds
    keep its split". v1's splits are kept, so the link is refused, naming the copy, both groups and their
    splits; nothing of v2 is written. --resplit draws every split again and puts the cluster in one."""
    from click.testing import CliRunner

    from wds_tools.cli import cli

    v1 = [("a0", 0, 0, "A"), ("a1", 2, 0, "A"), ("b0", 1, 0, "B"), ("c0", 3, 0, "C"), ("d0", 4, 0, "D")]
    split = {"A": "train", "B": "val", "C": "train", "D": "val"}
    root = tmp_path / "a"
    manifest = write(root, v1)
    rows = list(csv.reader(open(manifest)))  # v1's manifest gets a split column: A and C in train, B and D in val
    with open(root / "v1.csv", "w", newline="") as f:
        csv.writer(f).writerows([[*rows[0], "split"]] + [[*r, split[r[3]]] for r in rows[1:]])
    out = tmp_path / "out"
    run(root / "v1.csv", out, "v1", True)
    assert splits_of(out / "v1" / str(S)) == {"a0": "train", "a1": "train", "b0": "val", "c0": "train", "d0": "val"}
    v2 = write(tmp_path / "b", [*v1, ("n1", 1, 1, "A")])  # a mirror image of b0, filed under lesion A (train)
    with pytest.raises(
        SourceError,
        match=r"--dedup would move a group that v1 holds: the near-duplicate cluster of b0, n1 \(within 5 bits\) "
        r"joins units that v1 holds in different splits \(group 'A' in train; group 'B' in val\), and v1's splits "
        r"are kept \(build.split_base\)\. Remove or refile the copy, .* or pass --resplit",
    ):
        run(v2, out, "v2", True)
    assert not (out / "v2").exists()
    r = CliRunner().invoke(
        cli,
        [
            "convert",
            "--source",
            str(v2),
            "--version",
            "v2",
            "--size",
            str(S),
            "--out",
            str(out),
            "--group",
            "lesion",
            "--dedup",
        ],
    )
    assert r.exit_code == 1 and "--dedup would move a group that v1 holds" in r.output and "Traceback" not in r.output
    run(v2, out, "v2", True, resplit=True)
    second = splits_of(out / "v2" / str(S))
    assert second["a0"] == second["a1"] == second["b0"] == second["n1"]


def test_a_copy_under_a_new_group_follows_its_cluster_and_a_copy_within_one_split_is_accepted(tmp_path):
    """No refusal where nothing moves: a copy of a val image under a new lesion goes to val; a copy of a
    train image filed under another train lesion joins the two in train."""
    v1 = [(f"p{c}", c, 0, f"L{c}") for c in range(8)]
    out = tmp_path / "out"
    run(write(tmp_path / "a", v1), out, "v1", True, val_fraction=0.5)
    first = splits_of(out / "v1" / str(S))
    val = next(k for k in sorted(first) if first[k] == "val")
    train = [k for k in sorted(first) if first[k] == "train"]
    assert len(train) >= 2
    seed = {f"p{c}": c for c in range(8)}
    lesion_of_train = f"L{seed[train[1]]}"
    v2 = [*v1, ("n1", seed[val], 1, "NEW"), ("n2", seed[train[0]], 2, lesion_of_train)]
    run(write(tmp_path / "b", v2), out, "v2", True, val_fraction=0.5)
    second = splits_of(out / "v2" / str(S))
    assert {k: second[k] for k in first} == first
    assert second["n1"] == "val" and second["n2"] == "train"


def test_flat_pictures_are_joined_with_none_and_named(tmp_path):
    """Solid frames of different colours and two-colour gradients (their hashes mostly rounding noise)
    clustered and were drawn into one split together; now they join nothing, and the summary names them."""
    from wds_tools.synth import flat_picture

    rows = [("p0", 0, 0, None), ("p0m", 0, 1, None), ("p1", 1, 0, None)]
    manifest = write(tmp_path, rows)
    with open(manifest, "a", newline="") as f:
        w = csv.writer(f)
        for k in range(16):
            buf = io.BytesIO()
            flat_picture("solid" if k < 8 else "ramp", k, side=96).save(buf, "PNG")
            (tmp_path / "img" / f"flat{k:02d}.png").write_bytes(buf.getvalue())
            w.writerow([f"flat{k:02d}", f"img/flat{k:02d}.png", "ab"[k % 2], ""])
    r = run(manifest, tmp_path / "out", "v1", False, val_fraction=0.5)
    notes = "\n".join(r.notes)
    assert "--dedup: 1 cluster of near-duplicates (within 5 bits) joined 2 samples' groups or keys" in notes
    assert (
        "--dedup: 16 samples too flat to hash (flat or smooth pictures, docs/FORMAT.md), searched by their hashes as "
        "they are, which a copy may not share: " in notes
    )
    assert "flat00, flat01, flat02, flat03, flat04, flat05, flat06, flat07, flat08, flat09 and 6 more" in notes
    assert "flat00" in r.to_text() and r.to_dict()["notes"] == r.notes


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("copy", [4, 5])
def test_a_copy_in_other_colours_is_not_joined_but_a_greyscale_copy_is(tmp_path, incremental, copy):
    """Copy 4 has p0's grey and the opposite colours: within the threshold by the hashes, not joined; copy 5,
    p0 in grey, is (a grey picture has no colour to compare; each alone, as a grey copy would join both to one
    cluster). Incremental: p0 is in the base, its hash known, and is decoded again for its colour."""
    from wds_tools.convert.decode import decode_image
    from wds_tools.format.phash import phash_batch
    from wds_tools.similar.near import find_pairs

    i, j, _ = find_pairs(phash_batch([decode_image(image_bytes(0, c), S).pixels for c in (0, copy)]), 5)
    assert (i.tolist(), j.tolist()) == ([0], [1])  # the hashes alone: a pair
    rows = [("p0", 0, 0, None), ("p1", 1, 0, None), ("p2", 2, 0, None), ("p3", 3, 0, None)]
    out = tmp_path / "out"
    if incremental:
        run(write(tmp_path / "a", rows), out, "v1", False, val_fraction=0.5)
    r = run(write(tmp_path / "a", [*rows, ("p0c", 0, copy, None)]), out, "v2", False, val_fraction=0.5)
    joined = [n for n in r.notes if n.startswith("--dedup:") and "cluster" in n]
    want = (
        "0 clusters of near-duplicates (within 5 bits) joined 0"
        if copy == 4
        else "1 cluster of near-duplicates (within 5 bits) joined 2"
    )
    assert len(joined) == 1 and want in joined[0], joined
    if copy == 5:
        split = splits_of(out / "v2" / str(S))
        assert split["p0c"] == split["p0"]


def test_an_unchanged_source_unreadable_for_its_check_is_said(tmp_path, monkeypatch):
    """Incremental: p0's hash comes from the base; reading it again to check it against its recompressed copy fails
    (its size and mtime still match). It has no pixels to be checked on, so it joins nothing (the copy would join
    it: the same run with p0 readable joins the two), and the summary names it rather than passing in silence."""
    import wds_tools.convert.dedup as dedup

    rows = [("p0", 0, 0, None), ("p1", 1, 0, None), ("p2", 2, 0, None), ("p3", 3, 0, None)]
    out = tmp_path / "out"
    run(write(tmp_path / "a", rows), out, "v1", False, val_fraction=0.5)
    real = dedup.open_source

    def failing(path, *a, **k):
        if path.endswith("p0.png"):
            raise PermissionError(13, "Permission denied", path)
        return real(path, *a, **k)

    monkeypatch.setattr(dedup, "open_source", failing)
    r = run(write(tmp_path / "a", [*rows, ("p0c", 0, 3, None)]), out, "v2", False, val_fraction=0.5)
    said = [n for n in r.notes if "could not be read again" in n]
    assert said == [
        "--dedup: 1 unchanged source could not be read again to be checked against its near-duplicate candidates "
        "and was joined with none (docs/FORMAT.md, Near-duplicates): p0"
    ], r.notes
    assert any("0 clusters of near-duplicates (within 5 bits) joined 0" in n for n in r.notes), r.notes
    monkeypatch.setattr(dedup, "open_source", real)
    run(write(tmp_path / "b", rows), tmp_path / "out2", "v1", False, val_fraction=0.5)
    r = run(write(tmp_path / "b", [*rows, ("p0c", 0, 3, None)]), tmp_path / "out2", "v2", False, val_fraction=0.5)
    assert any("1 cluster of near-duplicates (within 5 bits) joined 2" in n for n in r.notes), r.notes
    assert not [n for n in r.notes if "could not be read again" in n]


# smooth lesion photos (synth.skin_lesion_photo("smooth", k, 300, 225)) of different lesions whose hashes at 96 px
# are within 5 bits of the first's (1-4 bits) and whose colours agree: one cluster by the hashes and colour alone
HUB = (4009, 4084, 4128, 4144)


def test_dedup_and_dups_give_the_same_clusters(tmp_path):
    """One rule everywhere: on skin lesion photos made like HAM10000's (synth.skin_lesion_photo), three with their
    edits (a crop to 90%, JPEG quality 30, a 4% shift, brighter) and four of different lesions that the hashes and
    colour alone join, convert --dedup's search of the sources (``near_rows``, from its own decodes) and ``dups`` of
    the converted set (from the stored pixels) give the same clusters: each photo with its edits, no two photos
    together."""
    import numpy as np
    from PIL import ImageEnhance
    from test_dups import _stored_pixels  # read with stock tarfile and numpy

    from wds_tools.convert.decode import DecodeSettings
    from wds_tools.convert.dedup import near_rows
    from wds_tools.format.phash import colour_layout, phash_batch
    from wds_tools.similar.dups import find_dups
    from wds_tools.similar.near import clusters_of, find_pairs
    from wds_tools.synth import skin_lesion_photo

    (tmp_path / "img").mkdir()
    rows = []
    photos = [("smooth", 4000), ("hairs", 4001), ("grey", 4002)] + [("smooth", k) for k in HUB]
    for n, (family, k) in enumerate(photos):
        im = skin_lesion_photo(family, k, 300, 225)
        edits = {"": im}
        if n < 3:
            w, h = im.size
            s = round(0.04 * h)
            shifted = np.pad(np.asarray(im), ((s, 0), (0, 0), (0, 0)), mode="edge")[:h]
            edits |= {
                "crop": im.crop((w // 20, h // 20, w - w // 20, h - h // 20)),
                "q30": Image.open(io.BytesIO(jpeg_bytes(im, 30))).convert("RGB"),
                "shift": Image.fromarray(shifted),
                "bright": ImageEnhance.Brightness(im).enhance(1.12),
            }
        for how, pic in edits.items():
            key = f"p{k}{how}"
            (tmp_path / "img" / f"{key}.jpg").write_bytes(jpeg_bytes(pic, 90))
            rows.append(key)
    with open(tmp_path / "m.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label"])
        w.writerows([key, f"img/{key}.jpg", "ab"[n % 2]] for n, key in enumerate(rows))
    size = 96
    convert(tmp_path / "m.csv", version="v1", size=size, out=tmp_path / "out", workers=1, progress=False)
    folder = tmp_path / "out" / "v1" / str(size)
    every = _stored_pixels(folder)
    stored = np.stack([every[f"p{k}"] for k in HUB])
    i, j, _ = find_pairs(phash_batch(stored), 5, colours=lambda side, r: colour_layout(stored)[r])
    assert clusters_of(len(HUB), i, j) == [list(range(len(HUB)))]  # the hashes and colour alone: one cluster
    by_dups = sorted(sorted(m["key"] for m in c.members) for c in find_dups(folder).clusters)
    found = near_rows(size, "center-crop", DecodeSettings(), 5)([str(tmp_path / "img" / f"{key}.jpg") for key in rows])
    by_dedup = sorted(sorted(rows[x] for x in c) for c in found.clusters)
    want = [sorted(f"p{k}{how}" for how in ("", "crop", "q30", "shift", "bright")) for k in (4000, 4001, 4002)]
    assert by_dups == by_dedup == sorted(want), (by_dups, by_dedup)
