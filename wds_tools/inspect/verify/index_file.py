"""index.json against itself: every field present and of its type, shard names confined to the folder,
splits, URL patterns and counts that agree (docs/FORMAT.md, "index.json").

``check_index`` never raises on a damaged index: each missing or wrongly typed field is a ``field``
problem named by its path (``splits.train.urls``), and ``IndexFacts`` holds the values the later
checks may use (None where a field is unusable). ``check_counts`` compares every count in index.json
with the counts taken from samples.npz (or, when the table is unreadable, with the shard list).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...format.index import ERRORS_FILE, SAMPLE_COLUMNS, SAMPLES_FILE, sample_columns
from ...format.meta import MetaColumn
from ...format.names import expand, indexed_name_problem, shard_name, url_pattern
from ...format.sample import MEMBERS, classes_digest, members_of
from .metadata import check_field
from .report import INDEX, Problem

__all__ = ["ShardEntry", "IndexFacts", "check_index", "check_counts", "mean_std", "stats_problems"]

_SPLIT = re.compile(r"[A-Za-z0-9_-]{1,32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
STATS_TOLERANCE = 2e-6  # mean/std are stored rounded to 6 decimals; a float path may differ in the last one


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# type name -> (test, what the message says is expected)
_TYPES = {
    "count": (_count, "a count (an integer >= 0)"),
    "size": (lambda v: _count(v) and v >= 1, "an integer >= 1"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "counts": (lambda v: isinstance(v, list) and all(_count(x) for x in v), "a list of counts"),
    "names": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "rgb": (
        lambda v: isinstance(v, list) and len(v) == 3 and all(_number(x) and 0 <= x <= 1 for x in v),
        "three numbers in [0, 1] (R, G, B)",
    ),
    "sha256": (lambda v: isinstance(v, str) and bool(_SHA256.fullmatch(v)), "64 lowercase hex digits"),
    "name_or_null": (lambda v: v is None or isinstance(v, str), "a file name or null"),
}


def _show(v: object) -> str:
    text = repr(v)
    return (text if len(text) <= 60 else text[:57] + "...") + f" ({type(v).__name__})"


@dataclass
class ShardEntry:
    """One entry of index.json's ``shards``; a field is None where it is missing or mistyped."""

    pos: int
    name: str | None  # None: not a name a reader may open (it is never read)
    split: str | None
    samples: int | None
    bytes: int | None
    sha256: str | None
    raw_name: object = None


@dataclass
class IndexFacts:
    """The fields later checks rely on, as index.json has them, or None where unusable."""

    size: int | None = None
    npy_shape: list | None = None
    classes: list[str] | None = None
    class_counts: list[int] | None = None
    samples: int | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    stats_split: str | None = None
    splits: dict[str, dict] = field(default_factory=dict)  # name -> its usable fields
    shards: list[ShardEntry] = field(default_factory=list)
    samples_name: str | None = SAMPLES_FILE
    samples_bytes: int | None = None
    samples_sha256: str | None = None
    errors_file: str | None = None
    shards_ok: bool = False  # shards is a list whose every entry has a usable name, split and samples
    metadata: list[MetaColumn] | None = field(default_factory=list)  # None: the field is unusable
    group: str | None = None  # build.group, when it names a metadata column
    members: tuple[str, ...] = MEMBERS  # a sample's member extensions, by format_version
    columns: dict[str, str] = field(default_factory=lambda: dict(SAMPLE_COLUMNS))  # samples.npz's, by version
    # the .json fields that name the dataset (version 2), as every sample must have them; None: not checked
    dataset: dict[str, str] | None = None

    @property
    def stats_of(self) -> str:
        """The split mean/std are over, by the format's rule (not by ``stats_split``, which may be wrong)."""
        return "train" if "train" in self.splits else "all"


class _Checker:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, kind: str, message: str, shard: str = INDEX) -> None:
        self.problems.append(Problem(shard, kind, message))

    def get(self, obj: dict, key: str, path: str, kind: str, *, required: bool = True) -> Any:
        """``obj[key]`` when it is of type ``kind``; None (and a ``field`` problem) otherwise."""
        test, expected = _TYPES[kind]
        if key not in obj:
            if required:
                self.problem("field", f"{path} is missing; expected {expected}")
            return None
        value = obj[key]
        if not test(value):
            self.problem("field", f"{path} is {_show(value)}; expected {expected}")
            return None
        return value


