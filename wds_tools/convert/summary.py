"""What a conversion did: one ``ConvertResult`` per size (``ConvertResults`` for several), printed
by the CLI as text or JSON."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from ..dataset.splits import class_gaps, gap_warnings
from ..format.model import IndexMeta
from ..format.names import url_pattern
from ..storage.objects import Store
from ..storage.transport import join
from .indexwrite import errors_order
from .write import ShardTask

__all__ = [
    "ConvertResult",
    "ConvertResults",
    "dry_run_result",
    "base_text",
    "result_from_index",
    "count",
    "split_report",
]


def count(n: int, word: str, plural: str | None = None) -> str:
    """``n`` and ``word``, plural unless n is 1: "1 shard", "12 shards", "1,200 images"."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


_LISTED = 10  # skipped files the text summary names


@dataclass
class ConvertResult:
    """What a conversion did; the CLI prints it as text or JSON."""

    out_dir: str
    dataset_version: str
    size: int
    samples_written: int = 0
    failed: int = 0
    failures: list[dict] = field(default_factory=list)  # the first ten of them as errors.jsonl lists them:
    # {"key", "path", "line" (a manifest's), "stage", "error"}
    shards: int = 0
    shards_resumed: int = 0  # shards an interrupted run had finished, kept
    samples_resumed: int = 0  # the samples in them (not counted in images_per_second)
    base: str | None = None  # the version whose pixels were reused
    base_rule: str | None = None  # how it was chosen: "newest" (the default) or "from" (--from)
    decoded: int = 0  # samples decoded from source in this run
    reused: int = 0  # samples copied from the base: label unchanged, or found under another key
    relabeled: int = 0  # samples copied from the base: same key and source bytes, another label (diff's rule)
    removed: int = 0  # base samples absent from this version
    by_key: dict[str, int] = field(default_factory=dict)  # against the base by key, as `wds-tools diff` counts
    reuse_problems: list[dict] = field(default_factory=list)  # base samples that failed their check
    checksum: bool = False  # every source was read to compare with the base (--checksum)
    unchanged_by_stat: int = 0  # sources taken as unchanged by path, size and mtime, not read
    unchanged_by_hash: int = 0  # sources taken as unchanged by their manifest sha256/md5, not read
    sources_read: int = 0  # sources read whole to fingerprint them against the base
    shared_decode: list[int] = field(default_factory=list)  # sizes decoded together with this one
    decodes: int = 0  # image decodes this size's samples took (shared with the sizes above)
    dry_run: bool = False
    seconds: float = 0.0
    images_per_second: float = 0.0
    splits: dict[str, dict] = field(default_factory=dict)
    split_shares: dict[str, float] = field(default_factory=dict)  # each split's share of the samples
    class_val_shares: dict[str, float] = field(default_factory=dict)  # each class's share of its samples in val
    split_warnings: list[str] = field(default_factory=list)  # class gaps, then shares beyond the tolerance
    # (split_report)
    class_gaps: list[dict] = field(default_factory=list)  # classes with no train or no val samples
    # (dataset.splits.class_gaps)
    split_base: str | None = None  # the version whose groups kept their split (build.split_base)
    resplit: bool = False  # every group's split drawn afresh (--resplit)
    errors_file: str | None = None
    max_errors_allowed: int = 0
    max_errors_exceeded: bool = False
    already_complete: bool = False
    notes: list[str] = field(default_factory=list)  # e.g. a lock or clean-up taken over from a killed run
    narrow_pixels: list[dict] = field(default_factory=list)  # errors.jsonl's stage "pixels" lines: a warning
    skipped: list[dict] = field(default_factory=list)  # an image folder's entries not converted: {"path", "reason"}

    def to_text(self) -> str:
        """What the run did (or would do), per split, with reuse and failure counts."""
        if self.already_complete:
            lines = [f"{self.out_dir} is already converted with these options; nothing to do."]
        elif self.dry_run:
            samples = sum(s["samples"] for s in self.splits.values())
            lines = [
                f"Dry run, nothing written: {self.out_dir} would hold {count(samples, 'sample')} in "
                f"{count(self.shards, 'shard')}"
            ]
        else:
            lines = [
                f"Converted {count(self.samples_written, 'image')} into {count(self.shards, 'shard')} in "
                f"{self.out_dir} ({self.seconds:.1f} s{self._rate()})"
            ]
        if self.base is not None and not self.already_complete:
            lines[0] += f"; {base_text(self.base, self.base_rule)}"
        width = max([len(s) for s in self.splits] + [5])
        for name, sp in self.splits.items():
            lines.append(
                f"  {name:<{width}} {sp['samples']:>9,} samples {sp['shards']:>5} "
                f"shard{'s' if sp['shards'] != 1 else ' '}  {sp['urls']}"
            )
        if self.split_shares and not self.dry_run:
            shares = ", ".join(f"{name} {share:.1%}" for name, share in self.split_shares.items())
            lines.append(f"  split shares: {shares}")
        if self.split_base is not None:
            lines.append(
                f"  splits: groups that {self.split_base} holds keep its split (build.split_base); "
                "--resplit draws them all again"
            )
        elif self.resplit:
            lines.append("  splits: every group's split drawn afresh (--resplit), none kept from an earlier version")
        loud = len(gap_warnings(self.class_gaps))  # the class gaps come first, in capitals
        lines += [f"  {'WARNING' if i < loud else 'warning'}: {w}" for i, w in enumerate(self.split_warnings)]
        if self.base is not None or self.dry_run:
            lines.append(
                f"  from base {self.base or '(none)'}: {self.reused:,} reused, {self.relabeled:,} "
                f"relabeled, {self.decoded:,} decoded, {self.removed:,} removed"
            )
        if self.by_key:
            k = self.by_key
            lines.append(
                f"  by key, as wds-tools diff {self.base} {self.dataset_version} counts: {k['added']:,} "
                f"added, {k['removed']:,} removed, {k['changed']:,} changed, {k['relabeled']:,} "
                f"relabeled, {k['unchanged']:,} unchanged"
            )
        if self.base is not None:
            how = (
                "every source read and hashed (--checksum)"
                if self.checksum
                else f"{self.unchanged_by_stat:,} unchanged by path, size and mtime and "
                f"{self.unchanged_by_hash:,} by manifest hash, not read; {self.sources_read:,} read and hashed"
            )
            lines.append(f"  compared with the base: {how}")
        if self.shared_decode and not self.already_complete and not self.dry_run:
            if self.size > max(self.shared_decode):
                sizes = ", ".join(map(str, [self.size, *self.shared_decode]))
                lines.append(
                    f"  each source read once for sizes {sizes}: "
                    f"{self.decodes:,} decodes (one per JPEG draft scale the sizes need)"
                )
            else:
                lines.append(
                    f"  pixels from the decodes of the size {self.shared_decode[0]} pass; "
                    f"{self.decodes:,} decoded again here"
                )
        for p in self.reuse_problems[:5]:
            lines.append(f"  decoded again, base copy failed its check: {p['key']} in {p['base_shard']}: {p['error']}")
        if self.failed:
            where = f" (every one with its reason in {self.errors_file})" if self.errors_file else ""
            lines.append(f"  failed: {self.failed:,}{where}:")
            for f in self.failures[:_LISTED]:
                at = f"line {f['line']}: " if "line" in f else ""
                lines.append(f"    {at}{f['key']} ({f['path']}): {f['error']}")
            if self.failed > len(self.failures[:_LISTED]):
                lines.append(f"    ... and {self.failed - len(self.failures[:_LISTED]):,} more")
        if self.narrow_pixels:
            n = len(self.narrow_pixels)
            where = f"; listed in {self.errors_file}, stage pixels" if self.errors_file else ""
            keys = ", ".join(w["key"] for w in self.narrow_pixels[:_LISTED]) + (", ..." if n > _LISTED else "")
            lines.append(
                f"  warning: {n:,} image{'s' if n != 1 else ''} stored with pixels spanning less than a "
                f"sixteenth of 0..255 (near-uniform, or a squeezed range{where}): {keys}"
            )
        if self.skipped:
            lines.append(
                f"  skipped {len(self.skipped):,} file{'s' if len(self.skipped) != 1 else ''} of the image "
                'folder (every one, with its reason, under "skipped" in --json):'
            )
            lines += [f"    {s['path']}: {s['reason']}" for s in self.skipped[:_LISTED]]
            if len(self.skipped) > _LISTED:
                lines.append(f"    ... and {len(self.skipped) - _LISTED:,} more")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _rate(self) -> str:
        """The rate of this run's own images; a resumed run says how many it kept."""
        if not self.shards_resumed:
            return f", {self.images_per_second:,.1f} images/s"
        kept = (
            f"{count(self.samples_resumed, 'image')} in {count(self.shards_resumed, 'shard')} kept from an "
            "interrupted run"
        )
        now = self.decoded + self.reused + self.relabeled
        if not now:
            return f"; all {kept}, this run wrote the index"
        return f"; {count(now, 'image')} in this run at {self.images_per_second:,.1f} images/s, {kept}"

    def to_dict(self) -> dict:
        """The result as JSON-ready values (the CLI's --json)."""
        return asdict(self)

    def count_failures(self, failures: list[dict], folder: bool) -> None:
        """Set the failures, the first ``_LISTED`` as errors.jsonl orders them, and whether --max-errors is passed."""
        self.failed, self.failures = len(failures), errors_order(failures, folder)[:_LISTED]
        self.max_errors_exceeded = self.failed > self.max_errors_allowed


