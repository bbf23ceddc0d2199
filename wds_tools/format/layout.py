"""Layout: where shards and their index live, which of them a spec names, and how to reach their bytes.

docs/FORMAT.md, "Layout". A version's shards are ``<split>-NNNNNN.tar`` beside ``index.json`` and
``samples.npz`` in ``OUT/<version>/<size>/``. A *spec* names some of them: a folder, its
index.json, a brace pattern (``train-{000000..000041}.tar``), several of these joined with ``::``
or given as a list; each a local path, a ``file://`` URL, an fsspec URL (``s3://``, ``gs://``...)
or an ``http(s)://`` URL (``pipe:CMD`` passes through, for the loader only). ``resolve`` turns a
spec into ``Shards``, which the loader (``training_adapter.shardlist``) and the inspectors
(stats, verify) share; it refuses shards of different datasets and specs naming part of a split
unless told otherwise (the rules: ``format.mixing``).

Bytes, by scheme: ``open_stream`` for sequential reads (local files unbuffered, filled with
``readinto``; webdataset's ``gopen`` for ``pipe:`` and ``http(s)://``, as stock webdataset opens
them; fsspec with large readahead blocks for object stores), ``open_file`` for a seekable file
(the converter's sources), ``read_bytes`` for a whole small file, ``file_size``, ``open_ranged``
and ``read_ranges`` for bytes at offsets, ``list_tars`` where the store can list a folder (not
over http).
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np

from ..errors import ExtraNotInstalledError, IndexFormatError, OptionError, ShardError
from . import mixing

__all__ = [
    "INDEX_FILE", "SAMPLES_FILE", "REMOTE_BLOCK",
    "shard_name", "url_pattern", "shard_split", "expand", "indexed_name_problem", "index_shards",
    "scheme", "is_local", "local_path", "join", "parent", "basename",
    "Shards", "resolve", "resolve_target", "newest_dataset", "read_index", "index_of", "read_samples",
    "filesystem", "open_stream", "open_file", "read_bytes", "file_size", "exists", "list_tars",
    "RangedFile", "open_ranged", "read_ranges",
]

INDEX_FILE = "index.json"
SAMPLES_FILE = "samples.npz"
# Object-store reads: one ranged request per block; larger blocks amortize request latency.
REMOTE_BLOCK = 32 << 20
GOPEN_BUFFER = 8 << 20
# Schemes webdataset's gopen opens itself (pipe: runs a command; http(s) streams with curl).
GOPEN_SCHEMES = frozenset({"pipe", "http", "https", "sftp", "ftps", "scp", "ais", "hf", "htgs"})
HTTP_SCHEMES = frozenset({"http", "https"})
HTTP_TIMEOUT = 60  # seconds to connect or to wait for the next bytes

_SHARD_NAME = re.compile(r"^(?P<split>.+)-(?P<num>\d{6})\.tar$")
# What an index.json may name: files in its own folder (no "/", "..", absolute path), a shard by the
# converter's split rule, another file (samples.npz) without a leading dot.
_INDEXED_SHARD = re.compile(r"[A-Za-z0-9_-]{1,32}-[0-9]{6}\.tar")
_INDEXED_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


# ------------------------------------------------------------------ names and patterns

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


def samples_file_name(meta: dict, where: str) -> str:
    """index.json's ``samples_file.name``, refused (``IndexFormatError``) unless a plain name in its folder."""
    info = meta.get("samples_file")
    name = info.get("name") if isinstance(info, dict) else None
    problem = indexed_name_problem(name, shard=False)
    if problem:
        raise IndexFormatError(f"{where}: samples_file.name {problem}")
    return name


def index_shards(meta: dict, where: str, *, strict: bool = True) -> list[dict]:
    """index.json's ``shards`` entries a reader may open: a name by ``indexed_name_problem`` and a
    ``samples`` count (``samples_file.name`` is checked too). ``strict``: the first bad entry raises
    ``IndexFormatError``; otherwise bad entries are left out, never opened (verify reports them)."""
    shards, info, problems, good = meta.get("shards"), meta.get("samples_file"), [], []
    if isinstance(info, dict) and indexed_name_problem(info.get("name"), shard=False):
        problems.append(f"samples_file.name {indexed_name_problem(info.get('name'), shard=False)}")
    if not isinstance(shards, list):
        problems.append(f"shards is {type(shards).__name__}; expected a list")
    for i, s in enumerate(shards if isinstance(shards, list) else []):
        count = s.get("samples") if isinstance(s, dict) else None
        if not isinstance(s, dict):
            problems.append(f"shards[{i}] is {type(s).__name__}; expected an object")
        elif indexed_name_problem(s.get("name")):
            problems.append(f"shards[{i}].name {indexed_name_problem(s.get('name'))}")
        elif not isinstance(count, int) or isinstance(count, bool) or count < 0:
            problems.append(f"shards[{i}].samples is {count!r}; expected a count >= 0")
        else:
            good.append(s)
    if problems and strict:
        raise IndexFormatError(f"{where}: {problems[0]}; the index is damaged or was edited: convert again")
    return good


