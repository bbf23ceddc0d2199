"""One writer per output folder (convert/lock.py): real processes hold and contend for real folders."""

import errno
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_images, write_manifest

from wds_tools.cli import cli
from wds_tools.convert import convert
from wds_tools.convert import lock as lock_mod
from wds_tools.convert.lock import LOCK_FILE, Holder, lock_folder, lock_folders, release_all
from wds_tools.errors import OutputBusyError
from wds_tools.inspect.verify import verify
from wds_tools.storage.objects import Store

ROOT = Path(__file__).resolve().parents[1]

# A conversion in its own process that stops before its shard number `at` until `go` exists (or for ever).
_HOLDER = r"""
import os, sys, time
import wds_tools.convert.write as w
manifest, out, at, go, size = sys.argv[1:6]
real, seen = w.open_shard, []
def paused(task):
    if len(seen) == int(at):
        open(go + ".waiting", "w").close()
        while not os.path.exists(go):
            time.sleep(0.02)
    seen.append(task.name)
    return real(task)
w.open_shard = paused
from wds_tools.convert import convert
convert(manifest, version="v1", size=size, out=out, shard_size=8, workers=1, progress=False)
print("holder done")
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _holder(manifest, out, tmp_path, at=2, size="32"):
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(manifest), str(out), str(at), str(go), size],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.time() + 60
    while not Path(str(go) + ".waiting").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    return proc, go


def _run(manifest, out, **kw):
    kw.setdefault("shard_size", 8)
    return convert(manifest, version="v1", size=32, out=out, workers=1, progress=False, **kw)


@pytest.fixture
def manifest(tmp_path):
    root = tmp_path / "c"
    return write_manifest(root / "m.csv", make_images(root, 40))


def test_a_second_conversion_is_refused_at_once_naming_the_holder(manifest, tmp_path):
    ref = _run(manifest, tmp_path / "ref")
    out = tmp_path / "out"
    proc, go = _holder(manifest, out, tmp_path)
    dest = out / "v1/32"
    try:
        before = {p.name: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        held = json.loads((dest / LOCK_FILE).read_text())
        assert held["pid"] == proc.pid and held["host"] == socket.gethostname()
        args = [
            "convert",
            "--source",
            str(manifest),
            "--version",
            "v1",
            "--size",
            "32",
            "--out",
            str(out),
            "--workers",
            "1",
            "--quiet",
        ]
        for extra in ([], ["--shard-size", "8"], ["--shard-size", "5"], ["--resize", "squash"]):
            t = time.perf_counter()
            res = CliRunner().invoke(cli, args + extra)
            assert time.perf_counter() - t < 5  # refused at once, not after waiting
            assert res.exit_code == 1 and "Traceback" not in res.output
            assert (
                f"is being written by another conversion: pid {proc.pid} on host {socket.gethostname()}" in res.output
            )
            assert f"since {held['since']} UTC" in res.output and "version=" not in res.output
            assert held["command"] in res.output and "Nothing was changed" in res.output
        assert {p.name: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
    finally:
        go.touch()
        out_, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert _files(dest) == _files(Path(ref.out_dir))
    assert not (dest / LOCK_FILE).exists() and verify(dest).ok


def test_multi_size_run_locks_every_size_and_a_refusal_takes_nothing(manifest, tmp_path):
    out = tmp_path / "out"
    proc, go = _holder(manifest, out, tmp_path, size="48")
    try:
        with pytest.raises(OutputBusyError, match=f"v1/48 is being written.*pid {proc.pid}"):
            convert(manifest, version="v1", size="32,48", out=out, shard_size=8, workers=1, progress=False)
        assert not (out / "v1/32").exists()  # the folder it made for its lock is gone again
        with pytest.raises(OutputBusyError, match=f"pid {proc.pid}"):
            convert(manifest, version="v1", size="48,64", out=out, shard_size=8, workers=1, progress=False)
        assert not (out / "v1/64").exists()
    finally:
        go.touch()
        proc.communicate(timeout=120)
    assert proc.returncode == 0
    locks = lock_folders([Store(str(out / "v1/32")), Store(str(out / "v1/48"))])
    try:  # while a multi-size run holds both, a run at either size alone is refused
        for size in (32, 48):
            with pytest.raises(OutputBusyError, match=f"v1/{size} is being written.*from another thread"):
                convert(manifest, version="v1", size=size, out=out, shard_size=8, workers=1, progress=False)
    finally:
        release_all(locks)
    res = convert(manifest, version="v1", size="32,48", out=out, shard_size=8, workers=1, progress=False)
    assert res.results[0].already_complete and res.results[1].samples_written == 40


def test_a_killed_holder_leaves_a_lock_the_next_run_takes_over(manifest, tmp_path):
    ref = _run(manifest, tmp_path / "ref")
    out = tmp_path / "out"
    proc, go = _holder(manifest, out, tmp_path)
    dest = out / "v1/32"
    proc.kill()
    proc.communicate(timeout=60)
    assert json.loads((dest / LOCK_FILE).read_text())["pid"] == proc.pid  # its file stays; its lock does not
    res = _run(manifest, out)
    assert res.shards_resumed == 2 and any(f"pid {proc.pid}" in n and "interrupted" in n for n in res.notes)
    assert f"note: resumed the conversion of pid {proc.pid}" in res.to_text()
    assert _files(dest) == _files(Path(ref.out_dir)) and not list(dest.glob(".*"))


def _contend(path, barrier, results):
    barrier.wait()
    try:
        got = lock_folder(Store(path))
    except OutputBusyError:
        results.put(False)
        return
    results.put(True)
    time.sleep(1.0)  # hold it until everyone has tried
    got.release()


def test_of_many_simultaneous_takers_exactly_one_wins(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    for trial in range(3):
        path = str(tmp_path / f"t{trial}" / "v1" / "32")
        barrier, results = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_contend, args=(path, barrier, results)) for _ in range(6)]
        for p in procs:
            p.start()
        outcome = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(60)
        assert outcome == [False] * 5 + [True]


def test_another_thread_of_this_process_is_refused(tmp_path):
    store = Store(str(tmp_path / "v1/32"))
    held = lock_folder(store)
    errors = []

    def second():
        try:
            lock_folder(store)
        except OutputBusyError as e:
            errors.append(str(e))

    t = threading.Thread(target=second)
    t.start()
    t.join()
    assert errors and "from another thread" in errors[0] and f"pid {os.getpid()}" in errors[0]
    held.release()
    assert not (tmp_path / "v1").exists()  # made for the lock, empty: removed
    lock_folder(store).release()


def test_a_lock_released_while_a_taker_waits_on_its_file_is_not_taken_twice(tmp_path, monkeypatch):
    """A taker that opened the file a finishing holder then unlinks must not win on that unlinked file
    (the holder unlinks while it still holds the lock; a third run may already have made a new file)."""
    root = str(tmp_path / "v1/32")
    os.makedirs(root)
    path = os.path.join(root, LOCK_FILE)
    Path(path).write_bytes(b"")
    stale_fd = os.open(path, os.O_RDWR)  # what the taker holds when the holder releases
    os.unlink(path)  # the holder's release
    real_open, handed = os.open, []

    def open_stale_first(p, *a, **kw):
        if p == path and not handed:
            handed.append(p)
            return stale_fd
        return real_open(p, *a, **kw)

    monkeypatch.setattr(lock_mod.os, "open", open_stale_first)
    got = lock_mod._lock_local(root, Holder.me())
    monkeypatch.undo()
    assert handed
    assert os.stat(path).st_ino == os.fstat(got.fd).st_ino  # the file at the path, not the unlinked one
    os.close(got.fd)


def _no_posix_locks(fd):
    raise OSError(errno.ENOLCK, "No locks available")


def test_without_posix_locks_a_marker_is_used(manifest, tmp_path, monkeypatch):
    monkeypatch.setattr(lock_mod, "_lockf", _no_posix_locks)
    dest = tmp_path / "out/v1/32"
    dest.mkdir(parents=True)
    other = Holder("elsewhere", 4242, "2026-01-02T03:04:05Z", "wds-tools convert --version v1")
    (dest / LOCK_FILE).write_bytes(other.to_bytes())
    with pytest.raises(OutputBusyError, match=r"pid 4242 on host elsewhere.*delete the marker .*\.wds-tools-lock"):
        _run(manifest, tmp_path / "out")
    # a marker of this host whose process is gone is taken over
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (dest / LOCK_FILE).write_bytes(Holder(socket.gethostname(), dead.pid, "2026-01-02T03:04:05Z", "x").to_bytes())
    res = _run(manifest, tmp_path / "out")
    assert res.samples_written == 40 and not (dest / LOCK_FILE).exists()
    # while held, the marker refuses another process
    store = Store(str(tmp_path / "out/v1/64"))
    held = lock_folder(store)
    assert held.fd is None and (tmp_path / "out/v1/64" / LOCK_FILE).exists()
    code = (
        "import sys; from wds_tools.convert.lock import lock_folder; from wds_tools.storage.objects import Store\n"
        "from wds_tools.errors import OutputBusyError\nimport errno, wds_tools.convert.lock as m\n"
        "def no(fd): raise OSError(errno.ENOLCK, 'No locks available')\nm._lockf = no\n"
        "try:\n lock_folder(Store(sys.argv[1]))\nexcept OutputBusyError as e:\n print(e); sys.exit(3)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, store.root],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 3 and f"pid {os.getpid()}" in r.stdout
    held.release()
    assert not (tmp_path / "out/v1/64").exists()


def test_object_storage_uses_a_conditional_create_marker(bucket, manifest, tmp_path):
    fs, url = bucket
    marker = f"{url}/shards/v1/32/{LOCK_FILE}"
    fs.pipe_file(marker, Holder("elsewhere", 99, "2026-01-02T03:04:05Z", "wds-tools convert").to_bytes())
    with pytest.raises(OutputBusyError, match="pid 99 on host elsewhere.*delete the marker s3://"):
        _run(manifest, f"{url}/shards")
    fs.rm_file(marker)
    store = Store(f"{url}/shards/v1/32")
    held = lock_folder(store)
    with pytest.raises(FileExistsError):  # S3 If-None-Match: the create that a second taker makes fails
        fs.pipe_file(marker, b"x", mode="create")
    held.release()
    assert not fs.exists(marker)
    res = _run(manifest, f"{url}/shards")
    assert res.samples_written == 40 and not fs.exists(marker)
