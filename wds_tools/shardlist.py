"""Which shards a command looks at: a shards folder, an index file, a URL pattern, or the newest version."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import IndexFormatError, OptionError
from .index import INDEX_FILE, DatasetIndex, indexes_newest_first, load_index

__all__ = ["Target", "resolve_target", "newest_dataset", "shard_split", "expand_pattern"]

_SHARD_NAME = re.compile(r"^(?P<split>.+)-(?P<num>\d{6})\.tar$")


@dataclass
class Target:
    """A resolved PATH: the folder, its index when there is one, and the shard files named."""

    path: str  # as the user gave it, or the default that was picked
    root: Path  # the folder that holds the shards
    index: DatasetIndex | None
    shards: list[Path]  # in index order (index), or name order (no index)
    selected: bool = False  # True when PATH named some shards (a pattern or a .tar), not a whole folder

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.shards]


def shard_split(name: str) -> str:
    """The split a shard file belongs to, from its name ``<split>-NNNNNN.tar``."""
    m = _SHARD_NAME.match(name)
    return m.group("split") if m else "all"


def newest_dataset(out: str | os.PathLike, *, need_index: bool = True) -> Path:
    """The most recently modified ``OUT/<version>/<size>/`` holding index.json (or, if not needed, tars)."""
    out = Path(out)
    indexed = indexes_newest_first(out)
    if indexed:
        return indexed[0]
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
    return max(found, key=lambda t: (t[0], str(t[1])))[1]


def expand_pattern(pattern: str) -> list[str]:
    """A webdataset brace pattern (``train-{000000..000041}.tar``) as its list of names."""
    import braceexpand  # installed with webdataset

    return list(braceexpand.braceexpand(pattern))


def resolve_target(path: str | os.PathLike | None, *, out: str | os.PathLike = "shards",
                   need_index: bool = True) -> Target:
    """Resolve PATH (folder, index.json, shard, or brace pattern; None: the newest under ``out``).

    With ``need_index`` False a folder or pattern without an index is accepted (for ``--scan``).
    """
    if path is None:
        root = newest_dataset(out, need_index=need_index)
        return _from_folder(str(root), root, need_index)
    text = os.fspath(path)
    if "://" in text or text.startswith("pipe:"):
        raise OptionError(f"{text}: only local paths are supported, not URLs")
    p = Path(text)
    if p.is_dir():
        return _from_folder(text, p, need_index)
    if p.is_file() and p.suffix == ".json":
        idx = load_index(p)
        return Target(text, idx.root, idx, [idx.root / s["name"] for s in idx.shards])
    if "{" in text or p.suffix == ".tar":
        files = [Path(f) for f in expand_pattern(text)] if "{" in text else [p]
        if not files:
            raise OptionError(f"{text}: the pattern names no files")
        folders = {f.parent for f in files}
        if len(folders) > 1:
            raise OptionError(f"{text}: the pattern spans several folders; give one shards folder at a time")
        root = folders.pop()
        if (root / INDEX_FILE).exists():
            idx = load_index(root)
            known = {s["name"] for s in idx.shards}
            unknown = [f.name for f in files if f.name not in known]
            if unknown and need_index:
                raise IndexFormatError(
                    f"{text}: {len(unknown)} shard(s) are not in {root / INDEX_FILE} "
                    f"(first: {unknown[0]}); use --scan to read the tars themselves"
                )
            return Target(text, root, idx, files, selected=True)
        if need_index:
            raise IndexFormatError(
                f"no index at {root / INDEX_FILE}; pass --scan to read the tars themselves (slower)"
            )
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise IndexFormatError(f"{text}: {len(missing)} shard(s) do not exist (first: {missing[0]})")
        return Target(text, root, None, files, selected=True)
    raise OptionError(f"{text}: no such shards folder, index file or shard pattern")


def _from_folder(text: str, root: Path, need_index: bool) -> Target:
    if (root / INDEX_FILE).exists():
        idx = load_index(root)
        return Target(text, root, idx, [root / s["name"] for s in idx.shards])
    if need_index:
        raise IndexFormatError(
            f"no index at {root / INDEX_FILE}; pass --scan to read the tars themselves (slower)"
        )
    shards = sorted(root.glob("*.tar"))
    if not shards:
        raise IndexFormatError(f"{root}: neither {INDEX_FILE} nor any *.tar shard")
    return Target(text, root, None, shards)
