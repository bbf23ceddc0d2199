"""What ``wds-tools verify`` found: problems by kind, and the report (text and the ``--json`` schema)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["SCHEMA", "PROBLEM_KINDS", "MAX_PER_KIND", "INDEX", "Problem", "VerifyReport", "capped", "duplicate_keys"]

SCHEMA = "wds-tools-verify/1"
"""The ``--json`` schema name and version of ``verify``."""
MAX_PER_KIND = 20
"""Problems of one kind listed per shard; the rest are summed up in one more."""
INDEX = "index.json"
"""The ``shard`` of a problem in index.json itself."""

PROBLEM_KINDS = {
    # the shards' bytes
    "missing": "the shard file does not exist",
    "unreadable": "the shard file cannot be opened or read to its end (permissions, I/O error)",
    "size": "the file size differs from the index",
    "sha256": "the file's SHA-256 differs from the index",
    "truncated": "the archive ends inside a member, inside a header, or without its end blocks",
    "tar_header": "a block where a ustar header should be is not one (bad magic, checksum or type)",
    "missing_member": "a member the index lists is not in the tar",
    "extra_member": "the tar holds a member the index does not list",
    "duplicate_member": "a member name occurs more than once in the tar",
    "member_offset": "members are not at the offset or length the index says",
    "npy_header": "a .npy member's header does not say dtype |u1 and shape [S, S, 3]",
    "incomplete_sample": "a sample does not have exactly one .cls, .json and .npy member (no index)",
    "duplicate_key": "a key occurs in more than one sample",
    # the samples' contents against samples.npz (the shards' bytes are the ground truth)
    "sample_data": "a .npy member's XXH3-64 differs from samples.npz npy_xxh3 (pixels or the column changed), "
    "or, after a sha256 mismatch, a member's bytes differ from the index",
    "label": "a .cls member is not a class index, or differs from the sample's label in samples.npz",
    "class_name": "the class name in a sample's .json is not classes[label]: classes is reordered or edited",
    "phash": "a sample's perceptual hashes, recomputed from its pixels (as converted: its XXH3-64 matches), differ "
    "from samples.npz phash (format version 3; checked by a full verify with --phash / phash=True)",
    "sample_meta": "a .json member's key, fingerprint, width, height, source_path or meta (the manifest's other "
    "columns) differs from samples.npz",
    # the index against itself and the data
    "index": "samples.npz is missing or unreadable, or its size or sha256 differs from index.json",
    "field": "an index.json field (metadata included) is missing, of the wrong type, or disagrees with the rest "
    "of the index",
    "shard_name": "index.json names a file outside its folder or not <split>-NNNNNN.tar (never read)",
    "count": "a count in index.json (samples, class_counts, splits.*.samples, .shards, .class_counts, "
    "shards[].samples) differs from samples.npz",
    "urls": "a split's URL pattern does not name exactly that split's shards",
    "column": "a samples.npz column (metadata columns included) is missing, of the wrong dtype or shape, or out "
    "of order or range",
    "group_split": "a group of the build.group column has samples in more than one split",
    "image_size": "size, sample.npy_shape or samples.npz npy_length disagree with each other or the .npy headers",
    "pixel_stats": "mean/std in index.json differ from the pixels (recomputed when verify reads every byte)",
    "leakage": "near-duplicate images (wds-tools dups) sit in more than one split (checked with --no-leakage)",
}
"""Every problem kind ``verify`` reports, and what it means."""


@dataclass
class Problem:
    """One thing wrong: the file (a shard, index.json or samples.npz), its kind (``PROBLEM_KINDS``), and where."""

    shard: str
    kind: str
    message: str
    key: str | None = None
    offset: int | None = None

    def to_dict(self) -> dict:
        """The problem as plain JSON types."""
        return {"shard": self.shard, "kind": self.kind, "message": self.message, "key": self.key, "offset": self.offset}


_CHECKS = {
    "full": "the index against itself; sizes, sha256, member tables, .npy headers and checksums, labels, "
    "sample metadata, mean/std from the pixels",
    "quick": "the index against itself; sizes, member tables, .npy headers, labels, sample metadata "
    "(no sha256, pixels or mean/std)",
    "scan": "tar structure, .npy headers, keys (no index: sizes and hashes unchecked)",
    "scan-quick": "tar headers, .npy headers, keys (no index: sizes and hashes unchecked)",
}


@dataclass
class VerifyReport:
    """What ``wds-tools verify`` prints; ``to_dict`` is the stable ``--json`` schema (``SCHEMA``)."""

    path: str
    root: str
    index: str | None
    mode: str  # "full", "quick", "scan" or "scan-quick"
    shards: int = 0
    samples: int = 0
    bytes: int = 0  # size of the shards checked
    bytes_read: int = 0
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    @property
    def bad_shards(self) -> list[str]:
        """The files with a problem, sorted."""
        return sorted({p.shard for p in self.problems})

    @property
    def bad_samples(self) -> list[str]:
        """The keys of the samples with a problem, sorted."""
        return sorted({p.key for p in self.problems if p.key is not None})

    def to_dict(self) -> dict:
        """The stable ``--json`` schema (``SCHEMA``)."""
        return {
            "schema": SCHEMA,
            "path": self.path,
            "root": self.root,
            "index": self.index,
            "mode": self.mode,
            "ok": self.ok,
            "shards": self.shards,
            "samples": self.samples,
            "bytes": self.bytes,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 4),
            "read_mb_per_s": round(self.bytes_read / self.seconds / 1e6, 1) if self.seconds > 0 else None,
            "bad_shards": self.bad_shards,
            "bad_samples": self.bad_samples,
            "problems": [p.to_dict() for p in self.problems],
            "warnings": self.warnings,
        }

    def to_text(self) -> str:
        """The report as text: a summary line, warnings, then each problem."""
        reads_all = self.mode in ("full", "scan")
        rate = (
            f", {self.bytes_read / self.seconds / 1e6:,.0f} MB/s"
            if reads_all and self.seconds > 0 and self.bytes_read
            else ""
        )
        lines = [
            f"{self.root}: checked {self.shards:,} shards, {self.samples:,} samples "
            f"({_CHECKS[self.mode]}) in {self.seconds:.2f} s{rate}"
        ]
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        if self.ok:
            lines.append("OK: every shard is intact.")
            return "\n".join(lines)
        lines.append(
            f"FAILED: {len(self.problems)} problem(s) in {len(self.bad_shards)} file(s): {', '.join(self.bad_shards)}"
        )
        for p in self.problems:
            where = "".join([f" key {p.key}" if p.key else "", f" @{p.offset}" if p.offset is not None else ""])
            lines.append(f"  {p.shard} [{p.kind}]{where}: {p.message}")
        if self.bad_samples:
            lines.append(
                f"bad samples: {', '.join(self.bad_samples[:50])}"
                + (f" ... and {len(self.bad_samples) - 50} more" if len(self.bad_samples) > 50 else "")
            )
        return "\n".join(lines)


def capped(problems: list[Problem]) -> list[Problem]:
    """At most ``MAX_PER_KIND`` problems of one kind per file, and one line counting the rest."""
    by_kind: Counter = Counter()
    kept: list[Problem] = []
    dropped: Counter[tuple[str, str]] = Counter()
    for p in problems:
        by_kind[(p.shard, p.kind)] += 1
        if by_kind[(p.shard, p.kind)] <= MAX_PER_KIND:
            kept.append(p)
        else:
            dropped[(p.shard, p.kind)] += 1
    for (shard, kind), n in dropped.items():
        kept.append(Problem(shard, kind, f"... and {n} more {kind} problems in this file"))
    return kept


def duplicate_keys(found: list[tuple[str, list[str]]], total: int, says: str, rest_in: str) -> list[Problem]:
    """A problem in each file holding one of the first ``MAX_PER_KIND`` duplicated keys (``found``: each with
    the file of each occurrence; ``says``: how often, as "... {n} ..."), one in ``rest_in`` counting the
    other ``total`` - ``MAX_PER_KIND``."""
    problems = []
    for key, names in found[:MAX_PER_KIND]:
        what = f"key {key} {says.format(n=len(names))} ({', '.join(sorted(set(names)))})"
        problems += [Problem(shard, "duplicate_key", what, key=key) for shard in sorted(set(names))]
    if total > MAX_PER_KIND:
        problems.append(Problem(rest_in, "duplicate_key", f"... and {total - MAX_PER_KIND} more duplicated keys"))
    return problems
