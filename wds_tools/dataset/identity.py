"""Whether the shards a spec names belong together: one dataset (``dataset_identity``), and whole splits.

``dataset.resolve`` asks before any reader sees a shard: parts from different datasets are *mixed* (a version
that added a class shifts every label), a split named only in part is *partial*. Copies of one dataset are one
dataset wherever they are; shards without an index are not compared. The rules: docs/FORMAT.md, "Layout".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ..errors import OptionError
from ..format.model import salvage

if TYPE_CHECKING:
    from .resolve import Shards  # (resolve imports this module)

__all__ = [
    "RECORD_ONLY",
    "dataset_identity",
    "dataset_key",
    "differences",
    "datasets",
    "Gap",
    "check_mixed",
    "gaps",
    "check_partial",
    "MIXED_HINT",
    "PARTIAL_HINT",
]

RECORD_ONLY = ("source_path", "base")
"""``build`` fields that are provenance only: the same conversion may record other values."""
# index.json fields that make a dataset; two indexes equal in all of them are copies of one dataset
_IDENTITY = ("format_version", "dataset_version", "size", "classes", "resize", "decode", "build", "shards")
_SHARD_FIELDS = ("name", "split", "samples", "bytes", "sha256")
SHOWN = 3  # names listed in a message before "and N more"

MIXED_HINT = (
    "pass allow_mixed=True to read them as one set anyway (wds-tools stats/verify: --allow-mixed; "
    "a trainer config: allow_mixed: true in its dataset block)"
)
"""How to read shards of different datasets as one set anyway, for refusals."""
PARTIAL_HINT = (
    "pass allow_partial=True to read only the shards named, on purpose (a quick experiment; "
    "a trainer config: allow_partial: true in its dataset block)"
)
"""How to read a pattern naming part of a split anyway, for refusals."""


# ------------------------------------------------------------------ what a dataset is


def dataset_identity(meta: dict) -> dict:
    """The fields of an index.json that say which dataset it is: version, size, classes, how it was
    built (``build`` without the provenance-only ``RECORD_ONLY``, ``resize``, ``decode``) and its
    shards (name, split, samples, bytes, sha256). Equal identities: the same samples, labels and
    bytes, shard for shard."""
    ident = {k: meta.get(k) for k in _IDENTITY}
    build = meta.get("build")
    if isinstance(build, dict):
        ident["build"] = {k: v for k, v in build.items() if k not in RECORD_ONLY}
    shards = meta.get("shards")
    if isinstance(shards, list):
        ident["shards"] = [{k: s.get(k) for k in _SHARD_FIELDS} if isinstance(s, dict) else s for s in shards]
    return ident


def dataset_key(meta: dict) -> str:
    """``dataset_identity`` as one comparable string."""
    return json.dumps(dataset_identity(meta), sort_keys=True, default=repr)


def _class_difference(a: object, b: object, na: str, nb: str) -> str:
    """How class list ``b`` differs from ``a``: names only in one, and shared names whose index differs
    (a label meaning one class in ``a`` means another in ``b``)."""
    if not (isinstance(a, list) and isinstance(b, list)):
        return f"classes {_short(a)} / {_short(b)}"
    pos_a, pos_b = {c: i for i, c in enumerate(a)}, {c: i for i, c in enumerate(b)}
    parts = [f"classes: {len(a)} / {len(b)}"]
    only_b = [c for c in b if c not in pos_a]
    only_a = [c for c in a if c not in pos_b]
    if only_b:
        parts.append(f"{_few(only_b)} only in {nb}")
    if only_a:
        parts.append(f"{_few(only_a)} only in {na}")
    shared = [c for c in a if c in pos_b]
    moved = [c for c in shared if pos_a[c] != pos_b[c]]
    if moved:
        which = "every one of the" if len(moved) == len(shared) else f"{len(moved)} of the"
        shown = ", ".join(f"{c!r} {pos_a[c]} / {pos_b[c]}" for c in moved[:SHOWN])
        more = f", and {len(moved) - SHOWN} more" if len(moved) > SHOWN else ""
        parts.append(
            f"{which} {len(shared)} shared classes has another index ({shown}{more}): "
            f"the same label means different classes"
        )
    return "; ".join(parts)


def differences(a: dict, b: dict, na: str = "[1]", nb: str = "[2]") -> list[str]:
    """What makes index ``b`` another dataset than index ``a`` (empty: copies of one dataset)."""
    ia, ib = dataset_identity(a), dataset_identity(b)
    out = []
    for k in _IDENTITY[:-1]:
        x, y = ia.get(k), ib.get(k)
        if x == y:
            continue
        if k == "classes":
            out.append(_class_difference(x, y, na, nb))
        elif isinstance(x, dict) and isinstance(y, dict):
            out += _dict_difference(x, y, k)
        else:
            out.append(f"{k} {_short(x)} / {_short(y)}")
    if not out and ia["shards"] != ib["shards"]:  # (other shards follow from any difference above)
        out.append(_shard_difference(ia["shards"], ib["shards"]))
    return out


def _dict_difference(x: dict, y: dict, prefix: str) -> list[str]:
    out = []
    for k in sorted(set(x) | set(y), key=str):
        a, b, name = x.get(k), y.get(k), f"{prefix}.{k}"
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += _dict_difference(a, b, name)
        elif name == "build.source.digest":
            out.append(f"{name} {_short(a)} / {_short(b)} (another source: rows, keys, paths, labels or splits)")
        else:
            out.append(f"{name} {_short(a)} / {_short(b)}")
    return out


def _shard_difference(x: object, y: object) -> str:
    if not (isinstance(x, list) and isinstance(y, list)):
        return "shards differ"
    if len(x) != len(y):
        return f"shards: {len(x)} / {len(y)}"
    other = [i for i, (s, t) in enumerate(zip(x, y)) if s != t]
    first = x[other[0]]
    name = first.get("name") if isinstance(first, dict) else other[0]
    return (
        f"shards: {len(other)} of {len(x)} hold other bytes or samples (first: {name}), e.g. converted "
        f"again from changed images or with another Pillow"
    )


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:16] + "..." + text[-3:]


def _few(names: Sequence[object]) -> str:
    shown = ", ".join(repr(n) if not isinstance(n, str) or "," in n else n for n in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more ({len(names)} in all)" if len(names) > SHOWN else "")


def _about(index_file: str, meta: dict) -> str:
    classes = meta.get("classes")
    n = f"{len(classes)} classes" if isinstance(classes, list) else "classes unknown"
    return f"{index_file} (dataset_version {meta.get('dataset_version')!r}, {meta.get('size')} px, {n})"


# ------------------------------------------------------------------ mixed


class _Indexed(NamedTuple):
    """A part with an index: its index.json as written and that file's path."""

    raw: dict
    index_file: str
    part: Shards


