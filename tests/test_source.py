import json

import pytest
from conftest import make_images, write_ham, write_isic, write_manifest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.convert import source
from wds_tools.convert.manifest import Columns
from wds_tools.convert.options import ConvertOptions
from wds_tools.convert.outfolder import spec
from wds_tools.convert.source import sanitize_keys
from wds_tools.convert.splitbase import SplitBase
from wds_tools.errors import InvalidKeyError, OptionError, SourceError

PLAIN = Columns()


def options(columns: Columns = PLAIN, **kw) -> ConvertOptions:
    """A conversion's options with these column options (``Columns``) and keywords, as ``convert`` makes them."""
    named = {"key": columns.key, "label": columns.label, "path": columns.path, "split": columns.split}
    return ConvertOptions(version="v1", size=8, group=columns.group, **named, **kw)


def read(path, columns: Columns = PLAIN, split_base=None, **kw) -> source.Source:
    """``source.read_source`` with ``options(columns, **kw)``."""
    return source.read_source(path, options(columns, **kw), split_base=split_base)


def build_fields(src: source.Source, columns: Columns = PLAIN, **kw) -> dict:
    """index.json ``build``'s fields of the column and split options (outfolder.spec), as ``src`` was read."""
    built = spec(src, options(columns, **kw), 8)["build"]
    return {
        k: v for k, v in built.items() if k not in ("shard_size", "seed", "val_fraction", "sanitize_keys", "source")
    }


HAM = Columns(key="image_id", label="dx", path="images/{image_id}.jpg", group="lesion_id")
ISIC = Columns(key="image_name", label="benign_malignant", path="train/{image_name}.jpg", group="patient_id")


def test_csv_manifest_rows_labels_and_hash_split(corpus):
    src = read(corpus, val_fraction=0.25, seed=0)
    assert src.kind == "csv"
    assert len(src.rows) == 40
    assert src.classes == ["a", "b", "c"]
    r = src.rows[0]
    assert r.key == "s0000" and r.source_path == "img/s0000.jpg" and r.label == "a"
    assert r.path == str(corpus.parent / "img/s0000.jpg")
    assert {r.split for r in src.rows} == {"train", "val"}
    assert read(corpus, val_fraction=0.25).digest() == src.digest()
    assert read(corpus, val_fraction=0.5).digest() != src.digest()


def test_split_column_is_kept(tmp_path):
    rows = make_images(tmp_path, 4)
    for r, s in zip(rows, ["train", "val", "test", ""]):
        r["split"] = s
    src = read(write_manifest(tmp_path / "m.csv", rows), val_fraction=0.0)
    assert [r.split for r in src.rows] == ["train", "val", "test", "train"]


def test_jsonl_manifest(tmp_path):
    rows = make_images(tmp_path, 3)
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    src = read(path)
    assert src.kind == "jsonl"
    assert [r.key for r in src.rows] == ["s0000", "s0001", "s0002"]


