"""Index: ``index.json`` and ``samples.npz`` (docs/FORMAT.md, "Index"), read and written.

The code lives in ``wds_tools.index`` until the converter's reorganisation moves it here; code
outside the converter (the loader, the inspectors, ``format.layout``) imports it from here.
"""

from __future__ import annotations

from ..index import *  # noqa: F401,F403
from ..index import __all__  # noqa: F401