def _by_dataset(parts: Sequence[Shards]) -> dict[str, list[_Indexed]]:
    """The parts with an index, grouped by dataset (in the order first named)."""
    indexed = [_Indexed(p.raw, p.index_file, p) for p in parts if p.raw is not None and p.index_file is not None]
    if len({id(i.raw) for i in indexed}) <= 1:  # one index read once (the usual spec): nothing to compare
        return {"": indexed} if indexed else {}
    groups: dict[str, list[_Indexed]] = {}
    for i in indexed:
        groups.setdefault(dataset_key(i.raw), []).append(i)
    return groups


def datasets(parts: Sequence[Shards]) -> list[dict]:
    """The index.json of each dataset the parts belong to (copies count once), in the order named."""
    return [g[0].raw for g in _by_dataset(parts).values()]


def check_mixed(spec: str, parts: Sequence[Shards]) -> None:
    """Refuse (``OptionError``) parts of different datasets, naming each (its index, version, size,
    classes, the parts of the spec in it) and how it differs from the first. Parts without an index
    are not compared."""
    groups = _by_dataset(parts)
    if len(groups) > 1:
        firsts = [g[0] for g in groups.values()]
        tags = [f"[{i + 1}]" for i in range(len(firsts))]
        lines = [f"{spec}: these shards belong to {len(firsts)} different datasets, which cannot be read as one set:"]
        lines += [
            f"  {t} {_about(g[0].index_file, g[0].raw)}: {_parts_text([i.part for i in g])}"
            for t, g in zip(tags, groups.values())
        ]
        for t, p in zip(tags[1:], firsts[1:]):
            lines.append(f"  {tags[0]} vs {t}: " + "; ".join(differences(firsts[0].raw, p.raw, tags[0], t)))
        lines.append(
            f"Read as one set, a label can name different classes in different shards and a key can "
            f"occur twice. Give the shards of one dataset, or {MIXED_HINT}."
        )
        raise OptionError("\n".join(lines))


def _parts_text(parts: Sequence[Shards]) -> str:
    shown = [f"{len(p)} shard{'s' if len(p) != 1 else ''} of {p.spec}" for p in parts[:SHOWN]]
    return "; ".join(shown) + (f"; and {len(parts) - SHOWN} more parts" if len(parts) > SHOWN else "")


# ------------------------------------------------------------------ partial


@dataclass(frozen=True)
class Gap:
    """A split of which a spec names some shards but not all: its index, the split, how many shards
    are named of how many, and the names left out (in index order)."""

    index_file: str
    split: str
    named: int
    total: int
    missing: tuple[str, ...]

    def describe(self, where: bool = True) -> str:
        """``names 3 of the 7 train shards of <index.json>; missing: ...`` (``where``: with the index)."""
        of = f" of {self.index_file}" if where else ""
        return f"names {self.named} of the {self.total} {self.split} shards{of}; missing: {_few(list(self.missing))}"

    def to_dict(self) -> dict:
        """The gap as JSON (``--json`` output)."""
        return {
            "index": self.index_file,
            "split": self.split,
            "named": self.named,
            "total": self.total,
            "missing": list(self.missing),
        }


def gaps(parts: Sequence[Shards]) -> list[Gap]:
    """Per dataset (copies count as one), the splits whose shards the parts name only in part."""
    out = []
    for group in _by_dataset(parts).values():
        # (a part naming tars its index lacks has no names: what it leaves out is not known)
        listing = [(i, i.part.names) for i in group if i.part.names is not None]
        if not listing:
            continue
        p, names = listing[0][0], {n for _, listed_names in listing for n in listed_names}
        by_split: dict[str, list[str]] = {}
        listed = p.part.info.shards if p.part.info is not None else salvage(p.raw)[0].shards
        for s in listed:  # (an entry with a problem is never read: verify reports it)
            if s is not None:
                by_split.setdefault(s.split, []).append(s.name)
        for split, all_names in by_split.items():
            have = [n for n in all_names if n in names]
            if have and len(have) < len(all_names):
                out.append(
                    Gap(p.index_file, split, len(have), len(all_names), tuple(n for n in all_names if n not in names))
                )
    return out


def check_partial(spec: str, found: Sequence[Gap]) -> None:
    """Refuse (``OptionError``) a spec that names only part of a split's shards, naming what is missing."""
    if found:
        what = "; ".join(g.describe() for g in found)
        raise OptionError(
            f"{spec}: {what}. It would read part of the split: give the shards folder or its "
            f"index.json to read every shard, correct the pattern, or {PARTIAL_HINT}."
        )
