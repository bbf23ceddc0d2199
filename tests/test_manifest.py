"""The manifest as a table: column options checked against the header, path templates, cell typing."""

import io
import json
import math
import os
import re

import pytest
from conftest import HAM_COLUMNS, write_ham, write_isic
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.convert.manifest import (
    Choice,
    Columns,
    PathTemplate,
    bind,
    cell_text,
    column_type,
    metadata_values,
    read_table,
    typed,
)
from wds_tools.errors import OptionError, SourceError

HAM = Columns(key="image_id", label="dx", path="images/{image_id}.jpg", group="lesion_id")
ISIC = Columns(key="image_name", label="benign_malignant", path="train/{image_name}.jpg", group="patient_id")


def test_ham_and_isic_headers_bind_and_keep_every_other_column(tmp_path):
    ham = read_table(str(write_ham(tmp_path / "ham", [2, 1])))
    assert ham.kind == "csv" and ham.columns == HAM_COLUMNS and len(ham.records) == 3
    b = bind(ham, HAM)
    assert b.template.fields == ["image_id"] and not b.template.bare and b.split is None
    assert b.metadata == ["lesion_id", "dx_type", "age", "sex", "localization"]  # image_id and dx are taken
    isic = read_table(str(write_isic(tmp_path / "isic", [2, 2])))
    b = bind(isic, ISIC)
    assert b.metadata == ["patient_id", "sex", "age_approx", "anatom_site_general_challenge", "diagnosis", "target"]