def test_jsonl_bad_line_is_named(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"key": "a", "path": "x.jpg", "label": "l"}\n{not json\n')
    with pytest.raises(SourceError, match="line 2 is not valid JSON"):
        read(path)


def test_integer_labels_keep_their_value(tmp_path):
    rows = make_images(tmp_path, 3)
    for r, lab in zip(rows, ["0", "2", "10"]):
        r["label"] = lab
    src = read(write_manifest(tmp_path / "m.csv", rows))
    assert src.classes == [str(i) for i in range(11)]
    assert src.label_index()["10"] == 10


def test_missing_columns_are_named(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("name,file\na,b.jpg\n")
    with pytest.raises(SourceError, match="missing column\\(s\\) key, label, path"):
        read(path)


def test_empty_field_names_the_line(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("key,path,label\na,a.jpg,x\nb,,x\n")
    with pytest.raises(SourceError, match="line 3: empty or missing 'path'"):
        read(path)


def test_unknown_manifest_type_and_missing_source(tmp_path):
    (tmp_path / "m.txt").write_text("x")
    with pytest.raises(SourceError, match="unknown manifest type"):
        read(tmp_path / "m.txt")
    with pytest.raises(SourceError, match="does not exist"):
        read(tmp_path / "nope.csv")


@pytest.mark.parametrize("bad", ["a.b", "a/b", "with space", "", "x" * 97])
def test_invalid_keys_are_refused_with_their_line(tmp_path, bad):
    path = tmp_path / "m.csv"
    path.write_text(f'key,path,label\ngood,a.jpg,x\n"{bad}",b.jpg,x\n')
    with pytest.raises((InvalidKeyError, SourceError), match="line 3"):
        read(path)


def test_duplicate_keys_are_refused_with_their_lines(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("key,path,label\nk1,a.jpg,x\nk2,b.jpg,x\nk1,c.jpg,x\n")
    with pytest.raises(InvalidKeyError, match="duplicate key.*'k1' at lines 2, 4"):
        read(path)


def test_sanitize_keys_maps_and_keeps_original(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("key,path,label\nIMG 1.jpg,a.jpg,x\nIMG_1_jpg,b.jpg,x\nok-key,c.jpg,x\n")
    with pytest.raises(InvalidKeyError, match="--sanitize-keys"):
        read(path)
    src = read(path, sanitize_keys=True)
    keys = [r.key for r in src.rows]
    assert len(set(keys)) == 3
    assert keys[2] == "ok-key" and src.rows[2].original_key is None
    # "IMG 1.jpg" and "IMG_1_jpg" collide after mapping: both get a hash suffix
    assert keys[0].startswith("IMG_1_jpg-") and keys[1].startswith("IMG_1_jpg-")
    assert src.rows[0].original_key == "IMG 1.jpg"


def test_sanitize_keys_is_deterministic_and_bounded():
    originals = ["a.b", "a/b", "é", "x" * 300]
    out = sanitize_keys(originals)
    assert out == sanitize_keys(originals)
    assert len(set(out)) == 4
    assert all(len(k) <= 95 for k in out)


def test_image_folder(tmp_path):
    root = tmp_path / "photos"
    for label in ("benign", "malignant"):
        d = root / label / "sub"
        d.mkdir(parents=True)
        for name in ("a.jpg", "a.png", "b.JPEG", ".hidden.jpg", "notes.txt"):
            (d / name).write_bytes(b"x")
    src = read(root, val_fraction=0.0)
    assert src.kind == "image-folder"
    assert src.classes == ["benign", "malignant"]
    assert len(src.rows) == 6  # hidden files and non-images skipped
    assert {r.original_key for r in src.rows} >= {"benign/sub/a.jpg", "benign/sub/a.png"}
    keys = [r.key for r in src.rows]
    assert len(set(keys)) == 6 and all("." not in k and "/" not in k for k in keys)
    assert "benign_sub_b" in keys


def test_empty_image_folder(tmp_path):
    (tmp_path / "empty" / "label").mkdir(parents=True)
    with pytest.raises(SourceError, match="no images found"):
        read(tmp_path / "empty")


def test_labels_are_class_indexes_only_when_every_one_is_a_plain_ascii_integer():
    from wds_tools.convert.source import _classes

    assert _classes({"3", "0", "10"}, "m.csv") == [str(i) for i in range(11)]
    assert _classes({"07", "7"}, "m.csv") == ["07", "7"]  # a leading zero: names, so 07 and 7 stay two classes
    for odd in ("\u00b2", "\u0663", "-1", "+1", " 1", "1.0"):  # str.isdigit takes the first two
        assert _classes({odd, "3"}, "m.csv") == sorted({odd, "3"}), odd


def test_hash_columns_are_read_and_checked(tmp_path):
    import hashlib

    rows = make_images(tmp_path, 3)
    digests = [hashlib.sha256((tmp_path / r["path"]).read_bytes()).hexdigest() for r in rows]
    for r, d in zip(rows, digests):
        r["sha256"] = d.upper() if r["key"] == "s0001" else d  # case does not matter
    rows[2]["sha256"] = ""  # a row without a hash is compared as if the column were absent
    src = read(write_manifest(tmp_path / "m.csv", rows, ("key", "path", "label", "sha256")))
    assert [r.content_hash for r in src.rows] == [f"sha256:{digests[0]}", f"sha256:{digests[1]}", None]
    plain = read(write_manifest(tmp_path / "plain.csv", [{k: v for k, v in r.items() if k != "sha256"} for r in rows]))
    assert plain.digest() == src.digest()  # the hash is a means to compare, not the source's identity
    # jsonl, md5
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({**rows[0], "sha256": None, "md5": "d41d8cd98f00b204e9800998ecf8427e"}) + "\n")
    assert read(path).rows[0].content_hash == "md5:d41d8cd98f00b204e9800998ecf8427e"


@pytest.mark.parametrize("value", ["abc", "g" * 64, "0" * 63])
def test_a_malformed_hash_is_named(tmp_path, value):
    rows = make_images(tmp_path, 2)
    rows[1]["sha256"] = value
    with pytest.raises(SourceError, match=r"m.csv: line 3: sha256 .* is not 64 hex digits.*remove the sha256 column"):
        read(write_manifest(tmp_path / "m.csv", rows, ("key", "path", "label", "sha256")))


# ------------------------------------------------------------------ a dataset's own metadata file


def test_a_ham10000_metadata_file_with_column_options(tmp_path):
    path = write_ham(tmp_path, [3, 1, 2])
    src = read(path, columns=HAM, val_fraction=0.3)
    assert [r.key for r in src.rows] == [f"ISIC_{i:07d}" for i in range(6)]
    assert src.rows[0].source_path == "images/ISIC_0000000.jpg" and src.rows[0].path == str(
        tmp_path / "images" / "ISIC_0000000.jpg"
    )
    assert src.classes == ["bkl", "mel", "nv"] and src.rows[3].label == "mel"
    assert [(c.name, c.type) for c in src.metadata] == [
        ("lesion_id", "string"),
        ("dx_type", "string"),
        ("age", "float"),
        ("sex", "string"),
        ("localization", "string"),
    ]
    assert src.rows[4].meta == ("HAM_0000002", "follow_up", None, "female", "頭皮")  # age missing
    assert src.rows[0].meta[2] == 5.0 and isinstance(src.rows[0].meta[2], float)
    assert src.meta_items(src.rows[0])[0] == ("lesion_id", "HAM_0000000")
    assert build_fields(src, HAM, val_fraction=0.3) == {
        "columns": {"key": "image_id", "label": "dx", "path": "images/{image_id}.jpg", "split": None},
        "group": "lesion_id",
        "split_base": None,
    }


def test_an_isic_train_csv_with_column_options(tmp_path):
    src = read(write_isic(tmp_path, [3, 2, 4]), columns=ISIC)
    assert src.classes == ["benign", "malignant"] and len(src.rows) == 9
    types = {c.name: c.type for c in src.metadata}
    assert types == {
        "patient_id": "string",
        "sex": "string",
        "age_approx": "float",
        "anatom_site_general_challenge": "string",
        "diagnosis": "string",
        "target": "int",
    }
    r = src.rows[5]  # n % 6 == 5: sex and age empty
    assert dict(src.meta_items(r))["sex"] is None and dict(src.meta_items(r))["age_approx"] is None
    assert dict(src.meta_items(src.rows[1]))["target"] == 1


def test_the_digest_covers_the_metadata(tmp_path):
    path = write_ham(tmp_path, [2, 2])
    before = read(path, columns=HAM).digest()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("épaule", "shoulder"), encoding="utf-8")
    assert read(path, columns=HAM).digest() != before
    plain = tmp_path / "plain.csv"
    plain.write_text("key,path,label\na,a.jpg,x\n")
    src = read(plain)
    import hashlib

    assert src.digest() == hashlib.sha256(f"a\ta.jpg\tx\t{src.rows[0].split}\n".encode()).hexdigest()  # v1's


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=25),
    st.sampled_from([0.1, 0.3, 0.5]),
    st.booleans(),
    st.integers(0, 5),
)
def test_no_group_lands_in_two_splits(tmp_path_factory, lesions, frac, stratify, seed):
    root = tmp_path_factory.mktemp("ham")
    path = root / "m.csv"
    rows = []
    for j, n in enumerate(lesions):
        rows += [
            {
                "key": f"k{j}_{i}",
                "path": f"{j}/{i}.jpg",
                "label": "ab"[(j * 7 + i) % 2 if j % 3 else 0],
                "lesion": f"L{j}",
            }
            for i in range(n)
        ]
    write_manifest(path, rows, ("key", "path", "label", "lesion"))
    src = read(path, columns=Columns(group="lesion"), val_fraction=frac, stratify=stratify, seed=seed)
    splits: dict[str, set] = {}
    for r in src.rows:
        splits.setdefault(dict(src.meta_items(r))["lesion"], set()).add(r.split)
    assert all(len(s) == 1 for s in splits.values())


def test_a_split_column_wins_and_carries_its_group(tmp_path):
    rows = [
        {"key": "a", "path": "a.jpg", "label": "x", "split": "test", "lesion": "L1"},
        {"key": "b", "path": "b.jpg", "label": "x", "split": "", "lesion": "L1"},
        {"key": "c", "path": "c.jpg", "label": "y", "split": "", "lesion": "L2"},
    ]
    path = write_manifest(tmp_path / "m.csv", rows, ("key", "path", "label", "split", "lesion"))
    src = read(path, columns=Columns(group="lesion"), val_fraction=0.0)
    assert [r.split for r in src.rows] == ["test", "test", "train"]


def test_a_group_in_two_splits_of_the_split_column_is_refused(tmp_path):
    rows = [
        {"key": "a", "path": "a.jpg", "label": "x", "split": "train", "lesion": "L1"},
        {"key": "b", "path": "b.jpg", "label": "x", "split": "val", "lesion": "L1"},
        {"key": "c", "path": "c.jpg", "label": "x", "split": "val", "lesion": "L1"},
    ]
    path = write_manifest(tmp_path / "m.csv", rows, ("key", "path", "label", "split", "lesion"))
    with pytest.raises(
        SourceError,
        match=r"m.csv: group 'L1' of column 'lesion' is in 2 splits of the manifest's "
        r"split column \(train at line\(s\) 2; val at line\(s\) 3, 4\)",
    ):
        read(path, columns=Columns(group="lesion"))
    assert {r.split for r in read(path).rows} == {"train", "val"}  # without --group: rows as given


def test_base_groups_keep_their_split_and_rows_without_a_group_are_their_own(tmp_path):
    rows = [
        {"key": f"k{i}", "path": f"{i}.jpg", "label": "x", "lesion": f"L{i // 2}" if i < 6 else ""} for i in range(8)
    ]
    path = write_manifest(tmp_path / "m.csv", rows, ("key", "path", "label", "lesion"))
    free = read(path, columns=Columns(group="lesion"), val_fraction=0.5)
    flipped = {
        ("g", "L0"): "val" if free.rows[0].split == "train" else "train",
        ("k", "k7"): "test",
        ("g", "L9"): "val",
    }  # a base group the new version lacks is ignored
    src = read(path, columns=Columns(group="lesion"), val_fraction=0.5, split_base=SplitBase("v0", flipped))
    assert src.rows[0].split == src.rows[1].split == flipped[("g", "L0")] and src.rows[7].split == "test"
    assert [r.split for r in src.rows[2:7]] == [r.split for r in free.rows[2:7]]
    assert build_fields(src, Columns(group="lesion"), val_fraction=0.5)["split_base"] == "v0"


def test_an_empty_template_cell_fails_its_row_only(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("id,folder,label\na,x,cat\nb,,cat\n")
    src = read(path, columns=Columns(key="id", path="{folder}/{id}.jpg"))
    assert [r.error for r in src.rows] == [None, "column 'folder' is empty; --path '{folder}/{id}.jpg' needs it"]
    assert src.rows[1].source_path == "/b.jpg"


def test_column_options_do_not_apply_to_an_image_folder(tmp_path):
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "a.jpg").write_bytes(b"x")
    with pytest.raises(OptionError, match="image folder .* which has none"):
        read(tmp_path / "photos", columns=Columns(group="lesion"))
    assert read(tmp_path / "photos", stratify=True).rows[0].split == "train"


def test_jsonl_with_column_options_keeps_typed_values(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(o, ensure_ascii=False)
            for o in [
                {"image": "a", "dx": "nv", "age": 40, "site": "dos", "flag": True},
                {"image": "b", "dx": "mel", "age": 52.5, "site": None, "flag": False},
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    src = read(path, columns=Columns(key="image", label="dx", path="img/{image}.jpg"))
    assert [(c.name, c.type) for c in src.metadata] == [("age", "float"), ("site", "string"), ("flag", "string")]
    assert [r.meta for r in src.rows] == [(40.0, "dos", "true"), (52.5, None, "false")]
    assert src.rows[1].source_path == "img/b.jpg"


# --- labels by value (issue 22, row 4) ---


def test_labels_written_as_floats_are_classes_by_integer_value(tmp_path):
    # what pandas writes for an int column with a missing value: 0.0 .. 11.0
    rows = make_images(tmp_path, 12)
    for i, r in enumerate(rows):
        r["label"] = f"{i}.0"
    src = read(write_manifest(tmp_path / "m.csv", rows))
    assert src.classes == [str(i) for i in range(12)]
    index = src.label_index()
    assert [index[r.label] for r in src.rows] == list(range(12))  # label 2.0 is class 2, not 4


def test_one_value_in_three_spellings_is_one_class(tmp_path):
    rows = make_images(tmp_path, 4)
    path = tmp_path / "m.jsonl"
    labels = [3, "3", 3.0, 0]
    path.write_text("".join(json.dumps({**r, "label": lab}) + "\n" for r, lab in zip(rows, labels)))
    src = read(path)
    assert src.classes == ["0", "1", "2", "3"]
    assert [r.label for r in src.rows] == ["3", "3", "3", "0"]


def test_a_boolean_among_numeric_labels_is_refused_naming_the_row(tmp_path):
    rows = make_images(tmp_path, 3)
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({**r, "label": lab}) + "\n" for r, lab in zip(rows, [3, True, 1])))
    with pytest.raises(SourceError, match=r"m\.jsonl: the label at line\(s\) 2 is a JSON boolean"):
        read(path)


def test_boolean_labels_alone_are_names(tmp_path):
    rows = make_images(tmp_path, 2)
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({**r, "label": lab}) + "\n" for r, lab in zip(rows, [True, False])))
    assert read(path).classes == ["false", "true"]


