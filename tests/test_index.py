import json

import numpy as np
import pytest

from wds_tools.errors import IndexFormatError
from wds_tools.format.index import FORMAT_VERSION, SAMPLE_COLUMNS, load_index, read_npz, write_index, write_npz
from wds_tools.format.packed import pack_strings
from wds_tools.format.sample import MEMBERS, classes_digest


def _columns(n: int) -> dict:
    """samples.npz's columns of ``n`` samples of class 0 in shard 0, as ``_meta`` lists them."""
    cols = {
        name: np.arange(n).astype(dtype)
        for name, dtype in SAMPLE_COLUMNS.items()
        if name not in ("key", "label", "shard", "fingerprint", "phash", "path_offsets", "path_data")
    }
    cols["label"], cols["shard"] = np.zeros(n, "<i4"), np.zeros(n, "<u4")
    cols["phash"] = np.zeros((n, 7), np.uint64)
    cols["key"] = np.array([f"k{i}".encode() for i in range(n)], dtype="S")
    cols["fingerprint"] = np.arange(n * 16, dtype=np.uint8).reshape(n, 16)
    cols["path_offsets"], cols["path_data"] = pack_strings([f"p/ü{i}.jpg" for i in range(n)])
    return cols


def _meta(n: int, **fields) -> dict:
    """A complete index.json of ``n`` samples of class "a" in one train shard (before write_index adds
    samples_file), with ``fields`` replaced."""
    rgb = [0.5, 0.5, 0.5]
    return {
        "format": "wds-tools-index",
        "format_version": FORMAT_VERSION,
        "size": 8,
        "sample": {"members": list(MEMBERS), "npy_dtype": "uint8", "npy_shape": [8, 8, 3]},
        "classes": ["a"],
        "classes_digest": classes_digest(["a"]),
        "class_counts": [n],
        "samples": n,
        "mean": rgb,
        "std": rgb,
        "stats_split": "train",
        "splits": {
            "train": {
                "samples": n,
                "shards": 1,
                "urls": "train-000000.tar",
                "class_counts": [n],
                "mean": rgb,
                "std": rgb,
            }
        },
        "shards": [{"name": "train-000000.tar", "split": "train", "samples": n, "bytes": 10240, "sha256": "0" * 64}],
        "errors_file": None,
        **fields,
    }


def test_npz_is_deterministic_and_readable(tmp_path):
    a, b = write_npz(_columns(10)), write_npz(_columns(10))
    assert a == b
    (tmp_path / "x.npz").write_bytes(a)
    back = read_npz(tmp_path / "x.npz")
    assert back["key"].tolist()[3] == b"k3"


def test_write_and_load_index_round_trip(tmp_path):
    written = write_index(tmp_path, _meta(5), _columns(5))
    assert written["samples_file"]["name"] == "samples.npz"
    idx = load_index(tmp_path)
    assert load_index(tmp_path / "index.json").meta == idx.meta
    assert idx.samples.keys == ["k0", "k1", "k2", "k3", "k4"]
    assert idx.samples.source_path(2) == "p/ü2.jpg"
    assert idx.samples.key_positions["k4"] == 4
    assert idx.samples.fingerprint_hex(1) == bytes(range(16, 32)).hex()
    assert idx.url_pattern("train") == str(tmp_path / "train-000000.tar")
    with pytest.raises(IndexFormatError, match="no split 'val'"):
        idx.url_pattern("val")


def test_load_index_errors(tmp_path):
    with pytest.raises(IndexFormatError, match="no index at"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text("{}")
    with pytest.raises(IndexFormatError, match="not a wds-tools index"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"format": "wds-tools-index", "format_version": 99}))
    with pytest.raises(IndexFormatError, match="format_version 99"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text("{broken")
    with pytest.raises(IndexFormatError, match="cannot read index"):
        load_index(tmp_path)


def test_an_index_naming_a_samples_file_outside_its_folder_is_refused(tmp_path):
    outside = tmp_path / "secret.npz"
    outside.write_bytes(write_npz(_columns(2)))
    folder = tmp_path / "v1" / "8"
    folder.mkdir(parents=True)
    meta = _meta(2, samples_file={"name": "../../secret.npz", "bytes": 1, "sha256": "0" * 64})
    (folder / "index.json").write_text(json.dumps(meta))
    with pytest.raises(
        IndexFormatError,
        match=r"samples_file.name is '../../secret.npz'; expected a file name in "
        r"the index's own folder",
    ):
        _ = load_index(folder).samples
    from wds_tools.convert.reindex import write_reader_indexes

    with pytest.raises(IndexFormatError, match="samples_file.name"):
        write_reader_indexes(folder, dali=True)


def test_read_sample_table_checks_the_columns_read_against_the_index(tmp_path):
    """read_sample_table refuses, naming it, a label that is no class, a row naming a shard the index does not
    list, a shard whose rows are not its ``samples``, a column of another type or row count; a selection of
    columns without ``key`` is read, its rows counted by index.json's ``samples``."""
    from wds_tools.format.index import open_index, read_sample_table

    good = _columns(5)
    write_index(tmp_path, _meta(5), good)
    t = read_sample_table(*open_index(tmp_path), ("fingerprint",))
    assert len(t) == 5 and t["fingerprint"].tolist() == good["fingerprint"].tolist()
    whole = read_sample_table(*open_index(tmp_path))
    assert whole.label.tolist() == [0] * 5 and whole.key(4) == "k4" and whole.npy_offset.dtype == np.int64
    one = {"name": "train-000000.tar", "split": "train", "bytes": 10240, "sha256": "0" * 64}
    cases = [
        ("label", 1, {}, r"1 label\(s\) are not a class index 0\.\.0 \(first: row 3, 1\)"),
        ("shard", 1, {}, r"1 row\(s\) name a shard position past the 1 in index\.json \(first: row 3\)"),
        (None, None, {"shards": [{**one, "samples": 4}]}, r"shards\[0\] \(train-000000\.tar\) says 4 samples, "),
        ("label", np.float32, {}, r"column 'label' is <f4 \[5\]; expected <"),
        (None, None, {"samples": 6}, r"column 'label' is <\w+ \[5\]; expected <\w+ \[6\]"),
    ]
    for column, value, fields, message in cases:
        cols = {k: v.copy() for k, v in good.items()}
        if isinstance(value, type):
            cols[column] = cols[column].astype(value)
        elif column is not None:
            cols[column][3] = value
        write_index(tmp_path, _meta(5, **fields), cols)
        with pytest.raises(IndexFormatError, match=r"samples\.npz: " + message):
            read_sample_table(*open_index(tmp_path), ("label", "shard"))
