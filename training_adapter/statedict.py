"""State dict: a loader state's fields, each checked on load, and its settings compared.

``check_state`` refuses a dict that is not a whole, well-formed state of this version and reader,
naming the field; ``check_settings`` one saved with another value of a setting; ``same`` one of
another dataset or selection. A state is never half-read.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from wds_tools.errors import OptionError

from .options import Option, Refused, declared

__all__ = [
    "STATE_VERSION",
    "MAX_WORLD",
    "MAX_WORKERS",
    "check_state",
    "check_settings",
    "check_span",
    "check_plan",
    "field_error",
    "settings",
    "settings_of",
    "state_base",
    "same",
    "weights_description",
]

STATE_VERSION = 2
"""The version of the ``state_dict`` layout; a state of another version is refused (1: before the
settings were recorded)."""
MAX_WORLD = 1 << 16
"""The most ranks a state may name: bounds what a hand-edited state makes the loader plan."""
MAX_WORKERS = 1 << 10
"""The most workers per rank a state may name (the same bound)."""
_KIND = "wds_tools.loader_state"
_I64 = (1 << 63) - 1  # the epoch lives in an int64 shared with the workers
_U64 = (1 << 64) - 1  # xxh3-64 digests

# --- fields and their checks --------------------------------------------------------------------
Check = Callable[[Any], str | None]  # a value -> None, or what was expected


def _integer(lo: int, hi: int = _I64, *, none: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if none and v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= int(v) <= hi:
            return f"expected an integer from {lo} to {hi}" + (", or None" if none else "")
        return None

    return check


def _weights(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return None
    if isinstance(v, Mapping) and all(
        isinstance(k, str) and isinstance(w, numbers.Real) and not isinstance(w, bool) for k, w in v.items()
    ):
        return None
    return "expected None, 'balanced' or a {class: weight} dict"


def _plan(v: Any) -> str | None:  # its shape and values are checked against the shards by resume
    if v is None or (isinstance(v, Mapping) and set(v) == {"shards", "batches"}):
        return None
    return "expected None or a dict of 'shards' and 'batches'"


# after the settings (the options declared ``order``, checked by their own check)
_COMMON: dict[str, Check] = {
    "shards": _integer(0),
    "shards_xxh3": _integer(0, _U64),
    "epoch": _integer(0),
    "world": _integer(1, MAX_WORLD),
}
_FIELDS: dict[str, dict[str, Check]] = {
    "index": {
        **_COMMON,
        "class_weights": _weights,
        "shares_xxh3": _integer(0, _U64, none=True),
        "samples": _integer(1),
        "rows_xxh3": _integer(0, _U64),
        "position": _integer(0),
        "end": _integer(1, none=True),
        "draws": _integer(1, none=True),
        "left_out": _integer(0),
    },
    "stream": {
        **_COMMON,
        "workers": _integer(1, MAX_WORKERS),
        "batches": _integer(0),
        "plan": _plan,
        "skipped": _integer(0),
    },
}


def field_error(name: str, value: Any, expected: str) -> OptionError:
    """The error for a state field ``name`` holding ``value``: ``expected`` says what it must hold."""
    shown = repr(value)
    return OptionError(
        f"load_state_dict: the state's {name}={shown if len(shown) <= 80 else shown[:77] + '...'}: {expected} "
        f"(an edited or damaged state: load the one loader.state_dict() returned, or start the epoch afresh)"
    )


def _setting(check: Callable[[Any], Any]) -> Check:
    def wrong(v: Any) -> str | None:
        try:
            check(v)
        except Refused as e:
            return str(e)
        return None

    return wrong


def check_state(state: Any, options: Any, *, reader: str) -> dict[str, Any]:
    """``state`` as a plain dict (integers as ``int``) if it is a loader state of this version for
    ``reader`` and ``options``' settings with every field present, known and of its type and range
    (a setting's by its option's check); else an ``OptionError`` naming what is wrong."""
    if not isinstance(state, Mapping) or state.get("kind") != _KIND:
        what = "a dict without kind=" + repr(_KIND) if isinstance(state, Mapping) else type(state).__name__
        raise OptionError(f"load_state_dict: expected the dict loader.state_dict() returned, got {what}")
    v = state.get("version")
    if isinstance(v, bool) or not isinstance(v, int) or v != STATE_VERSION:
        raise OptionError(
            f"load_state_dict: state version {v!r}; this loader reads version {STATE_VERSION} "
            f"(saved by another wds-tools version: start the epoch afresh without the state)"
        )
    if state.get("reader") != reader:
        raise OptionError(
            f"load_state_dict: the state was saved by the {state.get('reader')} reader, this loader "
            f"uses the {reader} reader (pass reader={state.get('reader')!r} to make_loader)"
        )
    fields = {name: _setting(o.check) for name, o in settings(options).items()} | _FIELDS[reader]
    missing = [n for n in fields if n not in state]
    if missing:
        nor = f" (nor {', '.join(map(repr, missing[1:]))})" if len(missing) > 1 else ""
        raise OptionError(
            f"load_state_dict: the state has no {missing[0]!r} field{nor}; a state of the {reader} reader "
            f"has {', '.join(fields)}"
        )
    unknown = [str(n) for n in state if n not in fields and n not in ("kind", "version", "reader")]
    if unknown:
        raise OptionError(
            f"load_state_dict: the state has a field this version does not know: {unknown[0]!r}; a "
            f"state of the {reader} reader has {', '.join(fields)}"
        )
    out: dict[str, Any] = {"kind": _KIND, "version": STATE_VERSION, "reader": reader}
    for name, check in fields.items():
        value = state[name]
        wrong = check(value)
        if wrong:
            raise field_error(name, value, wrong)
        out[name] = int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value
    return out | {name: o.check(state[name]) for name, o in settings(options).items()}  # as the options keep them


def state_base(reader: str, **fields: Any) -> dict[str, Any]:
    """A state dict's common fields, then ``fields``."""
    return {"kind": _KIND, "version": STATE_VERSION, "reader": reader, **fields}