def test_one_non_integer_value_written_two_ways_is_refused(tmp_path):
    rows = make_images(tmp_path, 2)
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({**r, "label": lab}) + "\n" for r, lab in zip(rows, [2.5, "2.50"])))
    with pytest.raises(SourceError, match=r"'2\.5' at line\(s\) 1; '2\.50' at line\(s\) 2 name one value"):
        read(path)


def test_leading_zero_labels_stay_names(tmp_path):
    rows = make_images(tmp_path, 2)
    for r, lab in zip(rows, ["07", "7"]):
        r["label"] = lab
    assert read(write_manifest(tmp_path / "m.csv", rows)).classes == ["07", "7"]


# --- integer labels never go through a double (issue 32, point 8) ---

BIG = ["cat", "12345678901234567", "12345678901234568", "9007199254740993", "99999999999999999999", "7"]


@pytest.mark.parametrize("kind", ["csv", "jsonl-text", "jsonl-number"])
def test_integer_labels_past_a_doubles_digits_are_kept_exactly(tmp_path, kind):
    rows = make_images(tmp_path, len(BIG))
    if kind == "csv":
        path = write_manifest(tmp_path / "m.csv", [{**r, "label": lab} for r, lab in zip(rows, BIG)])
    else:  # JSON lines: the labels as strings, or as JSON integers (Python's json reads those exactly)
        cells = BIG if kind == "jsonl-text" else [lab if lab == "cat" else int(lab) for lab in BIG]
        path = tmp_path / "m.jsonl"
        path.write_text("".join(json.dumps({**r, "label": lab}) + "\n" for r, lab in zip(rows, cells)))
    src = read(path)
    assert [r.label for r in src.rows] == BIG  # 12345678901234567 and ...568 are two classes, ...993 not ...992
    assert src.classes == sorted(BIG)
    assert len(set(src.label_index()[r.label] for r in src.rows)) == len(BIG)


