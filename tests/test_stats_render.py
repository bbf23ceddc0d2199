"""inspect/stats/render.py: the ``stats --by`` table on a real conversion of a manifest with metadata (review
of issues 14/16)."""

from conftest import make_images, write_manifest

from wds_tools.convert import convert
from wds_tools.inspect.stats import compute_stats


def test_by_table_rows_stay_one_line_per_value(tmp_path):
    rows = make_images(tmp_path / "c", 6)
    for i, r in enumerate(rows):
        r["note"] = ["line1\nline2", "tab\there", "plain"][i % 3]
        r["split"] = "train"
    convert(
        write_manifest(tmp_path / "c" / "m.csv", rows, fields=("key", "path", "label", "split", "note")),
        version="v1",
        size=8,
        out=tmp_path / "out",
        workers=1,
        progress=False,
    )
    text = compute_stats(tmp_path / "out" / "v1" / "8", by="note").to_text()
    table = text.split("train by note (string): samples per class\n")[1].split("\n\n")[0].splitlines()
    assert len(table) == 1 + 3, table  # the header and one line per value
    assert all("\t" not in line for line in table), table
    assert any("line1\\nline2" in line for line in table) and any("tab\\there" in line for line in table), table


def test_row_15_class_names_with_a_newline_stay_in_their_row(tmp_path):
    """Issue 22, row 15: a class named "cat\\nnose" broke the class table into two lines."""
    rows = make_images(tmp_path / "c", 6)
    for i, r in enumerate(rows):
        r["label"] = ["cat\nnose", "dog\tx", "plain"][i % 3]
        r["split"] = "train"
    convert(
        write_manifest(tmp_path / "c" / "m.csv", rows),
        version="v1",
        size=8,
        out=tmp_path / "out",
        workers=1,
        progress=False,
    )
    report = compute_stats(tmp_path / "out" / "v1" / "8")
    assert sorted(report.classes) == ["cat\nnose", "dog\tx", "plain"]  # the names themselves are kept
    text = report.to_text()
    table = text.split("  class ")[1].split("\n  class drift")[0].splitlines()
    assert len(table) == 1 + 3, table  # the header and one line per class
    assert any(line.startswith("  cat\\nnose ") for line in table[1:]), table
    assert any(line.startswith("  dog\\tx ") for line in table[1:]), table
    assert "\t" not in text
