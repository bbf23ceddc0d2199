"""index.json as typed values, and the one validator of it (docs/FORMAT.md, "index.json").

``validate`` yields every problem, each named by its field path (``splits.train.urls``); ``parse``
raises the first (the readers), ``salvage`` keeps what is usable despite them (``wds-tools verify``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..errors import IndexFormatError
from .meta import META_TYPES, MetaColumn
from .names import (
    ERRORS_FILE,
    MIN_SAMPLE_BYTES,
    SAMPLES_FILE,
    expand,
    indexed_name_problem,
    shard_name,
    url_pattern,
)
from .sample import MEMBERS, MEMBERS_V1, classes_digest

__all__ = [
    "FORMAT_NAME",
    "READABLE_VERSIONS",
    "Problem",
    "SampleSpec",
    "SplitInfo",
    "ShardInfo",
    "SamplesFile",
    "BuildInfo",
    "SourceInfo",
    "DecodeInfo",
    "IndexMeta",
    "Partial",
    "load_json",
    "validate",
    "salvage",
    "parse",
]

FORMAT_NAME = "wds-tools-index"
"""index.json's ``format``."""
READABLE_VERSIONS = (1, 2, 3)
"""The index format versions every reader reads."""

RGB = tuple[float, float, float]
_SPLIT = re.compile(r"[A-Za-z0-9_-]{1,32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with index.json: the field (``shards[3].bytes``), its kind (``wds-tools verify``'s
    ``PROBLEM_KINDS``: field, shard_name, count, urls, image_size) and what is wrong, as a sentence."""

    path: str
    kind: str
    message: str


@dataclass(frozen=True)
class SampleSpec:
    """``sample``: a sample's tar members, in file order, and its .npy array."""

    members: tuple[str, ...]
    npy_dtype: str
    npy_shape: tuple[int, int, int]


@dataclass(frozen=True)
class SplitInfo:
    """One entry of ``splits``."""

    name: str
    samples: int
    shards: int
    urls: str  # brace pattern, relative to the index's folder
    class_counts: tuple[int, ...]
    mean: RGB
    std: RGB


@dataclass(frozen=True)
class ShardInfo:
    """One entry of ``shards``; ``pos`` is its position there (samples.npz's ``shard`` column)."""

    pos: int
    name: str
    split: str
    samples: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class SamplesFile:
    """``samples_file``: samples.npz's name, size and SHA-256."""

    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class SourceInfo:
    """``build.source``: what was converted (each field None where absent)."""

    kind: str | None  # csv, jsonl or image-folder
    rows: int | None  # failed rows included
    digest: str | None


@dataclass(frozen=True)
class BuildInfo:
    """``build``, typed (each field None where absent); ``raw`` as written, for what compares it whole."""

    raw: Mapping[str, Any]
    group: str | None  # --group
    stratify: bool
    dedup: int | None  # --dedup's threshold in bits
    split_base: str | None
    base: str | None  # the version whose pixels were copied
    columns: Mapping[str, str | None] | None  # --key, --label, --path, --split when not their defaults
    shard_size: int | None
    seed: int | None
    val_fraction: float | None
    sanitize_keys: bool | None
    source: SourceInfo | None
    source_path: str | None


@dataclass(frozen=True)
class DecodeInfo:
    """``decode``: how the pixels were made (docs/FORMAT.md, Pixels); ``raw`` as written."""

    raw: Mapping[str, Any]
    draft: bool
    filter: str
    alpha_background: tuple[int, int, int]
    pad_fill: tuple[int, int, int]
    max_pixels: int
    colour: str  # "raw" where absent: made before ICC profiles were applied