def test_a_plain_manifest_binds_as_before(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("key,path,label,split,sha256\na,a.jpg,cat,val,\n")
    b = bind(read_table(str(path)), Columns())
    assert b.template.bare and b.split == "split" and b.metadata == []  # sha256 is a hash, not metadata
    assert Columns().default and not HAM.default


@pytest.mark.parametrize(
    "option, columns, message",
    [
        (
            "--key",
            Columns(key="image_idd", label="dx", path="images/{image_id}.jpg"),
            r"missing column\(s\) image_idd: 'image_idd' \(--key; did you mean 'image_id'\?\)\. The file's columns: "
            r"lesion_id, image_id, dx, dx_type, age, sex, localization\.",
        ),
        (
            "--label",
            Columns(key="image_id", label="diagnosis", path="images/{image_id}.jpg"),
            r"missing column\(s\) diagnosis: 'diagnosis' \(--label\)\. The file's columns: lesion_id, image_id",
        ),
        (
            "--group",
            Columns(key="image_id", label="dx", path="images/{image_id}.jpg", group="lesion"),
            r"'lesion' \(--group; did you mean 'lesion_id'\?\)",
        ),
        (
            "--split",
            Columns(key="image_id", label="dx", path="images/{image_id}.jpg", split="Split"),
            r"'Split' \(--split\)",
        ),
        ("--path", Columns(key="image_id", label="dx", path="file"), r"'file' \(--path\)"),
        ("--label", Columns(key="image_id", label="DX", path="images/{image_id}.jpg"), r"did you mean 'dx'\?"),
    ],
)
def test_a_missing_or_misspelt_column_option_names_the_column_and_lists_the_files(tmp_path, option, columns, message):
    table = read_table(str(write_ham(tmp_path, [1])))
    with pytest.raises(SourceError, match=message):
        bind(table, columns)


@pytest.mark.parametrize(
    "group, role",
    [
        ("image_id", "the --key column"),
        ("dx", "the --label column"),
        ("dx_type", "the split column"),
        ("sha256", "a hash column"),
        ("path", "the --path column"),
    ],
)
def test_a_group_column_that_is_the_key_label_path_split_or_a_hash_is_refused(tmp_path, group, role):
    path = tmp_path / "m.csv"
    path.write_text("lesion_id,image_id,dx,dx_type,path,sha256\nL1,a,nv,train,a.jpg,\n")
    cols = Columns(
        key="image_id", label="dx", path="path" if group == "path" else "{image_id}.jpg", split="dx_type", group=group
    )
    with pytest.raises(
        OptionError,
        match=rf"--group '{group}' is {role} of .*m\.csv; a group column names what "
        r"samples share .* e\.g\. --group lesion_id",
    ):
        bind(read_table(str(path)), cols)
    assert bind(
        read_table(str(path)), Columns(key="image_id", label="dx", path="path", split="dx_type", group="lesion_id")
    ).metadata == ["lesion_id"]


def test_the_default_columns_missing_suggest_the_options(tmp_path):
    table = read_table(str(write_ham(tmp_path, [1])))
    with pytest.raises(
        SourceError,
        match=r"missing column\(s\) key, label, path: .* The file's columns: lesion_id, "
        r"image_id, .*--key image_id --label dx --path 'images/\{image_id\}\.jpg'",
    ):
        bind(table, Columns())


@pytest.mark.parametrize(
    "template, unknown, close",
    [
        ("images/{imageid}.jpg", "imageid", "image_id"),
        ("{lesion_id}/{image}.jpg", "image", "image_id"),
        ("images/{nothing_like_it}.jpg", "nothing_like_it", None),
    ],
)
def test_a_template_naming_an_unknown_column_is_refused(tmp_path, template, unknown, close):
    table = read_table(str(write_ham(tmp_path, [1])))
    hint = rf"; did you mean '{close}'\?" if close else r"\."
    with pytest.raises(
        SourceError,
        match=rf"--path '{template.replace('{', '[{]').replace('.', '[.]')}' names column "
        rf"'{unknown}', which the file does not have{hint} The file's columns: "
        "lesion_id",
    ):
        bind(table, Columns(key="image_id", label="dx", path=template))


@pytest.mark.parametrize(
    "text, parts",
    [
        ("path", (("path",),)),
        ("images/{image_id}.jpg", ("images/", ("image_id",), ".jpg")),
        ("{a}{b}", (("a",), ("b",))),
        ("x{{y}}/{Patient ID}.png", ("x{y}/", ("Patient ID",), ".png")),
        ("{é}", (("é",),)),
        ("images/{image_id}.{jpg,png,heic}", ("images/", ("image_id",), ".", Choice(("jpg", "png", "heic")))),
        ("{a,b}/{id}.*", (Choice(("a", "b")), "/", ("id",), ".", Choice(()))),
    ],
)
def test_templates_parse(text, parts):
    t = PathTemplate.parse(text)
    assert t.parts == parts and t.bare == (text == "path")


@pytest.mark.parametrize(
    "text, where",
    [
        ("images/{image_id.jpg", "position 7"),
        ("a}b", "position 1"),
        ("a{}b", "position 1"),
        ("{a{b}}", "position 0"),
        ("images/{image_id}*.jpg", "a '\\*' at position 17: '.\\*' ends a template"),
        ("images/{image_id}*", "position 17"),
    ],
)
def test_malformed_templates_are_refused(text, where):
    with pytest.raises(OptionError, match=rf"--path .*{where}"):
        PathTemplate.parse(text)


def test_render_fills_the_columns():
    t = PathTemplate.parse("{site}/{id}-{id}.jpg")
    assert t.fields == ["site", "id"] and t.candidates({"site": "back", "id": "7"}) == ["back/7-7.jpg"]
    t = PathTemplate.parse("{site,other}/{id}.{jpg,png}")
    assert t.fields == ["id"] and t.choices and not PathTemplate.parse("{id}.jpg").choices
    assert t.candidates({"id": "7"}) == ["site/7.jpg", "site/7.png", "other/7.jpg", "other/7.png"]
    assert PathTemplate.parse("i/{id}.*").candidates({"id": "x"}) == ["i/x.*"]


def test_duplicate_and_nameless_header_columns(tmp_path):
    dup = tmp_path / "d.csv"
    dup.write_text("key,path,label,age,age\na,a.jpg,c,1,2\n")
    with pytest.raises(SourceError, match="column\\(s\\) 'age' more than once"):
        read_table(str(dup))
    trailing = tmp_path / "t.csv"
    trailing.write_text("key,path,label,\na,a.jpg,c,\n")  # a trailing comma: an empty nameless column
    assert read_table(str(trailing)).columns == ["key", "path", "label"]
    filled = tmp_path / "f.csv"
    filled.write_text("key,path,label,\na,a.jpg,c,\nb,b.jpg,c,x\n")
    with pytest.raises(SourceError, match="column 4 has no name in the header but holds values \\(line 3\\)"):
        read_table(str(filled))


def test_jsonl_columns_are_the_keys_in_first_seen_order(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"key": "a", "path": "a.jpg", "label": "x", "age": 40}\n\n'
        '{"key": "b", "label": "y", "path": "b.jpg", "site": "back", "age": null}\n'
    )
    t = read_table(str(path))
    assert t.kind == "jsonl" and t.columns == ["key", "path", "label", "age", "site"]
    cols, values = metadata_values(t, bind(t, Columns()).metadata)
    assert [(c.name, c.type) for c in cols] == [("age", "int"), ("site", "string")]
    assert values == [(40, None), (None, "back")]


