"""Compare two converted versions by key: added, removed, changed pixels, changed labels (old and new)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from ..format.index import SampleTable, open_index, read_sample_table

__all__ = ["DiffResult", "diff_versions"]


@dataclass
class DiffResult:
    """What ``diff_versions`` found between two versions, by sample key."""

    old: str
    new: str
    added: list[str] = field(default_factory=list)  # keys only in new
    removed: list[str] = field(default_factory=list)  # keys only in old
    changed: list[str] = field(default_factory=list)  # same key, other source bytes
    relabeled: list[str] = field(default_factory=list)  # same key and bytes, other label
    relabels: list[dict] = field(default_factory=list)  # each relabeled key's labels: {"key", "old", "new"}
    unchanged: int = 0

    def to_dict(self) -> dict:
        """The result as plain JSON types (``--json``)."""
        return asdict(self)

    def to_text(self, limit: int = 20) -> str:
        """A summary line, then up to ``limit`` keys per kind of change."""
        lines = [
            f"{self.old} -> {self.new}: {len(self.added):,} added, {len(self.removed):,} removed, "
            f"{len(self.changed):,} changed, {len(self.relabeled):,} relabeled, {self.unchanged:,} unchanged"
        ]
        for name in ("added", "removed", "changed", "relabeled"):
            keys = getattr(self, name)
            if keys and limit:
                more = f" ... and {len(keys) - limit:,} more" if len(keys) > limit else ""
                if name == "relabeled":  # each with its old and new label
                    shown = " ".join(f"{r['key']} ({r['old']} -> {r['new']})" for r in self.relabels[:limit])
                else:
                    shown = " ".join(keys[:limit])
                lines.append(f"  {name}: {shown}{more}")
        return "\n".join(lines)


def diff_versions(old: str | os.PathLike, new: str | os.PathLike) -> DiffResult:
    """Diff two shards folders (or index files, local or URLs) by sample key, source fingerprint and label name."""
    (root_a, ca, sa), (root_b, cb, sb) = _version(old), _version(new)
    pos_a = sa.key_positions
    fa, fb = sa["fingerprint"], sb["fingerprint"]
    la, lb = sa.label.tolist(), sb.label.tolist()
    res = DiffResult(old=root_a, new=root_b)
    for j, key in enumerate(sb.keys):
        i = pos_a.get(key)
        if i is None:
            res.added.append(key)
        elif fa[i].tobytes() != fb[j].tobytes():
            res.changed.append(key)
        elif ca[la[i]] != cb[lb[j]]:
            res.relabeled.append(key)
            res.relabels.append({"key": key, "old": ca[la[i]], "new": cb[lb[j]]})
        else:
            res.unchanged += 1
    keys_b = sb.key_positions
    res.removed = [k for k in sa.keys if k not in keys_b]
    for name in ("added", "removed", "changed", "relabeled"):
        getattr(res, name).sort()
    res.relabels.sort(key=lambda r: r["key"])
    return res


def _version(spec: str | os.PathLike) -> tuple[str, tuple[str, ...], SampleTable]:
    """(folder, classes, the samples' key, fingerprint and label) of one version, checked (``read_sample_table``)."""
    folder, info = open_index(spec)
    return folder, info.classes, read_sample_table(folder, info, ("key", "fingerprint", "label"))