def check_index(meta: dict) -> tuple[IndexFacts, list[Problem]]:
    """index.json's fields, their types and their agreement with each other (no file is read)."""
    c = _Checker()
    f = IndexFacts()
    f.size = c.get(meta, "size", "size", "size")
    for key, kind in (
        ("created_by", "text"),
        ("dataset_version", "text"),
        ("resize", "text"),
        ("decode", "object"),
        ("decoder_versions", "object"),
        ("build", "object"),
    ):
        c.get(meta, key, key, kind, required=False)  # provenance: checked when present
    f.members, f.columns = members_of(meta), sample_columns(meta)
    sample = c.get(meta, "sample", "sample", "object")
    if sample is not None:
        if sample.get("members") != list(f.members):
            c.problem(
                "field",
                f"sample.members is {_show(sample.get('members'))}; expected {list(f.members)} "
                f"(format_version {meta.get('format_version')})",
            )
        if sample.get("npy_dtype") != "uint8":
            c.problem("field", f"sample.npy_dtype is {_show(sample.get('npy_dtype'))}; expected 'uint8'")
        shape = sample.get("npy_shape")
        if not (isinstance(shape, list) and len(shape) == 3 and all(_count(x) for x in shape)):
            c.problem("field", f"sample.npy_shape is {_show(shape)}; expected [S, S, 3]")
        else:
            f.npy_shape = shape
            if f.size is not None and shape != [f.size, f.size, 3]:
                c.problem(
                    "image_size",
                    f"sample.npy_shape is {shape}, size is {f.size}: they disagree (expected [{f.size}, {f.size}, 3])",
                )
    f.classes = c.get(meta, "classes", "classes", "names")
    if f.classes is not None:
        seen: dict[str, int] = {}
        for i, name in enumerate(f.classes):
            if name in seen:
                c.problem("field", f"classes[{i}] is {name!r}, the same name as classes[{seen[name]}]")
            seen.setdefault(name, i)
    if meta.get("format_version") != 1:
        digest = c.get(meta, "classes_digest", "classes_digest", "text")
        if digest is not None and f.classes is not None and digest != classes_digest(f.classes):
            c.problem(
                "field",
                f"classes_digest is {digest!r}; the classes' digest is {classes_digest(f.classes)!r} "
                "(FORMAT.md: SHA-256 of the class list as canonical JSON, first 16 hex digits)",
            )
        version = meta.get("dataset_version")
        if digest is not None and isinstance(version, str):
            f.dataset = {"dataset_version": version, "classes_digest": digest}
    f.class_counts = c.get(meta, "class_counts", "class_counts", "counts")
    f.samples = c.get(meta, "samples", "samples", "count")
    f.mean = c.get(meta, "mean", "mean", "rgb")
    f.std = c.get(meta, "std", "std", "rgb")
    f.stats_split = c.get(meta, "stats_split", "stats_split", "text")
    f.metadata, f.group, problems = check_field(meta)
    c.problems += problems
    _check_files(c, f, meta)
    _check_shards(c, f, meta)
    _check_splits(c, f, meta)
    return f, c.problems


def _check_files(c: _Checker, f: IndexFacts, meta: dict) -> None:
    info = c.get(meta, "samples_file", "samples_file", "object")
    if info is not None:
        problem = indexed_name_problem(info.get("name"), shard=False)
        if problem:
            c.problem("shard_name", f"samples_file.name {problem}; it is not read")
            f.samples_name = None
        else:
            f.samples_name = info["name"]
        f.samples_bytes = c.get(info, "bytes", "samples_file.bytes", "count")
        f.samples_sha256 = c.get(info, "sha256", "samples_file.sha256", "sha256")
    if "errors_file" not in meta:
        c.problem("field", f"errors_file is missing; expected null or {ERRORS_FILE!r}")
    elif meta["errors_file"] is not None:
        problem = indexed_name_problem(meta["errors_file"], shard=False)
        if problem:
            c.problem("shard_name", f"errors_file {problem}")
        else:
            f.errors_file = meta["errors_file"]