def base_text(base: str, rule: str | None) -> str:
    """Which version a conversion reuses and keeps splits from, and how to choose another."""
    if rule == "from":
        return f"base {base} (--from; --no-reuse for none)"
    return f"base {base}, the newest earlier version with these settings (--from V picks another, --no-reuse none)"


@dataclass
class ConvertResults:
    """A multi-size conversion: one ``ConvertResult`` per size, largest first."""

    results: list[ConvertResult]
    seconds: float = 0.0

    @property
    def max_errors_exceeded(self) -> bool:
        """Whether any size failed more files than --max-errors allows."""
        return any(r.max_errors_exceeded for r in self.results)

    def to_text(self) -> str:
        """Each size's text, then the total time."""
        return "\n".join([r.to_text() for r in self.results] + [f"All sizes: {self.seconds:.1f} s"])

    def to_dict(self) -> dict:
        """The results as JSON-ready values (the CLI's --json)."""
        return {"results": [r.to_dict() for r in self.results], "seconds": self.seconds}


def dry_run_result(
    result: ConvertResult, tasks: list[ShardTask], failures: list[dict], t0: float, folder: bool = False
) -> ConvertResult:
    """What a run would do: counts only, nothing written."""
    for t in tasks:
        for s in t.samples:
            if s.reuse is None:
                result.decoded += 1
            elif s.reuse.relabeled:
                result.relabeled += 1
            else:
                result.reused += 1
        sp = result.splits.setdefault(t.split, {"samples": 0, "shards": 0, "urls": ""})
        sp["samples"] += len(t.samples)
        sp["shards"] += 1
    for name, sp in result.splits.items():
        sp["urls"] = join(result.out_dir, url_pattern(name, sp["shards"]))
    result.samples_written = 0
    result.shards = len(tasks)
    result.count_failures(failures, folder)
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def result_from_index(result: ConvertResult, store: Store, info: IndexMeta, drawn: bool | None = None) -> None:
    """Fill ``result``'s totals from an index; ``drawn``: no split came from a manifest split column (None:
    as the index's ``build.columns`` tells, which names only a --split option)."""
    result.samples_written = info.samples
    result.shards = len(info.shards)
    result.splits = {
        name: {"samples": sp.samples, "shards": sp.shards, "urls": store.join(sp.urls)}
        for name, sp in info.splits.items()
    }
    result.split_base = info.build.split_base if info.build is not None else None
    report = split_report(info, drawn)
    result.split_shares, result.class_val_shares, result.split_warnings, result.class_gaps = report


