"""inspect/page and ``wds-tools report``: the page of a real conversion (JPEGs written here, converted with
metadata, two failed files, a planted near-duplicate across splits, a class and a site missing from val) and of a
version built from it (a sample removed, one relabelled, one changed, one added), checked against facts taken
without the module under test: the tars read with stock ``tarfile``, errors.jsonl with ``json``, the manifests
this file writes. The page is read with ``html.parser`` here, and opened from disk in headless Chromium (Debian's
chromium and chromium-driver, through selenium), whose console must stay silent.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import shutil
import sys
import tarfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from wds_tools.cli import cli
from wds_tools.convert import convert
from wds_tools.errors import ExtraNotInstalledError, OptionError, ReadOnlyOutputError, ShardError
from wds_tools.inspect.page import MAX_PAGE_BYTES, write_report
from wds_tools.inspect.page.facts import share_rule
from wds_tools.inspect.page.thumbs import draw_per_class
from wds_tools.synth import jpeg_bytes, lesion_photo

S = 64
CLASSES = ("benign", "malignant", "nevus")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


# ------------------------------------------------------------------ the corpus and its facts


def _rows() -> list[dict]:
    """57 rows in three classes (every fifth in val), 3 of a class only train has, a near-duplicate pair within
    train with two labels (its keys sort first), one across the splits, two files that fail. Sites: val has no
    scalp; lesion L_shared is in both splits."""
    rows = []
    for i in range(57):
        val = i % 5 == 0
        rows.append(
            {
                "key": f"k{i:02d}",
                "path": f"img/k{i:02d}.jpg",
                "label": CLASSES[i % 3],
                "split": "val" if val else "train",
                "lesion": "L_shared" if i in (1, 5) else f"L{i:03d}",
                "sex": ["male", "female"][i % 2],
                "age": "" if i % 7 == 3 else f"{20 + i}.5",
                "site": ["back", "face"][i % 2] if val else ["back", "face", "scalp"][i % 3],
            }
        )
    for i in range(57, 60):
        rows.append(
            {**rows[i - 50], "key": f"k{i:02d}", "path": f"img/k{i:02d}.jpg", "label": "rare", "split": "train"}
        )
    for key, label, lesion in (("conf_a", "benign", "LC"), ("conf_b", "nevus", "LD")):
        rows.append(
            {**rows[6], "key": key, "path": f"img/{key}.jpg", "label": label, "split": "train", "lesion": lesion}
        )
    rows.append(
        {**rows[6], "key": "dup_a", "path": "img/dup_a.jpg", "label": "benign", "split": "train", "lesion": "LA"}
    )
    rows.append({**rows[6], "key": "dup_b", "path": "img/dup_b.jpg", "label": "benign", "split": "val", "lesion": "LB"})
    rows.append({**rows[6], "key": "bad_missing", "path": "img/missing.jpg", "split": "train", "lesion": "LX"})
    rows.append({**rows[6], "key": "bad_text", "path": "img/bad_text.jpg", "split": "train", "lesion": "LY"})
    return rows


def _write_images(root: Path, rows: list[dict]) -> None:
    (root / "img").mkdir(parents=True, exist_ok=True)
    for n, r in enumerate(rows):
        if r["key"] == "bad_missing":
            continue
        if r["key"] == "bad_text":
            (root / r["path"]).write_text("not an image")
            continue
        if r["key"] == "dup_b":
            im = lesion_photo(320, 240, 0, 900).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        elif r["key"] == "dup_a":
            im = lesion_photo(320, 240, 0, 900)
        elif r["key"] == "conf_a":
            im = lesion_photo(320, 240, 1, 901)
        elif r["key"] == "conf_b":  # conf_a turned, with another label, in the same split
            im = lesion_photo(320, 240, 1, 901).transpose(Image.Transpose.ROTATE_180)
        elif r["key"].startswith("conf_"):  # a copy turned, another label, the same split
            im = lesion_photo(320, 240, 1, 901).transpose(Image.Transpose.ROTATE_180 if r["key"] == "conf_b" else 0)
        else:
            im = lesion_photo(320, 240, n % 3, 500 + n)
        (root / r["path"]).write_bytes(jpeg_bytes(im, 90))


def _manifest(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(v1 folder, v2 folder, v1 rows, v2 rows): v2 is converted with v1 as its base."""
    root = tmp_path_factory.mktemp("report")
    rows = _rows()
    _write_images(root / "c", rows)
    out = root / "shards"
    common = dict(size=S, out=out, shard_size=16, workers=1, progress=False, max_errors="10%")
    convert(_manifest(root / "c" / "v1.csv", rows), version="v1", **common)
    v2 = [dict(r) for r in rows if r["key"] != "k02"]  # removed
    by_key = {r["key"]: r for r in v2}
    by_key["k03"]["label"] = "nevus"  # relabelled (k03 is benign in v1)
    by_key["k04"]["path"] = "img/k04_new.jpg"  # changed: other source bytes
    (root / "c" / "img/k04_new.jpg").write_bytes(jpeg_bytes(lesion_photo(320, 240, 1, 777), 90))
    v2.append({**rows[7], "key": "new1", "path": "img/new1.jpg", "lesion": "LN"})  # added
    (root / "c" / "img/new1.jpg").write_bytes(jpeg_bytes(lesion_photo(320, 240, 2, 778), 90))
    convert(_manifest(root / "c" / "v2.csv", v2), version="v2", base="v1", **common)
    return out / "v1" / str(S), out / "v2" / str(S), rows, v2