# --- the settings --------------------------------------------------------------------------------
def settings(options: Any) -> dict[str, Option]:
    """The settings: the options (``loader.LoaderOptions``) declared to decide which sample comes when."""
    return {name: o for name, o in declared(options).items() if o.order}


def settings_of(options: Any) -> dict[str, Any]:
    """The settings of ``options``, as given."""
    return {name: getattr(options, name) for name in settings(options)}


def _effective(reader: str, s: Mapping[str, Any], names: Iterable[str]) -> list[tuple[tuple[str, ...], Any, str]]:
    """What the settings ``names`` of ``s`` decide for ``reader``: (the settings it comes from, its value,
    a note when it is not one of them as given), in ``names``' order; a setting without a rule here, as
    given. The first one that differs is named on load."""
    train = s["train"]
    drop = train if s["drop_last"] is None else s["drop_last"]
    rules: dict[str, tuple[tuple[str, ...], Any, str] | None] = {
        "drop_last": (
            ("drop_last",),
            drop,
            f"{drop} in {'training' if train else 'evaluation'}" if s["drop_last"] is None else "",
        )
    }
    if reader == "index":  # one permutation of the samples, or the index order
        shuffle = train and (s["shuffle_shards"] or s["shuffle_buffer"] > 1)
        rules["shuffle_shards"] = (
            ("shuffle_shards", "shuffle_buffer"),
            shuffle,
            "samples shuffled" if shuffle else "index order",
        )
        rules["shuffle_buffer"] = None  # in the rule above
    else:  # the shard order, and the sample shuffle buffer (0 or 1: none); evaluation uses neither
        rules["shuffle_shards"] = (("shuffle_shards",), train and s["shuffle_shards"], "")
        rules["shuffle_buffer"] = (
            ("shuffle_buffer",),
            s["shuffle_buffer"] if train and s["shuffle_buffer"] > 1 else 0,
            "",
        )
    out = [rules.get(name, ((name,), s[name], "")) for name in names]
    return [r for r in out if r is not None]


def check_settings(state: Mapping[str, Any], options: Any, *, reader: str) -> None:
    """Refuse a (checked) ``state`` saved with another value of a setting that decides which sample
    comes when, naming the setting and both values."""
    ours = settings_of(options)
    pairs = zip(_effective(reader, state, ours), _effective(reader, ours, ours))
    for (names, was, note), (_, now, our_note) in pairs:
        if was == now and type(was) is type(now):
            continue
        saved = ", ".join(f"{n}={state[n]!r}" for n in names)
        have = ", ".join(f"{n}={ours[n]!r}" for n in names)
        raise OptionError(
            f"load_state_dict: the state was saved with {saved}{f' ({note})' if note else ''}, this loader "
            f"has {have}{f' ({our_note})' if our_note else ''}: the rest of the epoch would not be the "
            f"interrupted run's; make the loader with {saved}, as the interrupted run did (a change "
            f"applies from an epoch's start: do not load the state)"
        )


def weights_description(weights: Any) -> Any:
    """``class_weights`` as a state holds it (JSON-able): None, ``"balanced"`` or ``{str(class): weight}``."""
    if weights is None or isinstance(weights, str):
        return weights
    return {str(k): float(v) for k, v in weights.items()}