def split_report(
    info: IndexMeta, drawn: bool | None = None
) -> tuple[dict[str, float], dict[str, float], list[str], list[dict]]:
    """(each split's share, each class's val share, warnings, class gaps) of an index.

    Warned first, whoever chose the splits: each class with samples but none in train or none in
    val (``dataset.splits.class_gaps``). Then, when the splits were drawn (``drawn``: no manifest
    split column gave any) with val_fraction f > 0: no val split at all; a val share of all samples,
    or of a class holding at least 2/f samples (a smaller class cannot come that close: one sample
    moves it by more than f/2), outside f ± max(0.05, f/2).
    """
    total, splits, classes, whole = info.samples, info.splits, info.classes, info.class_counts
    shares = {name: round(sp.samples / total, 4) for name, sp in splits.items()} if total else {}
    val = splits["val"].class_counts if "val" in splits else [0] * len(classes)
    val_shares = {c: round(v / n, 4) for c, v, n in zip(classes, val, whole) if n}
    build = info.build
    f = float(build.val_fraction or 0.0) if build is not None else 0.0
    if drawn is None:
        drawn = build is None or (build.columns or {}).get("split") is None
    gaps = class_gaps(classes, {name: sp.class_counts for name, sp in splits.items()})
    if not drawn:
        hint = "the manifest's split column put them there"
    elif build is not None and build.group is not None:
        hint = (
            f"splits are drawn per group of {build.group!r}, each group whole, so a class held by few groups "
            "can land whole in one split: give such rows a split in a split column, or --stratify"
        )
    elif build is not None and build.source is not None and build.source.kind == "image-folder":
        hint = "a class of few samples can land whole in one split: a manifest's split column chooses them"
    else:
        hint = "a class of few samples can land whole in one split: give its rows a split in a split column"
    warnings = gap_warnings(gaps, hint)
    if not (drawn and f > 0 and total):
        return shares, val_shares, warnings, gaps
    tol = max(0.05, f / 2)
    base = build.split_base if build is not None else None
    fix = f"; --resplit draws every group again (the splits are kept from {base})" if base else ""
    if "val" not in splits:
        warnings.append(
            f"no val split although --val-fraction is {f:g}: too few groups or samples to draw one from{fix}"
        )
        return shares, val_shares, warnings, gaps
    rule = f"±{tol:.1%}: 5 points or half --val-fraction, whichever is larger"
    share = splits["val"].samples / total
    if abs(share - f) > tol:
        warnings.append(
            f"val holds {share:.1%} of the samples, --val-fraction asks {f:.1%} (tolerance "
            f"{rule}): the groups are too few or too uneven{fix}"
        )
    least = math.ceil(2 / f - 1e-9)
    off = [f"{c} {val_shares[c]:.1%}" for c, n in zip(classes, whole) if n >= 2 / f and abs(val_shares[c] - f) > tol]
    if off:
        more = f" and {len(off) - 5} more" if len(off) > 5 else ""
        hint = "" if build is not None and build.stratify else "; --stratify draws each class's share"
        warnings.append(
            f"val share of {count(len(off), 'class', 'classes')} outside {f:.1%} (tolerance {rule}; "
            f"checked for classes of at least 2/{f:g} = {least:,} samples): {', '.join(off[:5])}{more}{hint}"
        )
    return shares, val_shares, warnings, gaps