def _tar_facts(folder: Path) -> dict:
    """Per sample from the tars (stock tarfile): split, label name, pixels."""
    facts = {}
    for tar in sorted(folder.glob("*.tar")):
        split = tar.name.split("-")[0]
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                key, ext = m.name.split(".", 1)
                data = t.extractfile(m).read()
                f = facts.setdefault(key, {"split": split})
                if ext == "json":
                    f["label"] = json.loads(data)["label"]
                    f["meta"] = json.loads(data)["meta"]
                elif ext == "npy":
                    f["pixels"] = np.load(io.BytesIO(data))
    return facts


# ------------------------------------------------------------------ reading the page


class Page(HTMLParser):
    """What the page holds, read with html.parser: sections, charts, thumbnails by grid, tables by id."""

    VOID = {"img", "meta", "br", "hr", "input", "link", "source", "wbr"}

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict]] = []
        self.sections: list[str] = []
        self.charts: list[str] = []
        self.thumbs: list[dict] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.texts: list[str] = []
        self._cell: list[str] | None = None
        self.html = html
        self.feed(html)

    def _context(self, name: str) -> str | None:
        for _, attrs in reversed(self.stack):
            if name in attrs:
                return attrs[name]
        return None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs.get("id"))
        if tag == "svg" and self._context("data-chart") is not None and self.stack[-1][0] == "figure":
            self.charts.append(self._context("data-chart"))
        if tag == "figure" and "thumb" in attrs.get("class", ""):
            self.thumbs.append(
                {
                    "key": attrs["data-key"],
                    "class": self._context("data-class"),
                    "change": self._context("data-change"),
                    "cluster": self._context("data-cluster"),
                    "section": self.sections[-1] if self.sections else None,
                    "src": None,
                    "title": attrs["title"],
                }
            )
        if tag == "img" and self.thumbs and self.stack and self.stack[-1][0] == "figure":
            self.thumbs[-1]["src"] = attrs["src"]
        if tag == "figcaption" and self.thumbs and self._context("data-key"):
            self._cell = []
        if tag == "tr" and self._context("id") in self.tables:
            self.tables[self._context("id")].append([])
        if tag == "table" and "id" in attrs:
            self.tables[attrs["id"]] = []
        if tag in ("td", "th"):
            self._cell = []
        if tag not in self.VOID:
            self.stack.append((tag, attrs))

    def handle_startendtag(self, tag, attrs):
        if tag == "img":
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        while self.stack:
            t, attrs = self.stack.pop()
            if t == tag:
                break
        if tag in ("td", "th") and self._cell is not None:
            table = self._context("id")
            if table in self.tables and self.tables[table]:
                self.tables[table][-1].append("".join(self._cell).strip())
            self._cell = None
        if tag == "figcaption" and self._cell is not None:
            self.thumbs[-1]["caption"] = "".join(self._cell).strip()
            self._cell = None

    def handle_data(self, data):
        self.texts.append(data)
        if self._cell is not None:
            self._cell.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.texts).split())


