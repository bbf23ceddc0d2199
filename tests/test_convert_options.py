"""ConvertOptions: convert()'s options as one object, checked once when made."""

import dataclasses
import inspect
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import make_images, write_manifest

import wds_tools.convert
from wds_tools.cli import cli
from wds_tools.convert import ConvertOptions, convert
from wds_tools.convert.decode import DecodeSettings
from wds_tools.convert.options import declared
from wds_tools.convert.outfolder import spec
from wds_tools.convert.source import read_source
from wds_tools.errors import OptionError


def test_convert_takes_exactly_the_options_keywords_and_defaults():
    params = inspect.signature(convert).parameters
    keywords = {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    fields = {f.name: f.default for f in dataclasses.fields(ConvertOptions) if f.init}
    assert list(keywords) == list(fields)
    missing = {n for n, d in fields.items() if d is dataclasses.MISSING}
    assert missing == {"version", "size"} == {n for n, d in keywords.items() if d is inspect.Parameter.empty}
    assert {n: d for n, d in keywords.items() if n not in missing} == {
        n: d for n, d in fields.items() if n not in missing
    }


def test_parsed_forms_are_filled_once():
    opts = ConvertOptions(
        version="v1", size="224,384,224", shard_size=100, max_errors="5", workers=3, key="image_id", group="lesion"
    )
    assert opts.sides == (384, 224)
    assert opts.shard_samples == ((384, 100), (224, 100)) and opts.samples_per_shard(224) == 100
    assert opts.max_errors_rule == ("count", 5)
    assert (opts.columns.key, opts.columns.group) == ("image_id", "lesion")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 1  # type: ignore[misc]


def test_workers_default_to_the_usable_cpus_locally_only():
    assert ConvertOptions(version="v1", size=8).workers >= 1
    assert ConvertOptions(version="v1", size=8, executor="ray").workers is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"version": "v 1"}, "--version 'v 1'"),
        ({"size": 4}, "--size 4"),
        ({"resize": "stretch"}, "--resize 'stretch'"),
        ({"executor": "spark"}, "--executor 'spark'"),
        ({"workers": 0}, "--workers 0"),
        ({"shard_size": "lots"}, "--shard-size 'lots'"),
        ({"max_errors": "many"}, "--max-errors 'many'"),
        # the first bad option is the one reported, in the order the CLI checks them
        ({"version": "v 1", "size": 4, "workers": 0}, "--version 'v 1'"),
        ({"size": 4, "resize": "stretch"}, "--size 4"),
    ],
)
def test_each_bad_option_is_refused_with_its_name(kwargs, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(")):
        ConvertOptions(**{"version": "v1", "size": 8, **kwargs})


# --- each option declared once: every place it reaches is held to the declaration ---------------------------------

# a value other than the default for each declared option: (command-line arguments, the value convert() takes)
OTHER = {
    "version": (["--version", "v2"], "v2"),
    "size": (["--size", "16,8"], "16,8"),
    "out": (["--out", "elsewhere"], "elsewhere"),
    "workers": (["--workers", "2"], 2),
    "shard_size": (["--shard-size", "1MB"], "1MB"),
    "resize": (["--resize", "pad"], "pad"),
    "val_fraction": (["--val-fraction", "0.25"], 0.25),
    "seed": (["--seed", "7"], 7),
    "key": (["--key", "k2"], "k2"),
    "label": (["--label", "l2"], "l2"),
    "path": (["--path", "p2"], "p2"),
    "split": (["--split", "s"], "s"),
    "group": (["--group", "g"], "g"),
    "dedup": (["--dedup"], True),
    "stratify": (["--stratify"], True),
    "resplit": (["--resplit"], True),
    "sanitize_keys": (["--sanitize-keys"], True),
    "max_errors": (["--max-errors", "5"], "5"),
    "base": (["--from", "v0"], "v0"),
    "reuse": (["--no-reuse"], False),
    "checksum": (["--checksum"], True),
    "dry_run": (["--dry-run"], True),
    "executor": (["--executor", "ray"], "ray"),
    "ray_address": (["--ray-address", "auto"], "auto"),
    "decode": (["--colour", "raw"], DecodeSettings(colour="raw")),
    "progress": (["-q"], False),
}
REQUIRED = {"version": "v1", "size": "8"}  # as the command line gives them


def test_every_declared_option_has_a_value_here():
    assert list(OTHER) == list(declared())


def test_convert_documents_each_option_once_in_declaration_order():
    args = convert.__doc__.split("Args:")[1].split("Returns:")[0]
    assert re.findall(r"^ {8}(\w+):", args, re.M) == ["source", *declared()]


def _given_to_the_pipeline(monkeypatch, tmp_path, args: list[str], config: str = "") -> ConvertOptions | str:
    """The options ``wds-tools convert`` hands the pipeline for ``args`` (with ``config`` as wds-tools.toml's
    [convert] table), or its output when it refuses them."""
    seen = []
    monkeypatch.setattr(wds_tools.convert, "convert_with", lambda source, opts: seen.append(opts) or SystemExit(0))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wds-tools.toml").write_text(f"[convert]\n{config}")
    given = {"--version": "v1", "--size": "8"}
    for a in args:
        given.pop(a, None)
    res = CliRunner().invoke(cli, ["convert", "--source", "m.csv", *args, *[x for kv in given.items() for x in kv]])
    return seen[0] if seen else res.output


@pytest.mark.parametrize("name", list(OTHER))
def test_the_command_line_and_wds_tools_toml_give_convert_the_same_options(monkeypatch, tmp_path, name):
    """Each option's flag reaches ``ConvertOptions`` as the library keyword would; so does its wds-tools.toml key,
    where the declaration lets the file set it (else the key is refused, naming the flag)."""
    args, value = OTHER[name]
    expected = ConvertOptions(**{**REQUIRED, "progress": True, name: value})
    assert _given_to_the_pipeline(monkeypatch, tmp_path, args) == expected
    o = declared()[name]
    if o.flag is None or name in REQUIRED:
        return
    key = o.spelled(name)[2:]
    config = f"{key} = true\n" if len(args) == 1 else f"{key} = {json.dumps(args[1])}\n"
    from_file = _given_to_the_pipeline(monkeypatch, tmp_path, [], config)
    if o.config:
        assert from_file == expected
    else:
        assert f"[convert] {key!r} is not taken from wds-tools.toml: give {args[0]}" in from_file


def test_an_option_that_decides_the_bytes_changes_the_spec_and_no_other_does(tmp_path):
    """outfolder.spec (index.json's record; a folder made with another one is refused) changes with each option
    declared ``spec`` and with none other."""
    rows = make_images(tmp_path, 6)
    for i, r in enumerate(rows):
        r.update(k2=f"b{i}", l2="xy"[i % 2], p2=r["path"], s="train", g=f"G{i // 2}")
    write_manifest(tmp_path / "m.csv", rows, ("key", "path", "label", "k2", "l2", "p2", "s", "g"))

    def spec_of(**kw) -> dict:
        opts = ConvertOptions(**{**REQUIRED, **kw})
        return spec(read_source(tmp_path / "m.csv", opts), opts, opts.sides[0])

    plain = spec_of()
    changed = {name for name, (_, value) in OTHER.items() if spec_of(**{name: value}) != plain}
    assert changed == {name for name, o in declared().items() if o.spec}
    # and, not from the declaration: what docs/FORMAT.md says index.json records of a conversion (dataset_version,
    # size, resize, decode, build's shard_size, seed, val_fraction, columns, group, dedup, stratify, sanitize_keys)
    assert changed == {
        "version", "size", "resize", "decode", "shard_size", "seed", "val_fraction", "key", "label", "path",
        "split", "group", "dedup", "stratify", "sanitize_keys",
    }  # fmt: skip


def test_out_naming_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OptionError, match=r"--out .*f.\)?: is a file; expected a folder"):
        ConvertOptions(version="v1", size=8, out=tmp_path / "f")


def test_numpy_values_are_kept_as_plain_python_and_other_kinds_refused_by_name():
    """A value from a numpy computation is kept as the plain type index.json records (json cannot write numpy's);
    a bool where a number is meant, a string from Python or a float seed is refused, naming the option."""
    opts = ConvertOptions(
        version="v1", size=8, seed=np.int64(7), workers=np.int32(2), val_fraction=np.float64(0.25), dedup=np.bool_(1)
    )
    kept = (opts.seed, opts.workers, opts.val_fraction, opts.dedup)
    assert kept == (7, 2, 0.25, True) and [type(v) for v in kept] == [int, int, float, bool]
    for name, value in [("seed", True), ("seed", "7"), ("seed", 1.5), ("workers", True), ("val_fraction", True)]:
        with pytest.raises(OptionError, match=f"--{name.replace('_', '-')} {value!r}: expected"):
            ConvertOptions(version="v1", size=8, **{name: value})
    with pytest.raises(OptionError, match="--stratify 1: expected True or False"):
        ConvertOptions(version="v1", size=8, stratify=1)


def test_wds_tools_toml_may_give_sizes_as_a_list_and_a_shard_size_as_a_number(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(wds_tools.convert, "convert_with", lambda source, opts: seen.append(opts))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wds-tools.toml").write_text("[convert]\nsize = [16, 384]\nshard-size = 2000\n")
    res = CliRunner().invoke(cli, ["convert", "--source", "m.csv", "--version", "v1"])
    assert seen, res.output
    assert seen[0].sides == (384, 16) and seen[0].shard_samples == ((384, 2000), (16, 2000))