def test_integer_labels_written_with_a_zero_fraction_keep_their_digits(tmp_path):
    rows = make_images(tmp_path, 3)
    labels = ["9007199254740993.0", "9007199254740992.00", "dog"]
    src = read(write_manifest(tmp_path / "m.csv", [{**r, "label": lab} for r, lab in zip(rows, labels)]))
    assert [r.label for r in src.rows] == ["9007199254740993", "9007199254740992", "dog"]


def test_an_integer_label_too_large_for_a_class_index_is_quoted_exactly(tmp_path):
    rows = make_images(tmp_path, 2)
    for r, lab in zip(rows, ["99999999999999999999", "3"]):
        r["label"] = lab
    with pytest.raises(SourceError, match=r"m\.csv: integer label 99999999999999999999 \(line 2\) is too large"):
        read(write_manifest(tmp_path / "m.csv", rows))


def test_a_json_float_label_past_2_53_is_refused_naming_its_line(tmp_path):
    # json reads 12345678901234567.0 as the double 12345678901234568.0: its digits are lost before we see it
    rows = make_images(tmp_path, 2)
    path = tmp_path / "m.jsonl"
    second = json.dumps({k: v for k, v in rows[1].items() if k != "label"})[:-1] + ', "label": 12345678901234567.0}'
    path.write_text(json.dumps({**rows[0], "label": "cat"}) + "\n" + second + "\n")
    with pytest.raises(SourceError, match=r"m\.jsonl: the label at line\(s\) 2 is a JSON number with a fraction"):
        read(path)


