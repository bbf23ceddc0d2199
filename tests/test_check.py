"""The scan's worker side: header checks, and deciding "unchanged" with as few reads as possible."""

import hashlib
import os

import xxhash

from conftest import make_images
from wds_tools.convert.check import Check, check_sources, scan_files
from wds_tools.convert.decode import DecodeSettings

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
    same, touched, unknown = check_sources([
        Check(str(p), trusted=(st.st_size, st.st_mtime_ns)),
        Check(str(p), trusted=(st.st_size, st.st_mtime_ns - 1)),
        Check(str(p)),
    ], S)
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
