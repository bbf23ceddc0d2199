"""Disk full (convert/space.py): one line naming the folder and the space needed, no partial file
left, and a rerun after space is freed resumes to the same bytes."""

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from wds_tools.convert import convert
from wds_tools.convert.plan import sample_bytes
from wds_tools.convert.space import human_bytes
from wds_tools.errors import DiskFullError
from wds_tools.format.tarwrite import ShardWriter
from wds_tools.inspect.verify import verify


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _run(corpus, out, **kw):
    return convert(corpus, version="v1", size=32, out=out, shard_size=4, workers=1, progress=False, **kw)


def test_sample_bytes_is_what_a_shard_holds(corpus, tmp_path):
    res = _run(corpus, tmp_path / "out")
    dest = Path(res.out_dir)
    total = sum(p.stat().st_size for p in dest.glob("*.tar"))
    padding = 10240 * res.shards  # each tar ends in two zero blocks, padded to a 10 KiB record
    assert res.samples_written * sample_bytes(32) <= total <= res.samples_written * sample_bytes(32) + padding
    assert human_bytes(1_234_567) == "1.2 MB" and human_bytes(512) == "512 B"


def _no_partials(folder: Path) -> None:
    left = [p.name for p in folder.rglob("*") if ".partial-" in p.name or ".tmp-" in p.name]
    assert not left, left


def test_disk_full_is_one_line_and_a_rerun_resumes(corpus, tmp_path, monkeypatch):
    """ENOSPC injected into the shard writer on the third shard (any user can run this one)."""
    opened = []
    real_init, real_write = ShardWriter.__init__, ShardWriter._write

    def init(self, path, **kw):
        opened.append(path)
        real_init(self, path, **kw)

    def write(self, data):
        if len(opened) >= 3 and self.offset > 2000:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, data)

    monkeypatch.setattr(ShardWriter, "__init__", init)
    monkeypatch.setattr(ShardWriter, "_write", write)
    dest = tmp_path / "out/v1/32"
    with pytest.raises(DiskFullError) as e:
        _run(corpus, tmp_path / "out")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"No space left on device writing {dest}: the conversion needs about ")
    assert "more, estimated from its plan; " in msg and " free." in msg and "run the same command again" in msg
    _no_partials(dest)
    assert len(list(dest.glob("*.tar"))) == 2 and not (dest / "index.json").exists()
    monkeypatch.undo()
    res = _run(corpus, tmp_path / "out")
    assert res.shards_resumed == 2
    assert _files(dest) == _files(Path(_run(corpus, tmp_path / "ref").out_dir))


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 160 KiB tmpfs (root only): mount(8) needs CAP_SYS_ADMIN."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_real_full_disk(corpus, tmp_path, small_tmpfs):
    dest = small_tmpfs / "v1/32"
    with pytest.raises(DiskFullError) as e:
        _run(corpus, small_tmpfs)
    msg = str(e.value)
    assert "\n" not in msg and f"writing {dest}: the conversion needs about" in msg, msg
    assert "KB free" in msg or " B free" in msg
    _no_partials(small_tmpfs)
    kept = {p.name for p in dest.glob("*.tar")}
    assert kept and not (dest / "index.json").exists()
    # another run on the still-full disk fails the same way and loses nothing
    with pytest.raises(DiskFullError):
        _run(corpus, small_tmpfs)
    assert kept <= {p.name for p in dest.glob("*.tar")}
    _no_partials(small_tmpfs)
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_tmpfs)], check=True)
    res = _run(corpus, small_tmpfs)
    assert res.shards_resumed >= len(kept) and verify(dest).ok
    assert _files(dest) == _files(Path(_run(corpus, tmp_path / "ref").out_dir))


@pytest.fixture(scope="module")
def pool_case(tmp_path_factory):
    """20 JPEGs at two sizes, 4 samples a shard (4 or more train shards: the failures meet train-000002 on
    its way), and the one-process conversion's files of each size."""
    from conftest import make_images, write_manifest

    root = tmp_path_factory.mktemp("pool")
    manifest = write_manifest(root / "c" / "manifest.csv", make_images(root / "c", 20))
    ref = convert(manifest, out=root / "ref", workers=1, version="v1", size="48,32", shard_size=4, progress=False)
    assert all(len(list(Path(r.out_dir).glob("train-*.tar"))) >= 4 for r in ref.results)
    return manifest, [_files(Path(r.out_dir)) for r in ref.results]


@pytest.mark.parametrize("where", ["tar end", "worker write", "seal", "next shard's files"])
def test_disk_full_in_the_pool_leaves_no_partial_file_and_resumes(pool_case, tmp_path, where):
    """A full disk wherever the pool's writing meets it (the converter ending a shard, a worker writing a
    batch, a worker sealing a shard, the next shard's files), with two sizes (spill files too): one
    line, no partial file left anywhere, and a rerun resumes to the one-process bytes. Each run is a
    fresh process whose pool forks (tests/pooled.py), so the workers carry the failure."""
    import pooled

    manifest, want = pool_case
    spec = dict(manifest=str(manifest), out=str(tmp_path / "out"), version="v1", size="48,32", workers=2)
    spec["options"] = dict(shard_size=4)
    got = pooled.run({**spec, "fail": where})
    assert got["method"] == "fork" and got["error"] == "DiskFullError", got
    assert got["message"].startswith("No space left on device writing") and "\n" not in got["message"]
    _no_partials(tmp_path / "out")
    res = pooled.run(spec)["results"]
    assert [_files(Path(r["out_dir"])) for r in res] == want
    _no_partials(tmp_path / "out")
