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


def _pid_after(seconds):
    import os
    import time

    time.sleep(seconds)
    return os.getpid()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_ordered_yields_in_order_and_bounds_what_is_started(workers):
    """Results come in argument order whatever finishes first, and at most `window` calls are
    started and not yet yielded (decoded pixels cannot pile up)."""
    import os

    pulled, window = [], 4 * workers + 2  # the default window
    delays = [0.05 if i % 3 == 0 else 0.0 for i in range(20)]  # early calls finish late

    def args():
        for i, d in enumerate(delays):
            pulled.append(i)
            yield (d,)

    runner = Runner(workers)
    try:
        got = []
        for i, pid in enumerate(runner.ordered(_pid_after, args(), lambda n: None)):
            assert len(pulled) - i <= window  # started (pulled) but not yet yielded
            got.append(pid)
    finally:
        runner.close()
    assert len(got) == 20
    if workers == 1:
        assert set(got) == {os.getpid()}
    else:  # the calling process works too, beside workers - 1 pool processes
        assert os.getpid() in got and len(set(got)) == workers


def test_fork_only_without_threads():
    import sys
    import threading

    from wds_tools.convert.runner import _start_method

    if sys.platform == "linux" and threading.active_count() == 1:
        assert _start_method() == "fork"
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert _start_method() == "spawn"  # a thread could hold a lock a forked child would inherit
    finally:
        stop.set()
        t.join()


def test_ray_executor_multi_size_is_byte_identical_to_local(corpus, tmp_path):
    common = dict(version="v1", shard_size=8, progress=False)
    convert(corpus, out=tmp_path / "ray", executor="ray", workers=2, size="32,48", **common)
    for size in (32, 48):
        convert(corpus, out=tmp_path / "local", workers=1, size=size, **common)
        assert _files(tmp_path / f"ray/v1/{size}") == _files(tmp_path / f"local/v1/{size}")
