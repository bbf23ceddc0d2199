"""Issue 22 point 10: every convert-side command on a read-only folder gives one line (no traceback),
and a complete folder "converts" (nothing to do) and re-indexes without writing a byte.

A real read-only mount (a tmpfs remounted ``ro``) where the tests run as root; otherwise skipped
with the reason (chmod does not stop root, and a monkeypatched errno would not test the mount).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_images, write_manifest

ROOT = Path(__file__).resolve().parents[1]


def _mount(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture
def mount(tmp_path):
    """A fresh tmpfs at tmp_path/mnt; call ro() to remount it read-only. Unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a read-only mount needs root (tmpfs + remount,ro)")
    point = tmp_path / "mnt"
    point.mkdir()
    r = _mount(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(point)])
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")

    class Mount:
        path = point

        def ro(self) -> None:
            r = _mount(["mount", "-o", "remount,ro", str(point)])
            assert r.returncode == 0, r.stderr

    yield Mount()
    _mount(["umount", "-l", str(point)])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wds_tools", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def _tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def manifest(tmp_path):
    root = tmp_path / "c"
    return write_manifest(root / "m.csv", make_images(root, 12))


def _convert(manifest: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return _cli(
        "convert",
        "--source",
        str(manifest),
        "--version",
        "v1",
        "--size",
        "16",
        "--out",
        str(out),
        "--shard-size",
        "5",
        "--workers",
        "1",
        "--quiet",
        *extra,
    )


def test_out_on_a_read_only_mount_is_one_line(mount, manifest):
    mount.ro()
    r = _convert(manifest, mount.path / "shards")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert (
        f"{mount.path / 'shards' / 'v1' / '16'}: cannot write the conversion there: Read-only file system" in lines[0]
        and "--out" in lines[0]
    )


def test_a_complete_folder_on_a_read_only_mount_is_nothing_to_do(mount, manifest):
    out = mount.path / "shards"
    first = _convert(manifest, out)
    assert first.returncode == 0, first.stderr
    before = _tree(out)
    mount.ro()
    again = _convert(manifest, out)
    assert again.returncode == 0, again.stderr
    assert "is already converted with these options; nothing to do." in again.stdout
    assert "read-only: read, nothing written" in again.stdout
    assert _tree(out) == before
    # other options on the same read-only folder: refused as ever, in one line
    other = _convert(manifest, out, "--resize", "squash")
    assert other.returncode == 1 and "already holds a conversion made with other options" in other.stderr
    assert "Traceback" not in other.stderr
    # the index command: the reader files are all there, so nothing to write
    idx = _cli("index", str(out / "v1" / "16"))
    assert idx.returncode == 0, idx.stderr
    assert "are up to date; nothing written" in idx.stdout
    assert _tree(out) == before


def test_index_on_a_read_only_folder_missing_a_sidecar_is_one_line(mount, manifest):
    out = mount.path / "shards"
    assert _convert(manifest, out).returncode == 0
    folder = out / "v1" / "16"
    victim = sorted(folder.glob("*.wids.json"))[0]
    victim.unlink()
    mount.ro()
    r = _cli("index", str(folder))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{folder}: cannot write the reader index files ({victim.name} is missing" in lines[0], (
        r.stderr
    )
    assert "Read-only file system" in lines[0]
