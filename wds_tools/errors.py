"""The exception tree of wds-tools: every error a user can cause is a ``WdsToolsError``."""

from __future__ import annotations

import errno
import importlib
from collections.abc import Callable
from types import ModuleType

__all__ = [
    "WdsToolsError",
    "OptionError",
    "SourceError",
    "InvalidKeyError",
    "SourceNotFoundError",
    "DecodeError",
    "OutputExistsError",
    "IndexFormatError",
    "ShardError",
    "ExtraNotInstalledError",
    "EXTRAS",
    "install_hint",
    "require_extra",
    "TooManyErrorsError",
    "OutputBusyError",
    "DiskFullError",
    "ReadOnlyOutputError",
    "READ_ONLY_ERRNOS",
    "read_only_error",
    "unwritable_file_error",
]


class WdsToolsError(Exception):
    """Base class: the CLI prints the message and exits non-zero, without a traceback."""


class OptionError(WdsToolsError):
    """An option or configuration value is out of range or malformed."""


class SourceError(WdsToolsError):
    """The corpus (manifest or image folder) cannot be read as given."""


class InvalidKeyError(SourceError):
    """Sample keys are invalid or duplicated; the message names the rows."""


class SourceNotFoundError(SourceError, OptionError):
    """The --source named does not exist: a source error, and a usage one (the CLI exits 2, as for
    any path on its command line that is not there)."""


class DecodeError(WdsToolsError):
    """One source image cannot be turned into pixels (missing, empty, truncated, not an image)."""


class OutputExistsError(WdsToolsError):
    """The output folder holds a conversion made with other options or another source."""


class IndexFormatError(WdsToolsError):
    """An index file is missing, unreadable or of an unsupported format version."""


class ShardError(WdsToolsError):
    """A shard is missing, truncated or does not match its index entry.

    ``url`` is the shard and ``offset`` the byte in it where the problem is, when known.
    """

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.url, self.offset = url, offset

    def __reduce__(self) -> tuple[Callable[..., ShardError], tuple[str, str | None, int | None]]:
        # keep url and offset through pickling (DataLoader workers, process pools)
        return _shard_error, (str(self), self.url, self.offset)


def _shard_error(message: str, url: str | None, offset: int | None) -> ShardError:
    return ShardError(message, url=url, offset=offset)


class ExtraNotInstalledError(WdsToolsError):
    """A feature needs an optional extra that is not installed; the message names the extra."""


EXTRAS: dict[str, tuple[str, ...]] = {
    "heif": ("pillow-heif==1.8.1",),
    "s3": ("s3fs==2026.9.0",),
    "ray": ("ray==2.60.0",),
    "plot": ("matplotlib==3.11.2",),
    "report": ("jinja2==3.1.6", "matplotlib==3.11.2"),
    "augment": ("albumentations==2.0.8",),
    "lightning": ("pytorch-lightning==2.6.6",),
    "train": ("torch==2.13.0", "pyyaml==6.0.3", "opencv-python-headless==5.0.0.93"),
}
"""The packages of each optional extra that a message names, pinned as constraints.txt pins them (the
versions the tests ran with; tests/test_errors.py checks both files)."""


def install_hint(extra: str, *packages: str) -> str:
    """How to install an extra (or some of its ``packages``, by name), in words that work wherever
    wds-tools came from: a checkout, a wheel built from one, or none (there is no published package)."""
    pinned = [p for p in EXTRAS[extra] if not packages or p.split("==")[0] in packages]
    part = "part of " if packages else ""
    return (
        f"pip install {' '.join(pinned)} ({part}the {extra!r} extra: from a checkout, "
        f"pip install -e '.[{extra}]' -c constraints.txt)"
    )


def require_extra(module: str, need: str, extra: str) -> ModuleType:
    """``module`` imported, or ``ExtraNotInstalledError``: "<need>, which is not installed; install the <extra> extra"."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExtraNotInstalledError(
            f"{need}, which is not installed; install the {extra} extra: {install_hint(extra)}"
        ) from None


class TooManyErrorsError(WdsToolsError):
    """More source files failed than --max-errors allows."""


class OutputBusyError(WdsToolsError):
    """Another conversion is writing the output folder; the message names it (host, pid, since, command)."""


class DiskFullError(WdsToolsError):
    """The output's filesystem is full; the message names the folder and the space still needed."""


class ReadOnlyOutputError(WdsToolsError):
    """The output folder cannot be written (a read-only mount, no permission); the message names it."""


def read_only_error(root: str, e: OSError, what: str) -> ReadOnlyOutputError:
    """The one-line refusal for ``what`` in ``root``, which ``e`` (errno in READ_ONLY_ERRNOS) says cannot be written."""
    return ReadOnlyOutputError(
        f"{root}: cannot {what} there: {e.strerror or e} ({e.filename or root}). "
        "Is it a read-only mount? Give a writable folder (--out), or remount it read-write."
    )


def unwritable_file_error(path: str, e: OSError, what: str) -> ReadOnlyOutputError:
    """The one-line refusal for a file (a plot, a report) that cannot be written at ``path``."""
    return ReadOnlyOutputError(
        f"{path}: cannot write {what} there: {e.strerror or e}. Give a path in a writable folder."
    )


READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
"""The errnos of a folder that cannot be written (read-only mount, no permission)."""
