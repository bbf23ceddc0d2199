"""Which shards a spec names: ``resolve`` turns a spec into ``Shards``.

docs/FORMAT.md, "Layout". A *spec* names some shards: a folder, its index.json, a brace pattern
(``train-{000000..000041}.tar``), several of these joined with ``::`` or given as a list; each a
local path or a URL (``storage.transport``). The loader (``training_adapter.shardlist``) and the
inspectors (stats, verify) share ``Shards``; ``resolve`` refuses shards of different datasets and
specs naming part of a split unless told otherwise (the rules: ``dataset.identity``).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import IndexFormatError, OptionError, ShardError
from ..format.index import INDEX_FILE, LOCK_FILE, WORK_DIR, indexes_newest_first, read_index
from ..format.model import IndexMeta, ShardInfo, parse, salvage
from ..format.names import expand, unexpanded
from ..storage.transport import GOPEN_SCHEMES, basename, exists, join, list_tars, local_path, parent, read_bytes, scheme
from . import identity

__all__ = ["Shards", "resolve", "resolve_target", "newest_dataset", "unfinished_conversion"]


@dataclass
class Shards:
    """What a spec names: the shards' URLs (plain paths for local files) and the index listing them.

    ``info`` is the index.json in the folder of the (first) shards, typed, when there is one (None also where
    it has problems and ``resolve`` was not strict: ``raw``, the JSON as written, is then what verify reports
    on); ``names`` and ``counts`` are set when it lists every shard named (``counts``: also when several
    indexes do, one per folder).
    """

    spec: str  # as given; several joined with "::"
    urls: list[str]
    folder: str | None = None  # the one folder holding every shard; None when they are in several
    raw: dict | None = field(default=None, repr=False)  # index.json as written: identity compares it
    index_base: str | None = None  # the folder holding that index.json (and samples.npz)
    names: list[str] | None = field(default=None, repr=False)  # each URL's name in index.json's shards
    counts: list[int] | None = field(default=None, repr=False)  # samples per shard
    selected: bool = False  # named by a pattern or a .tar (some shards), not a whole folder or index
    gaps: list = field(default_factory=list, repr=False)  # identity.Gap: splits named only in part
    datasets: list = field(default_factory=list, repr=False)  # index.json of each dataset named (copies once)
    info: IndexMeta | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def index_file(self) -> str | None:
        """The index.json that ``raw`` was read from (None: no index)."""
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
        hint = (
            "pass --scan to read the tars themselves (slower)"
            if self.need_index
            else (f"convert first (a folder wds-tools converts has its {INDEX_FILE} once the conversion finishes)")
        )
        return f"no index at {where}; {hint}"

    def index_in(self, folder: str) -> dict | None:
        """The index.json in ``folder``; None where there is none."""
        if folder not in self.indexes:
            try:
                self.indexes[folder] = read_index(join(folder, INDEX_FILE))  # checked by _entries
            except FileNotFoundError:
                self.indexes[folder] = None
        return self.indexes[folder]


def resolve(
    spec: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    split: str | None = None,
    need_index: bool = False,
    scan: bool = False,
    pipe: bool = False,
    one_folder: bool = False,
    strict: bool = True,
    allow_mixed: bool = False,
    allow_partial: bool = False,
) -> Shards:
    """The shards a spec names (see the module docstring).

    ``split``: from a folder or index, only that split's shards (None: all of them).
    ``need_index``: an index.json beside the shards must list every one (stats, verify).
    ``scan``: a folder without an index stands for the ``*.tar`` in it, where the store can list.
    ``pipe``: accept ``pipe:`` commands. ``one_folder``: refuse shards from several folders.
    ``strict``: an index with a problem (``format.model.validate``) raises ``IndexFormatError``; otherwise
    a shard entry with one is left out (never opened) and the caller reports it.
    ``allow_mixed``: accept shards of different datasets (``dataset.identity.check_mixed``; copies of
    one dataset are always accepted). ``allow_partial``: accept a spec naming only some shards of a
    split (``dataset.identity.check_partial``); ``Shards.gaps`` lists them either way.
    """
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    texts = [t.strip() for item in items for t in os.fspath(item).split("::") if t.strip()]
    if not texts:
        raise OptionError(
            "no shard given; expected a shards folder, its index.json or a pattern like "
            "shards/v1/224/train-{000000..000041}.tar"
        )
    rules = _Rules(split, need_index, scan, pipe, one_folder, strict)
    parts = [p for t in texts for p in _resolve_one(t, rules)]  # one per text and folder
    whole = "::".join(texts)
    if not allow_mixed:
        identity.check_mixed(whole, parts)
    shards = _combine(whole, parts, len(texts), one_folder)
    shards.gaps, shards.datasets = identity.gaps(parts), identity.datasets(parts)
    if not allow_partial:
        identity.check_partial(whole, shards.gaps)
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
        raise OptionError(
            f"{spec}: the shards are in several folders ({', '.join(sorted(str(f) for f in folders))})"
            f"; give one shards folder at a time{also}"
        )
    one_index = all(p.names is not None and p.index_base == first.index_base for p in parts)
    return Shards(
        spec,
        [u for p in parts for u in p.urls],
        folder,
        first.raw,
        first.index_base,
        [n for p in parts for n in p.names or ()] if one_index else None,
        None if any(p.counts is None for p in parts) else [c for p in parts for c in p.counts or ()],
        selected=True,
        info=first.info,
    )


def _resolve_one(text: str, rules: _Rules) -> list[Shards]:
    """The shards of one spec item: one Shards, or one per folder of a pattern spanning several."""
    kind = scheme(text)
    if kind == "pipe":
        if not rules.pipe:
            raise OptionError(
                f"{text}: pipe: commands are read by the loader only; give a shards folder, "
                "its index.json or a shard pattern"
            )
        return [Shards(text, expand(text))]
    local = local_path(text)
    if local is not None:
        path = str(Path(os.path.expanduser(local)))
        if os.path.isdir(path):
            return [_folder(text, path, rules)]
    else:
        path = text.rstrip("/")
    if path.endswith(".json"):
        missing = _missing_folder(parent(path)) if local is not None else ""
        if missing:  # a mistyped size or version: say what there is
            raise IndexFormatError(f"no index at {path}; {missing}")
        raw = read_index(path, required=True)
        return [_listed(text, parent(path), raw, rules.split, rules.strict)]
    if "{" in path or "}" in path or path.endswith(".tar"):
        return _pattern(text, path, rules)
    if kind in ("", "file"):
        missing = _missing_folder(path)
        raise OptionError(
            f"{text}: no such shards folder, index file or shard pattern" + (f": {missing}" * bool(missing))
        )
    return [_folder(text, path, rules)]


def _folder(text: str, folder: str, rules: _Rules) -> Shards:
    raw = rules.index_in(folder)
    if raw is not None:
        return _listed(text, folder, raw, rules.split, rules.strict)
    _refuse_unfinished(text, folder)
    where = join(folder, INDEX_FILE)
    below = _datasets_below(text, folder)
    if below is not None:  # OUT/V or OUT given for OUT/V/S: no index here, but converted datasets under it
        raise IndexFormatError(f"no index at {where}; {below}")
    if not rules.scan:
        raise IndexFormatError(rules.no_index(where))
    names = list_tars(folder)
    if names is None:
        raise IndexFormatError(
            f"no index at {where}, and a {scheme(folder)}:// folder cannot be listed; give a shard pattern"
        )
    if not names:
        raise IndexFormatError(f"{folder}: neither {INDEX_FILE} nor any *.tar shard")
    return Shards(text, [join(folder, n) for n in names], folder)


def _datasets_below(text: str, folder: str) -> str | None:
    """What a local folder without index.json holds one or two levels down, as the layout OUT/V/S puts
    converted datasets: its size folders (``text`` is OUT/V) or its versions (``text`` is OUT); None
    when it holds neither."""
    local = local_path(folder)
    if local is None:
        return None
    shown = text.rstrip("/")
    sizes = _sizes(Path(local))
    if sizes:
        return f"{shown} holds the sizes {', '.join(sizes)} (a folder each): use {shown}/{sizes[0]}, for one"
    versions = {v.name: _sizes(v) for v in sorted(Path(local).iterdir()) if v.is_dir()}
    versions = {v: s for v, s in versions.items() if s}
    if not versions:
        return None
    listed = "; ".join(f"{v} ({', '.join(s)})" for v, s in versions.items())
    newest = indexes_newest_first(local)[0]
    return (
        f"{shown} holds the versions {listed}: use e.g. {shown}/{newest.parent.name}/{newest.name} "
        f"(OUT/<version>/<size>, the most recently converted)"
    )


def _missing_folder(folder: str) -> str:
    """What exists near a local folder that does not (a mistyped size or version): that it does not, and
    the sizes of its version folder or the versions of OUT, as ``_datasets_below`` says them; "" when
    it exists (or is not local)."""
    local = local_path(folder)
    if local is None or os.path.isdir(local):
        return ""
    here = Path(local)
    for above in (here.parent, here.parent.parent):
        if above.is_dir():
            below = _datasets_below(str(above), str(above))
            return f"{local} does not exist; {below}" if below else f"{local} does not exist"
    return f"{local} does not exist"


def _sizes(folder: Path) -> list[str]:
    """The size folders of a version folder that hold an index.json, largest first."""
    names = [p.parent.name for p in folder.glob(f"*/{INDEX_FILE}")]
    return sorted(names, key=lambda n: (not n.isdigit(), -int(n) if n.isdigit() else 0, n))


def _entries(raw: dict, where: str, strict: bool) -> tuple[IndexMeta | None, list[ShardInfo], list[str]]:
    """(index.json typed, None where it has a problem; the shard entries a reader may open; the split names):
    ``strict``, the index's first problem raises; otherwise the entries with one are left out, never opened
    (verify reports them)."""
    try:
        info = parse(raw, where)
        return info, list(info.shards), list(info.splits)
    except IndexFormatError:
        if strict:
            raise
    part, _ = salvage(raw)
    return None, [s for s in part.shards if s is not None], list(part.splits)


def _listed(text: str, base: str, raw: dict, split: str | None, strict: bool = True) -> Shards:
    """Every shard the index lists (of ``split``, when given)."""
    info, shards, splits = _entries(raw, join(base, INDEX_FILE), strict)
    if split is not None:
        if split not in splits:
            raise IndexFormatError(
                f"{join(base, INDEX_FILE)}: no split {split!r}; the index has {', '.join(splits) or 'none'}"
            )
        shards = [s for s in shards if s.split == split]
    names = [s.name for s in shards]
    urls = [join(base, n) for n in names]
    return Shards(text, urls, base, raw, base, names, [s.samples for s in shards], info=info)


def _pattern(text: str, pattern: str, rules: _Rules) -> list[Shards]:
    """A pattern's shards, one Shards per folder (in the order the pattern first names each folder),
    each with the index.json of its folder when that lists its shards."""
    urls = expand(pattern)
    if not urls:
        raise OptionError(f"{text}: the pattern names no files")
    problem = unexpanded(text, urls)
    if problem is not None:
        raise OptionError(problem)
    if not (rules.need_index or rules.scan):  # the loader: a mistyped range fails here, not in a worker
        _check_exist(text, urls)
    by_folder: dict[str, list[str]] = {}
    for u in urls:
        by_folder.setdefault(parent(u), []).append(u)
    return [_in_folder(text, folder, group, rules) for folder, group in by_folder.items()]


def _in_folder(text: str, folder: str, urls: list[str], rules: _Rules) -> Shards:
    info: IndexMeta | None = None
    listed: list[ShardInfo] = []
    try:
        raw = rules.index_in(folder)
        if raw is not None:
            info, listed, _ = _entries(raw, join(folder, INDEX_FILE), rules.strict)
    except IndexFormatError:
        if rules.need_index:
            raise
        raw = None  # a damaged or unreachable index beside a pattern: read the shards without it
    if raw is None:
        _refuse_unfinished(text, folder)
    names = [basename(u) for u in urls]
    by_name = {s.name: s.samples for s in listed}
    unknown = [n for n in names if n not in by_name]
    if rules.need_index:
        if raw is None:
            missing = _missing_folder(folder)
            raise IndexFormatError(f"{text}: {missing}" if missing else rules.no_index(join(folder, INDEX_FILE)))
        if unknown:
            raise IndexFormatError(
                f"{text}: {len(unknown)} shard(s) are not in {join(folder, INDEX_FILE)} "
                f"(first: {unknown[0]}); use --scan to read the tars themselves"
            )
    if unknown:
        return Shards(text, urls, folder, raw, folder if raw else None, selected=True, info=info)
    return Shards(text, urls, folder, raw, folder, names, [by_name[n] for n in names], selected=True, info=info)


def unfinished_conversion(folder: str) -> str | None:
    """How a folder without index.json shows a conversion that has not finished (its work folder
    or lock file, and who holds the lock); None where it shows none. Reads only: the lock is never
    probed (a probe could make a starting conversion refuse), its text says who took it."""
    if scheme(folder) in GOPEN_SCHEMES:  # http(s)/pipe: nothing to list or ask
        return None
    local = local_path(folder)
    try:
        if local is not None:
            work, lock = os.path.isdir(os.path.join(local, WORK_DIR)), os.path.isfile(os.path.join(local, LOCK_FILE))
        else:
            work, lock = exists(join(folder, WORK_DIR, "run.json")), exists(join(folder, LOCK_FILE))
    except OSError:
        return None
    if not (work or lock):
        return None
    holder = _holder(join(folder, LOCK_FILE)) if lock else None
    present = " and ".join(n for n, here in ((f"{WORK_DIR}/", work), (LOCK_FILE, lock)) if here)
    if holder is None:
        state = "is running in it or was interrupted"
    else:
        host, pid, since, command = holder
        who = f"pid {pid} on host {host}, since {since} UTC: `{command}`"
        alive = _alive(host, pid)
        state = (
            f"is running in it ({who})"
            if alive
            else f"was interrupted ({who}, no longer running)"
            if alive is False
            else f"is running in it or was interrupted ({who})"
        )
    return f"a conversion {state}: the folder holds {present} but no {INDEX_FILE}"


def _holder(url: str) -> tuple[str, int, str, str] | None:
    """(host, pid, since, command) from a lock file's text (convert.lock.Holder); None if unreadable."""
    try:
        d = json.loads(read_bytes(url) or b"")
        return str(d["host"]), int(d["pid"]), str(d["since"]), str(d["command"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _alive(host: str, pid: int) -> bool | None:
    """Whether the lock's holder runs (None: on another host, which cannot be asked from here)."""
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except (OverflowError, ValueError):
        return None
    return True


def _refuse_unfinished(text: str, folder: str) -> None:
    """Refuse a spec naming a folder, or shards in a folder, whose conversion has not finished."""
    state = unfinished_conversion(folder)
    if state is not None:
        raise IndexFormatError(
            f"{text}: {folder} is not a finished dataset: {state}. Its shards are part of a conversion, not "
            f"a whole split (a pattern naming them would read part of it). Wait for the conversion to "
            f"finish, or run the convert command again to finish it (it resumes), then read the folder"
        )


def _check_exist(text: str, urls: list[str]) -> None:
    """Local shards a pattern names must exist (remote ones are found missing when read; the
    inspectors report missing shards themselves)."""
    missing = [u for u in urls if (local := local_path(u)) is not None and not os.path.isfile(local)]
    if missing:
        folder = parent(missing[0])
        where = _missing_folder(folder) or _listed_patterns(folder)
        raise ShardError(
            f"{text}: {len(missing)} of {len(urls)} shards do not exist, e.g. {missing[0]}"
            + (f" ({where})" if where else "")
            + "; check the pattern, or point at the shards folder"
        )


def _listed_patterns(folder: str) -> str:
    """What an existing folder's index.json lists, split by split (``train-{000000..000005}.tar``); "" without one."""
    try:
        where = join(folder, INDEX_FILE)
        info = parse(read_index(where), where)
    except (OSError, IndexFormatError):
        return ""
    listed = ", ".join(f"{sp.urls} ({sp.shards:,} {name})" for name, sp in info.splits.items())
    return f"{join(folder, INDEX_FILE)} lists {listed}" if listed else ""


def resolve_target(
    path: str | os.PathLike | None,
    *,
    out: str | os.PathLike = "shards",
    scan: bool = False,
    strict: bool = True,
    allow_mixed: bool = False,
) -> Shards:
    """What the inspectors (stats, verify) read: PATH, or the newest version under ``out``.

    Without ``scan`` an index must list every shard, and the shards must be in one folder (its
    index is what is reported on); with it a folder may hold tars alone, and several folders are
    read as one set. ``strict`` as in ``resolve`` (verify passes False and reports bad entries
    itself); ``allow_mixed`` as in ``resolve``. A spec naming part of a split is accepted: its
    ``gaps`` say what it leaves out, and the inspectors print them.
    """
    if path is None:
        path = newest_dataset(out, need_index=not scan)
    return resolve(
        path,
        need_index=not scan,
        scan=scan,
        one_folder=not scan,
        strict=strict,
        allow_mixed=allow_mixed,
        allow_partial=True,
    )


def newest_dataset(out: str | os.PathLike, *, need_index: bool = True) -> str:
    """The most recently modified local ``OUT/<version>/<size>/`` holding index.json (or, if not needed, tars)."""
    out = Path(out)
    indexed = indexes_newest_first(out)
    if indexed:
        return str(indexed[0])
    found = []
    if not need_index:
        found = [
            (max(t.stat().st_mtime for t in d.glob("*.tar")), d)
            for d in out.glob("*/*")
            if d.is_dir() and any(d.glob("*.tar"))
        ]
    if not found:
        what = f"OUT/<version>/<size>/{INDEX_FILE}" if need_index else "OUT/<version>/<size>/*.tar"
        raise IndexFormatError(
            f"no converted dataset under {out} (looked for {what}); pass a PATH, or --out with the "
            "folder you converted into"
        )
    return str(max(found, key=lambda t: (t[0], str(t[1])))[1])