@dataclass(frozen=True)
class IndexMeta:
    """A valid index.json (``parse``). ``raw`` is the JSON as written, for what compares or copies it whole."""

    raw: dict[str, Any]  # as written: do not change it
    format_version: int
    size: int
    sample: SampleSpec
    classes: tuple[str, ...]
    class_counts: tuple[int, ...]
    samples: int
    mean: RGB
    std: RGB
    stats_split: str
    splits: Mapping[str, SplitInfo]
    shards: tuple[ShardInfo, ...]
    samples_file: SamplesFile
    errors_file: str | None
    metadata: tuple[MetaColumn, ...]  # () for an index without metadata (every version 1 index)
    classes_digest: str | None  # None in version 1
    dataset_version: str | None
    created_by: str | None
    resize: str | None
    decode: DecodeInfo | None
    decoder_versions: Mapping[str, str] | None
    build: BuildInfo | None
    phash_flat_rules: int | None  # absent from tables written before it was recorded

    @property
    def members(self) -> tuple[str, ...]:
        """A sample's member extensions, in file order."""
        return self.sample.members

    @property
    def group(self) -> str | None:
        """``build.group``: the metadata column splits were drawn by."""
        return self.build.group if self.build is not None else None

    def split_shards(self, split: str) -> tuple[ShardInfo, ...]:
        """The shards of one split, in index order."""
        return tuple(s for s in self.shards if s.split == split)


@dataclass(frozen=True)
class Partial:
    """index.json as far as it is usable despite its problems (``salvage``): a field is None where a
    problem makes it unusable, a split or shard entry None where any of its fields is."""

    raw: dict[str, Any]
    format_version: int
    size: int | None
    sample: SampleSpec | None
    classes: tuple[str, ...] | None
    class_counts: tuple[int, ...] | None
    samples: int | None
    mean: RGB | None
    std: RGB | None
    stats_split: str | None
    splits: Mapping[str, SplitInfo | None]  # by each name a split may have
    shards: tuple[ShardInfo | None, ...]
    shard_names: tuple[str | None, ...]  # each entry's name where a reader may open it (also of a bad entry)
    shards_ok: bool  # a list whose every entry is usable: which shards a split has is known
    samples_name: str | None  # samples_file.name, where a reader may open it
    samples_file: SamplesFile | None
    errors_file: str | None
    metadata: tuple[MetaColumn, ...] | None
    group: str | None  # build.group, where it names a metadata column
    classes_digest: str | None
    dataset_version: str | None

    @property
    def members(self) -> tuple[str, ...]:
        """A sample's member extensions, in file order, by ``format_version``."""
        return MEMBERS_V1 if self.format_version == 1 else MEMBERS

    @property
    def stats_of(self) -> str:
        """The split the top-level mean/std are over, by the format's rule (not by ``stats_split``)."""
        return "train" if "train" in self.splits else "all"


# ------------------------------------------------------------------ reading


def load_json(data: bytes | str, where: str | os.PathLike) -> dict:
    """index.json's bytes as its dict, refused (``IndexFormatError``) unless a wds-tools index of a version
    this code reads; the other fields are not looked at (``parse``, ``salvage``)."""
    try:
        raw = json.loads(data)
    except ValueError as e:
        raise IndexFormatError(f"cannot read index {where}: {e}") from None
    for p in _head(raw):
        raise IndexFormatError(f"{where} {p.message.removeprefix('index.json ')}")
    return raw


def parse(raw: Mapping[str, Any], where: str | os.PathLike) -> IndexMeta:
    """``raw`` (``load_json``) as an ``IndexMeta``; its first problem raises ``IndexFormatError``."""
    part, problems, extra = _salvage(raw)
    if part is None or extra is None:
        raise IndexFormatError(f"{where} {problems[0].message.removeprefix('index.json ')}")
    if problems:
        raise IndexFormatError(
            f"{where}: {problems[0].message}; the index is damaged or was edited: convert again "
            "(wds-tools verify lists every problem)"
        )
    values = {f.name: getattr(part, f.name) for f in fields(IndexMeta) if hasattr(part, f.name)} | extra
    required = [values[f.name] for f in fields(IndexMeta) if "None" not in str(f.type)]  # (annotations as text)
    if None in required + list(part.shards) + list(part.splits.values()):
        raise AssertionError(f"{where}: a field left unset without a problem")  # an invariant of _salvage
    return IndexMeta(**values)


def validate(raw: object) -> Iterator[Problem]:
    """Every problem of an index.json's dict (of any JSON value), in field order; none for a valid index."""
    yield from _salvage(raw)[1]