def test_two_decimal_labels_one_double_holds_are_two_values_not_one_spelt_twice(tmp_path):
    rows = make_images(tmp_path, 2)
    for r, lab in zip(rows, ["0.1", "0.10000000000000000001"]):  # one double, two decimal values
        r["label"] = lab
    assert read(write_manifest(tmp_path / "m.csv", rows)).classes == ["0.1", "0.10000000000000000001"]


# --- every file of an image folder accounted for (issue 22, row 2) ---


def test_every_file_not_taken_is_listed_with_its_reason(tmp_path):
    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    for name in ("a.jpg", "b.jfif", "c.jpe", "d.heic", "e.avif", "f.HEIF", ".DS_Store", "notes.txt", "raw.cr2"):
        (root / "cat" / name).write_bytes(b"x")
    (root / "cat" / ".thumbs").mkdir()
    (root / "cat" / ".thumbs" / "t.jpg").write_bytes(b"x")
    (root / "README.md").write_text("a corpus")
    (root / ".git").mkdir()
    src = read(root, val_fraction=0.0)
    assert sorted(r.source_path for r in src.rows) == [
        f"cat/{n}" for n in ("a.jpg", "b.jfif", "c.jpe", "d.heic", "e.avif", "f.HEIF")
    ]
    reasons = {s["path"]: s["reason"] for s in src.skipped}
    assert sorted(reasons) == [".git", "README.md", "cat/.DS_Store", "cat/.thumbs", "cat/notes.txt", "cat/raw.cr2"]
    assert reasons["cat/raw.cr2"].startswith("extension '.cr2' is not an image extension")
    assert reasons["README.md"].startswith("not inside a label folder")
    assert "hidden" in reasons["cat/.DS_Store"] and "hidden" in reasons["cat/.thumbs"] and "hidden" in reasons[".git"]


