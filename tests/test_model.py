"""format.model: index.json typed, and its one validator, on indexes the converter wrote and then damaged."""

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.errors import IndexFormatError
from wds_tools.format.meta import MetaColumn
from wds_tools.format.model import load_json, parse, salvage, validate

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def ham_set(tmp_path_factory) -> Path:
    """A HAM-shaped set converted with --group lesion_id (metadata, build, two splits)."""
    from conftest import write_ham

    from wds_tools.convert import convert

    root = tmp_path_factory.mktemp("model")
    convert(
        write_ham(root / "c", [3, 1, 2, 4, 1, 1, 2, 3]),
        version="v1",
        size=16,
        out=root / "out",
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        group="lesion_id",
        val_fraction=0.3,
        shard_size=4,
        workers=1,
        progress=False,
    )
    return root / "out" / "v1" / "16"


@pytest.fixture(scope="module")
def ham(ham_set) -> dict:
    """index.json of ``ham_set``."""
    return json.loads((ham_set / "index.json").read_text())


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_golden_indexes_of_every_version_are_valid_and_typed_as_written(version):
    raw = json.loads((GOLDEN / f"format-v{version}" / "index.json").read_text())
    assert list(validate(raw)) == []
    info = parse(raw, "golden")
    assert info.raw is raw and info.format_version == version
    assert info.size == raw["size"] == 8 and info.sample.npy_shape == (8, 8, 3)
    assert info.members == (("cls", "json", "npy") if version == 1 else ("cls", "i32", "json", "npy"))
    assert list(info.classes) == raw["classes"] and list(info.class_counts) == raw["class_counts"]
    assert [(s.pos, s.name, s.split, s.samples, s.bytes, s.sha256) for s in info.shards] == [
        (i, s["name"], s["split"], s["samples"], s["bytes"], s["sha256"]) for i, s in enumerate(raw["shards"])
    ]
    for name, sp in raw["splits"].items():
        got = info.splits[name]
        assert (got.samples, got.shards, got.urls, list(got.mean), list(got.std)) == (
            sp["samples"],
            sp["shards"],
            sp["urls"],
            sp["mean"],
            sp["std"],
        )
    assert info.samples_file.name == "samples.npz" and info.samples_file.bytes == raw["samples_file"]["bytes"]
    assert info.errors_file is None and info.dataset_version == "v1"
    assert info.classes_digest == (None if version == 1 else "ba8ca6e007eea18d")
    assert info.phash_flat_rules == (2 if version == 3 else None)
    assert info.decode is not None and info.decode.colour == ("srgb" if version == 3 else "raw")  # absent: raw
    if version == 1:
        assert info.metadata == () and info.group is None
    else:
        assert info.metadata[0] == MetaColumn("lesion", "string") and info.group == "lesion"
        assert info.build is not None and info.build.stratify is True and info.build.columns["label"] == "dx"


def test_a_converted_index_is_valid(ham):
    assert list(validate(ham)) == []
    info = parse(ham, "ham")
    assert info.group == "lesion_id" and info.classes == ("bcc", "bkl", "mel", "nv")
    assert [(c.name, c.type) for c in info.metadata] == [(m["name"], m["type"]) for m in ham["metadata"]]
    assert sum(s.samples for s in info.shards) == info.samples == sum(ham["class_counts"])


def _at(raw: dict, path: str):
    """The parent object and key of ``path`` (``splits.train.urls``, ``shards[1].name``) in ``raw``."""
    keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]
    obj = raw
    for k in keys[:-1]:
        obj = obj[k]
    return obj, keys[-1]


def _damaged(raw: dict, path: str, value) -> dict:
    raw = copy.deepcopy(raw)
    obj, key = _at(raw, path)
    if value is DELETE:
        del obj[key]
    else:
        obj[key] = value
    return raw