def _image(uri: str) -> np.ndarray:
    head, data = uri.split(",", 1)
    assert head == "data:image/jpeg;base64"
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"), np.float64)


@pytest.fixture(scope="module")
def v1_page(corpus, tmp_path_factory):
    v1, _, _, _ = corpus
    dest = tmp_path_factory.mktemp("page") / "v1.html"
    result = write_report(v1, output=dest, workers=2, thumbs_per_class=4)
    return result, dest, Page(dest.read_text(encoding="utf-8"))


# ------------------------------------------------------------------ the page against the facts


def test_sections_counts_and_failed_files_match_the_tars_and_errors_jsonl(corpus, v1_page):
    v1, _, rows, _ = corpus
    result, dest, page = v1_page
    assert page.sections == [
        "summary",
        "conversion",
        "splits",
        "metadata",
        "samples",
        "duplicates",
        "shards",
        "epoch",
        "versions",
    ]
    facts = _tar_facts(v1)
    splits = {s: sum(f["split"] == s for f in facts.values()) for s in ("train", "val")}
    table = {r[0]: r for r in page.tables["splits-table"][1:]}
    assert {s: int(table[s][1].replace(",", "")) for s in splits} == splits == {"train": 51, "val": 13}
    classes = sorted({f["label"] for f in facts.values()})
    per_class = {r[0]: r[1:] for r in page.tables["class-table"][1:]}
    assert sorted(per_class) == classes
    for c in classes:
        want = [sum(f["label"] == c and f["split"] == s for f in facts.values()) for s in ("train", "val")]
        assert [int(x) for x in per_class[c][:2]] == want, c
    per_shard = {}  # split -> samples per shard, from the tars
    for tar in sorted(v1.glob("*.tar")):
        with tarfile.open(tar) as t:
            per_shard.setdefault(tar.name.split("-")[0], []).append(sum(m.name.endswith(".npy") for m in t))
    shards = {r[0]: r for r in page.tables["shards-table"][1:]}
    for s, counts in per_shard.items():
        assert shards[s][1] == str(len(counts))
        median = float(np.median(counts))
        median_text = f"{int(median)}" if median.is_integer() else f"{median:.1f}"
        assert shards[s][2] == f"{min(counts)} / {median_text} / {max(counts)}", (s, counts)
    # the epoch split, index reader, 1 rank x 2 workers: training reads every train sample on rank 0
    assert page.tables["epoch-train"][1][:2] == ["0", str(splits["train"])]
    assert page.tables["epoch-val"][1][:2] == ["0", str(splits["val"])]
    errors = [json.loads(line) for line in (v1 / "errors.jsonl").read_text().splitlines()]
    failed = {r[0]: r for r in page.tables["failed"][1:]}
    assert set(failed) == {e["key"] for e in errors if "error" in e} == {"bad_missing", "bad_text"}
    for e in errors:
        assert failed[e["key"]][1] == e["path"] and failed[e["key"]][4] == e["error"]
    assert result.samples == len(facts) == len(rows) - 2
    assert f"{len(rows) - 2} / 2 of {len(rows)} source rows" in page.text
    assert "center-crop" in page.text and "srgb" in page.text and f"{S} × {S} px" in page.text
    assert dest.stat().st_size == result.bytes <= MAX_PAGE_BYTES