def same(state: Mapping[str, Any], name: str, have: Any, fix: str, *, show: Callable[[Any], str] = repr) -> None:
    """Refuse a state whose ``name`` is not ``have`` (another dataset or selection), saying ``fix``."""
    if state[name] != have:
        raise OptionError(
            f"load_state_dict: the state was saved with {name}={show(state[name])}, this loader has {show(have)}: {fix}"
        )


# --- the position, against the dataset ------------------------------------------------------------
def check_span(
    state: Mapping[str, Any], *, rows: int, batch_size: int, epoch_batches: int | None, resampled: bool
) -> None:
    """Refuse an index-reader ``state`` (checked, settings equal) whose ``position``, ``end``, ``draws``
    or ``left_out`` no run over ``rows`` selected rows could have saved."""
    position, end, draws = state["position"], state["end"], state["draws"]
    if end is None:  # an epoch not begun
        if position != 0:
            raise field_error("position", position, "expected 0 with end=None (an epoch not begun)")
        if draws is not None:
            raise field_error("draws", draws, "expected None with end=None (an epoch not begun)")
    elif resampled:  # the sequence's length, drawn for the ranks of the run that began the epoch
        unit = batch_size * (epoch_batches or 1)
        most = unit * MAX_WORLD if epoch_batches else max(rows, batch_size * MAX_WORLD)
        if draws is None or draws % unit or draws > most:
            raise field_error(
                "draws",
                draws,
                f"expected the samples a resampled epoch draws: a multiple of {unit} (batch_size"
                f"{' x epoch_batches' if epoch_batches else ''} x ranks) up to {most}",
            )
    elif draws is not None:
        raise field_error("draws", draws, "expected None (only resampled=True draws)")
    length = draws if draws is not None else rows
    if end is not None and end > length:
        raise field_error(
            "end", end, f"expected at most {length}, the {'draws' if draws is not None else 'samples'} of the epoch"
        )
    if end is not None and position >= end:
        raise field_error(
            "position",
            position,
            f"expected from 0 to {end - 1} (end={end}); a state at an epoch's end names the next epoch, "
            f"with position=0 and end=None",
        )
    if state["left_out"] > length:
        raise field_error("left_out", state["left_out"], f"expected at most {length}, the epoch's rows")


def check_plan(
    plan: Mapping[str, Any],
    *,
    world: int,
    workers: int,
    counts: list[int],
    batch_size: int,
    resampled: bool,
) -> tuple[list[list[list[int]]], list[list[int]]]:
    """A streamed state's ``plan`` (the rest of a resumed epoch: [rank][worker] -> shards, batches) as
    plain lists, if it fits ``world`` ranks of ``workers`` workers and the shards' ``counts``: every
    shard at most once, no batch beyond its worker's samples (resampled: no shard); else an
    ``OptionError`` naming the part that does not."""

    def refuse(where: str, value: Any, expected: str) -> OptionError:
        return field_error(f"plan{where}", value, expected)

    shards, batches = plan["shards"], plan["batches"]
    for name, grid in (("shards", shards), ("batches", batches)):
        if not isinstance(grid, list) or len(grid) != world:
            raise refuse(f"[{name!r}]", grid, f"expected a list of world={world} ranks")
        for r, ranks in enumerate(grid):
            if not isinstance(ranks, list) or len(ranks) != workers:
                raise refuse(f"[{name!r}][{r}]", ranks, f"expected a list of workers={workers} workers")
    seen: set[int] = set()
    out_shards: list[list[list[int]]] = []
    for r, ranks in enumerate(shards):
        out_shards.append([])
        for w, own in enumerate(ranks):
            good = isinstance(own, list) and all(
                isinstance(i, numbers.Integral) and not isinstance(i, bool) and 0 <= int(i) < len(counts) for i in own
            )
            if not good or (resampled and own):
                expected = "expected []: resampled epochs draw their shards" if good else "expected a list of shard"
                raise refuse(f"['shards'][{r}][{w}]", own, expected + f" positions from 0 to {len(counts) - 1}")
            if len(set(own)) < len(own) or seen.intersection(own):
                raise refuse(f"['shards'][{r}][{w}]", own, "expected each shard once in the plan")
            seen.update(own)
            out_shards[-1].append([int(i) for i in own])
    out_batches: list[list[int]] = []
    for r, ranks in enumerate(batches):
        out_batches.append([])
        for w, b in enumerate(ranks):
            samples = sum(counts[i] for i in out_shards[r][w])
            most = _I64 if resampled else -(-samples // batch_size)
            if isinstance(b, bool) or not isinstance(b, numbers.Integral) or not 0 <= int(b) <= most:
                raise refuse(
                    f"['batches'][{r}][{w}]",
                    b,
                    f"expected an integer from 0 to {most}"
                    + ("" if resampled else f" (its shards hold {samples} samples, batch_size={batch_size})"),
                )
            out_batches[-1].append(int(b))
    return out_shards, out_batches
