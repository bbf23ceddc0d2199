"""Classes a dataset's splits leave out: a class with samples but none in ``train`` (a model never learns
it) or none in ``val`` (its accuracy is never measured), as convert's summary and ``stats`` warn.

A split drawn per group (``--group``) keeps each group whole, so a class held by one or a few groups can
land whole in one split; a class of one sample always does. docs/FORMAT.md, "Splits per group".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["CHECKED_SPLITS", "class_gaps", "gap_warnings"]

CHECKED_SPLITS = ("train", "val")
"""The splits a class with samples should have some in (each where the dataset has that split)."""
_LISTED = 10  # classes named one by one


def class_gaps(classes: Sequence[str], counts: Mapping[str, Sequence[int]]) -> list[dict]:
    """Each class with samples that ``train`` or ``val`` (those the dataset has) holds none of:
    ``{"class", "samples", "train", "val", "missing"}`` (``samples``: in every split; a split the
    dataset lacks is left out; ``missing``: the checked splits holding none), in class order.
    ``counts``: split -> samples per class, in ``classes`` order."""
    checked = [s for s in CHECKED_SPLITS if s in counts]
    out = []
    for c, name in enumerate(classes):
        total = sum(int(per[c]) for per in counts.values())
        held = {s: int(counts[s][c]) for s in checked}
        missing = [s for s in checked if held[s] == 0]
        if total and missing:
            out.append({"class": name, "samples": total, **held, "missing": missing})
    return out


def gap_warnings(gaps: Sequence[dict], hint: str = "") -> list[str]:
    """One warning per class of ``class_gaps`` (the first ten; then how many more), ``hint`` after the last."""
    lines = []
    for g in gaps[:_LISTED]:
        n, missing = g["samples"], g["missing"]
        held = ", ".join(f"{s} {g[s]:,}" for s in CHECKED_SPLITS if s in g)
        why = "a model never learns it" if "train" in missing else "its accuracy is never measured"
        lines.append(
            f"class {g['class']!r} has no {' and no '.join(missing)} samples ({held} of its "
            f"{n:,} {'sample' if n == 1 else 'samples'}): {why}"
        )
    if len(gaps) > _LISTED:
        lines.append(f"and {len(gaps) - _LISTED:,} more classes without train or val samples (all in --json)")
    if lines and hint:
        lines[-1] += f"; {hint}"
    return lines
