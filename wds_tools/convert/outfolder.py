"""One size's output folder: what determines its bytes (the spec), whether it is fresh, unfinished or
complete, which shards an interrupted run finished, and which earlier version is its base."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..dataset.identity import RECORD_ONLY
from ..errors import IndexFormatError, OutputExistsError
from ..format.index import ERRORS_FILE, INDEX_FILE, LOCK_FILE, WORK_DIR
from ..format.model import IndexMeta, load_json, parse
from ..storage.objects import Store
from ..storage.transport import is_remote, join
from . import sourcecache as hashes
from .decode import recorded_decode
from .plan import sample_bytes
from .reuse import Base, find_base
from .source import Source
from .summary import ConvertResult
from .write import SampleTask, ShardTask

if TYPE_CHECKING:
    from .options import ConvertOptions

__all__ = [
    "WORK_DIR",
    "Target",
    "spec",
    "spec_differences",
    "prepare_dest",
    "task_digest",
    "finished_meta",
    "select_base",
]


@dataclass
class Target:
    """One size of a conversion, as the pipeline carries it from scan to index."""

    side: int  # pixels
    store: Store
    spec: dict
    state: str  # "fresh", "resume" or "complete"
    done_meta: IndexMeta | None
    result: ConvertResult
    shard_samples: int  # samples per shard
    base: Base | None = None
    tasks: list[ShardTask] = field(default_factory=list)
    metas: dict[str, dict] = field(default_factory=dict)

    @property
    def work(self) -> str:
        """The folder of this size's resume state."""
        return self.store.join(WORK_DIR)


_RECORDED = {"version", "size", "resize", "decode", "shard_size", "seed", "val_fraction", "sanitize_keys"}
_RECORDED |= {"key", "label", "path", "split", "group", "stratify", "dedup"}  # build.columns, group, ...


def spec(source: Source, opts: ConvertOptions, side: int) -> dict:
    """What determines the bytes of a conversion at ``side`` pixels (the options declared ``spec``, and the
    source); equal specs give identical output. index.json records it (``build``: docs/FORMAT.md); an option
    declared ``spec`` after these is recorded in ``build`` under its name when it is not its default, so a
    folder made before it stays the same conversion."""
    build: dict = {
        "shard_size": opts.samples_per_shard(side),
        "seed": opts.seed,
        "val_fraction": opts.val_fraction,
        "sanitize_keys": opts.sanitize_keys,
        "source": {"kind": source.kind, "rows": len(source.rows), "digest": source.digest()},
    }
    if not opts.columns.default:
        build["columns"] = opts.columns.record()
    if opts.group is not None:
        build["group"] = opts.group
    if opts.stratify:
        build["stratify"] = True
    if source.dedup is not None:
        build["dedup"] = source.dedup
    if opts.draws_units:
        build["split_base"] = source.split_base
    for f in fields(opts):
        o = f.metadata.get("option")
        if o is not None and o.spec and f.name not in _RECORDED and getattr(opts, f.name) != f.default:
            build[f.name] = getattr(opts, f.name)
    return {
        "dataset_version": opts.version,
        "size": side,
        "resize": opts.resize,
        "decode": opts.decode.to_dict(),
        "build": build,
    }


def spec_differences(old: dict, new: dict, prefix: str = "", side: int | None = None) -> list[str]:
    """Every field whose value differs between two specs, as ``"a.b: existing x, requested y"``; the shard
    size in samples per shard and the megabytes that makes at the spec's size (what --shard-size 256MB
    was turned into)."""
    side = new.get("size", side) if isinstance(new.get("size", side), int) else side
    diffs = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += spec_differences(a, b, f"{prefix}{k}.", side)
        elif a != b:
            if f"{prefix}{k}" == "build.shard_size" and isinstance(a, int) and isinstance(b, int) and side:
                diffs.append(f"build.shard_size: existing {_samples(a, side)}, requested {_samples(b, side)}")
            else:
                diffs.append(f"{prefix}{k}: existing {a!r}, requested {b!r}")
    return diffs


def _samples(n: int, side: int) -> str:
    """A shard size in samples per shard and about how many MB that is at ``side`` px."""
    return f"{n:,} samples per shard (about {n * sample_bytes(side) / 1e6:,.1f} MB at {side} px)"


def _colour_hint(diffs: list[str]) -> str:
    """A hint when the folder's only difference is the colour rule of an older conversion."""
    if not any(d.startswith("decode.colour: existing 'raw'") for d in diffs):
        return ""
    return (
        " Its pixels keep embedded ICC profiles' raw values (as every conversion before --colour did): "
        "pass --colour raw to take it as it is."
    )