@pytest.mark.parametrize(
    "values, kind",
    [
        (["45", "-3", "0", None], "int"),
        (["45", "45.0"], "float"),
        (["1e3", ".5", "2."], "float"),
        (["+5"], "float"),
        (["007"], "string"),
        (["02134", "1"], "string"),
        (["00.5"], "string"),
        (["0.5", "-0"], "float"),
        (["-0x1"], "string"),
        (["NaN"], "string"),
        (["inf"], "string"),
        (["1e999"], "string"),
        (["9223372036854775807"], "int"),
        (["9223372036854775808"], "string"),
        (["9007199254740993", "1.5"], "string"),  # a double would hold it as ...992 (issue 32, point 8)
        (["9007199254740992", "18014398509481988", "1.5"], "float"),  # doubles hold these exactly
        (["9007199254740993.0", "1.5"], "float"),  # written as a float: the nearest double, as documented
        (["١٢"], "string"),
        ([None, None], "string"),
        (["male", "45"], "string"),
    ],
)
def test_column_types(values, kind):
    assert column_type(values) == kind


def test_cells_as_text():
    assert [cell_text(v) for v in ("  back ", "", "  ", None, 45, 45.0, True, [1, "a"], {"b": 1, "a": "é"})] == [
        "back",
        None,
        None,
        None,
        "45",
        "45.0",
        "true",
        '[1,"a"]',
        '{"a":"é","b":1}',
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=1))
def test_integers_round_trip(values):
    texts = [cell_text(v) for v in values]
    kind = column_type(texts)
    assert kind == ("int" if any(v is not None for v in values) else "string")
    if kind == "int":
        assert [typed(t, kind) for t in texts] == values


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)), min_size=1))
def test_floats_round_trip(values):
    texts = [cell_text(v) for v in values]  # JSON numbers as Python writes them: 45.0, 1e-07, -0.0
    kind = column_type(texts)
    if any(v is not None for v in values):
        assert kind == "float"
        got = [typed(t, kind) for t in texts]
        assert all(
            (a is None and b is None) or (a == b and math.copysign(1, a) == math.copysign(1, b))
            for a, b in zip(got, values)
        )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(min_size=1)), min_size=1))
def test_strings_keep_their_text_stripped(values):
    texts = [cell_text(v) for v in values]
    kind = column_type(texts)
    for t, v in zip(texts, values):
        assert t == (None if v is None or not v.strip() else v.strip())
        if kind == "string" and t is not None:
            assert typed(t, kind) == t and json.loads(json.dumps(t, ensure_ascii=False)) == t


def test_a_csv_row_with_more_cells_than_the_header_is_refused_naming_its_line(tmp_path):
    from wds_tools.convert import convert

    manifest = write_ham(tmp_path / "ham", [2, 1, 3])
    lines = manifest.read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2] + ", left side"  # e.g. localization written 'back, left side' without quotes
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(
        SourceError,
        match=r"line 3 has 8 cells, but the header has 7 columns: a cell that holds "
        r"the delimiter ',' must be in double quotes",
    ):
        convert(
            manifest,
            version="v1",
            size=8,
            out=tmp_path / "out",
            key="image_id",
            label="dx",
            path="images/{image_id}.jpg",
            workers=1,
            progress=False,
        )
    assert not (tmp_path / "out" / "v1" / "8" / "index.json").exists()
    lines[2] = lines[2].rsplit(",", 3)[0]  # now two cells short
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"line 3 has 5 cells, but the header has 7 columns"):
        convert(
            manifest,
            version="v1",
            size=8,
            out=tmp_path / "out",
            key="image_id",
            label="dx",
            path="images/{image_id}.jpg",
            workers=1,
            progress=False,
        )
    lines[2] = lines[2] + ",,"  # empty cells are missing values: read
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    convert(
        manifest,
        version="v1",
        size=8,
        out=tmp_path / "out",
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        workers=1,
        progress=False,
        max_errors=100,
    )
    assert (tmp_path / "out" / "v1" / "8" / "index.json").exists()


def test_the_unknown_template_column_message_reads_as_a_sentence(tmp_path):
    table = read_table(str(write_ham(tmp_path / "ham", [1])))
    with pytest.raises(SourceError) as e:
        bind(table, Columns(key="image_id", label="dx", path="images/{imageid}.jpg"))
    assert "did you mean 'image_id'?" in str(e.value) and "?." not in str(e.value)


