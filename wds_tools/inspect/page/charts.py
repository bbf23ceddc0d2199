"""The page's charts: SVG text drawn by matplotlib's SVG backend (the ``report`` extra), to be put inline.

The same bytes on every run (``svg.hashsalt`` fixed, no date); text stays text (``svg.fonttype`` none), drawn
in the page's font. Why matplotlib and not pygal: docs/guide/report.md, "Requirements and the libraries".
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from ...errors import require_extra

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["SPLIT_COLOURS", "bars", "histogram", "per_shard", "require_matplotlib", "MAX_BARS"]

SPLIT_COLOURS = ("#4051b5", "#e8710a", "#0f9d58", "#9334e6", "#d93025", "#12b5cb", "#7c7c7c")
"""Series colours, one per split in order: the docs site's indigo first (MkDocs Material's primary)."""
MAX_BARS = 200
"""Shards per chart drawn as one bar each; more are drawn as a histogram of the per-shard values."""
_LABEL = 18  # characters of a category label shown under its bars (the table beside has it whole)


def require_matplotlib() -> ModuleType:
    """matplotlib, or a message naming the ``report`` extra."""
    return require_extra("matplotlib", "wds-tools report draws its charts with matplotlib", "report")


def _axes(height: float, top: float, bottom: float) -> tuple[Figure, Axes]:
    """A chart's figure, transparent, and its one pair of axes (no top or right spine, light y grid)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, height))
    fig.set_facecolor("none")
    fig.subplots_adjust(left=0.09, right=0.99, top=top, bottom=bottom)
    ax = fig.add_subplot()
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=8, color="#777")
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)
    return fig, ax


def _legend(ax: Axes, series: int) -> None:
    if series > 1:
        ax.legend(frameon=False, fontsize=8, ncols=min(series, 4), loc="lower right", bbox_to_anchor=(1, 1))


def _svg(fig: Figure, chart_id: str) -> str:
    """The figure as SVG text without the XML prolog and metadata, sized by the page (CSS), ids unique per chart."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    buf = io.StringIO()
    # the salt makes the ids of clip paths and markers the chart's own: two charts inline in one page
    # must not share one; fixed, it makes them the same on every run
    with (
        matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": chart_id, "svg.id": f"chart-{chart_id}"}),
        warnings.catch_warnings(),
    ):
        # text stays text, drawn by the browser in the page's fonts: a glyph matplotlib's own font lacks (a
        # Chinese site name) only sizes its layout, and is no warning to the user
        warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
        FigureCanvasSVG(fig).print_svg(buf, metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.S)
    # matplotlib numbers its groups per figure (figure_1, axes_1, patch_2): ids unique in one SVG file, not
    # in a page holding several; each id and reference to one gets the chart's name in front
    return re.sub(r'(\bid="|href="#|url\(#)(?!chart-)([^")]+)', lambda m: f"{m.group(1)}{chart_id}-{m.group(2)}", text)


def _short(label: str) -> str:
    return label if len(label) <= _LABEL else label[: _LABEL - 1] + "…"


def bars(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    chart_id: str,
    ylabel: str,
    percent: bool = False,
) -> str:
    """Grouped bars: one group per category, one bar per series (a split), as SVG text."""
    import matplotlib.ticker as mticker

    n, k = len(categories), max(1, len(series))
    rotate = n > 8 or any(len(c) > 8 for c in categories)
    fig, ax = _axes(2.6, 0.9, 0.34 if rotate else 0.14)
    x = np.arange(n)
    width = 0.8 / k
    for j, (name, values) in enumerate(series.items()):
        ax.bar(
            x - 0.4 + width * (j + 0.5),
            np.asarray(values, dtype=np.float64),
            width,
            label=name,
            color=SPLIT_COLOURS[j % len(SPLIT_COLOURS)],
        )
    ax.set_xticks(
        x, [_short(str(c)) for c in categories], rotation=35 if rotate else 0, ha="right" if rotate else "center"
    )
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel(ylabel, fontsize=8)
    if percent:
        ax.yaxis.set_major_formatter(mticker.PercentFormatter(1.0, decimals=0))
    _legend(ax, len(series))
    return _svg(fig, chart_id)


def histogram(
    edges: np.ndarray,
    series: Mapping[str, np.ndarray],
    *,
    chart_id: str,
    xlabel: str,
    ylabel: str = "share of the split",
) -> str:
    """Step histograms over shared bin ``edges``, one per series (a split's share per bin), as SVG text."""
    import matplotlib.ticker as mticker

    fig, ax = _axes(2.6, 0.9, 0.17)
    for j, (name, shares) in enumerate(series.items()):
        colour = SPLIT_COLOURS[j % len(SPLIT_COLOURS)]
        ax.stairs(np.asarray(shares, np.float64), edges, label=name, color=colour, linewidth=1.4)
        ax.stairs(np.asarray(shares, np.float64), edges, color=colour, fill=True, alpha=0.12)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.yaxis.set_major_formatter(mticker.PercentFormatter(1.0, decimals=0))
    _legend(ax, len(series))
    return _svg(fig, chart_id)


def per_shard(values: Mapping[str, np.ndarray], *, chart_id: str, ylabel: str) -> str:
    """A value per shard (samples, bytes), the splits' shards side by side, as SVG text: a bar per shard up
    to ``MAX_BARS`` shards in all, else a histogram of the values (how many shards hold how much)."""
    total = sum(len(v) for v in values.values())
    if total > MAX_BARS:
        every = np.concatenate([np.asarray(v, np.float64) for v in values.values()])
        lo, hi = float(every.min()), float(every.max())
        edges = np.linspace(lo, hi if hi > lo else lo + 1, 31)
        shares = {s: np.histogram(np.asarray(v, np.float64), edges)[0] / max(1, len(v)) for s, v in values.items()}
        return histogram(edges, shares, chart_id=chart_id, xlabel=f"{ylabel} per shard", ylabel="share of the shards")
    fig, ax = _axes(2.2, 0.88, 0.17)
    start = 0
    for j, (name, v) in enumerate(values.items()):
        x = np.arange(start, start + len(v))
        ax.bar(x, np.asarray(v, np.float64), 1.0, label=name, color=SPLIT_COLOURS[j % len(SPLIT_COLOURS)], linewidth=0)
        start += len(v)
    ax.set_xlim(-0.5, max(start, 1) - 0.5)
    ax.set_xlabel("shard (in each split's order)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    _legend(ax, len(values))
    return _svg(fig, chart_id)