def test_a_symlinked_subfolder_is_followed_and_a_loop_is_listed(tmp_path):
    import os

    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.jpg").write_bytes(b"x")
    elsewhere = tmp_path / "more"
    elsewhere.mkdir()
    (elsewhere / "b.jpg").write_bytes(b"x")
    os.symlink(elsewhere, root / "cat" / "linked")
    os.symlink(root / "cat", root / "cat" / "loop")  # back to its own parent
    src = read(root, val_fraction=0.0)
    assert sorted(r.source_path for r in src.rows) == ["cat/a.jpg", "cat/linked/b.jpg"]
    assert [s["path"] for s in src.skipped] == ["cat/loop"]
    assert "already walked" in src.skipped[0]["reason"]


# --- mixed extensions in one folder (issue 38, point 14) ---


def _mixed_ham(root):
    """A HAM10000-shaped folder of 6 images whose files are JPEG, PNG and HEIC as a phone and a scanner
    left them: ISIC_0000001.png, ISIC_0000002.HEIC (upper case), ISIC_0000003.png beside a stale
    ISIC_0000003.jpg, ISIC_0000004 missing. Returns the manifest and each key's colour."""
    import numpy as np
    from PIL import Image

    from wds_tools.synth import jpeg_bytes

    pillow_heif = pytest.importorskip("pillow_heif")
    pillow_heif.register_heif_opener()
    manifest = write_ham(root, [2, 2, 2])
    images = root / "images"
    colours = {}
    for n, fmt in enumerate(["jpg", "png", "HEIC", "png", None, "jpg"]):
        key = f"ISIC_{n:07d}"
        (images / f"{key}.jpg").unlink()
        if fmt is None:
            continue
        colour = (30 + 35 * n, 200 - 25 * n, 90)
        colours[key] = np.array(colour)
        im = Image.new("RGB", (40, 30), colour)
        if fmt == "jpg":
            (images / f"{key}.jpg").write_bytes(jpeg_bytes(im))
        else:
            im.save(images / f"{key}.{fmt}", "PNG" if fmt == "png" else "HEIF", quality=95)
    (images / "ISIC_0000003.jpg").write_bytes(jpeg_bytes(Image.new("RGB", (40, 30), (0, 0, 0))))
    return manifest, colours