def test_a_semicolon_delimited_csv_gets_a_delimiter_hint_naming_the_file(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("key;path;label\na;a.jpg;cat\n")
    with pytest.raises(
        SourceError,
        match=r"m\.csv: the header 'key;path;label' is one column holding ';'.*"
        r"save it with ',' as the delimiter",
    ):
        read_table(str(path))


# ------------------------------------------------------------------ quotes and line breaks (issue 38, points 1 and 11)


def _ham_with_notes(root, notes: list[str], *, suffix: str = ".csv", raw: dict[int, str] | None = None):
    """A HAM10000-shaped corpus of len(notes) images with a free-text ``notes`` column, written as
    ``suffix`` by stock csv (a .tsv with tabs); ``raw``: rows (1-based) whose notes cell is written
    as given, unquoted, as a hand edit would. Returns the manifest."""
    import csv

    ham = write_ham(root, [1] * len(notes))
    rows = list(csv.reader(ham.open(encoding="utf-8", newline="")))
    ham.unlink()
    path = root / f"HAM10000_metadata{suffix}"
    delimiter = "\t" if suffix == ".tsv" else ","
    lines = []
    for n, (row, note) in enumerate(zip(rows, ["notes", *notes])):
        buf = io.StringIO()
        csv.writer(buf, delimiter=delimiter, lineterminator="\n").writerow([*row, note])
        line = buf.getvalue()
        if raw and n in raw:
            line = delimiter.join([*row, raw[n]]) + "\n"
        lines.append(line)
    path.write_text("".join(lines), encoding="utf-8", newline="")
    return path


def _convert_ham(manifest, out, version="v1"):
    from wds_tools.convert import convert

    return convert(
        manifest,
        version=version,
        size=8,
        out=out,
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        val_fraction=0.0,
        workers=1,
        progress=False,
    )


def _stored_notes(folder) -> dict[str, object]:
    """key -> meta.notes of every sample, read from the tars with stock tarfile."""
    import tarfile

    found = {}
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf:
                if m.name.endswith(".json"):
                    js = json.loads(tf.extractfile(m).read())
                    found[js["key"]] = js["meta"]["notes"]
    return found


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_free_text_quote_left_open_never_swallows_the_rows_after_it(tmp_path, suffix):
    """The issue's manifest: a notes cell opening a quote it never closes ("5 mm, irregular). A .csv
    refuses it naming the line and writes nothing; a .tsv keeps the quote as a character (a row is one
    line) and says so: every row is a sample."""
    manifest = _ham_with_notes(
        tmp_path / "ham", ['"5 mm, irregular', "fine", "fine"], suffix=suffix, raw={1: '"5 mm, irregular'}
    )
    assert manifest.read_text(encoding="utf-8").count("\n") == 4  # the header and three one-line rows
    out = tmp_path / "out"
    if suffix == ".csv":
        with pytest.raises(
            SourceError,
            match=r"line 2: a double quote opens a cell that is never closed, so the rest "
            r"of the file \(lines 2-4\) would be read as that one cell.*Nothing was written",
        ):
            _convert_ham(manifest, out)
        assert not out.exists()
        return
    result = _convert_ham(manifest, out)
    assert result.samples_written == 3
    assert _stored_notes(out / "v1" / "8") == {
        "ISIC_0000000": '"5 mm, irregular',
        "ISIC_0000001": "fine",
        "ISIC_0000002": "fine",
    }
    assert any("line 2 (notes)" in n and "kept as written" in n for n in result.notes), result.notes
    assert read_table(str(manifest)).lines == 4


def test_a_quote_closed_rows_later_is_refused_naming_the_line_it_swallowed(tmp_path):
    """A stray quote on line 2 closed by a cell ending in a quote on line 4 (6" lesion) is valid CSV
    syntax, but lines 3-4 read as rows of their own: refused, naming them, before anything is written."""
    manifest = _ham_with_notes(tmp_path / "ham", ["x", "fine", 'size 6"'], raw={1: '"5 mm, irregular', 3: 'size 6"'})
    with pytest.raises(
        SourceError,
        match=r"line 2: a double quote opens a cell that closes only on line 4.*line 3 reads as a row of its own "
        r"\('HAM_0000001,ISIC_0000001,.*write the manifest as JSON lines",
    ):
        _convert_ham(manifest, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_quoted_cell_with_line_breaks_as_a_spreadsheet_writes_it_is_one_sample_and_said(tmp_path):
    """What Excel exports for a notes cell with line breaks (in quotes, quotes doubled): read, its
    line breaks kept, and the summary says where rows and lines part."""
    notes = ['Pt reports:\n- itching\n- 3 weeks, "worse"', "fine", "two\r\nlines"]
    manifest = _ham_with_notes(tmp_path / "ham", notes)
    assert manifest.read_bytes().count(b"\n") == 7  # "\r\n" is one line break
    result = _convert_ham(manifest, tmp_path / "out")
    assert result.samples_written == 3
    stored = _stored_notes(tmp_path / "out" / "v1" / "8")
    assert [stored[f"ISIC_{n:07d}"] for n in range(3)] == notes
    (note,) = [n for n in result.notes if "rows on" in n]
    assert "3 rows on 7 lines: 2 rows span several lines" in note and "lines 2-4 (notes); lines 6-7 (notes)" in note
    table = read_table(str(manifest))
    assert [line for line, _ in table.records] == [2, 5, 6] and table.spans == [(2, 4, ("notes",)), (6, 7, ("notes",))]


def test_a_csv_cell_going_on_after_its_closing_quote_is_refused(tmp_path):
    manifest = _ham_with_notes(tmp_path / "ham", ["x", "fine"], raw={2: '"6" lesion'})
    with pytest.raises(SourceError, match=r"line 3: malformed quoting \(',' expected after '\"'\)"):
        read_table(str(manifest))


def test_a_tsv_cell_wholly_in_quotes_is_unquoted_and_one_spanning_lines_is_refused_with_the_hint(tmp_path):
    """pandas and spreadsheets quote a .tsv cell that holds a quote or a tab: unquoted. A cell whose
    quotes span lines (a line break in a .tsv cell) is refused at the line that falls short, naming
    the line whose quote was left open."""
    notes = ['said "itchy"', "a\tb", '"quoted"', ""]
    manifest = _ham_with_notes(tmp_path / "ham", notes, suffix=".tsv")
    assert '"said ""itchy"""' in manifest.read_text(encoding="utf-8")
    table = read_table(str(manifest))
    assert [obj["notes"] for _, obj in table.records] == notes and not table.open_quotes and not table.notes()
    text = manifest.read_text(encoding="utf-8").replace('"said ""itchy"""', '"said\nitchy"')
    manifest.write_text(text, encoding="utf-8")
    with pytest.raises(
        SourceError,
        match=r"line 3 has 1 cells, but the header has 8 columns.* Line 2 has a cell "
        r"that opens a double quote its line does not close: a \.tsv row is one line",
    ):
        read_table(str(manifest))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.text(alphabet="ab ,;\t\"\n\r'é", max_size=8), min_size=3, max_size=3), max_size=6))