DELETE = object()
# (path, new value or DELETE, expected (path, kind) of a problem, its message): one damage of each kind
DAMAGE = [
    ("size", "16", ("size", "field"), r"^size is '16' \(str\); expected an integer >= 1$"),
    ("classes", DELETE, ("classes", "field"), r"^classes is missing; expected a list of strings$"),
    ("classes[3]", "bcc", ("classes[3]", "field"), r"^classes\[3\] is 'bcc', the same name as classes\[0\]$"),
    ("classes_digest", "0" * 16, ("classes_digest", "field"), r"^classes_digest is '0{16}'; the classes' digest"),
    ("mean", [0.5, 0.5], ("mean", "field"), r"^mean is \[0\.5, 0\.5\] \(list\); expected three numbers in \[0, 1\]"),
    ("sample.npy_shape", [8, 8, 3], ("sample.npy_shape", "image_size"), r"^sample\.npy_shape is \[8, 8, 3\], size"),
    ("sample.members", ["cls", "npy"], ("sample.members", "field"), r"^sample\.members is \['cls', 'npy'\]"),
    ("stats_split", "all", ("stats_split", "field"), r"^stats_split is 'all'; expected 'train'"),
    ("shards[1].name", "../x.tar", ("shards[1].name", "shard_name"), r"^shards\[1\]\.name is '\.\./x\.tar'; expected"),
    ("samples_file.name", "/etc/x", ("samples_file.name", "shard_name"), r"^samples_file\.name is '/etc/x'"),
    ("errors_file", "../e.jsonl", ("errors_file", "shard_name"), r"^errors_file is '\.\./e\.jsonl'"),
    ("shards[0].split", "val", ("shards[0].split", "field"), r"^shards\[0\]\.split is 'val', but its name"),
    ("shards[0].sha256", "ABC", ("shards[0].sha256", "field"), r"expected 64 lowercase hex digits$"),
    ("shards[0].samples", 10**6, ("shards[0].samples", "count"), r"^shards\[0\]\.samples is 1,000,000, but a shard "),
    ("splits.train.shards", 9, ("splits.train.shards", "count"), r"^splits\.train\.shards is 9; shards lists \d+"),
    ("splits.val.urls", "val-{000000..000009}.tar", ("splits.val.urls", "urls"), r"names 10 file\(s\)"),
    ("splits.val.urls", "val-{0", ("splits.val.urls", "urls"), r"which is not a brace pattern; the index lists"),
    ("metadata[1].type", "date", ("metadata[1]", "field"), r"^metadata\[1\] is .*; expected \{name: a non-empty"),
    ("build.group", "nope", ("build.group", "field"), r"^build\.group is 'nope', which is not a column of metadata$"),
    ("build.stratify", "yes", ("build.stratify", "field"), r"^build\.stratify is 'yes' \(str\); expected true or"),
    ("decode.max_pixels", 0, ("decode.max_pixels", "field"), r"^decode\.max_pixels is 0 \(int\); expected an int"),
    ("decoder_versions", {"pillow": 11}, ("decoder_versions", "field"), r"expected an object of strings$"),
    ("phash_flat_rules", "2", ("phash_flat_rules", "field"), r"^phash_flat_rules is '2' \(str\); expected a count"),
    ("format_version", 4, ("format_version", "field"), r"has format_version 4; this wds-tools reads versions 1, 2"),
    # FORMAT.md names the two files: another plain name in the folder is not one of them
    (
        "samples_file.name",
        "other.npz",
        ("samples_file.name", "field"),
        r"^samples_file\.name is 'other\.npz'; expected "
        r"'samples\.npz'$",
    ),
    (
        "errors_file",
        "failed.jsonl",
        ("errors_file", "field"),
        r"^errors_file is 'failed\.jsonl'; expected null or "
        r"'errors\.jsonl'$",
    ),
    # build's fields are typed as FORMAT.md states them
    ("build.seed", "0", ("build.seed", "field"), r"^build\.seed is '0' \(str\); expected an integer$"),
    (
        "build.val_fraction",
        1.5,
        ("build.val_fraction", "field"),
        r"^build\.val_fraction is 1\.5 \(float\); expected a "
        r"number in \[0, 1\]$",
    ),
    (
        "build.shard_size",
        0,
        ("build.shard_size", "field"),
        r"^build\.shard_size is 0 \(int\); expected an integer >= 1",
    ),
    ("build.sanitize_keys", 1, ("build.sanitize_keys", "field"), r"^build\.sanitize_keys is 1 \(int\); expected true"),
    ("build.source.rows", -1, ("build.source.rows", "field"), r"^build\.source\.rows is -1 \(int\); expected a count"),
    ("build.source.digest", "x", ("build.source.digest", "field"), r"expected 64 lowercase hex digits$"),
    (
        "build.source_path",
        None,
        ("build.source_path", "field"),
        r"^build\.source_path is None \(NoneType\); expected a",
    ),
]