@pytest.mark.parametrize("template", ["images/{image_id}.{jpg,png,heic,HEIC}", "images/{image_id}.*"])
def test_a_template_listing_extensions_or_ending_with_a_star_takes_each_file_of_a_mixed_folder(tmp_path, template):
    """Each row takes the first listed extension that exists ('.*': the first image file by name); a
    row with two candidates is named in a note; one with none fails naming every path tried."""
    manifest, colours = _mixed_ham(tmp_path)
    src = read(manifest, val_fraction=0.0, columns=Columns(key="image_id", label="dx", path=template))
    taken = {r.key: r.source_path for r in src.rows}
    assert taken == {
        "ISIC_0000000": "images/ISIC_0000000.jpg",
        "ISIC_0000001": "images/ISIC_0000001.png",
        "ISIC_0000002": "images/ISIC_0000002.HEIC",
        "ISIC_0000003": "images/ISIC_0000003.jpg",  # listed first, and first by name
        "ISIC_0000004": "images/ISIC_0000004.jpg" if "{jpg" in template else "images/ISIC_0000004.*",
        "ISIC_0000005": "images/ISIC_0000005.jpg",
    }
    errors = {r.key: r.error for r in src.rows if r.error}
    assert list(errors) == ["ISIC_0000004"] and errors["ISIC_0000004"].startswith("missing file: none of images/")
    (note,) = src.notes
    assert "1 row names more than one existing file" in note
    assert "line 5: images/ISIC_0000003.jpg (also images/ISIC_0000003.png)" in note


