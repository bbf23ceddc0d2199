"""``wds-tools.toml``: defaults for the CLI's options, read from the working directory.

Not to be confused with ``training_adapter.load_config``, which reads a trainer's YAML/TOML config.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from ..errors import OptionError

__all__ = [
    "CONFIG_FILE",
    "SHARED_KEYS",
    "load_cli_defaults",
    "default_map",
]

CONFIG_FILE = "wds-tools.toml"
"""The config file the CLI reads from the current folder."""
SHARED_KEYS = _TOP_LEVEL = frozenset({"source", "out"})
"""Top-level wds-tools.toml keys that feed every command taking that option."""
_PATH_KEYS = {"source", "out"}
_COMMANDS = {"convert", "diff", "dups", "index", "stats", "verify"}


def load_cli_defaults(path: str | os.PathLike | None = None) -> dict:
    """Read a wds-tools.toml (default: ./wds-tools.toml if present); {} when there is none.

    Relative ``source`` and ``out`` are taken relative to the file's folder."""
    explicit = path is not None
    p = Path(path) if path is not None else Path.cwd() / CONFIG_FILE
    if not p.exists():
        if explicit:
            raise OptionError(f"--config {p}: no such file")
        return {}
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise OptionError(f"{p}: not valid TOML: {e}") from None
    for key, value in data.items():
        if key not in _TOP_LEVEL and key not in _COMMANDS:
            raise OptionError(
                f"{p}: unknown key {key!r}; expected {', '.join(sorted(_TOP_LEVEL))} or a "
                f"[{'] / ['.join(sorted(_COMMANDS))}] table"
            )
        if key in _COMMANDS and not isinstance(value, dict):
            raise OptionError(f"{p}: {key!r} must be a table, e.g. [{key}]")
    base = p.parent.resolve()

    def resolve(d: dict) -> dict:
        # a relative path is relative to the file's folder, and stays relative (to the working
        # directory): index.json records `source` as given, so a copied project converts to the same bytes
        return {
            k: (
                os.path.relpath(base / v)
                if k in _PATH_KEYS and isinstance(v, str) and "://" not in v and not os.path.isabs(v)
                else v
            )
            for k, v in d.items()
        }

    return {
        "_path": str(p),
        **resolve({k: v for k, v in data.items() if k in _TOP_LEVEL}),
        **{c: resolve(data[c]) for c in _COMMANDS if c in data},
    }


def default_map(config: dict) -> dict:
    """Per command, the defaults ``config`` gives it: top-level keys feed every command, [command]
    tables override. Keys stay as written (``shard-size``); the CLI turns them into click's parameter names."""
    shared = {k: config[k] for k in _TOP_LEVEL if k in config}
    return {c: {**shared, **config.get(c, {})} for c in _COMMANDS}