def expand(pattern: str) -> list[str]:
    """A webdataset brace pattern (``train-{000000..000041}.tar``) as its list of names."""
    import braceexpand  # installed with webdataset

    return list(braceexpand.braceexpand(pattern))


# ------------------------------------------------------------------ paths and URLs

def scheme(url: str | os.PathLike) -> str:
    """``""`` for a local path, ``pipe`` for ``pipe:CMD``, else the URL's scheme (file, s3, https...)."""
    text = os.fspath(url)
    if text.startswith("pipe:"):
        return "pipe"
    m = _URL.match(text)
    return m.group(1).lower() if m else ""


def is_local(url: str | os.PathLike) -> bool:
    """A plain path or a ``file://`` URL."""
    return scheme(url) in ("", "file")


def local_path(url: str | os.PathLike) -> str | None:
    """The file a local path or ``file://`` URL names; None for any other URL."""
    kind = scheme(url)
    if kind == "":
        return os.fspath(url)
    if kind == "file":
        return url2pathname(urlparse(os.fspath(url)).path)
    return None


def join(base: str | os.PathLike, *names: str) -> str:
    """``base/name``: an OS path for a local folder, ``/``-joined for a URL."""
    local = local_path(base)
    if local is not None:
        return os.path.join(local, *names)
    return "/".join([os.fspath(base).rstrip("/"), *names])


def parent(url: str) -> str:
    """The folder holding ``url``."""
    return url.rsplit("/", 1)[0] if scheme(url) else os.path.dirname(url)


def basename(url: str) -> str:
    """The file name in ``url``."""
    return url.rsplit("/", 1)[-1] if scheme(url) else os.path.basename(url)


# ------------------------------------------------------------------ which shards a spec names

@dataclass
class Shards:
    """What a spec names: the shards' URLs (plain paths for local files) and the index listing them.

    ``meta`` is the index.json in the folder of the (first) shards, when there is one; ``names``
    and ``counts`` are set when it lists every shard named (``counts``: also when several indexes
    do, one per folder).
    """

    spec: str  # as given; several joined with "::"
    urls: list[str]
    folder: str | None = None  # the one folder holding every shard; None when they are in several
    meta: dict | None = field(default=None, repr=False)
    index_base: str | None = None  # the folder holding meta's index.json (and samples.npz)
    names: list[str] | None = field(default=None, repr=False)  # each URL's entry in meta["shards"]
    counts: list[int] | None = field(default=None, repr=False)  # samples per shard
    selected: bool = False  # named by a pattern or a .tar (some shards), not a whole folder or index
    gaps: list = field(default_factory=list, repr=False)  # mixing.Gap: splits named only in part
    datasets: list = field(default_factory=list, repr=False)  # index.json of each dataset named (copies once)

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def index_file(self) -> str | None:
        return join(self.index_base, INDEX_FILE) if self.index_base is not None else None


@dataclass
class _Rules:
    split: str | None
    need_index: bool
    scan: bool
    pipe: bool
    one_folder: bool
    strict: bool = True
    indexes: dict[str, dict | None] = field(default_factory=dict)  # folder -> its index.json, read once

    def no_index(self, where: str) -> str:
        hint = "pass --scan to read the tars themselves (slower)" if self.need_index else \
            "convert first, or give a shard pattern"
        return f"no index at {where}; {hint}"

    def index_in(self, folder: str) -> dict | None:
        """The index.json in ``folder``; None where there is none."""
        if folder not in self.indexes:
            try:
                self.indexes[folder] = read_index(join(folder, INDEX_FILE))
            except FileNotFoundError:
                self.indexes[folder] = None
        return self.indexes[folder]


