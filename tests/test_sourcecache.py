"""(manifest hash, fingerprint) pairs kept outside the format for the next version."""

from wds_tools.convert.sourcecache import cache_file, load_pairs, save_pairs


def test_pairs_round_trip_and_merge(tmp_path):
    a = {"sha256:" + "a" * 64: bytes(range(16)), "md5:" + "b" * 32: bytes(16)}
    save_pairs(tmp_path, "v1", a)
    assert load_pairs(tmp_path, "v1") == a
    more = {"sha256:" + "c" * 64: bytes(range(1, 17))}
    save_pairs(tmp_path, "v1", more)  # another size of the same version adds its pairs
    assert load_pairs(tmp_path, "v1") == {**a, **more}
    assert load_pairs(tmp_path, "v2") == {}
    assert cache_file(tmp_path, "v1").parent.parent.name == ".wds-tools-cache"


def test_a_damaged_cache_is_no_cache(tmp_path):
    path = cache_file(tmp_path, "v1")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a zip")
    assert load_pairs(tmp_path, "v1") == {}
