"""format/meta.py: metadata columns in samples.npz, written and read back; the selection and grouping
helpers against plain-Python references."""

import io
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.errors import IndexFormatError
from wds_tools.format.index import read_npz, write_npz
from wds_tools.format.meta import (
    MetaColumn,
    column_names,
    encode_columns,
    metadata_columns,
    npz_names,
    read_metadata,
    string_values,
    value_text,
)

_VALUES = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "string": st.text(min_size=1),
}


@st.composite
def tables(draw):
    """(columns, rows): 0-4 columns of random types, 0-30 rows, about a quarter of the values missing."""
    types = draw(st.lists(st.sampled_from(["int", "float", "string"]), max_size=4))
    columns = [MetaColumn(f"c{i}·{t}", t) for i, t in enumerate(types)]
    n = draw(st.integers(0, 30))
    rows = [
        tuple(draw(st.one_of(st.none(), _VALUES[c.type], _VALUES[c.type], _VALUES[c.type])) for c in columns)
        for _ in range(n)
    ]
    return columns, rows


def _round_trip(columns, rows):
    meta = {"metadata": [c.to_dict() for c in columns]}
    arrays = encode_columns(columns, rows)
    assert list(arrays) == column_names(meta)  # every array, in stored order
    stored = read_npz("t.npz", data=write_npz(arrays))  # through the bytes of an .npz
    return meta, stored, read_metadata(stored, metadata_columns(meta))


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (
        type(a) is type(b)
        and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))
        and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))
    )


@settings(max_examples=150, deadline=None)
@given(tables())
def test_values_round_trip_through_samples_npz(table):
    columns, rows = table
    meta, stored, read = _round_trip(columns, rows)
    assert list(read) == [c.name for c in columns]
    for i, c in enumerate(columns):
        got = read[c.name].tolist()
        assert all(_same(g, r[i]) for g, r in zip(got, rows)), c
        names = npz_names(i, c.type)
        if c.type == "string":
            offsets, data = stored[names[1]], stored[names[2]].tobytes()
            values = [data[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:])]
            assert values == sorted({r[i] for r in rows if r[i] is not None})  # distinct, code-point order
            assert stored[names[0]].dtype == np.dtype("<i4")
        elif c.type == "int":
            assert stored[names[0]].dtype == np.dtype("<i8") and stored[names[1]].dtype == np.dtype("|b1")
            assert all(v == 0 for v, m in zip(stored[names[0]], stored[names[1]]) if m)
        else:
            assert stored[names[0]].dtype == np.dtype("<f8")


@settings(max_examples=150, deadline=None)
@given(tables(), st.data())
def test_mask_factorize_and_array_match_plain_python(table, data):
    columns, rows = table
    _, _, read = _round_trip(columns, rows)
    for i, c in enumerate(columns):
        mv = read[c.name]
        present = [r[i] for r in rows if r[i] is not None]
        wanted = data.draw(
            st.lists(
                st.one_of(st.none(), st.sampled_from(present) if present else st.none(), _VALUES[c.type]), max_size=3
            )
        )
        want = [r[i] in wanted if r[i] is not None else None in wanted for r in rows]
        assert mv.mask(wanted).tolist() == want
        ids, distinct = mv.factorize()
        assert [None if j < 0 else distinct[j] for j in ids.tolist()] == [r[i] for r in rows]
        assert len(set(distinct)) == len(distinct)
        arr = mv.array()
        for a, r in zip(arr.tolist(), rows):
            v = r[i]
            if v is None:
                assert a is None if c.type == "string" else math.isnan(a)
            elif c.type == "int" and mv.missing.any():  # float64 then: integers beyond 2**53 are rounded
                assert a == float(v)
            else:
                assert a == v


def test_mask_refuses_a_value_of_another_kind():
    columns = [MetaColumn("site", "string"), MetaColumn("age", "int")]
    _, _, read = _round_trip(columns, [("back", 45), (None, None)])
    assert read["age"].mask([45.0]).tolist() == [True, False]  # 45.0 is 45
    assert read["age"].mask([None]).tolist() == [False, True]
    with pytest.raises(TypeError, match="'site' is a string column; 3 is not a string"):
        read["site"].mask([3])
    with pytest.raises(TypeError, match="'age' is a column of ints; '45' is not a number"):
        read["age"].mask(["45"])


