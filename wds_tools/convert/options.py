"""``convert`` and its options, each declared once in ``ConvertOptions``.

A field's ``option(...)`` gives its check, its help and flag on the command line, whether wds-tools.toml may
set it and whether it decides the output bytes; the CLI's options are made from it and a test holds
``convert``'s signature to it (docs/guide/converter-internals.md, "Options").
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any

from ..cpus import usable_cpus
from ..errors import OptionError
from ..storage.transport import is_remote
from .decode import COLOUR_MODES, RESIZE_MODES, DecodeSettings
from .manifest import Columns
from .pipeline import convert_with
from .plan import parse_shard_size
from .runner import EXECUTORS
from .summary import ConvertResult, ConvertResults

__all__ = [
    "ConvertOptions",
    "Option",
    "Cli",
    "Refused",
    "convert",
    "declared",
    "parse_sizes",
    "parse_max_errors",
    "Flag",
    "Integer",
    "Fraction",
    "OneOf",
    "Text",
]


class Refused(ValueError):
    """A value a check refuses; its message says what was expected."""


Check = Callable[[Any], Any]  # a value -> the value as kept; Refused (or OptionError) if bad


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or type(v).__name__ in ("bool", "bool_")  # numpy's (2.x, 1.x) without importing it


def _integer(v: Any) -> int | None:
    """``v`` as an ``int`` when it is an integer (numpy's too), not a bool; else None."""
    try:
        return None if _is_bool(v) else operator.index(v)
    except TypeError:
        return None


@dataclass(frozen=True)
class Flag:
    """True or False (a numpy bool as a bool)."""

    def __call__(self, v: Any) -> bool:
        if _is_bool(v):
            return bool(v)
        raise Refused("expected True or False")


@dataclass(frozen=True)
class Integer:
    """An integer (a numpy one as an ``int``; not a bool, float or string) of at least ``lo``; None too if ``none``."""

    lo: int | None = None
    none: bool = False

    def __call__(self, v: Any) -> int | None:
        if v is None and self.none:
            return None
        value = _integer(v)
        if value is None or (self.lo is not None and value < self.lo):
            raise Refused("expected an integer" if self.lo is None else f"expected an integer >= {self.lo}")
        return value


@dataclass(frozen=True)
class Fraction:
    """A number from 0 to below 1."""

    def __call__(self, v: Any) -> float:
        if isinstance(v, numbers.Real) and not _is_bool(v) and 0.0 <= float(v) < 1.0:
            return float(v)
        raise Refused("expected a number from 0 to below 1")


@dataclass(frozen=True)
class OneOf:
    """One of ``values``."""

    values: tuple[str, ...]

    def __call__(self, v: Any) -> str:
        if isinstance(v, str) and v in self.values:
            return v
        raise Refused(f"expected one of {', '.join(self.values)}")


@dataclass(frozen=True)
class Text:
    """A non-empty string; None too if ``none``."""

    none: bool = False

    def __call__(self, v: Any) -> str | None:
        if (v is None and self.none) or (isinstance(v, str) and v):
            return v
        raise Refused("expected a non-empty string" + (" or None" if self.none else ""))


@dataclass(frozen=True)
class Cli:
    """The command line's value of an option whose value is not the option's own: its check (its kind
    on the command line), default, and the option's value made from it."""

    check: Check
    default: Any
    to_option: Callable[[Any], Any]


@dataclass(frozen=True)
class Option:
    """One option's declaration beside its field: ``check``; ``help``, the command line's; ``flag``, its
    spelling there ("": ``--`` and the name with dashes; None: not on the command line); ``config``,
    whether wds-tools.toml's ``[convert]`` may set it; ``spec``, whether it decides the output bytes (a
    folder made with another value is refused, outfolder.spec); ``cli``, where the command line's
    value differs from the option's."""

    check: Check
    help: str
    flag: str | None = ""
    metavar: str | None = None
    config: bool = True
    spec: bool = False
    cli: Cli | None = None

    def spelled(self, name: str) -> str:
        """How a message names the option: its flag, else its keyword."""
        return self.flag or ("--" + name.replace("_", "-") if self.flag == "" else name)

    def checked(self, name: str, value: Any) -> Any:
        """``value`` as kept, or an ``OptionError`` naming the option, the value and what was expected."""
        try:
            return self.check(value)
        except Refused as e:
            raise OptionError(f"{self.spelled(name)} {value!r}: {e}") from None


def option(default: Any = MISSING, **declaration: Any) -> Any:
    """A dataclass field declaring an option (see ``Option``); no default: required."""
    return field(default=default, metadata={"option": Option(**declaration)})


def declared(options: Any = None) -> dict[str, Option]:
    """Each option ``ConvertOptions`` declares, by name, in declaration order."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(options or ConvertOptions) if f.init}


_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _version(v: Any) -> str:
    if isinstance(v, str) and _VERSION.fullmatch(v):
        return v
    raise Refused("use letters, digits, '.', '_' or '-' (at most 64), e.g. v1")


def parse_sizes(value: int | str | Sequence[int | str]) -> list[int]:
    """224, "224", "224,384" or [224, 384] -> the distinct sides in pixels, largest first."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    sides = []
    for item in items:
        try:
            side = int(str(item).strip()) if not isinstance(item, bool) else None
        except ValueError:
            side = None
        if side is None or not 8 <= side <= 8192:
            raise OptionError(f"--size {value!r}: expected integers between 8 and 8192 pixels, e.g. 224 or 224,384")
        sides.append(side)
    if not sides:
        raise OptionError(f"--size {value!r}: expected at least one size, e.g. 224")
    return sorted(set(sides), reverse=True)


def _sizes(v: Any) -> Any:
    parse_sizes(v)
    return v


def _shard_size(v: Any) -> str | int | None:
    value = v if v is None or isinstance(v, str) else _integer(v)
    if value is None and v is not None:
        raise Refused("expected a sample count (2000) or a size (256MB)")
    parse_shard_size(value, 8)  # its syntax; the count it gives at each size is checked with the sizes
    return value


def parse_max_errors(value: str | int | float) -> tuple[str, float]:
    """ "25" -> at most 25 files; "1%" or "0.01" -> at most that fraction of the rows."""
    text = str(value).strip()
    try:
        if text.endswith("%"):
            frac = float(text[:-1]) / 100
        elif re.fullmatch(r"\d+", text):
            return "count", int(text)
        else:
            frac = float(text)
    except ValueError:
        raise OptionError(
            f"--max-errors {value!r}: expected a count (25), a fraction (0.01) or a percentage (1%)"
        ) from None
    if not 0.0 <= frac <= 1.0:
        raise OptionError(f"--max-errors {value!r}: a fraction must lie between 0 and 1 (0% to 100%)")
    return "fraction", frac


def _max_errors(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise Refused("expected a count (25), a fraction (0.01) or a percentage (1%)")
    parse_max_errors(v)
    return v


def _folder(v: Any) -> str | os.PathLike:
    if not isinstance(v, (str, os.PathLike)) or not os.fspath(v):
        raise Refused("expected a folder (a path or a URL)")
    if not is_remote(v) and os.path.exists(v) and not os.path.isdir(v):
        raise Refused("is a file; expected a folder")
    return v


def _decode(v: Any) -> DecodeSettings:
    if isinstance(v, DecodeSettings):
        return v
    raise Refused("expected a DecodeSettings")


@dataclass(frozen=True)
class ConvertOptions:
    """``convert``'s keyword options (its docstring says what each does), each declared once.

    Made once per conversion: each value is checked (and kept as checked) in declaration order, the
    order the command line's help lists them, so the first bad one is reported by name; then the
    forms the pipeline reads are filled (``sides``, ``max_errors_rule``, ``shard_samples``,
    ``columns``, ``out_root``). ``workers=None`` becomes the usable CPUs for the local executor.
    """

    version: str = option(
        check=_version,
        metavar="NAME",
        spec=True,
        help="Name of the dataset version to write, e.g. v1; shards go to OUT/VERSION/SIZE/. (Not the "
        "program's version: that is wds-tools --version.)",
    )
    size: int | str | Sequence[int] = option(
        check=_sizes,
        metavar="SIZE[,SIZE...]",
        spec=True,
        help="Side of the square output images in pixels, e.g. 224; several sizes, e.g. 224,384, give one folder "
        "each (OUT/VERSION/224, OUT/VERSION/384), each identical to a run at that size alone, from one read and "
        "decode of each source.",
    )
    out: str | os.PathLike = option("shards", check=_folder, metavar="DIRECTORY", help="Root folder of all versions.")
    workers: int | None = option(
        None,
        check=Integer(1, none=True),
        help="Decoding processes (batches of samples are spread over them whatever the number of shards; with 1, "
        "everything runs in this process). Default: all cores.",
    )
    shard_size: str | int | None = option(
        None,
        check=_shard_size,
        spec=True,
        help="Samples per shard (2000) or a target size (256MB). Default: ~256 MB per shard.",
    )
    resize: str = option(
        "center-crop",
        check=OneOf(RESIZE_MODES),
        spec=True,
        help="center-crop: scale the short side to SIZE and crop the middle; squash: scale both sides to SIZE, "
        "ignoring aspect; pad: fit the long side and pad with black.",
    )
    val_fraction: float = option(
        0.1,
        check=Fraction(),
        spec=True,
        help="Fraction of keys (of groups, with --group) put in split 'val' when the manifest has no split column.",
    )
    seed: int = option(
        0, check=Integer(), spec=True, help="Seed of the key hash that orders samples and assigns splits."
    )
    key: str = option(
        "key",
        check=Text(),
        metavar="COL",
        spec=True,
        help="Manifest column holding each sample's key, e.g. image_id.",
    )
    label: str = option(
        "label", check=Text(), metavar="COL", spec=True, help="Manifest column holding the class name, e.g. dx."
    )
    path: str = option(
        "path",
        check=Text(),
        metavar="TEMPLATE",
        spec=True,
        help="Manifest column holding each image's path, or a template naming columns in braces, e.g. "
        "'images/{image_id}.jpg' (relative to the manifest's folder; '{{' and '}}' for braces). Mixed extensions: "
        "'images/{image_id}.{jpg,png,heic}' takes the first listed that exists, 'images/{image_id}.*' any image "
        "extension. A row whose path names a missing file is skipped and listed in errors.jsonl, naming a file of "
        "the same name with another extension when there is one.",
    )
    split: str | None = option(
        None,
        check=Text(none=True),
        metavar="COL",
        spec=True,
        help="Manifest column holding each sample's split (train, val, ...); a row with an empty one gets a drawn "
        "split. Default: the column 'split' when the manifest has one. With --group, a group it puts in two splits "
        "is refused, naming the group.",
    )
    group: str | None = option(
        None,
        check=Text(none=True),
        metavar="COL",
        spec=True,
        help="Manifest column grouping samples that must share a split (lesion_id, patient_id): splits are drawn "
        "per group and --val-fraction applies to groups. Groups an earlier version holds keep their split (see "
        "--from).",
    )
    dedup: bool = option(
        False,
        check=Flag(),
        spec=True,
        help="Keep near-duplicate images (wds-tools dups, default threshold) in "
        "one split: each cluster is joined with the --group values it touches (or its keys) before splits are drawn; "
        "an earlier version's assignments are kept and new copies follow them; a cluster that would join groups the "
        "earlier version holds in different splits is refused, naming them (--resplit draws all again). Pictures too "
        "flat to hash are listed (their copies may be missed). Decodes every source once more.",
    )
    stratify: bool = option(
        False,
        check=Flag(),
        spec=True,
        help="Draw splits so that each class's val share is close to --val-fraction: per class, groups (or samples) "
        "in a seeded hash order go to val while they keep it under the target, so each class ends within half its "
        "largest group of it (rule: docs/FORMAT.md, Splits per group).",
    )
    resplit: bool = option(
        False,
        check=Flag(),
        help="With --group or --stratify, draw every group's split afresh for this version instead of keeping the "
        "splits an earlier version holds (the summary says which it did).",
    )
    sanitize_keys: bool = option(
        False,
        check=Flag(),
        spec=True,
        help="Map invalid or clashing keys to valid ones instead of refusing them (the original key is kept in each "
        "sample's json).",
    )
    max_errors: str | int | float = option(
        "1%",
        check=_max_errors,
        help="Bad source files tolerated: a count (25), a fraction (0.01) or a percentage (1%). Past it the command "
        "stops with a non-zero exit and no index.json; the shards written are kept, and the same command with a "
        "higher limit finishes the rest.",
    )
    base: str | None = option(
        None,
        check=Text(none=True),
        flag="--from",
        metavar="VERSION",
        help="Reuse pixels from this earlier version (same --size and decode settings), and with --group or "
        "--stratify keep the splits of its groups. Default: the newest such version under --out.",
    )
    reuse: bool = option(
        True,
        check=Flag(),
        flag="--no-reuse",
        cli=Cli(Flag(), False, operator.not_),
        help="Decode every image, even those an earlier version holds.",
    )
    checksum: bool = option(
        False,
        check=Flag(),
        help="Read and fingerprint every source to find what changed since the base. Default: a source whose "
        "manifest sha256/md5 the base recorded, or else whose path, size and mtime equal the base's, is taken as "
        "unchanged without being read (misses an edit that kept size and mtime; see the README).",
    )
    dry_run: bool = option(
        False,
        check=Flag(),
        config=False,  # a run mode, not a default: from wds-tools.toml it would make every run write nothing
        help="Print what would be decoded, reused and removed; write nothing.",
    )
    executor: str = option(
        "local",
        check=OneOf(EXECUTORS),
        help="local: a process pool on this machine; ray: Ray tasks on the cluster ray.init reaches (needs the "
        "'ray' extra; sources and --out must be visible to every node).",
    )
    ray_address: str | None = option(
        None,
        check=Text(none=True),
        metavar="ADDRESS",
        help="Ray cluster address for --executor ray, e.g. ray://head:10001 or auto. Default: start a local Ray "
        "instance.",
    )
    decode: DecodeSettings = option(
        DecodeSettings(),
        check=_decode,
        flag="--colour",
        spec=True,
        cli=Cli(OneOf(COLOUR_MODES), "srgb", lambda colour: DecodeSettings(colour=colour)),
        help="An image's embedded ICC colour profile: srgb converts its pixels to sRGB (Display P3 phone photos, "
        "Adobe RGB scans); raw keeps the stored values and ignores the profile.",
    )
    progress: bool = option(True, check=Flag(), flag=None, help="Draw progress bars on stderr (the CLI's -q: none).")
    sides: tuple[int, ...] = field(init=False)  # the sizes, largest first
    max_errors_rule: tuple[str, float] = field(init=False)  # parse_max_errors
    shard_samples: tuple[tuple[int, int], ...] = field(init=False)  # (side, samples per shard)
    columns: Columns = field(init=False)
    out_root: str = field(init=False)  # ``out`` as a string

    def __post_init__(self) -> None:
        """Check every option in declaration order, keep each as checked, then fill the parsed forms."""
        for name, o in declared(self).items():
            object.__setattr__(self, name, o.checked(name, getattr(self, name)))  # frozen: set once, here
        workers = self.workers if self.workers is not None or self.executor != "local" else usable_cpus()
        if self.base is not None and not self.reuse:
            raise OptionError("--from and --no-reuse contradict each other; pass one of them")
        out = os.fspath(self.out)
        if self.base is not None and is_remote(out):  # a base's shards are read by offset: local folders only
            raise OptionError(
                f"--from {self.base}: reusing pixels from object storage is not supported; "
                "convert with --no-reuse, or into a local --out"
            )
        sides = tuple(parse_sizes(self.size))
        for name, value in (
            ("sides", sides),
            ("workers", workers),
            ("shard_samples", tuple((side, parse_shard_size(self.shard_size, side)) for side in sides)),
            ("max_errors_rule", parse_max_errors(self.max_errors)),
            ("columns", Columns(key=self.key, label=self.label, path=self.path, split=self.split, group=self.group)),
            ("out_root", out),
        ):
            object.__setattr__(self, name, value)

    def samples_per_shard(self, side: int) -> int:
        """Samples per shard of the folder at ``side`` pixels (--shard-size)."""
        return dict(self.shard_samples)[side]

    def allowed_errors(self, total: int) -> int:
        """The number of failed files --max-errors allows among ``total`` rows."""
        kind, v = self.max_errors_rule
        return int(v) if kind == "count" else math.floor(v * total + 1e-9)

    @property
    def draws_units(self) -> bool:
        """Splits are drawn per unit (a group, or a row), not per key alone: with --group, --stratify or
        --dedup; the units an earlier version holds then keep their split."""
        return self.group is not None or self.stratify or self.dedup


def convert(
    source: str | os.PathLike,
    *,
    version: str,
    size: int | str | Sequence[int],
    out: str | os.PathLike = "shards",
    workers: int | None = None,
    shard_size: str | int | None = None,
    resize: str = "center-crop",
    val_fraction: float = 0.1,
    seed: int = 0,
    key: str = "key",
    label: str = "label",
    path: str = "path",
    split: str | None = None,
    group: str | None = None,
    dedup: bool = False,
    stratify: bool = False,
    resplit: bool = False,
    sanitize_keys: bool = False,
    max_errors: str | int | float = "1%",
    base: str | None = None,
    reuse: bool = True,
    checksum: bool = False,
    dry_run: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    decode: DecodeSettings = DecodeSettings(),
    progress: bool = True,
) -> ConvertResult | ConvertResults:
    """Convert ``source`` into ``out/version/size/<split>-NNNNNN.tar`` shards plus their index.

    Resumes an interrupted run with the same arguments; refuses a folder made with other options
    or another source. Bad source files are skipped and listed in errors.jsonl. Each size folder is
    locked for the run (lock.py). When an earlier version with the same size and decode settings
    exists, samples whose source it already holds are copied from its shards instead of decoded: a
    source is unchanged when its manifest sha256/md5 is one the base recorded, or else when its path,
    size and mtime equal the base's; neither reads it.

    Args:
        source: A manifest (.csv, .tsv or .jsonl; local or an fsspec URL such as ``s3://...``) or a
            local image folder laid out as ``ROOT/<label>/<file>``.
        version: The dataset version, the folder under ``out`` (letters, digits, ``.``, ``_``, ``-``;
            at most 64), e.g. ``"v1"``.
        size: The side in pixels of the stored square images (8 to 8192), or several
            (``[224, 384]`` or ``"224,384"``): each source is then read and decoded once for all of
            them, and every folder equals a conversion at that size alone.
        out: The root folder of the versions (local or a URL).
        workers: Decode processes (None: the usable CPUs; 1: everything in this process); with
            ``executor="ray"`` the cluster CPUs used (None: all of them).
        shard_size: Samples per shard (``2000``) or a byte target (``"256MB"``, ``"1GiB"``);
            None: about 256 MB per shard.
        resize: ``"center-crop"``, ``"squash"`` or ``"pad"``: how a non-square image becomes square.
        val_fraction: The fraction of rows (or of groups, with ``group``) drawn into ``val`` where
            the source gives no split, in [0, 1).
        seed: Seeds the split draw and the order of samples (an integer).
        key: The manifest column holding sample keys.
        label: The manifest column holding class names.
        path: The manifest column holding image paths, or a template such as
            ``"images/{image_id}.jpg"``.
        split: The manifest column holding each row's split; None: the column ``split`` if there
            is one, else the splits are drawn.
        group: A column whose groups (lesion, patient) each land in one split; ``val_fraction``
            then applies to groups.
        dedup: Join near-duplicate images (``similar.near``, default threshold) into one unit with
            their groups before the splits are drawn, so a cluster lands in one split (each source is
            decoded once more).
        stratify: Keep each split's class mix close to the whole's.
        resplit: With ``group``, ``stratify`` or ``dedup``, draw every unit's split afresh instead of
            keeping the split an earlier version gave its group (``base``, else the newest other
            version under ``out``).
        sanitize_keys: Map invalid or duplicate sample keys to valid ones (the original is kept in
            the sample's json) instead of refusing them.
        max_errors: How many source files may fail: a count (``25``), a fraction (``0.01``) or a
            percentage (``"1%"``).
        base: The earlier version to reuse from and keep group splits of; None: the newest.
        reuse: Copy unchanged samples from an earlier version's shards; False decodes everything.
        checksum: Read and fingerprint every source instead of trusting path, size and mtime.
        dry_run: Report the plan and write nothing.
        executor: ``"local"`` (a process pool) or ``"ray"`` (one task per shard on a Ray cluster,
            same plan and bytes; needs the ``ray`` extra).
        ray_address: The Ray cluster to join; None: a local instance.
        decode: How source bytes become pixels (JPEG draft mode, resampling filter, colour
            management, decompression-bomb guard).
        progress: Draw progress bars on stderr.

    Returns:
        A ``ConvertResult`` (the folder, counts, errors, reuse and timings) for one size, or a
        ``ConvertResults`` holding one per size when ``size`` names several.

    Raises:
        OptionError: An option is out of range or malformed (named as the command line spells it).
        SourceError: The manifest or image folder cannot be read as given (``InvalidKeyError``:
            invalid or duplicate keys without ``sanitize_keys``).
        OutputExistsError: The folder holds a conversion made with other options or another source.
        OutputBusyError: Another conversion is writing the folder; the message names it.
        TooManyErrorsError: More files failed than ``max_errors`` allows; no index is written, and
            a rerun with a higher limit finishes.
        DiskFullError: The filesystem is full; the message names the folder and the space still
            needed.
        ReadOnlyOutputError: The folder cannot be written (unless it is complete with these options).
        ExtraNotInstalledError: ``executor="ray"`` (or a HEIC source) without its extra.
    """
    return convert_with(source, ConvertOptions(**{k: v for k, v in locals().items() if k != "source"}))
