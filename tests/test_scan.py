"""The scan's worker side: header checks, and deciding "unchanged" with as few reads as possible."""

import hashlib
import os

import pytest
import xxhash
from conftest import make_images

from wds_tools.convert.decode import DecodeSettings
from wds_tools.convert.scan import Check, check_sources, scan_files

S = DecodeSettings()


def test_scan_files_reports_size_mtime_and_reasons(tmp_path):
    rows = make_images(tmp_path, 1)
    good = tmp_path / rows[0]["path"]
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "text.jpg").write_text("no image")
    st = good.stat()
    assert scan_files([str(good)], S) == [(None, st.st_size, st.st_mtime_ns)]
    got = scan_files([str(tmp_path / "gone.jpg"), str(tmp_path / "empty.jpg"), str(tmp_path / "text.jpg")], S)
    assert [g[0] for g in got[:2]] == ["missing file", "empty file"] and "not an image" in got[2][0]


def test_check_sources_reads_only_when_the_stat_differs(tmp_path):
    rows = make_images(tmp_path, 1)
    p = tmp_path / rows[0]["path"]
    st = p.stat()
    data = p.read_bytes()
    fp = xxhash.xxh3_128_digest(data)
    same, touched, unknown = check_sources(
        [
            Check(str(p), trusted=(st.st_size, st.st_mtime_ns)),
            Check(str(p), trusted=(st.st_size, st.st_mtime_ns - 1)),
            Check(str(p)),
        ],
        S,
    )
    assert same == (None, None, st.st_size, st.st_mtime_ns, False)  # not read: the caller takes the base's
    assert touched == unknown == (None, fp, st.st_size, st.st_mtime_ns, True)
    # a trusted manifest hash needs only the stat, even with a new mtime
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 5))
    (by_hash,) = check_sources([Check(str(p), stat_only=True, content_hash="sha256:" + "0" * 64)], S)
    assert by_hash == (None, None, st.st_size, st.st_mtime_ns + 5, False)
    missing = check_sources([Check(str(tmp_path / "gone.jpg"), stat_only=True)], S)
    assert missing == [("missing file", None, 0, 0, False)]


def test_check_sources_verifies_a_manifest_hash_when_it_reads(tmp_path):
    rows = make_images(tmp_path, 1)
    p = tmp_path / rows[0]["path"]
    data = p.read_bytes()
    right = "sha256:" + hashlib.sha256(data).hexdigest()
    wrong = "md5:" + "0" * 32
    ok, bad = check_sources([Check(str(p), content_hash=right), Check(str(p), content_hash=wrong)], S)
    assert ok[1] == xxhash.xxh3_128_digest(data) and ok[4]
    # read, no fingerprint and no error: the caller decodes it, and the decode reports the mismatch
    assert bad[0] is None and bad[1] is None and bad[4]


def _special_files(root):
    """A FIFO, a folder named like an image, a Unix socket, and a character device (/dev/zero)."""
    import socket

    os.mkfifo(root / "pipe.jpg")
    (root / "folder.jpg").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock.jpg"))
    return sock, {"pipe": "pipe.jpg", "folder": "folder.jpg", "sock": "sock.jpg", "zero": "/dev/zero"}


def test_paths_that_are_not_regular_files_are_skipped_never_read(tmp_path):
    import signal

    from wds_tools.convert.scan import open_source

    sock, paths = _special_files(tmp_path)
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("blocked")))
    signal.alarm(10)  # opening a FIFO for reading blocks until a writer comes: fail, do not hang
    try:
        full = [p if os.path.isabs(p) else str(tmp_path / p) for p in paths.values()]
        got = [g[0] for g in scan_files(full, S)]
        checked = [c[0] for c in check_sources([Check(p) for p in full], S)]
        by_hash = [c[0] for c in check_sources([Check(p, stat_only=True) for p in full], S)]
        for path in full:
            with pytest.raises(OSError):
                open_source(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        sock.close()
    want = [
        "is a FIFO (named pipe), not a regular file: skipped, never read",
        "is a directory, not a regular file: skipped, never read",
        "is a socket, not a regular file: skipped, never read",
        "is a character device, not a regular file: skipped, never read",
    ]
    assert got == checked == by_hash == want


def test_a_conversion_lists_special_files_and_goes_on(tmp_path):
    import json
    import signal

    from conftest import write_manifest

    from wds_tools.convert import convert

    rows = make_images(tmp_path, 12)
    sock, paths = _special_files(tmp_path)
    rows += [{"key": k, "path": p, "label": "a"} for k, p in paths.items()]
    manifest = write_manifest(tmp_path / "m.csv", rows)
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("blocked")))
    signal.alarm(60)
    try:
        res = convert(manifest, version="v1", size=32, out=tmp_path / "out", workers=2, max_errors="4", progress=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        sock.close()
    assert res.samples_written == 12 and res.failed == 4
    errors = {e["key"]: e["error"] for e in map(json.loads, open(res.errors_file))}
    assert set(errors) == set(paths) and all("not a regular file" in v for v in errors.values())
