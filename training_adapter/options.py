"""Options: how a loader option is declared (``option``) and checked, and the checks they share.

``loader.LoaderOptions`` declares each of ``make_loader``'s keywords once, as a field whose
``option`` says how its value is checked, whether it decides which sample comes when (a resume
state records it and refuses another value) and whether a trainer config may set it; the
signature, the config keys and the resume settings are derived from, or tested against, that.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import numbers
import operator
from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

import numpy as np

from wds_tools.errors import OptionError

__all__ = [
    "Option",
    "Refused",
    "option",
    "declared",
    "check_all",
    "integer",
    "flag",
    "choice",
    "text",
    "function",
    "rgb",
    "names",
    "context",
    "MAX_SEED",
]

MAX_SEED = (1 << 63) - 1
"""The largest ``seed``: a state records it as an int64, and numpy's generators take no negative one."""


class Refused(ValueError):
    """A value a check refuses; its message says why and what was expected (``a bool; expected ...``)."""


Check = Callable[[Any], Any]  # a value -> the value as the loader keeps it; Refused (or an OptionError) if bad


@dataclass(frozen=True)
class Option:
    """One option's declaration beside its field: ``check``; ``order``, whether it decides which
    sample comes when (recorded in a resume state, another value refused on load); ``config``, whether
    a trainer config's ``dataset`` block may set it; ``none_default``, whether None stands for the default."""

    check: Check
    order: bool = False
    config: bool = True
    none_default: bool = False

    def checked(self, name: str, value: Any) -> Any:
        """``value`` as kept, or an ``OptionError`` naming ``name``, the value and what was expected."""
        try:
            return self.check(value)
        except Refused as e:
            raise OptionError(f"{name}={value!r}: {e}") from None


def option(
    default: Any = MISSING, *, check: Check, order: bool = False, config: bool = True, none_default: bool = False
) -> Any:
    """A dataclass field declaring an option (see ``Option``); no default: required."""
    return dataclasses.field(default=default, metadata={"option": Option(check, order, config, none_default)})


def declared(options: Any) -> dict[str, Option]:
    """Each option a dataclass (or an instance of one) declares, by name, in declaration order."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(options)}


def check_all(options: Any) -> None:
    """Check each declared field of the frozen dataclass instance ``options``, keeping its value as checked
    (None for the field's default where ``none_default``)."""
    for f in dataclasses.fields(options):
        o, value = f.metadata["option"], getattr(options, f.name)
        kept = f.default if value is None and o.none_default else o.checked(f.name, value)
        object.__setattr__(options, f.name, kept)


def _kind(v: Any) -> str:
    """What ``v`` is, for a message: ``a str``, ``a numpy float64``, ``a Tensor of torch.int64, shape (1,)``."""
    dtype, shape = getattr(v, "dtype", None), tuple(getattr(v, "shape", ()))
    if dtype is None:
        return f"a {type(v).__name__}"
    if type(v).__module__ == "numpy" and not shape and type(v).__name__ != "ndarray":
        return f"a numpy {dtype}"
    return f"a {type(v).__name__} of {dtype}" + (f", shape {shape}" if shape else "")


def integer(lo: int, hi: int = MAX_SEED, *, expected: str, none: bool = False) -> Check:
    """Any integer from ``lo`` to ``hi`` as an ``int`` (numpy integers, 0-d integer arrays and tensors
    included: a config or a numpy computation gives those), not a bool, float or string; None too if ``none``."""

    def check(v: Any) -> int | None:
        if v is None and none:
            return None
        kind = str(getattr(v, "dtype", type(v).__name__))
        try:  # operator.index: what numpy and torch allow as an index, i.e. integers only
            value = None if "bool" in kind or getattr(v, "ndim", 0) != 0 else operator.index(v)
        except TypeError:
            value = None
        if value is None:
            raise Refused(f"{_kind(v)}; expected {expected}")
        if not lo <= value <= hi:
            raise Refused(f"expected {expected}")
        return value

    return check


def flag(*, none: bool = False, expected: str | None = None) -> Check:
    """True or False (a numpy bool as a bool); None too if ``none``."""
    says = expected or ("True, False or None" if none else "True or False")

    def check(v: Any) -> bool | None:
        if v is None and none:
            return None
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        raise Refused(f"expected {says}")

    return check


def choice(*values: Any, expected: str | None = None) -> Check:
    """One of ``values``, of the same type (so 1 is not True)."""
    shown = [repr(c) for c in values]
    says = expected or (", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else shown[0])

    def check(v: Any) -> Any:
        if any(v == c and type(v) is type(c) for c in values):
            return v
        raise Refused(f"expected {says}")

    return check


def text(v: Any) -> str | None:
    """A string, or None."""
    if v is None or isinstance(v, str):
        return v
    raise Refused(f"{_kind(v)}; expected a string or None")


def function(v: Any) -> Any:
    """A callable (a function or a callable module), or None."""
    if v is None or callable(v):
        return v
    raise Refused("expected a function (or a callable module)")


def rgb(v: Any) -> tuple[float, ...] | None:
    """Three finite numbers (R, G, B), or None."""
    if v is None:
        return None
    good = isinstance(v, Collection) and not isinstance(v, (str, bytes, Mapping)) and len(v) == 3
    if good and all(isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) for x in v):
        return tuple(float(x) for x in v)
    raise Refused("expected three numbers (R, G, B, in 0-1 units), or None")


def names(v: Any) -> tuple[str, ...]:
    """A list of strings, as a tuple."""
    if isinstance(v, Collection) and not isinstance(v, (str, bytes, Mapping)) and all(isinstance(m, str) for m in v):
        return tuple(v)
    raise Refused("expected a list of column names, e.g. ['age', 'sex', 'localization']")


def context(v: Any) -> Any:
    """A multiprocessing start method's name, a context (``multiprocessing.get_context(...)``), or None."""
    if v is None or (isinstance(v, str) and v in multiprocessing.get_all_start_methods()):
        return v
    if not isinstance(v, str) and callable(getattr(v, "get_start_method", None)):
        return v
    raise Refused(
        f"expected one of {', '.join(map(repr, multiprocessing.get_all_start_methods()))}, a context, or None"
    )
