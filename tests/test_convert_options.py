"""ConvertOptions: convert()'s options as one object, checked once when made."""

import dataclasses
import inspect

import pytest

from wds_tools.convert import ConvertOptions, convert
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