def test_thumbnails_are_the_stored_pixels_of_a_fixed_draw_per_class(corpus, v1_page):
    v1, _, rows, _ = corpus
    result, _, page = v1_page
    facts = _tar_facts(v1)
    grid = [t for t in page.thumbs if t["section"] == "samples"]
    for c in sorted({f["label"] for f in facts.values()}):
        mine = [t for t in grid if t["class"] == c]
        assert len(mine) == min(4, sum(f["label"] == c for f in facts.values())), c
        for t in mine:
            assert facts[t["key"]]["label"] == c
    assert result.thumbnails == len([t for t in page.thumbs if t["src"]])
    meta = {r["key"]: r for r in rows}
    for t in grid:
        stored = facts[t["key"]]["pixels"].astype(np.float64)
        got = _image(t["src"])
        assert got.shape == stored.shape  # 64 px stored: never scaled up
        other = next(f["pixels"] for k, f in facts.items() if k != t["key"]).astype(np.float64)
        assert np.abs(got - stored).mean() < 6 < np.abs(got - other).mean(), t["key"]  # JPEG's loss only
        assert f"split: {facts[t['key']]['split']}" in t["title"] and f"site: {meta[t['key']]['site']}" in t["title"]
    keys = [t["key"] for t in grid]
    assert len(set(keys)) == len(keys)


def test_the_split_rule_warns_of_the_class_and_site_val_lacks_and_the_shared_lesion(v1_page):
    _, _, page = v1_page
    text = page.text
    assert "val: no sample of 1 class (rare)" in text
    assert "column 'site': val: no sample of 1 value (scalp)" in text
    assert "column 'lesion': 1 value found in more than one split (e.g. L_shared)" in text
    assert not re.search(r"column 'sex': \w+: no sample", text)  # both sexes are in both splits


def test_the_planted_cross_split_pair_is_the_first_cluster_with_its_evidence(v1_page):
    _, _, page = v1_page
    first = [t for t in page.thumbs if t["cluster"] == "1"]
    assert sorted(t["key"] for t in first) == ["dup_a", "dup_b"]  # first, though conf_a sorts before dup_a
    assert [t["caption"] for t in sorted(first, key=lambda t: t["key"])] == ["train · benign", "val · benign"]
    second = [t for t in page.thumbs if t["cluster"] == "2"]
    assert sorted(t["caption"] for t in second) == ["train · benign", "train · nevus"]
    clusters = re.findall(r'data-cluster="(\d+)".*?<p><b>Cluster \d+</b> · (\d+) samples (.*?)</p>', page.html, re.S)
    assert [(n, size, "cross-split" in flags, "label conflict" in flags) for n, size, flags in clusters[:2]] == [
        ("1", "2", True, False),
        ("2", "2", False, True),
    ]
    evidence = re.findall(
        r'<table class="facts evidence"><tr><th>size</th><td>2</td></tr><tr><th>max_distance', page.html
    )
    assert len(evidence) == len(clusters) >= 2  # each cluster's fields from its to_dict(), in order
    assert "near-duplicate cluster crosses splits" in page.text
    assert "near-duplicate cluster carries different labels" in page.text


def test_a_clusters_evidence_is_rendered_from_its_to_dict_whatever_fields_it_has(corpus, tmp_path, monkeypatch):
    """The near-duplicate search may add fields to ``Cluster.to_dict()`` (a list of pairs with their distances):
    the page shows each, a list of objects as a table, without a change to the page's code."""
    from wds_tools.similar import dups

    v1, _, _, _ = corpus
    plain = dups.Cluster.to_dict

    def with_pairs(self):
        keys = [m["key"] for m in self.members]
        pairs = [{"a": keys[0], "b": k, "distance": 3, "score": 0.875} for k in keys[1:]]
        return {**plain(self), "pairs": pairs, "method": "phash+colour"}

    monkeypatch.setattr(dups.Cluster, "to_dict", with_pairs)
    write_report(v1, output=tmp_path / "p.html", workers=2, thumbs_per_class=0)
    html = (tmp_path / "p.html").read_text()
    tables = re.findall(r'<table class="evidence" data-evidence="pairs">(.*?)</table>', html, re.S)
    assert len(tables) == 2  # one per cluster
    assert "<th>a</th><th>b</th><th>distance</th><th>score</th>" in tables[0]
    assert "<td>dup_a</td><td>dup_b</td><td>3</td><td>0.875</td>" in tables[0]  # cross-split first
    assert html.count("<tr><th>method</th><td>phash+colour</td></tr>") == 2


