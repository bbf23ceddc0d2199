"""Names: what a shard file is called (``<split>-NNNNNN.tar``), the brace patterns that name several, and
which names an index.json may hold: only files in its own folder (``indexed_name_problem``, checked by
``format.model``), so a reader never opens a file elsewhere because of what an index says (docs/FORMAT.md,
"Layout").
"""

from __future__ import annotations

import re

import braceexpand  # installed with webdataset

from ..errors import OptionError

__all__ = [
    "shard_name",
    "url_pattern",
    "shard_split",
    "expand",
    "unexpanded",
    "indexed_name_problem",
    "MIN_SAMPLE_BYTES",
    "INDEX_FILE",
    "SAMPLES_FILE",
    "ERRORS_FILE",
]

INDEX_FILE = "index.json"
"""A converted folder's index, beside its shards (docs/FORMAT.md, "Layout")."""
SAMPLES_FILE = "samples.npz"
"""A converted folder's per-sample table, beside its shards: the one name ``samples_file.name`` may hold."""
ERRORS_FILE = "errors.jsonl"
"""A converted folder's list of the source files that failed: the one name ``errors_file`` may hold (or null)."""

_SHARD_NAME = re.compile(r"^(?P<split>.+)-(?P<num>\d{6})\.tar$")
# What an index.json may name: files in its own folder (no "/", "..", absolute path), a shard by the
# converter's split rule, another file (samples.npz) without a leading dot.
_INDEXED_SHARD = re.compile(r"[A-Za-z0-9_-]{1,32}-[0-9]{6}\.tar")
_INDEXED_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")


def shard_name(split: str, number: int) -> str:
    """``train``, 3 -> ``train-000003.tar``."""
    return f"{split}-{number:06d}.tar"


def url_pattern(split: str, count: int) -> str:
    """The brace pattern of a split's ``count`` shards (``train-{000000..000041}.tar``)."""
    if count == 1:
        return shard_name(split, 0)
    return f"{split}-{{{0:06d}..{count - 1:06d}}}.tar"


def shard_split(name: str) -> str:
    """The split a shard file belongs to, from its name ``<split>-NNNNNN.tar`` (``all`` for other names)."""
    m = _SHARD_NAME.match(name)
    return m.group("split") if m else "all"


def indexed_name_problem(name: object, *, shard: bool = True) -> str | None:
    """Why an index.json may not name ``name`` (None: it may): every name is a file in the index's own
    folder, a shard ``<split>-NNNNNN.tar``, another file (``shard=False``) a plain name."""
    if isinstance(name, str) and (_INDEXED_SHARD if shard else _INDEXED_FILE).fullmatch(name):
        return None
    return f"is {name!r}; expected {'<split>-NNNNNN.tar' if shard else 'a file name'} in the index's own folder"


# The fewest bytes one sample takes in a shard: its .npy member, a 512-byte tar header and at least one
# 512-byte block of data (docs/FORMAT.md, "Shards"); a shard's ``samples`` is at most its bytes // this.
MIN_SAMPLE_BYTES = 1024
"""The fewest bytes one sample takes in a shard; a shard's ``samples`` is at most its bytes // this."""


_PATTERN_HELP = (
    "a shard pattern is train-{000000..000041}.tar (a range: two dots) or train-{000000,000003}.tar (a list)"
)


def expand(pattern: str) -> list[str]:
    """A webdataset brace pattern (``train-{000000..000041}.tar``) as its list of names; unbalanced braces
    are refused (``OptionError``) naming the brace."""
    try:
        return list(braceexpand.braceexpand(pattern))
    except ValueError:  # braceexpand.UnbalancedBracesError, the one error it raises
        raise OptionError(f"{pattern}: {_unbalanced(pattern)}; {_PATTERN_HELP}") from None


def _unbalanced(pattern: str) -> str:
    """Which brace of ``pattern`` has no partner (braceexpand's error names none)."""
    opened: list[int] = []
    for i, ch in enumerate(pattern):
        if ch == "{":
            opened.append(i)
        elif ch == "}":
            if not opened:
                return f"the '}}' at position {i} closes no '{{'"
            opened.pop()
    return f"the '{{' at position {opened[0]} is never closed" if opened else "unbalanced braces"


def unexpanded(pattern: str, names: list[str]) -> str | None:
    """Why a pattern's names still hold braces (braceexpand leaves a brace group it cannot read, such as
    ``{000000...000006}``, as it is), for a refusal; None when every brace was expanded."""
    left = next((n for n in names if "{" in n or "}" in n), None)
    if left is None:
        return None
    start = left.find("{")
    group = left[start : left.find("}", start) + 1] if start >= 0 else left
    return (
        f"{pattern}: the braces {group} were not expanded, so the pattern would name the one file {left}; "
        f"{_PATTERN_HELP}"
    )