def resolve(spec: str | os.PathLike | Sequence[str | os.PathLike], *, split: str | None = None,
            need_index: bool = False, scan: bool = False, pipe: bool = False, one_folder: bool = False,
            strict: bool = True, allow_mixed: bool = False, allow_partial: bool = False) -> Shards:
    """The shards a spec names (see the module docstring).

    ``split``: from a folder or index, only that split's shards (None: all of them).
    ``need_index``: an index.json beside the shards must list every one (stats, verify).
    ``scan``: a folder without an index stands for the ``*.tar`` in it, where the store can list.
    ``pipe``: accept ``pipe:`` commands. ``one_folder``: refuse shards from several folders.
    ``strict``: an index entry naming a file outside its folder (``index_shards``) raises
    ``IndexFormatError``; otherwise that entry is left out (never opened) and the caller reports it.
    ``allow_mixed``: accept shards of different datasets (``format.mixing.check_mixed``; copies of
    one dataset are always accepted). ``allow_partial``: accept a spec naming only some shards of a
    split (``format.mixing.check_partial``); ``Shards.gaps`` lists them either way.
    """
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    texts = [t.strip() for item in items for t in os.fspath(item).split("::") if t.strip()]
    if not texts:
        raise OptionError("no shard given; expected a shards folder, its index.json or a pattern like "
                          "shards/v1/224/train-{000000..000041}.tar")
    rules = _Rules(split, need_index, scan, pipe, one_folder, strict)
    parts = [p for t in texts for p in _resolve_one(t, rules)]  # one per text and folder
    whole = "::".join(texts)
    if not allow_mixed:
        mixing.check_mixed(whole, parts)
    shards = _combine(whole, parts, len(texts), one_folder)
    shards.gaps, shards.datasets = mixing.gaps(parts), mixing.datasets(parts)
    if not allow_partial:
        mixing.check_partial(whole, shards.gaps)
    return shards


def _combine(spec: str, parts: list[Shards], texts: int, one_folder: bool) -> Shards:
    """One Shards of the parts: ``names`` where one index lists them all, ``counts`` where each has them."""
    if len(parts) == 1:
        return parts[0]
    first, folders = parts[0], {p.folder for p in parts}
    folder = first.folder if len(folders) == 1 else None
    if one_folder and folder is None:
        also = " (or read their tars as one set: --scan)"
        if texts == 1:
            raise OptionError(f"{spec}: the pattern spans several folders; give one shards folder at a time{also}")
        raise OptionError(f"{spec}: the shards are in several folders ({', '.join(sorted(str(f) for f in folders))})"
                          f"; give one shards folder at a time{also}")
    one_index = all(p.names is not None and p.index_base == first.index_base for p in parts)
    return Shards(
        spec, [u for p in parts for u in p.urls], folder, first.meta, first.index_base,
        [n for p in parts for n in p.names] if one_index else None,
        None if any(p.counts is None for p in parts) else [c for p in parts for c in p.counts],
        selected=True)


def _resolve_one(text: str, rules: _Rules) -> list[Shards]:
    """The shards of one spec item: one Shards, or one per folder of a pattern spanning several."""
    kind = scheme(text)
    if kind == "pipe":
        if not rules.pipe:
            raise OptionError(f"{text}: pipe: commands are read by the loader only; give a shards folder, "
                              "its index.json or a shard pattern")
        return [Shards(text, expand(text))]
    if kind in ("", "file"):
        path = str(Path(os.path.expanduser(local_path(text))))
        if os.path.isdir(path):
            return [_folder(text, path, rules)]
    else:
        path = text.rstrip("/")
    if path.endswith(".json"):
        meta = read_index(path, required=True)
        return [_listed(text, parent(path), meta, rules.split, rules.strict)]
    if "{" in path or path.endswith(".tar"):
        return _pattern(text, path, rules)
    if kind in ("", "file"):
        raise OptionError(f"{text}: no such shards folder, index file or shard pattern")
    return [_folder(text, path, rules)]


def _folder(text: str, folder: str, rules: _Rules) -> Shards:
    meta = rules.index_in(folder)
    if meta is not None:
        return _listed(text, folder, meta, rules.split, rules.strict)
    where = join(folder, INDEX_FILE)
    if not rules.scan:
        raise IndexFormatError(rules.no_index(where))
    names = list_tars(folder)
    if names is None:
        raise IndexFormatError(f"no index at {where}, and a {scheme(folder)}:// folder cannot be listed; "
                               "give a shard pattern")
    if not names:
        raise IndexFormatError(f"{folder}: neither {INDEX_FILE} nor any *.tar shard")
    return Shards(text, [join(folder, n) for n in names], folder)


