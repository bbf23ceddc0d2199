"""Executors: the local pool and Ray give the same bytes as the in-process path."""

import pytest

from wds_tools.convert import convert
from wds_tools.errors import ExtraNotInstalledError, OptionError
from wds_tools.convert.runner import Runner


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _square(x):
    return x * x


def test_local_runner_in_process_and_pool_agree():
    for workers in (1, 2):
        runner = Runner(workers)
        got = {}
        try:
            runner.map(_square, [(i,) for i in range(7)], lambda n: None, got.__setitem__)
        finally:
            runner.close()
        assert got == {i: i * i for i in range(7)}


def test_unknown_executor_is_refused(corpus, tmp_path):
    with pytest.raises(OptionError, match="--executor 'spark'"):
        convert(corpus, version="v1", size=32, out=tmp_path, executor="spark")


def test_ray_executor_is_byte_identical_to_local(corpus, tmp_path):
    common = dict(version="v1", size=32, shard_size=8, progress=False)
    local = convert(corpus, out=tmp_path / "local", workers=1, **common)
    ray_res = convert(corpus, out=tmp_path / "ray", executor="ray", workers=2, **common)
    assert ray_res.samples_written == local.samples_written == 40
    assert _files(tmp_path / "ray/v1/32") == _files(tmp_path / "local/v1/32")


def test_ray_executor_without_ray_names_the_extra(corpus, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    with pytest.raises(ExtraNotInstalledError, match=r"pip install 'wds-tools\[ray\]'"):
        convert(corpus, version="v1", size=32, out=tmp_path, executor="ray", progress=False)
    assert not (tmp_path / "v1").exists()  # nothing written