def salvage(raw: Mapping[str, Any]) -> tuple[Partial, list[Problem]]:
    """(what is usable, every problem) of ``raw`` (``load_json``): ``wds-tools verify`` reports the problems and
    checks the shards against the rest."""
    part, problems, _ = _salvage(raw)
    if part is None:
        raise IndexFormatError(problems[0].message)  # (load_json refused it already)
    return part, problems


def _head(raw: object) -> Iterator[Problem]:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        yield Problem("format", "field", f'index.json is not a wds-tools index (no "format": "{FORMAT_NAME}")')
        return
    version = raw.get("format_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        yield Problem(
            "format_version",
            "field",
            f"index.json has format_version {version!r}; this wds-tools reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS[:-1]))} and {READABLE_VERSIONS[-1]} (a newer version needs a "
            "newer wds-tools)",
        )


# ------------------------------------------------------------------ the checks


def _count(v: object, top: float = float("inf")) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= top


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _colour(v: object) -> bool:
    return isinstance(v, list) and len(v) == 3 and all(_count(x, 255) for x in v)


# type name -> (test, what the message says is expected)
_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "count": (_count, "a count (an integer >= 0)"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "fraction": (lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "size": (lambda v: _count(v) and v >= 1, "an integer >= 1"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "text_or_null": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "counts": (lambda v: isinstance(v, list) and all(_count(x) for x in v), "a list of counts"),
    "names": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "texts": (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), "an object of strings"),
    "texts_or_null": (
        lambda v: isinstance(v, dict) and all(x is None or isinstance(x, str) for x in v.values()),
        "an object of strings or null",
    ),
    "rgb": (
        lambda v: isinstance(v, list) and len(v) == 3 and all(_number(x) and 0 <= x <= 1 for x in v),
        "three numbers in [0, 1] (R, G, B)",
    ),
    "colour": (_colour, "three integers in 0..255 (R, G, B)"),
    "sha256": (lambda v: isinstance(v, str) and bool(_SHA256.fullmatch(v)), "64 lowercase hex digits"),
}


def _show(v: object) -> str:
    text = repr(v)
    return (text if len(text) <= 60 else text[:57] + "...") + f" ({type(v).__name__})"


def _names(names: list) -> str:
    shown = ", ".join(str(n) for n in names[:3])
    return shown + (f" ... {names[-1]} ({len(names)})" if len(names) > 3 else "")


class _Check:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def bad(self, path: str, message: str, kind: str = "field") -> None:
        self.problems.append(Problem(path, kind, message))

    def get(self, obj: Mapping[str, Any], key: str, path: str, kind: str, *, required: bool = True) -> Any:
        """``obj[key]`` when it is of type ``kind``; None (and a problem) otherwise, or when absent and optional."""
        test, expected = _TYPES[kind]
        if key not in obj:
            if required:
                self.bad(path, f"{path} is missing; expected {expected}")
            return None
        value = obj[key]
        if not test(value):
            self.bad(path, f"{path} is {_show(value)}; expected {expected}")
            return None
        return value

    def name(self, value: Any, path: str, *, shard: bool = True) -> str | None:
        """``value`` where an index may name it (``names.indexed_name_problem``); None (and a problem) otherwise."""
        problem = indexed_name_problem(value, shard=shard)
        if problem:
            self.bad(path, f"{path} {problem}", "shard_name")
        return None if problem else value

    def file(self, value: Any, path: str, expected: str, told: str) -> str | None:
        """``value`` where it is the one name the format gives that file (``expected``); None (and a problem)
        otherwise: a name leading elsewhere is a ``shard_name`` problem, another plain name a ``field`` one."""
        if self.name(value, path, shard=False) is None:
            return None
        if value != expected:
            self.bad(path, f"{path} is {value!r}; expected {told}")
            return None
        return value

    def fields(self, obj: Mapping[str, Any], prefix: str, spec: str) -> dict[str, Any]:
        """``get`` of each ``key:kind`` of ``spec`` (``key:kind?``: optional) under ``prefix``; lists as tuples."""
        out = {}
        for item in spec.split():
            key, kind = item.rstrip("?").split(":")
            value = self.get(obj, key, prefix + key, kind, required=not item.endswith("?"))
            out[key] = tuple(value) if isinstance(value, list) else value
        return out


def _salvage(raw: Any) -> tuple[Partial | None, list[Problem], dict[str, Any] | None]:
    """(the usable fields, every problem, the fields only ``IndexMeta`` has): index.json's checks, in field
    order (of any JSON value: None and the one problem when it is no index of a version read)."""
    head = list(_head(raw))
    if head:
        return None, head, None
    c = _Check()
    version: int = raw["format_version"]
    v = c.fields(raw, "", "size:size created_by:text? resize:text? dataset_version:text? decoder_versions:texts?")
    extra = {k: v.pop(k) for k in ("created_by", "resize", "decoder_versions")}
    extra["decode"] = _decode(c, raw)
    v["sample"] = _sample(c, raw, version, v["size"])
    v |= c.fields(raw, "", "classes:names")
    classes, seen = v["classes"], dict[str, int]()
    for i, name in enumerate(classes or ()):
        if seen.setdefault(name, i) != i:
            c.bad(f"classes[{i}]", f"classes[{i}] is {name!r}, the same name as classes[{seen[name]}]")
    v["classes_digest"] = None
    if version != 1:
        v["classes_digest"] = digest = c.get(raw, "classes_digest", "classes_digest", "text")
        if digest is not None and classes is not None and digest != classes_digest(classes):
            c.bad(
                "classes_digest",
                f"classes_digest is {digest!r}; the classes' digest is {classes_digest(classes)!r} "
                "(FORMAT.md: SHA-256 of the class list as canonical JSON, first 16 hex digits)",
            )
    v |= c.fields(raw, "", "class_counts:counts samples:count mean:rgb std:rgb stats_split:text")
    v["metadata"] = _metadata(c, raw)
    extra["build"], v["group"] = _build(c, raw, v["metadata"])
    extra["phash_flat_rules"] = c.get(raw, "phash_flat_rules", "phash_flat_rules", "count", required=False)
    v["samples_name"], v["samples_file"], v["errors_file"] = _files(c, raw)
    v["shards"], v["shard_names"] = _shards(c, raw)
    v["shards_ok"] = isinstance(raw.get("shards"), list) and None not in v["shards"]
    v["splits"] = _splits(c, raw, v["shards"] if v["shards_ok"] else None, v["stats_split"])
    part = Partial(raw=raw, format_version=version, **v)
    return part, c.problems, extra


def _sample(c: _Check, raw: Mapping[str, Any], version: int, size: int | None) -> SampleSpec | None:
    sample = c.get(raw, "sample", "sample", "object")
    if sample is None:
        return None
    members = MEMBERS_V1 if version == 1 else MEMBERS
    ok = True
    if sample.get("members") != list(members):
        c.bad(
            "sample.members",
            f"sample.members is {_show(sample.get('members'))}; expected {list(members)} (format_version {version})",
        )
        ok = False
    if sample.get("npy_dtype") != "uint8":
        c.bad("sample.npy_dtype", f"sample.npy_dtype is {_show(sample.get('npy_dtype'))}; expected 'uint8'")
        ok = False
    shape = sample.get("npy_shape")
    if not (isinstance(shape, list) and len(shape) == 3 and all(_count(x) for x in shape)):
        c.bad("sample.npy_shape", f"sample.npy_shape is {_show(shape)}; expected [S, S, 3]")
        return None
    if size is not None and shape != [size, size, 3]:
        c.bad(
            "sample.npy_shape",
            f"sample.npy_shape is {shape}, size is {size}: they disagree (expected [{size}, {size}, 3])",
            "image_size",
        )
    return SampleSpec(members, "uint8", (shape[0], shape[1], shape[2])) if ok else None


def _decode(c: _Check, raw: Mapping[str, Any]) -> DecodeInfo | None:
    d = c.get(raw, "decode", "decode", "object", required=False)
    if d is None:
        return None
    got = c.fields(d, "decode.", "draft:bool filter:text alpha_background:colour pad_fill:colour max_pixels:size")
    colour = c.get(d, "colour", "decode.colour", "text", required=False)
    return DecodeInfo(raw=d, colour=colour or "raw", **got) if None not in got.values() else None


def _metadata(c: _Check, raw: Mapping[str, Any]) -> tuple[MetaColumn, ...] | None:
    items = raw.get("metadata", [])
    if not isinstance(items, list):
        c.bad("metadata", f"metadata is {type(items).__name__}; expected a list of {{name, type}}")
        return None
    columns: list[MetaColumn] | None = []
    seen: set[str] = set()
    for i, m in enumerate(items):
        ok = (
            isinstance(m, dict)
            and isinstance(m.get("name"), str)
            and m["name"] != ""
            and m.get("type") in META_TYPES
            and set(m) == {"name", "type"}
        )
        if not ok:
            c.bad(
                f"metadata[{i}]",
                f"metadata[{i}] is {str(m)[:60]}; expected {{name: a non-empty string, type: {' | '.join(META_TYPES)}}}",
            )
            columns = None
        elif m["name"] in seen:
            c.bad(f"metadata[{i}]", f"metadata[{i}] names column {m['name']!r} again")
            columns = None
        elif columns is not None:
            seen.add(m["name"])
            columns.append(MetaColumn(m["name"], m["type"]))
    return tuple(columns) if columns is not None else None


def _build(
    c: _Check, raw: Mapping[str, Any], metadata: tuple[MetaColumn, ...] | None
) -> tuple[BuildInfo | None, str | None]:
    """(``build``, its group where that names a metadata column)."""
    b = c.get(raw, "build", "build", "object", required=False)
    if b is None:
        return None, None
    got = c.fields(
        b,
        "build.",
        "group:text_or_null? stratify:bool? dedup:count? split_base:text_or_null? base:text_or_null? "
        "columns:texts_or_null? shard_size:size? seed:int? val_fraction:fraction? sanitize_keys:bool? "
        "source_path:text? source:object?",
    )
    group = got["group"]
    if group is not None and metadata is not None and group not in {m.name for m in metadata}:
        c.bad("build.group", f"build.group is {str(group)[:60]!r}, which is not a column of metadata")
        group = None
    got["stratify"] = bool(got["stratify"])
    if got["source"] is not None:
        got["source"] = SourceInfo(**c.fields(got["source"], "build.source.", "kind:text? rows:count? digest:sha256?"))
    return BuildInfo(raw=b, **got), group if metadata is not None else None


def _files(c: _Check, raw: Mapping[str, Any]) -> tuple[str | None, SamplesFile | None, str | None]:
    """(samples_file.name where it may be opened, samples_file, errors_file)."""
    info = c.get(raw, "samples_file", "samples_file", "object")
    name = entry = errors = None
    if info is not None:
        name = c.file(info.get("name"), "samples_file.name", SAMPLES_FILE, repr(SAMPLES_FILE))
        got = c.fields(info, "samples_file.", "bytes:count sha256:sha256")
        entry = SamplesFile(name, **got) if name is not None and None not in got.values() else None
    if "errors_file" not in raw:
        c.bad("errors_file", f"errors_file is missing; expected null or {ERRORS_FILE!r}")
    elif raw["errors_file"] is not None:
        errors = c.file(raw["errors_file"], "errors_file", ERRORS_FILE, f"null or {ERRORS_FILE!r}")
    return name, entry, errors


def _shards(c: _Check, raw: Mapping[str, Any]) -> tuple[tuple[ShardInfo | None, ...], tuple[str | None, ...]]:
    """(each entry, None where it has a problem; each entry's name where a reader may open it)."""
    listed = c.get(raw, "shards", "shards", "list")
    entries: list[ShardInfo | None] = []
    names: list[str | None] = []
    seen: dict[str, int] = {}
    for i, s in enumerate(listed or ()):
        path = f"shards[{i}]"
        if not isinstance(s, dict):
            c.bad(path, f"{path} is {_show(s)}; expected an object {{name, split, samples, bytes, sha256}}")
            entries.append(None)
            names.append(None)
            continue
        name = c.name(s.get("name"), f"{path}.name")
        if name is not None and seen.setdefault(name, i) != i:
            c.bad(f"{path}.name", f"{path}.name {name} is also shards[{seen[name]}].name; it is checked once")
            name = None
        split = c.get(s, "split", f"{path}.split", "text")
        samples = c.get(s, "samples", f"{path}.samples", "count")
        nbytes = c.get(s, "bytes", f"{path}.bytes", "count")
        sha = c.get(s, "sha256", f"{path}.sha256", "sha256")
        if name is not None and split is not None and not name.startswith(split + "-"):
            c.bad(
                f"{path}.split",
                f"{path}.split is {split!r}, but its name {name} puts it in split {name.rsplit('-', 1)[0]!r}",
            )
            split = name.rsplit("-", 1)[0]  # readers go by the name
        if samples is not None and nbytes is not None and samples > nbytes // MIN_SAMPLE_BYTES:
            c.bad(  # bounded here, before any planner loops over it
                f"{path}.samples",
                f"{path}.samples is {samples:,}, but a shard of {nbytes:,} bytes holds at most "
                f"{nbytes // MIN_SAMPLE_BYTES:,} samples",
                "count",
            )
        usable = name is not None and None not in (split, samples, nbytes, sha)
        entries.append(ShardInfo(i, name, split, samples, nbytes, sha) if name is not None and usable else None)
        names.append(name)
    return tuple(entries), tuple(names)


def _splits(
    c: _Check, raw: Mapping[str, Any], shards: tuple[ShardInfo | None, ...] | None, stats_split: str | None
) -> dict[str, SplitInfo | None]:
    """``splits``; with ``shards`` (every entry usable), against them."""
    splits = c.get(raw, "splits", "splits", "object")
    if splits is None:
        return {}
    members: dict[str, list[str]] = {}
    for s in shards or ():
        if s is not None:
            members.setdefault(s.split, []).append(s.name)
    out: dict[str, SplitInfo | None] = {}
    for name, sp in splits.items():
        path = f"splits.{name}"
        if not _SPLIT.fullmatch(name):
            c.bad(path, f"splits has a split named {name!r}; expected [A-Za-z0-9_-]{{1,32}}")
            continue
        if not isinstance(sp, dict):
            c.bad(path, f"{path} is {_show(sp)}; expected an object {{samples, shards, urls, ...}}")
            out[name] = None
            continue
        got = c.fields(sp, path + ".", "samples:count shards:count urls:text class_counts:counts mean:rgb std:rgb")
        out[name] = SplitInfo(name, **got) if None not in got.values() else None
        if shards is None:
            continue  # which shards belong to it is not known: the bad entries are the problems
        own = members.get(name, [])
        if got["shards"] is not None and got["shards"] != len(own):
            c.bad(
                f"{path}.shards", f"{path}.shards is {got['shards']}; shards lists {len(own)} {name} shard(s)", "count"
            )
        if not own:
            c.bad(path, f"{path}: no entry of shards belongs to split {name!r}")
            continue
        want = [shard_name(name, k) for k in range(len(own))]
        if own != want:
            c.bad(
                "shards",
                f"the {name} shards in shards are {_names(own)}; expected {_names(want)} (numbered "
                f"from 000000 in order)",
            )
        urls = got["urls"]
        if urls is not None and urls != url_pattern(name, len(own)):
            try:
                named: list[str] | None = expand(urls)
            except Exception:  # noqa: BLE001 - any malformed pattern is the problem reported
                named = None
            what = "is not a brace pattern" if named is None else f"names {len(named)} file(s) ({_names(named)})"
            c.bad(
                f"{path}.urls",
                f"{path}.urls is {urls!r}, which {what}; the index lists {len(own)} {name} shard(s), "
                f"so expected {url_pattern(name, len(own))!r}",
                "urls",
            )
    for split in sorted(set(members) - set(splits)):
        c.bad("splits", f"splits has no entry {split!r}, the split of {_names(members[split])}")
    expected = "train" if "train" in splits else "all"
    if stats_split is not None and stats_split != expected:
        c.bad(
            "stats_split",
            f"stats_split is {stats_split!r}; expected {expected!r} (the index has splits "
            f"{', '.join(sorted(splits)) or 'none'})",
        )
    return out