@pytest.mark.parametrize(
    "path, value, where, pattern",
    DAMAGE,
    ids=[f"{d[0]}={'deleted' if d[1] is DELETE else repr(d[1])}"[:40] for d in DAMAGE],
)
def test_each_damage_is_a_problem_named_by_its_field(ham, path, value, where, pattern):
    raw = _damaged(ham, path, value)
    problems = list(validate(raw))
    hits = [p for p in problems if (p.path, p.kind) == where and re.search(pattern, p.message)]
    assert hits, problems
    if path == "format_version":  # refused before any other field is looked at
        for read in (lambda: parse(raw, "X/index.json"), lambda: load_json(json.dumps(raw), "X/index.json")):
            with pytest.raises(IndexFormatError, match=r"^X/index\.json has format_version 4; this wds-tools reads"):
                read()
        return
    with pytest.raises(IndexFormatError, match=r"^X/index\.json: .*; the index is damaged or was edited") as e:
        parse(raw, "X/index.json")
    assert problems[0].message in str(e.value)  # the readers raise the first problem, whole


def test_salvage_keeps_what_is_usable(ham):
    raw = _damaged(ham, "shards[1].sha256", 12)
    raw = _damaged(raw, "shards[2].name", "../x.tar")
    raw = _damaged(raw, "splits.val.urls", None)
    raw = _damaged(raw, "size", "16")
    part, problems = salvage(raw)
    assert {p.path for p in problems} >= {"shards[1].sha256", "shards[2].name", "splits.val.urls", "size"}
    assert part.size is None and part.classes == tuple(ham["classes"])
    assert part.shards[1] is None and part.shard_names[1] == ham["shards"][1]["name"]  # read, not compared
    assert part.shards[2] is None and part.shard_names[2] is None  # never opened
    assert part.shards[0] is not None and part.shards[0].name == ham["shards"][0]["name"]
    assert part.splits["val"] is None and part.splits["train"] is not None
    assert not part.shards_ok  # an entry without a usable name: which shards a split has is not known


def _paths(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, f"{prefix}[{i}]")
    if prefix:
        yield prefix


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**19) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_damage_is_a_list_of_problems_never_a_traceback(ham, data):
    """Any values (or deletions) anywhere: validate lists problems, parse raises IndexFormatError exactly when
    it lists one (never another exception), salvage lists the same ones."""
    raw = copy.deepcopy(ham)
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(sorted(_paths(raw)) or ["size"]))
        try:
            obj, key = _at(raw, path)
            if data.draw(st.booleans()) and isinstance(obj, dict):
                del obj[key]
            else:
                obj[key] = data.draw(_JSON)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced the parent
    problems = list(validate(raw))
    assert all(p.path and p.kind and p.message for p in problems)
    try:
        parse(raw, "X")
    except IndexFormatError as e:
        assert problems and problems[0].message.removeprefix("index.json ") in str(e)
    else:
        assert not problems
    if not [p for p in problems if p.path in ("format", "format_version")]:
        assert salvage(raw)[1] == problems


def _kind(v) -> str:
    return (
        "null"
        if v is None
        else "bool"
        if isinstance(v, bool)
        else "number"
        if isinstance(v, (int, float))
        else {
            str: "string",
            list: "list",
            dict: "object",
        }[type(v)]
    )