def _check_shards(c: _Checker, f: IndexFacts, meta: dict) -> None:
    shards = c.get(meta, "shards", "shards", "list")
    names: dict[str, int] = {}
    for i, s in enumerate(shards or []):
        path = f"shards[{i}]"
        if not isinstance(s, dict):
            c.problem("field", f"{path} is {_show(s)}; expected an object {{name, split, samples, bytes, sha256}}")
            f.shards.append(ShardEntry(i, None, None, None, None, None))
            continue
        name = s.get("name")
        problem = indexed_name_problem(name)
        if problem:
            c.problem("shard_name", f"{path}.name {problem}; it is not read")
            name = None
        elif name in names:
            c.problem("field", f"{path}.name {name} is also shards[{names[name]}].name; it is checked once")
            name = None
        else:
            names[name] = i
        entry = ShardEntry(
            i,
            name,
            c.get(s, "split", f"{path}.split", "text"),
            c.get(s, "samples", f"{path}.samples", "count"),
            c.get(s, "bytes", f"{path}.bytes", "count"),
            c.get(s, "sha256", f"{path}.sha256", "sha256"),
            raw_name=s.get("name"),
        )
        if name is not None and entry.split is not None and not name.startswith(entry.split + "-"):
            c.problem(
                "field",
                f"{path}.split is {entry.split!r}, but its name {name} puts it in split {name.rsplit('-', 1)[0]!r}",
            )
            entry.split = name.rsplit("-", 1)[0]  # readers go by the name
        f.shards.append(entry)
    f.shards_ok = shards is not None and all(s.name and s.split and s.samples is not None for s in f.shards)


def _check_splits(c: _Checker, f: IndexFacts, meta: dict) -> None:
    splits = c.get(meta, "splits", "splits", "object")
    if splits is None:
        return
    members: dict[str, list[ShardEntry]] = {}
    for s in f.shards:
        if s.split is not None:
            members.setdefault(s.split, []).append(s)
    for name, sp in splits.items():
        path = f"splits.{name}"
        if not _SPLIT.fullmatch(name):
            c.problem("field", f"splits has a split named {name!r}; expected [A-Za-z0-9_-]{{1,32}}")
            continue
        if not isinstance(sp, dict):
            c.problem("field", f"{path} is {_show(sp)}; expected an object {{samples, shards, urls, ...}}")
            continue
        facts = {
            key: c.get(sp, key, f"{path}.{key}", kind)
            for key, kind in (
                ("samples", "count"),
                ("shards", "count"),
                ("urls", "text"),
                ("class_counts", "counts"),
                ("mean", "rgb"),
                ("std", "rgb"),
            )
        }
        f.splits[name] = facts
        if not f.shards_ok:
            continue  # which shards belong to it is not known: the bad entries are the problems
        own = members.get(name, [])
        if facts["shards"] is not None and facts["shards"] != len(own):
            c.problem("count", f"{path}.shards is {facts['shards']}; shards lists {len(own)} {name} shard(s)")
        if not own:
            c.problem("field", f"{path}: no entry of shards belongs to split {name!r}")
            continue
        want = [shard_name(name, k) for k in range(len(own))]
        have = [s.name if s.name is not None else s.raw_name for s in own]
        if have != want:
            c.problem(
                "field",
                f"the {name} shards in shards are {_names(have)}; expected {_names(want)} (numbered "
                f"from 000000 in order)",
            )
        urls = facts["urls"]
        if urls is not None and urls != url_pattern(name, len(own)):
            try:
                named = expand(urls)
            except Exception:  # noqa: BLE001 - any malformed pattern is the problem reported
                named = None
            what = "is not a brace pattern" if named is None else f"names {len(named)} file(s) ({_names(named)})"
            c.problem(
                "urls",
                f"{path}.urls is {urls!r}, which {what}; the index lists {len(own)} {name} shard(s), "
                f"so expected {url_pattern(name, len(own))!r}",
            )
    for split in sorted(set(members) - set(splits)) if f.shards_ok else ():
        shards = _names([s.name or s.raw_name for s in members[split]])
        c.problem("field", f"splits has no entry {split!r}, the split of {shards}")
    expected = "train" if "train" in splits else "all"
    if f.stats_split is not None and f.stats_split != expected:
        c.problem(
            "field",
            f"stats_split is {f.stats_split!r}; expected {expected!r} (the index has splits "
            f"{', '.join(sorted(splits)) or 'none'})",
        )


