import json

import pytest

from conftest import make_images, write_manifest
from wds_tools.errors import InvalidKeyError, SourceError
from wds_tools.convert.source import read_source, sanitize_keys


def test_csv_manifest_rows_labels_and_hash_split(corpus):
    src = read_source(corpus, val_fraction=0.25, seed=0)
    assert src.kind == "csv"
    assert len(src.rows) == 40
    assert src.classes == ["a", "b", "c"]
    r = src.rows[0]
    assert r.key == "s0000" and r.source_path == "img/s0000.jpg" and r.label == "a"
    assert r.path == str(corpus.parent / "img/s0000.jpg")
    assert {r.split for r in src.rows} == {"train", "val"}
    assert read_source(corpus, val_fraction=0.25).digest() == src.digest()
    assert read_source(corpus, val_fraction=0.5).digest() != src.digest()


def test_split_column_is_kept(tmp_path):
    rows = make_images(tmp_path, 4)
    for r, s in zip(rows, ["train", "val", "test", ""]):
        r["split"] = s
    src = read_source(write_manifest(tmp_path / "m.csv", rows), val_fraction=0.0)
    assert [r.split for r in src.rows] == ["train", "val", "test", "train"]


def test_jsonl_manifest(tmp_path):
    rows = make_images(tmp_path, 3)
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    src = read_source(path)
    assert src.kind == "jsonl"
    assert [r.key for r in src.rows] == ["s0000", "s0001", "s0002"]


def test_jsonl_bad_line_is_named(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"key": "a", "path": "x.jpg", "label": "l"}\n{not json\n')
    with pytest.raises(SourceError, match="line 2 is not valid JSON"):
        read_source(path)


def test_integer_labels_keep_their_value(tmp_path):
    rows = make_images(tmp_path, 3)
    for r, lab in zip(rows, ["0", "2", "10"]):
        r["label"] = lab
    src = read_source(write_manifest(tmp_path / "m.csv", rows))
    assert src.classes == [str(i) for i in range(11)]
    assert src.label_index()["10"] == 10


def test_missing_columns_are_named(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("name,file\na,b.jpg\n")
    with pytest.raises(SourceError, match="missing column\\(s\\) key, label, path"):
        read_source(path)


def test_empty_field_names_the_line(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("key,path,label\na,a.jpg,x\nb,,x\n")
    with pytest.raises(SourceError, match="line 3: empty or missing 'path'"):
        read_source(path)


def test_unknown_manifest_type_and_missing_source(tmp_path):
    (tmp_path / "m.txt").write_text("x")
    with pytest.raises(SourceError, match="unknown manifest type"):
        read_source(tmp_path / "m.txt")
    with pytest.raises(SourceError, match="does not exist"):
        read_source(tmp_path / "nope.csv")


@pytest.mark.parametrize("bad", ["a.b", "a/b", "with space", "", "x" * 97])
def test_invalid_keys_are_refused_with_their_line(tmp_path, bad):
    path = tmp_path / "m.csv"
    path.write_text(f"key,path,label\ngood,a.jpg,x\n\"{bad}\",b.jpg,x\n")
    with pytest.raises((InvalidKeyError, SourceError), match="line 3"):
        read_source(path)


def test_duplicate_keys_are_refused_with_their_lines(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("key,path,label\nk1,a.jpg,x\nk2,b.jpg,x\nk1,c.jpg,x\n")
    with pytest.raises(InvalidKeyError, match="duplicate key.*'k1' at lines 2, 4"):
        read_source(path)


def test_sanitize_keys_maps_and_keeps_original(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("key,path,label\nIMG 1.jpg,a.jpg,x\nIMG_1_jpg,b.jpg,x\nok-key,c.jpg,x\n")
    with pytest.raises(InvalidKeyError, match="--sanitize-keys"):
        read_source(path)
    src = read_source(path, sanitize_keys=True)
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
    src = read_source(root, val_fraction=0.0)
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
        read_source(tmp_path / "empty")


def test_labels_are_class_indexes_only_when_every_one_is_a_plain_ascii_integer():
    from wds_tools.convert.source import _classes

    assert _classes({"3", "0", "10"}) == [str(i) for i in range(11)]
    assert _classes({"07", "7"}) == ["07", "7"]  # a leading zero: names, so 07 and 7 stay two classes
    for odd in ("\u00b2", "\u0663", "-1", "+1", " 1", "1.0"):  # str.isdigit takes the first two
        assert _classes({odd, "3"}) == sorted({odd, "3"}), odd


def test_hash_columns_are_read_and_checked(tmp_path):
    import hashlib

    rows = make_images(tmp_path, 3)
    digests = [hashlib.sha256((tmp_path / r["path"]).read_bytes()).hexdigest() for r in rows]
    for r, d in zip(rows, digests):
        r["sha256"] = d.upper() if r["key"] == "s0001" else d  # case does not matter
    rows[2]["sha256"] = ""  # a row without a hash is compared as if the column were absent
    src = read_source(write_manifest(tmp_path / "m.csv", rows, ("key", "path", "label", "sha256")))
    assert [r.content_hash for r in src.rows] == [f"sha256:{digests[0]}", f"sha256:{digests[1]}", None]
    plain = read_source(write_manifest(tmp_path / "plain.csv", [{k: v for k, v in r.items() if k != "sha256"}
                                                                for r in rows]))
    assert plain.digest() == src.digest()  # the hash is a means to compare, not the source's identity
    # jsonl, md5
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({**rows[0], "sha256": None, "md5": "d41d8cd98f00b204e9800998ecf8427e"}) + "\n")
    assert read_source(path).rows[0].content_hash == "md5:d41d8cd98f00b204e9800998ecf8427e"


@pytest.mark.parametrize("value", ["abc", "g" * 64, "0" * 63])
def test_a_malformed_hash_is_named(tmp_path, value):
    rows = make_images(tmp_path, 2)
    rows[1]["sha256"] = value
    with pytest.raises(SourceError, match=r"m.csv: line 3: sha256 .* is not 64 hex digits.*remove the sha256 column"):
        read_source(write_manifest(tmp_path / "m.csv", rows, ("key", "path", "label", "sha256")))