def _listed(text: str, base: str, meta: dict, split: str | None, strict: bool = True) -> Shards:
    """Every shard the index lists (of ``split``, when given)."""
    shards = index_shards(meta, join(base, INDEX_FILE), strict=strict)
    if split is not None:
        splits = meta.get("splits", {})
        if split not in splits:
            raise IndexFormatError(f"{join(base, INDEX_FILE)}: no split {split!r}; the index has "
                                   f"{', '.join(splits) or 'none'}")
        shards = [s for s in shards if s.get("split") == split]
    names = [s["name"] for s in shards]
    return Shards(text, [join(base, n) for n in names], base, meta, base, names,
                  [int(s["samples"]) for s in shards])


def _pattern(text: str, pattern: str, rules: _Rules) -> list[Shards]:
    """A pattern's shards, one Shards per folder (in the order the pattern first names each folder),
    each with the index.json of its folder when that lists its shards."""
    urls = expand(pattern)
    if not urls:
        raise OptionError(f"{text}: the pattern names no files")
    if not (rules.need_index or rules.scan):  # the loader: a mistyped range fails here, not in a worker
        _check_exist(text, urls)
    by_folder: dict[str, list[str]] = {}
    for u in urls:
        by_folder.setdefault(parent(u), []).append(u)
    return [_in_folder(text, folder, group, rules) for folder, group in by_folder.items()]


def _in_folder(text: str, folder: str, urls: list[str], rules: _Rules) -> Shards:
    try:
        meta = rules.index_in(folder)
        listed = index_shards(meta, join(folder, INDEX_FILE), strict=rules.strict) if meta else []
    except IndexFormatError:
        if rules.need_index:
            raise
        meta, listed = None, []  # a damaged or unreachable index beside a pattern: read the shards without it
    names = [basename(u) for u in urls]
    by_name = {s["name"]: s["samples"] for s in listed}
    unknown = [n for n in names if n not in by_name]
    if rules.need_index:
        if meta is None:
            raise IndexFormatError(rules.no_index(join(folder, INDEX_FILE)))
        if unknown:
            raise IndexFormatError(f"{text}: {len(unknown)} shard(s) are not in {join(folder, INDEX_FILE)} "
                                   f"(first: {unknown[0]}); use --scan to read the tars themselves")
    if unknown:
        return Shards(text, urls, folder, meta, folder if meta else None, selected=True)
    return Shards(text, urls, folder, meta, folder, names, [by_name[n] for n in names], selected=True)


def _check_exist(text: str, urls: list[str]) -> None:
    """Local shards a pattern names must exist (remote ones are found missing when read; the
    inspectors report missing shards themselves)."""
    missing = [u for u in urls if is_local(u) and not os.path.isfile(local_path(u))]
    if missing:
        raise ShardError(f"{text}: {len(missing)} of {len(urls)} shards do not exist, e.g. {missing[0]}; "
                         f"check the pattern, or point at the shards folder")


def resolve_target(path: str | os.PathLike | None, *, out: str | os.PathLike = "shards",
                   scan: bool = False, strict: bool = True, allow_mixed: bool = False) -> Shards:
    """What the inspectors (stats, verify) read: PATH, or the newest version under ``out``.

    Without ``scan`` an index must list every shard, and the shards must be in one folder (its
    index is what is reported on); with it a folder may hold tars alone, and several folders are
    read as one set. ``strict`` as in ``resolve`` (verify passes False and reports bad entries
    itself); ``allow_mixed`` as in ``resolve``. A spec naming part of a split is accepted: its
    ``gaps`` say what it leaves out, and the inspectors print them.
    """
    if path is None:
        path = newest_dataset(out, need_index=not scan)
    return resolve(path, need_index=not scan, scan=scan, one_folder=not scan, strict=strict,
                   allow_mixed=allow_mixed, allow_partial=True)