def _names(names: list) -> str:
    shown = ", ".join(str(n) for n in names[:3])
    return shown + (f" ... {names[-1]} ({len(names)})" if len(names) > 3 else "")


def check_counts(
    f: IndexFacts,
    rows: int,
    per_shard: np.ndarray | None,
    labels: np.ndarray | None,
    labels_by_split: dict[str, np.ndarray] | None,
    source: str,
) -> list[Problem]:
    """Every count in index.json against the counts ``source`` gives: ``rows`` samples, ``per_shard``
    rows by shard position, ``labels`` samples by class, ``labels_by_split`` the same per split."""
    problems = []

    def bad(message: str) -> None:
        problems.append(Problem(INDEX, "count", message))

    if f.samples is not None and f.samples != rows:
        bad(f"samples is {f.samples:,}; {source} has {rows:,}")
    if per_shard is not None:
        for s in f.shards:
            got = int(per_shard[s.pos]) if s.pos < len(per_shard) else 0
            if s.samples is not None and s.samples != got:
                bad(
                    f"shards[{s.pos}].samples ({s.name or s.raw_name!r}) is {s.samples:,}; {source} has {got:,} "
                    "for this shard"
                )
        for name, sp in f.splits.items() if f.shards_ok else ():
            got = int(sum(per_shard[s.pos] for s in f.shards if s.split == name and s.pos < len(per_shard)))
            if sp["samples"] is not None and sp["samples"] != got:
                bad(f"splits.{name}.samples is {sp['samples']:,}; {source} has {got:,} in its shards")
    if labels is not None:
        problems += [
            Problem(INDEX, "count", m) for m in _count_diff("class_counts", f.class_counts, labels, f.classes, source)
        ]
    for name, sp in f.splits.items() if f.shards_ok else ():
        got = (labels_by_split or {}).get(name)
        if got is not None:
            problems += [
                Problem(INDEX, "count", m)
                for m in _count_diff(f"splits.{name}.class_counts", sp["class_counts"], got, f.classes, source)
            ]
    return problems


def _count_diff(
    path: str, stated: list[int] | None, counted: np.ndarray, classes: list[str] | None, source: str
) -> list[str]:
    if stated is None:
        return []
    if classes is not None and len(stated) != len(classes):
        return [f"{path} has {len(stated)} entries; classes has {len(classes)} names"]
    counted = counted.tolist()
    counted = counted + [0] * (len(stated) - len(counted))
    out = [
        f"{path} counts no label {i} or above; {source} has {sum(counted[len(stated) :]):,} such samples"
        for i in [len(stated)]
        if sum(counted[len(stated) :])
    ]
    for i, (a, b) in enumerate(zip(stated, counted)):
        if a != b:
            name = f" ({classes[i]!r})" if classes is not None else ""
            out.append(f"{path}[{i}]{name} is {a:,}; {source} has {b:,} samples with label {i}")
    return out


def mean_std(count: list[int], s1: list[int], s2: list[int]) -> tuple[list[float], list[float]]:
    """index.json's mean/std from each channel's pixel count, sum and sum of squares: the converter's
    ``histogram_mean_std`` exactly (its histogram products are these integers, exact in float64);
    zeros for a split without pixels, as the converter writes."""
    if not all(count):
        return [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    mean = [float(a) / n for a, n in zip(s1, count)]
    std = [math.sqrt(max(float(b) / n - m * m, 0.0)) for b, n, m in zip(s2, count, mean)]
    return [round(x / 255, 6) for x in mean], [round(x / 255, 6) for x in std]


def stats_problems(
    path: str, mean: list | None, std: list | None, got: tuple[list[float], list[float]], what: str
) -> list[Problem]:
    """``path``.mean/std against the values recomputed from ``what``."""
    problems = []
    for key, stated, value in (("mean", mean, got[0]), ("std", std, got[1])):
        if stated is not None and any(abs(a - b) > STATS_TOLERANCE for a, b in zip(stated, value)):
            problems.append(Problem(INDEX, "pixel_stats", f"{path}{key} is {stated}; {what} give {value}"))
    return problems
