"""The page's HTML: the Jinja2 template ``templates/report.html.j2`` (with its stylesheet inlined) filled
with the sections' figures; autoescaped, so a class name or a key is text, never markup. The charts'
SVG, which matplotlib writes with its own text escaped, is put in as it is."""

from __future__ import annotations

from importlib import resources
from types import ModuleType

from ...errors import require_extra
from ..stats.render import num, size_text

__all__ = ["require_jinja2", "render_page"]


def require_jinja2() -> ModuleType:
    """jinja2, or a message naming the ``report`` extra."""
    return require_extra("jinja2", "wds-tools report lays out its page with Jinja2", "report")


def render_page(context: dict) -> str:
    """The page's HTML for ``context`` (the sections' figures)."""
    jinja2 = require_jinja2()
    folder = resources.files(__package__).joinpath("templates")
    env = jinja2.Environment(
        loader=jinja2.DictLoader({p.name: p.read_text(encoding="utf-8") for p in folder.iterdir() if p.is_file()}),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a name the template expects but the figures lack is a bug, said
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["bytes"] = size_text
    env.filters["num"] = num
    env.filters["pct"] = lambda x, d=1: "-" if x is None else f"{100 * x:.{d}f}%"
    return env.get_template("report.html.j2").render(**context)
