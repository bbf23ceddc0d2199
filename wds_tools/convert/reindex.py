"""Write the readers' sidecar files (wids shard lists, DALI index files) for an existing conversion.

``convert`` writes them itself; this serves folders converted before they existed, or whose
sidecars were deleted. Everything is derived from index.json and samples.npz: no shard is read.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from ..errors import READ_ONLY_ERRNOS, read_only_error
from ..format.index import open_index, read_sample_table
from ..format.sidecars import sidecar_files
from ..storage.objects import Store

__all__ = ["write_reader_indexes", "ReaderIndexes"]


@dataclass
class ReaderIndexes:
    """What ``write_reader_indexes`` wrote; the CLI prints it."""

    folder: str
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)  # already there with these bytes: not written

    def to_text(self) -> str:
        """One line: what was written where."""
        if not self.written:
            return f"all {len(self.unchanged)} reader index files in {self.folder} are up to date; nothing written"
        kept = f" ({len(self.unchanged)} more already up to date)" if self.unchanged else ""
        return f"wrote {len(self.written)} files in {self.folder}{kept}: " + ", ".join(self.written)

    def to_dict(self) -> dict:
        """The result as JSON-ready values."""
        return asdict(self)


def write_reader_indexes(path: str | os.PathLike, *, wids: bool = True, dali: bool = True) -> ReaderIndexes:
    """Write ``<split>.wids.json`` (``wids``) and ``<shard>.idx`` (``dali``) beside the index at
    ``path`` (a shards folder or its index.json, local or an fsspec URL); returns their names."""
    folder, info = open_index(path)
    columns = read_sample_table(folder, info).columns if dali else {}
    store = Store(folder)
    files = sidecar_files(info, columns, wids=wids, dali=dali)
    out = ReaderIndexes(folder)
    for name, data in sorted(files.items()):
        path = store.join(name)
        if store.exists(path) and store.read_bytes(path) == data:  # a read-only folder that has them is fine
            out.unchanged.append(name)
            continue
        try:
            store.write_bytes(path, data)
        except OSError as e:
            if e.errno not in READ_ONLY_ERRNOS:
                raise
            raise read_only_error(folder, e, f"write the reader index files ({name} is missing or stale)") from None
        out.written.append(name)
    return out