def test_what_stock_csv_writes_reads_back_cell_for_cell_or_is_refused_naming_a_line(rows):
    """Oracle: Python's csv writer. A .csv reads back every cell it wrote, or (a quoted cell whose lines
    read as rows) is refused naming a line; a .tsv of cells without tabs or line breaks reads back; the
    physical lines are counted."""
    import csv
    import tempfile

    header = ["key", "label", "notes"]
    with tempfile.TemporaryDirectory() as d:
        for suffix, delimiter in ((".csv", ","), (".tsv", "\t")):
            cells = (
                rows
                if suffix == ".csv"
                else [[c.replace("\t", " ").replace("\r", " ").replace("\n", " ") for c in r] for r in rows]
            )
            cells = [r for r in cells if any(r)] if suffix == ".csv" else [r for r in cells if r != ["", "", ""]]
            path = os.path.join(d, f"m{suffix}")
            with open(path, "w", encoding="utf-8", newline="") as f:
                csv.writer(f, delimiter=delimiter).writerows([header, *cells])  # "\r\n": quotes a cell holding "\r"
            try:
                table = read_table(path)
            except SourceError as e:
                assert suffix == ".csv" and "reads as a row of its own" in str(e), e
                continue
            assert [[obj[h] for h in header] for _, obj in table.records] == cells
            with open(path, "rb") as f:  # the physical lines, counted by hand: every line break ends one
                assert table.lines == len(re.findall(rb"\r\n|\r|\n", f.read()))


def test_a_cell_longer_than_pythons_csv_limit_is_read_whole(tmp_path):
    """csv's own limit is 131,072 characters a cell; a long free-text cell (here 200,000) is a cell,
    kept whole in the sample's meta, and csv's limit is left as it was."""
    import csv

    long = "irregular border; " * 11_112
    assert len(long) > 200_000
    limit = csv.field_size_limit()
    for suffix in (".csv", ".tsv"):
        manifest = _ham_with_notes(tmp_path / suffix[1:], [long, "fine"], suffix=suffix)
        result = _convert_ham(manifest, tmp_path / suffix[1:] / "out")
        assert result.samples_written == 2
        assert _stored_notes(tmp_path / suffix[1:] / "out" / "v1" / "8")["ISIC_0000000"] == long.strip()
    assert csv.field_size_limit() == limit