def test_charts_one_per_figure_and_metadata_column(v1_page):
    _, _, page = v1_page
    # classes, one per drawn metadata column (sex, age, site; lesion is an identifier), samples and bytes per shard
    assert page.charts == ["classes", "column-1", "column-2", "column-3", "shard-samples", "shard-bytes"]


def test_the_page_needs_no_network_and_is_the_same_bytes_every_run(corpus, v1_page, tmp_path):
    v1, _, _, _ = corpus
    _, dest, _ = v1_page
    html = dest.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)
    assert "<link" not in html and "<script" not in html and "@import" not in html
    ids = re.findall(r'\sid="([^"]+)"', html)  # several charts' SVG inline: every id once in the page
    assert len(ids) > 50 and len(ids) == len(set(ids))
    again = write_report(v1, output=tmp_path / "again.html", workers=2, thumbs_per_class=4)
    assert (tmp_path / "again.html").read_bytes() == dest.read_bytes()
    assert not again.replaced
    other = write_report(v1, output=tmp_path / "again.html", workers=2, thumbs_per_class=4, seed=1)
    assert other.replaced and (tmp_path / "again.html").read_bytes() != dest.read_bytes()


def test_the_version_built_from_v1_shows_its_changes(corpus, tmp_path):
    _, v2, rows, rows2 = corpus
    result = write_report(v2, output=tmp_path / "v2.html", workers=2, thumbs_per_class=1)
    page = Page((tmp_path / "v2.html").read_text(encoding="utf-8"))
    old = {r["key"]: r for r in rows if not r["key"].startswith("bad_")}
    new = {r["key"]: r for r in rows2 if not r["key"].startswith("bad_")}
    shown = {c: sorted(t["key"] for t in page.thumbs if t["change"] == c) for c in ("added", "removed", "relabelled")}
    assert shown["added"] == sorted(set(new) - set(old)) == ["new1"]
    assert shown["removed"] == sorted(set(old) - set(new)) == ["k02"]
    relabelled = [
        k for k in new if k in old and new[k]["label"] != old[k]["label"] and new[k]["path"] == old[k]["path"]
    ]
    assert shown["relabelled"] == relabelled == ["k03"]
    caption = next(t["caption"] for t in page.thumbs if t["change"] == "relabelled")
    assert caption == f"k03 · {old['k03']['label']} → {new['k03']['label']}" == "k03 · benign → nevus"
    changed = [t["key"] for t in page.thumbs if t["change"] == "changed"]
    assert changed == ["k04", "k04"]  # old and new side by side
    assert result.compared_with == str(v2.parent.parent / "v1" / str(S))
    assert "1 added, 1 removed, 1 relabelled, 1 changed" in page.text


def test_thumbnails_past_the_byte_budget_are_named_not_shown(corpus, tmp_path, monkeypatch):
    from wds_tools.inspect.page import thumbs

    v1, _, _, _ = corpus
    full = write_report(v1, output=tmp_path / "full.html", workers=2, thumbs_per_class=4, dups=False)
    every = Page((tmp_path / "full.html").read_text()).thumbs
    assert all(t["src"] for t in every) and len(every) == full.thumbnails
    budget = sum(len(t["src"]) for t in every[:5]) + 1  # the first five fit, then one byte is left
    monkeypatch.setattr(thumbs, "THUMB_BYTES", budget)
    capped = write_report(v1, output=tmp_path / "capped.html", workers=2, thumbs_per_class=4, dups=False)
    page = Page((tmp_path / "capped.html").read_text())
    assert [t["key"] for t in page.thumbs] == [t["key"] for t in every]  # every one still named, in its place
    assert [t["key"] for t in page.thumbs if t["src"]] == [t["key"] for t in every[:5]]
    assert capped.thumbnails == 5 and capped.thumbnails_left_out == len(every) - 5
    assert f"{len(every) - 5} thumbnails over the page's size cap are named, not shown" in page.text