def test_a_version_1_index_has_no_metadata():
    assert metadata_columns({"format_version": 1}) == [] and read_metadata({}, metadata_columns({})) == {}
    with pytest.raises(IndexFormatError, match="metadata is not a list"):
        metadata_columns({"metadata": [{"name": "a", "type": "date"}]})


def test_damaged_string_codes_are_refused():
    columns = [MetaColumn("site", "string")]
    arrays = encode_columns(columns, [("back",), ("face",)])
    arrays["meta0"] = np.array([0, 5], "<i4")
    with pytest.raises(IndexFormatError, match="codes outside -1..1"):
        read_metadata(arrays, columns)
    del arrays["meta0_data"]
    with pytest.raises(IndexFormatError, match="no column 'meta0_data' \\(metadata column 'site'\\)"):
        read_metadata(arrays, columns)


def test_value_text_is_a_groups_identity():
    # a whole float is the int it equals (an int column turned float by one new cell keeps its groups)
    assert [value_text(v) for v in ("HAM_01", 5, 5.0, -0.0, 1e-07, 45.5, 1e20)] == [
        "HAM_01",
        "5",
        "5",
        "0",
        "1e-07",
        "45.5",
        "100000000000000000000",
    ]
    # a text cell that an int or float column would hold is that number (a column turned text by a
    # new cell keeps its groups); other text is itself
    assert [
        value_text(v)
        for v in ("5.0", "5", "-0", "1e3", "45.50", "99999999999999999999", "007", "NaN", "1e400", " 5", "٣")
    ] == ["5", "5", "0", "1000", "45.5", "99999999999999999999", "007", "NaN", "1e400", " 5", "٣"]


def test_npz_names_are_positional_and_never_ours():
    from wds_tools.format.index import SAMPLE_COLUMNS

    names = [n for i, t in enumerate(["int", "float", "string"]) for n in npz_names(i, t)]
    assert names == ["meta0", "meta0_missing", "meta1", "meta2", "meta2_offsets", "meta2_data"]
    assert not set(names) & set(SAMPLE_COLUMNS)
    with np.load(io.BytesIO(write_npz(encode_columns([MetaColumn("key", "string")], [("x",)])))) as z:
        assert z.files == ["meta0", "meta0_offsets", "meta0_data"]  # a column named "key" is meta0


def _strings(offsets, data: bytes):
    return np.array(offsets, "<u8"), np.frombuffer(data, "|u1")


def test_string_values_follow_the_formats_rule_and_name_what_breaks_it():
    """meta<i>_offsets rise from 0 to the data's end in steps of at least 1, the values are UTF-8, distinct
    and in code-point order (docs/FORMAT.md, Metadata); each broken rule is named."""
    names = ("meta0_offsets", "meta0_data")
    assert string_values(*_strings([0, 1, 3], "aé".encode()), names, "site") == (["a", "é"], None)
    assert string_values(*_strings([0], b""), names, "site") == ([], None)  # no value present
    for offsets, data in (([1, 2], b"ab"), ([0, 1, 1, 2], b"ab"), ([0, 1], b"ab"), ([], b"")):
        values, problem = string_values(*_strings(offsets, data), names, "site")
        assert values is None and problem == (
            f"meta0_offsets (metadata 'site') does not rise from 0 to len(meta0_data) = {len(data)} in steps of at "
            "least 1"
        )
    values, problem = string_values(*_strings([0, 1], b"\xff"), names, "site")
    assert values is None and problem.startswith("meta0_data (metadata 'site') is not UTF-8: ")
    values, problem = string_values(*_strings([0, 1, 2], b"ba"), names, "site")  # readable, out of order
    assert (
        values == ["b", "a"]
        and problem == "the values of metadata 'site' (meta0_data) are not distinct and in code-point order"
    )


def test_a_reader_refuses_string_values_that_cannot_be_read():
    cols = encode_columns([MetaColumn("site", "string")], [("a",), ("b",)])
    assert read_metadata(cols, [MetaColumn("site", "string")])["site"].tolist() == ["a", "b"]
    cols["meta0_data"] = np.frombuffer(b"\xff\xfe", "|u1")
    with pytest.raises(IndexFormatError, match=r"^here: meta0_data \(metadata 'site'\) is not UTF-8: .*run wds-tools"):
        read_metadata(cols, [MetaColumn("site", "string")], where="here")