def read_meta(store: Store) -> IndexMeta:
    """The folder's index.json; a malformed one refuses the folder."""
    path = store.join(INDEX_FILE)
    try:
        return parse(load_json(store.read_bytes(path), path), path)
    except IndexFormatError as e:
        raise OutputExistsError(f"{e}; nothing was changed") from None


def prepare_dest(store: Store, spec: dict) -> tuple[str, IndexMeta | None]:
    """('complete', its index.json), ('resume', None) or ('fresh', None); refuse a folder made with
    other options or another source."""
    dest, run_file = store.root, store.join(WORK_DIR, "run.json")
    if store.exists(store.join(INDEX_FILE)):
        info = read_meta(store)
        old: dict[str, Any] = {"dataset_version": info.dataset_version, "size": info.size, "resize": info.resize}
        old["decode"] = recorded_decode(dict(info.decode.raw) if info.decode is not None else None)
        old["build"] = {k: v for k, v in (info.build.raw if info.build else {}).items() if k not in RECORD_ONLY}
        diffs = spec_differences(old, spec)
        if diffs:
            raise OutputExistsError(
                f"{dest} already holds a conversion made with other options or another source "
                f"({'; '.join(diffs[:6])}). Nothing was changed. Choose another --version or --out, "
                f"or remove {dest} to convert again.{_colour_hint(diffs)}"
            )
        return "complete", info
    if store.exists(run_file):
        try:
            old = json.loads(store.read_bytes(run_file))
        except ValueError:
            old = {}
        if isinstance(old, dict) and "decode" in old:
            old["decode"] = recorded_decode(old["decode"])
        diffs = spec_differences(old, spec)
        if diffs:
            raise OutputExistsError(
                f"{dest} holds an unfinished conversion made with other options or another source "
                f"({'; '.join(diffs[:6])}). Run the original command again to finish it, or remove "
                f"{dest} to start over."
            )
        return "resume", None
    others = [name for name in store.names(dest) if name not in (ERRORS_FILE, WORK_DIR, LOCK_FILE)]
    if others:
        raise OutputExistsError(
            f"{dest} exists and holds files wds-tools did not write ({', '.join(others[:5])}); "
            "nothing was changed. Choose another --version or --out, or remove the folder."
        )
    return "fresh", None


def task_digest(spec_digest: str, name: str, samples: Iterable[SampleTask]) -> str:
    """A shard's digest: the spec's and its samples' (a finished shard with another digest is redone)."""
    h = hashlib.sha256(f"{spec_digest}\n{name}\n".encode())
    for s in samples:
        h.update(f"{s.key}\t{s.path}\t{s.source_path}\t{s.label}\t{s.label_name}\t{s.original_key}\n".encode())
    return h.hexdigest()


def finished_meta(store: Store, task: ShardTask) -> dict | None:
    """The meta of a shard a previous run finished (and uploaded) with the same plan, else None."""
    try:
        meta = json.loads(store.read_bytes(join(task.work, task.name + ".json")))
        ok = (
            meta.get("digest") == task.digest
            and store.size(join(task.dest, task.name)) == meta["bytes"]
            and store.exists(join(task.work, task.name + ".npz"))
        )
        if ok and meta.get("failed_stat"):  # a source that failed and has changed since (repaired?): redo
            now = {s.key: [s.src_nbytes, s.src_mtime_ns] for s in task.samples}
            ok = all(now.get(key) == stat for key, stat in meta["failed_stat"].items())
        return meta if ok else None
    except (OSError, ValueError, KeyError):
        return None


def select_base(opts: ConvertOptions, side: int, decoders: dict) -> Base | None:
    """The base of a conversion at ``side`` pixels (see reuse.find_base); ``decoders`` are this run's
    decoder_versions, which a base must share. None without reuse, or into object storage (a base's
    shards are read by offset: local folders only; ``ConvertOptions`` refuses --from there)."""
    out, version, base = opts.out_root, opts.version, opts.base
    if not opts.reuse or is_remote(out):
        return None
    wanted = {"size": side, "resize": opts.resize, "decode": opts.decode.to_dict(), "decoder_versions": decoders}
    found = find_base(Path(out), version, wanted, base)
    if found is None:
        return None
    return Base(found, hashes.load_stats(out, found.info.dataset_version or ""))
