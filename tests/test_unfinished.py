"""Issue 22, point 7 (row 8): a folder whose conversion is running or was interrupted is never read
as a whole dataset, by the loader, stats or verify, whether named as a folder or by a pattern
inside it; and point 10: a complete folder is read without writing a byte."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_images, write_manifest

from wds_tools.cli import cli
from wds_tools.convert import convert
from wds_tools.dataset.resolve import resolve, unfinished_conversion
from wds_tools.errors import IndexFormatError
from wds_tools.format.index import LOCK_FILE, WORK_DIR


def _manifest(root: Path, n: int = 24) -> Path:
    rows = make_images(root / "c", n)
    for i, r in enumerate(rows):
        r["split"] = "val" if i % 6 == 0 else "train"
    return write_manifest(root / "c" / "m.csv", rows)


@pytest.fixture
def interrupted(tmp_path, interrupt_writes) -> Path:
    """A real conversion interrupted after 3 of its shards: tars and the work folder, no index.json."""
    manifest = _manifest(tmp_path)
    written = interrupt_writes(3)
    with pytest.raises(KeyboardInterrupt):
        convert(manifest, version="v2", size=16, out=tmp_path / "out", shard_size=3, workers=1, progress=False)
    written.restore()
    folder = tmp_path / "out" / "v2" / "16"
    assert len(written) == 3 and len(list(folder.glob("*.tar"))) >= 3
    assert (folder / WORK_DIR).is_dir() and not (folder / "index.json").exists()
    return folder


def test_the_layout_names_are_the_converters():
    from wds_tools.convert import outfolder as target

    assert (target.WORK_DIR, target.LOCK_FILE) == (WORK_DIR, LOCK_FILE)


def test_an_interrupted_folder_is_refused_by_every_reader_also_through_a_pattern(interrupted):
    pytest.importorskip("torch")
    from training_adapter import make_loader

    tars = sorted(p.name for p in interrupted.glob("train-*.tar"))
    pattern = str(interrupted / f"train-{{000000..{len(tars) - 1:06d}}}.tar")
    state = unfinished_conversion(str(interrupted))
    assert state is not None and WORK_DIR in state and "index.json" in state
    for spec in (interrupted, pattern, str(interrupted / tars[0])):
        with pytest.raises(
            IndexFormatError,
            match=r"is not a finished dataset: a conversion .*run the convert "
            r"command again to finish it",
        ) as e:
            make_loader(spec, batch_size=2, train=True, num_workers=0)
        assert "give a shard pattern" not in str(e.value)
        with pytest.raises(IndexFormatError, match="is not a finished dataset"):
            resolve(spec, scan=True)
    runner = CliRunner()
    for command in (["stats"], ["stats", "--scan"], ["verify"], ["verify", "--scan"]):
        for spec in (str(interrupted), pattern):
            r = runner.invoke(cli, [*command, spec])
            assert r.exit_code != 0 and "is not a finished dataset" in r.output, (command, spec, r.output)
            assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_a_running_conversion_is_named_with_its_holder(interrupted):
    from wds_tools.convert.lock import lock_folder
    from wds_tools.storage.objects import Store

    lock = lock_folder(Store(interrupted))  # this process holds it: a conversion running now
    try:
        state = unfinished_conversion(str(interrupted))
        assert state is not None and state.startswith("a conversion is running in it")
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in state and LOCK_FILE in state
    finally:
        lock.release()
    # a lock file naming a process of this host that is gone: interrupted
    (interrupted / LOCK_FILE).write_text(
        json.dumps(
            {
                "host": socket.gethostname(),
                "pid": 2**22 + 12345,
                "since": "2026-01-01T00:00:00Z",
                "command": "wds-tools x",
            }
        )
    )
    state = unfinished_conversion(str(interrupted))
    assert state is not None and "was interrupted" in state and "no longer running" in state


def test_a_finished_conversion_reads_again(interrupted, tmp_path):
    manifest = tmp_path / "c" / "m.csv"
    convert(manifest, version="v2", size=16, out=tmp_path / "out", shard_size=3, workers=1, progress=False)
    assert unfinished_conversion(str(interrupted)) is None
    assert sum(resolve(interrupted).counts or []) == 24


def test_a_folder_of_plain_tars_is_not_called_unfinished(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"\0" * 1024)
    assert unfinished_conversion(str(tmp_path)) is None
    with pytest.raises(IndexFormatError, match=r"no index at .*; convert first") as e:
        resolve(tmp_path)
    assert "give a shard pattern" not in str(e.value)


# ------------------------------------------------------------------ point 10: read-only datasets

_NO_WRITES = textwrap.dedent("""
    import os, sys
    root = os.path.realpath(sys.argv[1])
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def inside(path):
        try:
            return os.path.realpath(os.fsdecode(path)).startswith(root)
        except (TypeError, ValueError):
            return False

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)) and inside(args[0]):
            mode, flags = args[1], args[2]
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE:
                raise PermissionError(f"read-only dataset: open({args[0]!r}, {mode!r}, {flags!r})")
        elif event in ("os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.unlink",
                       "os.truncate", "os.chmod", "os.utime", "shutil.rmtree", "os.link", "os.symlink") \\
                and args and isinstance(args[0], (str, bytes, os.PathLike)) and inside(args[0]):
            raise PermissionError(f"read-only dataset: {event}({args[0]!r})")

    sys.addaudithook(hook)
    for attempt in (lambda: open(os.path.join(root, "probe"), "wb"), lambda: os.mkdir(os.path.join(root, "d")),
                    lambda: os.open(os.path.join(root, "probe"), os.O_WRONLY | os.O_CREAT)):
        try:
            attempt()
            raise SystemExit("the hook let a write through")
        except PermissionError:
            pass
    from click.testing import CliRunner
    from wds_tools.cli import cli
    runner = CliRunner()
    for command in (["stats"], ["stats", "--scan"], ["verify"], ["verify", "--quick"], ["verify", "--scan"]):
        r = runner.invoke(cli, [*command, root])
        assert r.exit_code == 0 and "read-only dataset" not in r.output, (command, r.output)
    from training_adapter import make_loader
    for reader in ("index", "stream"):
        for train in (True, False):
            n = sum(len(b[1]) for b in make_loader(root, batch_size=2, train=train, num_workers=0, reader=reader))
            assert n > 0, (reader, train)
    print("read without writing")
""")


def test_a_complete_folder_is_read_without_writing(tmp_path):
    """stats, verify and the loader on a complete folder: any write under it (open for writing, mkdir,
    rename, remove ...) fails the run (an audit hook, which root's writes cannot pass either)."""
    pytest.importorskip("torch")
    manifest = _manifest(tmp_path)
    convert(manifest, version="v1", size=16, out=tmp_path / "out", shard_size=3, workers=1, progress=False)
    folder = tmp_path / "out" / "v1" / "16"
    r = subprocess.run(
        [sys.executable, "-c", _NO_WRITES, str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=300,
    )
    assert r.returncode == 0 and "read without writing" in r.stdout, r.stdout + r.stderr