_OTHER = {
    "null": None,
    "bool": True,
    "number": 7,
    "string": "x",
    "list": [],
    "object": {},
}
# fields a value of another JSON type may stand in (null, or not typed by the model: kept as written)
_FREE = re.compile(r"^(errors_file|build\.(group|base|split_base|columns\.\w+)|decode\.colour)$")


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_value_of_another_type_in_any_typed_field_is_a_problem_of_that_field(ham, data):
    """Each leaf (and each list or object) of a converted index, replaced by a value of another JSON type: a
    problem whose path is that field or holds it (``classes`` for ``classes[2]``)."""
    paths = [p for p in _paths(ham) if not _FREE.match(p)]
    path = data.draw(st.sampled_from(sorted(paths)))
    obj, key = _at(copy.deepcopy(ham), path)
    kind = _kind(obj[key])
    other = data.draw(st.sampled_from([k for k in _OTHER if k != kind]))
    raw = _damaged(ham, path, _OTHER[other])
    problems = list(validate(raw))
    assert any(path.startswith(p.path) or p.path.startswith(path) for p in problems), (path, other, problems)


def test_the_converters_build_fields_are_typed(ham):
    build = parse(ham, "ham").build
    assert build is not None and build.source is not None
    raw = ham["build"]
    assert (build.shard_size, build.seed, build.val_fraction, build.sanitize_keys, build.source_path) == (
        raw["shard_size"],
        raw["seed"],
        raw["val_fraction"],
        raw["sanitize_keys"],
        raw["source_path"],
    )
    assert (build.source.kind, build.source.rows, build.source.digest) == (
        "csv",
        raw["source"]["rows"],
        raw["source"]["digest"],
    )


def _doc_fields(which: str) -> list[str]:
    """The fields FORMAT.md's index.json section lists after "Required:" or "Optional:"."""
    text = (Path(__file__).parents[1] / "docs" / "FORMAT.md").read_text()
    section = text.split("## index.json", 1)[1].split("\n## ", 1)[0]
    line = re.search(rf"^{which}: (.+?)\.$", section, re.M | re.S)
    assert line, f"FORMAT.md's index.json section has no {which}: list"
    return re.findall(r"`(\w+)`", line.group(1))


def test_the_fields_format_md_calls_optional_are_those_a_reader_takes_absent(ham):
    """Each top-level field of a converted index removed: a problem of that field exactly when FORMAT.md lists it
    as required (classes_digest: from version 2 on, which this index is); the two lists name every field of the
    table."""
    required, optional = _doc_fields("Required"), _doc_fields("Optional")
    text = (Path(__file__).parents[1] / "docs" / "FORMAT.md").read_text().split("## index.json", 1)[1]
    table = {
        f for row in re.findall(r"^\| (`.+?) \|", text.split("\n## ", 1)[0], re.M) for f in re.findall(r"`(\w+)`", row)
    }
    assert set(required) | set(optional) == table and not set(required) & set(optional)
    for field in sorted(ham):
        problems = [p for p in validate(_damaged(ham, field, DELETE)) if re.match(rf"{field}\b(?!_)", p.path)]
        assert bool(problems) == (field in required), (field, problems)  # (not: a field checked against it)
    assert set(ham) >= set(required)


def test_every_reader_refuses_the_first_problem_verify_reports(ham_set, tmp_path):
    """An index the converter wrote, its val URL pattern then edited: load_index, open_index, resolve (the
    loader's and stats' shard lists), stats and diff refuse it naming the field; verify reports it, with
    the shards still checked."""
    from wds_tools.dataset.resolve import resolve
    from wds_tools.format.index import load_index, open_index
    from wds_tools.inspect.diff import diff_versions
    from wds_tools.inspect.stats import compute_stats
    from wds_tools.inspect.verify import verify

    folder = shutil.copytree(ham_set, tmp_path / "set")
    meta = json.loads((folder / "index.json").read_text())
    meta["splits"]["val"]["urls"] = "val-{000000..000009}.tar"
    (folder / "index.json").write_text(json.dumps(meta))
    named = r"index\.json: splits\.val\.urls is 'val-\{000000\.\.000009\}\.tar', which names 10 file\(s\)"
    for read in (
        lambda: load_index(folder),
        lambda: open_index(folder),
        lambda: resolve(folder),
        lambda: resolve(folder / "index.json", split="train"),
        lambda: compute_stats(folder),
        lambda: diff_versions(ham_set, folder),
    ):
        with pytest.raises(IndexFormatError, match=named + r".*; the index is damaged or was edited"):
            read()
    report = verify(folder, quick=True)
    assert [p.kind for p in report.problems] == ["urls"] and report.shards == len(meta["shards"])
