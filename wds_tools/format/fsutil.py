"""Small filesystem helpers: atomic writes."""

from __future__ import annotations

import json
import os

__all__ = ["atomic_write_bytes", "dumps_canonical"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, then rename over ``path``."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def dumps_canonical(obj: object) -> str:
    """JSON with sorted keys and fixed separators, so equal data gives equal bytes."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False)