def newest_dataset(out: str | os.PathLike, *, need_index: bool = True) -> str:
    """The most recently modified local ``OUT/<version>/<size>/`` holding index.json (or, if not needed, tars)."""
    out = Path(out)
    indexed = _index_module().indexes_newest_first(out)
    if indexed:
        return str(indexed[0])
    found = []
    if not need_index:
        found = [(max(t.stat().st_mtime for t in d.glob("*.tar")), d)
                 for d in out.glob("*/*") if d.is_dir() and any(d.glob("*.tar"))]
    if not found:
        what = f"OUT/<version>/<size>/{INDEX_FILE}" if need_index else "OUT/<version>/<size>/*.tar"
        raise IndexFormatError(
            f"no converted dataset under {out} (looked for {what}); pass a PATH, or --out with the "
            "folder you converted into"
        )
    return str(max(found, key=lambda t: (t[0], str(t[1])))[1])


# ------------------------------------------------------------------ the index files

def _index_module():
    # format.index imports this module (file names, join): import it when first used
    from . import index

    return index


def read_index(url: str, *, required: bool = False) -> dict:
    """index.json at ``url``, checked to be a wds-tools index of a version this code reads.

    A missing file raises ``FileNotFoundError``, or ``IndexFormatError`` when ``required``.
    """
    try:
        data = read_bytes(url)
    except FileNotFoundError:
        if required:
            raise IndexFormatError(
                f"no index at {url}; convert first, or point at a folder holding {INDEX_FILE}") from None
        raise
    except OSError as e:
        raise IndexFormatError(f"cannot read index {url}: {e}") from None
    return _index_module().parse_index_meta(data, url)


def index_of(spec: str | os.PathLike) -> tuple[str, dict]:
    """(folder, index.json's dict) of a shards folder or its index.json, local or a URL."""
    text = os.fspath(spec)
    if text.endswith(".json") and not os.path.isdir(text):
        url = text
    else:
        url = join(text, INDEX_FILE)
    return parent(url), read_index(url, required=True)


def read_samples(url: str, names: Sequence[str] | None = None, *, data: bytes | None = None
                 ) -> dict[str, np.ndarray]:
    """Columns of a samples.npz (``names``, or all); a local file is read only for those columns."""
    if data is None and not is_local(url):
        try:
            data = read_bytes(url)
        except OSError as e:
            raise IndexFormatError(f"cannot read sample table {url}: {e}") from None
    return _index_module().read_npz(local_path(url) or url, names, data=data)


# ------------------------------------------------------------------ bytes

def filesystem(url: str):
    """The fsspec filesystem of ``url``'s scheme (s3, gs...), made once per scheme."""
    return _filesystem(scheme(url))


@lru_cache(maxsize=16)
def _filesystem(protocol: str):
    try:
        import fsspec
    except ImportError:
        raise ExtraNotInstalledError(f"{protocol}:// paths need fsspec: pip install 'wds-tools[s3]'") from None
    try:
        return fsspec.filesystem(protocol)
    except (ImportError, ValueError) as e:
        raise OptionError(f"{protocol}:// paths need their fsspec backend ({e}); for s3:// "
                          "pip install 'wds-tools[s3]'") from None


def open_stream(url: str):
    """Open a file for reading start to end: unbuffered for a local file (fill buffers with
    ``readinto``), webdataset's ``gopen`` for pipe: and http(s), fsspec in ``REMOTE_BLOCK`` ranged
    requests for an object store. A missing file raises ``FileNotFoundError`` where the scheme
    tells (not through gopen: there the first read fails)."""
    kind = scheme(url)
    if kind in ("", "file"):
        return open(local_path(url), "rb", buffering=0)
    if kind in GOPEN_SCHEMES:
        from webdataset.gopen import gopen

        return gopen(url, "rb", bufsize=GOPEN_BUFFER)
    return open_file(url, block_size=REMOTE_BLOCK)


def open_file(url: str, block_size: int | None = None):
    """Open a seekable binary file: a local one, or any URL fsspec knows (its file objects have
    ``size``), read in ranged requests of ``block_size`` as the reader goes (no download first)."""
    local = local_path(url)
    if local is not None:
        return open(local, "rb")
    kw = {"block_size": block_size, "cache_type": "readahead"} if block_size else {}
    return filesystem(url).open(url, "rb", **kw)


def read_bytes(url: str) -> bytes:
    """A whole (small) file."""
    kind = scheme(url)
    if kind in ("", "file"):
        with open(local_path(url), "rb") as f:
            return f.read()
    if kind in HTTP_SCHEMES:
        with _http(url) as r:
            return r.read()
    if kind in GOPEN_SCHEMES:
        with open_stream(url) as f:
            return f.read()
    return filesystem(url).cat_file(url)