def test_mixed_extensions_convert_their_own_pixels_through_the_cli(tmp_path):
    """The HAM10000 walkthrough: the README's template with the extensions listed converts the JPEGs, PNGs
    and the HEIC, each sample its own picture; the missing file is the one failure, named."""
    import io
    import tarfile

    import numpy as np
    from click.testing import CliRunner

    from wds_tools.cli import cli

    manifest, colours = _mixed_ham(tmp_path)
    (tmp_path / "images" / "ISIC_0000003.jpg").unlink()  # no stale copy: the PNG is the picture
    args = ["convert", "--source", str(manifest), "--key", "image_id", "--label", "dx"]
    args += ["--path", "images/{image_id}.{jpg,png,heic,HEIC}", "--version", "v1", "--size", "16"]
    args += ["--out", str(tmp_path / "out"), "--workers", "1", "--val-fraction", "0", "--max-errors", "1", "-q"]
    run = CliRunner().invoke(cli, args)
    assert run.exit_code == 0, run.output
    assert "failed: 1" in run.output and "ISIC_0000004" in run.output
    means = {}
    for tar in (tmp_path / "out" / "v1" / "16").glob("*.tar"):
        with tarfile.open(tar) as tf:
            for m in tf:
                if m.name.endswith(".npy"):
                    means[m.name[:-4]] = np.load(io.BytesIO(tf.extractfile(m).read())).reshape(-1, 3).mean(0)
    assert sorted(means) == sorted(colours)
    for key, colour in colours.items():
        assert np.abs(means[key] - colour).max() < 6, (key, means[key], colour)


def test_a_missing_file_names_the_same_name_with_another_extension(tmp_path):
    """--path 'images/{image_id}.jpg' on a folder holding PNGs beside the JPEGs: each PNG row fails as
    before, its reason naming the PNG and the template that takes both (errors.jsonl and the refusal)."""
    from wds_tools.convert import convert
    from wds_tools.errors import TooManyErrorsError

    manifest, _ = _mixed_ham(tmp_path)
    kw = dict(version="v1", size=16, out=tmp_path / "out", key="image_id", label="dx", workers=1, progress=False)
    with pytest.raises(
        TooManyErrorsError,
        match=r"First: images/ISIC_0000001\.jpg: missing file; "
        r"images/ISIC_0000001\.png exists \(--path 'images/\{image_id\}\.\{jpg,png\}' takes each",
    ):
        convert(manifest, path="images/{image_id}.jpg", **kw)
    errors = [json.loads(line) for line in (tmp_path / "out" / "v1" / "16" / "errors.jsonl").read_text().splitlines()]
    reasons = {e["key"]: e["error"] for e in errors}
    assert reasons == {
        "ISIC_0000001": "missing file; images/ISIC_0000001.png exists (--path 'images/{image_id}.{jpg,png}' takes "
        "each of them, the first that exists; '.*' any image extension)",
        "ISIC_0000002": "missing file; images/ISIC_0000002.HEIC exists (--path 'images/{image_id}.{jpg,HEIC}' takes "
        "each of them, the first that exists; '.*' any image extension)",
        "ISIC_0000004": "missing file",
    }


def test_a_missing_file_of_a_path_column_names_the_file_beside_it(tmp_path):
    """A manifest's own path column: the reason names the PNG beside the missing JPEG, no template advice."""
    from PIL import Image

    from wds_tools.convert import convert

    rows = make_images(tmp_path, 6)
    Image.open(tmp_path / "img/s0002.jpg").save(tmp_path / "img/s0002.PNG")
    (tmp_path / "img/s0002.jpg").unlink()
    manifest = write_manifest(tmp_path / "m.csv", rows)
    result = convert(manifest, version="v1", size=16, out=tmp_path / "out", workers=1, progress=False, max_errors=1)
    assert [(f["key"], f["error"]) for f in result.failures] == [("s0002", "missing file; img/s0002.PNG exists")]
