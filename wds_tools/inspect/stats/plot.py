"""``wds-tools stats --plot``: samples per shard and class share per shard, drawn with matplotlib
(the ``plot`` extra)."""

from __future__ import annotations

import io
import os
from types import ModuleType

import numpy as np

from ...errors import ShardError, require_extra, unwritable_file_error
from ...storage.fsutil import atomic_write_bytes
from .figures import StatsReport

__all__ = ["plot_stats", "require_matplotlib"]


def plot_stats(report: StatsReport, path: str | os.PathLike) -> str:
    """Draw samples per shard and class share per shard (a heatmap) for each split into ``path``."""
    mpl = require_matplotlib()
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(report.splits.values())
    if not splits:
        raise ShardError(f"{report.root}: no shards to plot")
    fig, axes = plt.subplots(
        2, len(splits), figsize=(6 * len(splits), 7), squeeze=False, gridspec_kw={"height_ratios": [1, 2]}
    )
    for col, sp in enumerate(splits):
        ax = axes[0][col]
        ax.bar(np.arange(sp.shards), sp.shard_samples, width=1.0, color="#4c72b0")
        ax.set_title(f"{sp.name}: samples per shard")
        ax.set_xlabel("shard")
        ax.set_ylabel("samples")
        ax = axes[1][col]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.nan_to_num(sp.shard_class_counts / sp.shard_samples[:, None])
        im = ax.imshow(share.T, aspect="auto", interpolation="nearest", cmap="viridis")
        ax.set_title(f"{sp.name}: class share per shard")
        ax.set_xlabel("shard")
        ax.set_ylabel("class")
        if len(report.classes) <= 30:
            ax.set_yticks(range(len(report.classes)), report.classes)
        fig.colorbar(im, ax=ax, label="share of the shard")
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, dpi=100, format="png")
    finally:
        plt.close(fig)
    try:
        atomic_write_bytes(path, png.getvalue())  # never a half-written file at path
    except OSError as e:  # a read-only mount, a missing folder: one line, no traceback
        raise unwritable_file_error(str(path), e, "the plot") from None
    return str(path)


def require_matplotlib() -> ModuleType:
    """matplotlib, or a message naming the extra to install."""
    return require_extra("matplotlib", "--plot needs matplotlib", "plot")
