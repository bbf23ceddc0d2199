"""The ``wds-tools`` command line: parse options, call one library function, print its result.

``group`` holds the ``wds-tools`` group and ``main``; ``convert`` and ``inspect`` hold the commands over
``wds_tools.convert`` and ``wds_tools.inspect``, ``report`` the page of ``wds_tools.inspect.page``: registered
on the group when this package is imported.
"""

from __future__ import annotations

from . import convert, inspect, report  # noqa: F401  (registers the commands on the group)
from .group import cli, main

__all__ = ["cli", "main"]
