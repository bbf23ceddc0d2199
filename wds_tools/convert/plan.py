"""Pure planning: which split a key falls in, the order of samples, which shard holds which sample.

Everything here is a function of its arguments and a seed, so a conversion, its resumption,
an incremental update and a fresh conversion of the same rows agree on every byte.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..format.names import shard_name
from ..format.npy import NPY_HEADER_BYTES
from ..format.tarwrite import BLOCK as TAR_BLOCK

__all__ = [
    "key_hash",
    "assign_split",
    "split_groups",
    "sample_bytes",
    "default_shard_size",
    "parse_shard_size",
    "plan_split",
    "ShardPlan",
]

# Default shard target: ~256 MB, between the 100 MB and 500 MB webdataset recommends.
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024


def key_hash(key: str, seed: int, purpose: str = "order") -> int:
    """A 64-bit seeded hash of a key; stable across processes, platforms and Python versions."""
    digest = hashlib.blake2b(f"{purpose}:{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign_split(key: str, *, seed: int, val_fraction: float) -> str:
    """'val' for a seeded-hash fraction of keys, else 'train'."""
    return "val" if key_hash(key, seed, "split") < val_fraction * 2**64 else "train"


Unit = tuple[str, str]  # a split unit: ("g", group value as text) or ("k", key) for a row without a group


def unit_hash(unit: Unit, seed: int) -> int:
    """h_group of a group's text (``"group:<seed>:<text>"``), h_split of an ungrouped row's key."""
    kind, text = unit
    return key_hash(text, seed, "group" if kind == "g" else "split")


def split_groups(
    units: Mapping[Unit, Mapping[int, int]],
    *,
    seed: int,
    val_fraction: float,
    stratify: bool = False,
    fixed: Mapping[Unit, str] | None = None,
) -> dict[Unit, str]:
    """The split of every unit (a group, or an ungrouped row), ``units`` giving its samples per label.

    ``fixed`` units keep their split (a manifest split column, or the base version's). Without
    ``stratify``, a unit goes to ``val`` when its hash is below ``val_fraction`` · 2^64, as a key does
    without groups. With ``stratify``, each unit belongs to the class most of its samples have (the
    smallest label index on a tie); per class, of the units in train or val (fixed ones included),
    with S their samples and v those in fixed val units, the other units are taken in order of
    (hash, unit) and each goes to val when 2·v + n < 2 · val_fraction · S, n its samples (exactly, with the
    double's exact value), v growing as it does. So each class's val samples are within half its
    largest unit of val_fraction × its samples when nothing is fixed (and, for units of one label,
    per label). Last, with 0 < val_fraction < 1 and two units or more, neither train nor val is left
    empty (``_neither_empty``).
    """
    fixed = dict(fixed or {})
    out: dict[Unit, str] = {}
    if not stratify:
        limit = val_fraction * 2**64
        for unit in units:
            out[unit] = fixed.get(unit) or ("val" if unit_hash(unit, seed) < limit else "train")
        return _neither_empty(out, fixed, seed=seed, val_fraction=val_fraction)
    frac = Fraction(val_fraction)
    pools: dict[int, list] = {}  # majority class -> [(hash, unit, samples)] of units to draw
    total: dict[int, int] = {}
    in_val: dict[int, int] = {}
    for unit, labels in units.items():
        n = sum(labels.values())
        major = min(labels, key=lambda c: (-labels[c], c)) if labels else -1
        split = fixed.get(unit)
        if split is not None:
            out[unit] = split
            if split not in ("train", "val"):
                continue
            in_val[major] = in_val.get(major, 0) + (n if split == "val" else 0)
        else:
            pools.setdefault(major, []).append((unit_hash(unit, seed), unit, n))
        total[major] = total.get(major, 0) + n
    for major, pool in pools.items():
        v, bound = in_val.get(major, 0), 2 * frac.numerator * total[major]
        for _, unit, n in sorted(pool):
            if (2 * v + n) * frac.denominator < bound:
                out[unit] = "val"
                v += n
            else:
                out[unit] = "train"
    return _neither_empty(out, fixed, seed=seed, val_fraction=val_fraction)


def _neither_empty(
    out: dict[Unit, str], fixed: Mapping[Unit, str], *, seed: int, val_fraction: float
) -> dict[Unit, str]:
    """With 0 < val_fraction < 1 and at least two units in train or val, neither comes out empty:
    an empty val takes the drawn (not fixed) train unit of the smallest (hash, unit), an empty train
    the drawn val unit of the largest; when every unit is fixed, the splits stay as they are."""
    if not 0 < val_fraction < 1 or sum(1 for s in out.values() if s in ("train", "val")) < 2:
        return out
    for empty, other, pick in (("val", "train", min), ("train", "val", max)):
        if empty in out.values():
            continue
        drawn = [(unit_hash(u, seed), u) for u, s in out.items() if s == other and u not in fixed]
        if drawn:
            out[pick(drawn)[1]] = empty
    return out


def sample_bytes(size: int, json_bytes: int = 256) -> int:
    """Approximate bytes a sample takes in a tar: four headers (.cls, .i32, .json, .npy), data, padding."""
    npy = NPY_HEADER_BYTES + size * size * 3
    pad = lambda n: -(-n // TAR_BLOCK) * TAR_BLOCK  # noqa: E731
    return 4 * TAR_BLOCK + pad(npy) + pad(8) + pad(4) + pad(json_bytes)


def default_shard_size(size: int) -> int:
    """Samples per shard so that a shard holds about 256 MB."""
    return max(1, DEFAULT_SHARD_BYTES // sample_bytes(size))


def parse_shard_size(value: str | int | None, size: int) -> int:
    """A sample count ("2000") or a byte target ("256MB", "1GiB"); None gives the default."""
    from ..errors import OptionError

    if value is None:
        return default_shard_size(size)
    if isinstance(value, int):
        n = value
    else:
        text = value.strip().upper().replace(" ", "")
        units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
        for unit, mult in units.items():
            if text.endswith(unit):
                try:
                    target = float(text[: -len(unit)]) * mult
                except ValueError:
                    raise OptionError(f"--shard-size {value!r}: expected a number before {unit}") from None
                n = int(target // sample_bytes(size))
                break
        else:
            try:
                n = int(text)
            except ValueError:
                raise OptionError(f"--shard-size {value!r}: expected a sample count (2000) or a size (256MB)") from None
    if n < 1:
        raise OptionError(f"--shard-size {value!r} gives {n} samples per shard; it must be at least 1")
    return n


@dataclass(frozen=True)
class ShardPlan:
    """One shard of a split's plan: its number and its members in write order."""

    split: str
    index: int  # shard number within the split
    members: tuple[int, ...]  # positions into the caller's item list, in write order

    @property
    def name(self) -> str:
        """The shard's file name."""
        return shard_name(self.split, self.index)


def plan_split(split: str, items: Sequence[tuple[str, int]], *, shard_size: int, seed: int) -> list[ShardPlan]:
    """Assign (key, label) items of one split to shards, stratified by label.

    The number of shards is ceil(n / shard_size). Items are sorted by (label, seeded hash of
    key) and dealt round-robin, so shard sizes differ by at most one and each class is spread
    over the shards as evenly as integers allow. Within a shard, samples are ordered by the
    seeded hash of their key, which interleaves the classes.
    """
    if not items:
        return []
    hashes = [key_hash(k, seed) for k, _ in items]
    order = sorted(range(len(items)), key=lambda i: (items[i][1], hashes[i], items[i][0]))
    n_shards = math.ceil(len(items) / shard_size)
    buckets: list[list[int]] = [[] for _ in range(n_shards)]
    for pos, i in enumerate(order):
        buckets[pos % n_shards].append(i)
    return [
        ShardPlan(split, s, tuple(sorted(b, key=lambda i: (hashes[i], items[i][0])))) for s, b in enumerate(buckets)
    ]