def test_progress_shows_once_the_report_has_run_two_seconds(corpus, tmp_path, monkeypatch, capsys):
    import wds_tools.inspect.page as page_module

    v1, _, _, _ = corpus
    monkeypatch.setattr(page_module, "PROGRESS_AFTER", 1e9)  # as if it ran fast: nothing
    write_report(v1, output=tmp_path / "p.html", workers=2, dups=False, progress=True)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(page_module, "PROGRESS_AFTER", 0.0)  # as if every step came after 2 s
    write_report(v1, output=tmp_path / "p.html", workers=2, dups=False, progress=False)
    assert capsys.readouterr().err == ""
    write_report(v1, output=tmp_path / "p.html", workers=2, dups=False, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines and re.match(r"report: (\d+)/\1 step \(100%\)", lines[-1]), lines  # every step counted, no more


def test_caps_hold_on_a_set_of_many_classes_and_columns_of_free_text(tmp_path):
    """1,200 classes of one sample each, 30 metadata columns (one of 500-character notes): the grid, the class
    table and chart, the columns drawn and each tooltip are capped, and the page says where it cuts."""
    from wds_tools.inspect.page import GRID_LIMIT
    from wds_tools.inspect.page.facts import CLIP, MAX_COLUMNS, MAX_TABLE_ROWS

    n = 1200
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(n):
        (tmp_path / f"img/{i}.jpg").write_bytes(jpeg_bytes(lesion_photo(24, 24, i % 3, i), 90))
        row = {
            "key": f"s{i:04d}",
            "path": f"img/{i}.jpg",
            "label": f"class_{i:04d}",
            "split": "val" if i % 4 else "train",
        }
        row["notes"] = f"note {i} " + "x" * 500
        row.update({f"c{j:02d}": str((i * (j + 1)) % 5) for j in range(29)})
        rows.append(row)
    convert(_manifest(tmp_path / "m.csv", rows), version="v1", size=16, out=tmp_path / "out", workers=1, progress=False)
    result = write_report(tmp_path / "out/v1/16", output=tmp_path / "p.html", workers=2, dups=False)
    page = Page((tmp_path / "p.html").read_text())
    grid = [t for t in page.thumbs if t["section"] == "samples"]
    assert len(grid) == result.thumbnails == GRID_LIMIT  # one per class, the first 480 classes
    assert f"the first {GRID_LIMIT:,} classes shown, {n - GRID_LIMIT:,} left out" in page.text
    assert [t["class"] for t in grid] == [f"class_{i:04d}" for i in range(GRID_LIMIT)]
    assert len(page.tables["class-table"]) == 1 + MAX_TABLE_ROWS
    assert f"{n - MAX_TABLE_ROWS:,} more not" in page.text
    assert page.charts.count("classes") == 1 and len(page.charts) == 1 + MAX_COLUMNS - 1 + 2  # notes: an identifier
    assert f"{30 - MAX_COLUMNS} more columns not drawn: c23, c24, c25, c26, c27, c28" in page.text
    for t in grid:
        notes = next(line for line in t["title"].splitlines() if line.startswith("notes: "))
        assert len(notes) == len("notes: ") + CLIP and notes.endswith("…")
    assert result.bytes <= MAX_PAGE_BYTES


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_golden_folders_of_every_format_version(version, tmp_path):
    """tests/golden's conversions (a HAM-like set with metadata, a Chinese site name): versions 1 and 2 have no
    hashes, so the page does not search near-duplicates unless told; no warning reaches the user (matplotlib's
    font lacks CJK glyphs, which the browser draws)."""
    import warnings

    golden = Path(__file__).parent / "golden" / f"format-v{version}"
    folder = tmp_path / "v"
    folder.mkdir()
    for p in golden.iterdir():
        data = base64.decodebytes(p.read_bytes()) if p.name.endswith(".b64") else p.read_bytes()
        (folder / p.name.removesuffix(".b64")).write_bytes(data)
    keys = set()
    for tar in folder.glob("*.tar"):
        with tarfile.open(tar) as t:
            keys |= {m.name.split(".")[0] for m in t}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = write_report(folder, output=tmp_path / "p.html", workers=2)
    page = Page((tmp_path / "p.html").read_text())
    assert sorted(t["key"] for t in page.thumbs if t["section"] == "samples") == sorted(keys)  # few: every one
    if version < 3:
        assert result.duplicates.startswith(f"not searched: this index (format version {version}) holds no perceptual")
        assert write_report(folder, output=tmp_path / "p.html", workers=2, dups=True).duplicates == "searched"
    else:
        assert result.duplicates == "searched"


# ------------------------------------------------------------------ the rule and the draw, worked by hand


def test_share_rule_by_hand():
    # 100 samples: train 80, val 20 (f = 0.2, tolerance 0.1)
    counts = np.array([[40, 10], [30, 0], [9, 1], [1, 9], [0, 0]])  # a fine, b missing, c low share, d high, e absent
    got = share_rule(["a", "b", "c", "d", "e"], counts, ["train", "val"], "class", every_missing=True)
    assert got == [
        "train: the share of 1 class found in train is outside 80.0% ± 40.0% (the split's share of all samples): d 10.0%",
        "val: no sample of 1 class (b) although val holds 20.0% of the samples",
        "val: the share of 1 class found in val is outside 20.0% ± 10.0% (the split's share of all samples): d 90.0%",
    ]
    # c: 10 samples, 1 in val (10%, inside 20% ± 10%); a value with n * f < 2 missing is not warned unless every_missing
    rare = np.array([[5, 0], [75, 20]])
    assert share_rule(["x", "y"], rare, ["train", "val"], "value", every_missing=False) == []
    assert share_rule(["x", "y"], rare, ["train", "val"], "class", every_missing=True) == [
        "val: no sample of 1 class (x) although val holds 20.0% of the samples"
    ]
    two = np.array([[4, 0], [4, 0], [0, 2]])  # "classes", not "classs"
    assert share_rule(["a", "b", "c"], two, ["train", "val"], "class", every_missing=True)[1] == (
        "val: no sample of 2 classes (a, b) although val holds 20.0% of the samples"
    )


def test_draw_per_class_is_fixed_by_the_seed():
    labels = np.repeat(np.arange(4), [10, 3, 0, 7])
    a = draw_per_class(labels, 4, 5, seed=0)
    assert [len(x) for x in a] == [5, 3, 0, 5]
    assert all((labels[x] == c).all() for c, x in enumerate(a))
    assert all(np.array_equal(x, y) for x, y in zip(a, draw_per_class(labels, 4, 5, seed=0)))
    assert not all(np.array_equal(x, y) for x, y in zip(a, draw_per_class(labels, 4, 5, seed=1)))
    order = np.random.default_rng(0).permutation(len(labels))
    assert a[0].tolist() == [r for r in order.tolist() if labels[r] == 0][:5]  # the first of the drawn order


# ------------------------------------------------------------------ the command


def test_cli_writes_the_default_name_and_says_so(corpus, tmp_path, monkeypatch):
    v1, _, _, _ = corpus
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli, ["report", str(v1), "--loader-workers", "2", "--no-dups", "--thumbs", "1"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / f"report-v1-{S}.html").is_file()
    assert f"written: report-v1-{S}.html" in res.output and "near-duplicates: not searched (--no-dups)" in res.output
    res = runner.invoke(cli, ["report", str(v1), "--loader-workers", "2", "--json", "-q", "-o", "p.html"])
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and data["path"] == "p.html" and data["duplicates"] == "searched"
    assert data["bytes"] == (tmp_path / "p.html").stat().st_size and data["replaced"] is False
    res = runner.invoke(cli, ["report", str(v1), "--json", "-q", "-o", "p.html", "--no-dups"])
    assert json.loads(res.stdout)["replaced"] is True


def test_errors_name_the_path(corpus, tmp_path, monkeypatch):
    v1, _, _, _ = corpus
    runner = CliRunner()
    res = runner.invoke(cli, ["report", str(v1), "-o", str(tmp_path / "no" / "such" / "dir" / "p.html")])
    assert res.exit_code == 1 and "p.html: cannot write the report there" in res.output
    with pytest.raises(ReadOnlyOutputError, match="p.html: cannot write the report there"):
        write_report(v1, output=tmp_path / "no" / "p.html", dups=False)
    with pytest.raises(OptionError, match="a report is of a whole converted folder"):
        write_report(str(v1 / "train-{000000..000001}.tar"), output=tmp_path / "p.html")
    with pytest.raises(OptionError, match="thumbs_per_class -1"):
        write_report(v1, output=tmp_path / "p.html", thumbs_per_class=-1)
    cut = tmp_path / "cut"
    shutil.copytree(v1, cut)
    (cut / "train-000000.tar").unlink()
    with pytest.raises(ShardError, match="train-000000.tar"):
        write_report(cut, output=tmp_path / "p.html", dups=False)
    assert not (tmp_path / "p.html").exists()  # nothing written when it fails


def test_a_missing_extra_is_named(corpus, tmp_path, monkeypatch):
    v1, _, _, _ = corpus
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 raises ImportError
    with pytest.raises(ExtraNotInstalledError, match=r"the 'report' extra.*pip install -e '\.\[report\]'"):
        write_report(v1, output=tmp_path / "p.html")
    res = CliRunner().invoke(cli, ["report", str(v1), "-o", str(tmp_path / "p.html")])
    assert res.exit_code != 0 and "install the report extra" in res.output
    assert not (tmp_path / "p.html").exists()


# ------------------------------------------------------------------ in a real browser


def _browser():
    """A headless Chromium under selenium, or a skip saying why (a failure under CI, which must run it)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (the test extra)")
    if missing:
        why = f"no {', '.join(missing)}: apt-get install -y chromium chromium-driver (as .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must open the report in a browser; {why}")
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def test_without_chromium_the_browser_test_skips_saying_why_and_fails_under_ci(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(
        pytest.skip.Exception, match="no /nonexistent/chromium: apt-get install -y chromium chromium-dr"
    ):
        _browser()
    monkeypatch.setenv("CI", "true")  # as .ci/run runs
    try:
        _browser()
    except pytest.skip.Exception:  # (not an outcome of this test: a skip here would hide the rule it checks)
        raise AssertionError("under CI=true a missing browser skipped the test instead of failing it") from None
    except pytest.fail.Exception as e:
        assert str(e).startswith("CI must open the report in a browser; no /nonexistent/chromium")
    else:
        raise AssertionError("no browser, and yet it started one")


def test_the_page_opens_from_disk_in_chromium_without_a_console_error(corpus, v1_page):
    result, dest, page = v1_page
    driver = _browser()
    try:
        driver.get(dest.resolve().as_uri())
        log = driver.get_log("browser")
        js = driver.execute_script
        assert js("return document.readyState") == "complete"
        assert js("return [...document.querySelectorAll('section')].map(s => s.id)") == page.sections
        charts = js("return [...document.querySelectorAll('figure.chart')].map(f => [f.dataset.chart, "
                    "f.querySelector('svg').getBoundingClientRect().height])")  # fmt: skip
        assert [c[0] for c in charts] == page.charts and all(h > 100 for _, h in charts), charts
        loaded = js(
            "return [...document.querySelectorAll('figure.thumb img')].filter(i => i.complete && i.naturalWidth > 0).length"
        )
        assert loaded == result.thumbnails == len([t for t in page.thumbs if t["src"]]) > 0
        grid = js("return Object.fromEntries([...document.querySelectorAll('#samples .grid')].map("
                  "g => [g.dataset.class, g.querySelectorAll('img').length]))")  # fmt: skip
        assert grid == {"benign": 4, "malignant": 4, "nevus": 4, "rare": 3}
        # a broken data URI or a bad chart would log here; so would an uncaught error
        assert [e for e in log if e["level"] in ("SEVERE", "WARNING")] == []
    finally:
        driver.quit()
