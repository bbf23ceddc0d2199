"""One writer per output folder: a conversion holds an exclusive lock on each ``OUT/VERSION/SIZE``.

Local folders (NFS included): a POSIX ``fcntl.lockf`` lock on ``.wds-tools-lock``, released by the kernel
when its holder dies, so no stale lock is guessed at; object storage, or a filesystem without POSIX locks: a
marker created only when absent. Why, and the races each closes: docs/guide/converter-internals.md, "Locks".
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shlex
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..errors import OutputBusyError
from ..format.index import LOCK_FILE  # beside WORK_DIR, which a folder's state check skips too
from ..storage.objects import Store

__all__ = ["LOCK_FILE", "Holder", "FolderLock", "lock_folder", "lock_folders", "release_all"]

_NO_POSIX_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}
_HELD: dict[str, FolderLock] = {}  # lock path -> lock, for this process
_HELD_GUARD = threading.Lock()
_READ_HOLDER_FOR = 1.0  # seconds a refused run waits for a just-started holder to write its name


def _command() -> str:
    argv = list(sys.argv) or ["python"]
    prog = os.path.basename(argv[0])
    if prog in ("__main__.py", "wds-tools", "-c"):
        prog = "wds-tools"
    return shlex.join([prog, *argv[1:]])[:1000]


@dataclass(frozen=True)
class Holder:
    """Who holds a folder: written into the lock file or marker."""

    host: str
    pid: int
    since: str  # UTC, ISO 8601
    command: str

    @classmethod
    def me(cls) -> Holder:
        """This process, now."""
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(socket.gethostname(), os.getpid(), since, _command())

    def to_bytes(self) -> bytes:
        """The lock file's contents."""
        return (
            json.dumps(
                {"host": self.host, "pid": self.pid, "since": self.since, "command": self.command}, sort_keys=True
            )
            + "\n"
        ).encode()

    @classmethod
    def parse(cls, data: bytes | None) -> Holder | None:
        """The holder a lock file names; None when it is missing or unreadable."""
        try:
            d = json.loads(data or b"")
            return cls(str(d["host"]), int(d["pid"]), str(d["since"]), str(d["command"]))
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        """The holder in a message's words."""
        return f"pid {self.pid} on host {self.host}, since {self.since} UTC, running `{self.command}`"

    def gone(self) -> bool:
        """True only when this host ran the holder and no process with its pid is left."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False


@dataclass
class FolderLock:
    """A held lock; ``release()`` gives it back (and removes the folders it created, if empty)."""

    root: str
    path: str
    holder: Holder
    fd: int | None = None  # local: the lockf'd file; None for a marker
    marker: _Markers | None = None
    taken_over: Holder | None = None  # the run whose lock this one found free (interrupted) or stale
    created: list[str] = field(default_factory=list)  # folders made for the lock, deepest last

    def release(self) -> None:
        """Give the folder back (remove the lock file, and the folders made for it when empty)."""
        with _HELD_GUARD:
            if _HELD.get(self.path) is not self:
                return
            del _HELD[self.path]
            if self.fd is not None:
                try:
                    os.unlink(self.path)  # while locked: a taker that opened it sees another file
                except FileNotFoundError:
                    pass
                os.close(self.fd)
                self.fd = None
            elif self.marker is not None:
                if self.marker.read(self.path) == self.holder.to_bytes():
                    self.marker.delete(self.path)
            for folder in reversed(self.created):  # a refused or failed fresh run leaves no folder
                try:
                    os.rmdir(folder)
                except OSError:
                    break


def _busy(root: str, holder: Holder | None, *, lock_path: str, marker: bool, thread: bool = False) -> OutputBusyError:
    if thread and holder is not None:  # a thread of this process holds it: its holder is known
        who = f"this process ({holder.describe()}), from another thread"
    elif holder is None:
        who = f"another process (it has not written its name into {lock_path} yet)"
    else:
        who = holder.describe()
    msg = (
        f"{root} is being written by another conversion: {who}. Nothing was changed. Wait for it to "
        "finish and run this command again (it then resumes, or finds the folder complete), or write "
        "elsewhere with another --out or --version."
    )
    if marker and holder is not None:
        msg += (
            f" If that run is no longer running (its host cannot be asked from here), delete the marker "
            f"{lock_path} and run again."
        )
    return OutputBusyError(msg)


def _makedirs(folder: str) -> list[str]:
    """Create ``folder`` and its missing parents; return those created, outermost first."""
    missing = []
    f = os.path.abspath(folder)
    while not os.path.isdir(f):
        missing.append(f)
        parent = os.path.dirname(f)
        if parent == f:
            break
        f = parent
    os.makedirs(folder, exist_ok=True)
    return list(reversed(missing))


def _read_fd(fd: int) -> bytes:
    return os.pread(fd, 1 << 16, 0)


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _lockf(fd: int) -> None:
    """An exclusive POSIX lock on the whole file, without waiting (OSError EACCES/EAGAIN when held)."""
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _lock_local(root: str, me: Holder) -> FolderLock:
    path = os.path.join(root, LOCK_FILE)
    created = _makedirs(root)
    for _ in range(1000):  # each pass is lost only to a holder that released meanwhile
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd, made = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, made = os.open(path, flags), False
            except FileNotFoundError:  # released meanwhile
                continue
        except FileNotFoundError:  # a refused run removed the empty folder it had made
            created += _makedirs(root)
            continue
        try:
            _lockf(fd)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                deadline = time.monotonic() + _READ_HOLDER_FOR
                while (holder := Holder.parse(_read_fd(fd))) is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                os.close(fd)  # no lock of ours on it: closing drops nothing
                raise _busy(root, holder, lock_path=path, marker=False) from None
            if e.errno in _NO_POSIX_LOCKS:
                if made:  # created exclusively by this process: it is our marker
                    try:
                        os.write(fd, me.to_bytes())
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    return FolderLock(root, path, me, marker=_LocalMarkers(), created=created)
                os.close(fd)
                return _lock_marker(root, path, me, _LocalMarkers(), created)
            os.close(fd)
            raise
        if not _same_file(fd, path):  # its holder finished and unlinked it after we opened it
            os.close(fd)
            continue
        previous = Holder.parse(_read_fd(fd))
        data = me.to_bytes()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return FolderLock(root, path, me, fd=fd, taken_over=previous, created=created)
    raise OutputBusyError(
        f"{root}: could not take the lock {path}: it was released and taken again "
        "1000 times in a row; is a script starting conversions in a loop?"
    )


class _Markers:
    """Conditional-create markers: ``create`` succeeds only when nothing is there."""

    def create(self, path: str, data: bytes) -> bool:
        raise NotImplementedError

    def read(self, path: str) -> bytes | None:
        raise NotImplementedError

    def delete(self, path: str) -> None:
        raise NotImplementedError


class _LocalMarkers(_Markers):
    def create(self, path: str, data: bytes) -> bool:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read(1 << 16)
        except FileNotFoundError:
            return None

    def delete(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class _RemoteMarkers(_Markers):
    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def create(self, path: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def read(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None

    def delete(self, path: str) -> None:
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass


class _HostMutex:
    """A lockf lock in the temporary folder, keyed by ``key``: serialises this host's takers."""

    def __init__(self, key: str) -> None:
        folder = os.path.join(tempfile.gettempdir(), "wds-tools-locks")
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock")

    def __enter__(self) -> _HostMutex:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.lockf(self.fd, fcntl.LOCK_EX)  # held for a read, a delete and a create
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _lock_marker(root: str, path: str, me: Holder, markers: _Markers, created: list[str]) -> FolderLock:
    data = me.to_bytes()
    for _ in range(20):
        if markers.create(path, data):
            return FolderLock(root, path, me, marker=markers, created=created)
        found = markers.read(path)
        if found is None:  # released meanwhile
            continue
        holder = Holder.parse(found)
        if holder is None:  # being written (local O_EXCL file), or not ours to judge
            time.sleep(0.05)
            holder = Holder.parse(markers.read(path))
            if holder is None:
                raise _busy(root, None, lock_path=path, marker=True)
        if not holder.gone():
            raise _busy(root, holder, lock_path=path, marker=True)
        with _HostMutex(path):  # the holder ran here and is gone: take its marker over, one taker at a time
            if markers.read(path) == found:
                markers.delete(path)
                if markers.create(path, data):
                    return FolderLock(root, path, me, marker=markers, taken_over=holder, created=created)
    raise _busy(root, Holder.parse(markers.read(path)), lock_path=path, marker=True)


def lock_folder(store: Store) -> FolderLock:
    """Take ``store``'s folder for this process, or raise ``OutputBusyError`` naming the holder."""
    me = Holder.me()
    path = store.join(LOCK_FILE)
    with _HELD_GUARD:
        held = _HELD.get(path)
        if held is not None:
            raise _busy(store.root, held.holder, lock_path=path, marker=held.marker is not None, thread=True)
        if store.remote:
            from ..storage.transport import filesystem

            lock = _lock_marker(store.root, path, me, _RemoteMarkers(filesystem(path)), [])
        else:
            lock = _lock_local(store.root, me)
        _HELD[path] = lock
    return lock


def lock_folders(stores: Sequence[Store]) -> list[FolderLock]:
    """Lock every folder (in the given order), or none: a refusal releases those already taken."""
    locks: list[FolderLock] = []
    try:
        for store in stores:
            locks.append(lock_folder(store))
    except BaseException:
        release_all(locks)
        raise
    return locks


def release_all(locks: Sequence[FolderLock]) -> None:
    """Release ``locks``, the last taken first."""
    for lock in reversed(locks):
        lock.release()