def file_size(url: str) -> int:
    """The size of a file in bytes; ``FileNotFoundError`` when there is none."""
    kind = scheme(url)
    if kind in ("", "file"):
        return os.path.getsize(local_path(url))
    if kind in HTTP_SCHEMES:
        with _http(url, "HEAD") as r:
            length = r.headers.get("Content-Length")
        if length is None:
            raise OSError(f"{url}: the server gives no Content-Length")
        return int(length)
    if kind in GOPEN_SCHEMES:
        raise OSError(f"{url}: the size of a {kind}: URL is not known before it is read")
    return int(filesystem(url).size(url))


def exists(url: str) -> bool:
    """Whether a file is there."""
    if is_local(url):
        return os.path.isfile(local_path(url))
    try:
        file_size(url)
    except FileNotFoundError:
        return False
    return True


def list_tars(folder: str) -> list[str] | None:
    """Names of the ``*.tar`` files in a folder, sorted; None where the store cannot list (http)."""
    kind = scheme(folder)
    if kind in ("", "file"):
        return sorted(e.name for e in os.scandir(local_path(folder)) if e.name.endswith(".tar") and e.is_file())
    if kind in GOPEN_SCHEMES:
        return None
    try:
        found = filesystem(folder).ls(folder, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    return sorted(n for n in (p.rstrip("/").rsplit("/", 1)[-1] for p in found) if n.endswith(".tar"))


def _http(url: str, method: str = "GET", start: int | None = None, end: int | None = None):
    """An open urllib response; HTTP 404 raises ``FileNotFoundError``, other failures ``OSError``."""
    req = urllib.request.Request(url, method=method)
    if start is not None:
        req.add_header("Range", f"bytes={start}-{end - 1}")
    try:
        return urllib.request.urlopen(req, timeout=HTTP_TIMEOUT)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code in (404, 410):
            raise FileNotFoundError(2, f"HTTP {e.code} {e.reason}", url) from None
        raise OSError(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise OSError(f"cannot reach the server: {e.reason}") from None


class RangedFile:
    """A file read at offsets: ``pread`` on a local file, ranged requests elsewhere.

    An http server that ignores ``Range`` sends the whole file: it is kept and sliced.
    """

    def __init__(self, url: str):
        self.url = url
        self._kind = scheme(url)
        self._fd: int | None = None
        self._whole: bytes | None = None
        if self._kind in ("", "file"):
            self._fd = os.open(local_path(url), os.O_RDONLY)
            self.size = os.fstat(self._fd).st_size
        elif self._kind in GOPEN_SCHEMES - HTTP_SCHEMES:
            raise OSError(f"{url}: a {self._kind}: URL cannot be read at offsets")
        else:
            self.size = file_size(url)

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end of the file)."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        if self._fd is not None:
            return os.pread(self._fd, end - offset, offset)
        if self._whole is not None:
            return self._whole[offset:end]
        if self._kind in HTTP_SCHEMES:
            with _http(self.url, start=offset, end=end) as r:
                data = r.read()
                if r.status == 206:
                    return data
            self._whole = data  # 200: the server sent the whole file
            return data[offset:end]
        return filesystem(self.url).cat_file(self.url, start=offset, end=end)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._whole = None

    def __enter__(self) -> RangedFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_ranged(url: str) -> RangedFile:
    """Open a file for reads at offsets (``RangedFile``); ``FileNotFoundError`` when there is none."""
    return RangedFile(url)


def read_ranges(urls: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> list[bytes | BaseException]:
    """Bytes ``starts[i]:ends[i]`` of ``urls[i]`` (one store), or the exception that read raised.

    Object stores get concurrent requests (fsspec ``cat_ranges``); a local or http file is opened once.
    """
    if not urls:
        return []
    if not is_local(urls[0]) and scheme(urls[0]) not in GOPEN_SCHEMES:
        return filesystem(urls[0]).cat_ranges(list(urls), list(starts), list(ends), on_error="return")
    files: dict[str, RangedFile | BaseException] = {}
    out: list[bytes | BaseException] = []
    try:
        for url, s, e in zip(urls, starts, ends):
            f = files.get(url)
            if f is None:
                try:
                    f = files[url] = RangedFile(url)
                except OSError as err:
                    f = files[url] = err
            if isinstance(f, BaseException):
                out.append(f)
                continue
            try:
                out.append(f.read(s, e - s))
            except OSError as err:
                out.append(err)
    finally:
        for f in files.values():
            if isinstance(f, RangedFile):
                f.close()
    return out
