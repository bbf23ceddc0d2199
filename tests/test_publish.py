"""The end of a conversion (convert/publish.py): the --max-errors gate at every stage, and the order
and completion of the final steps (index, then clean-up, finished by any later run)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_images, write_manifest

from wds_tools.cli import cli
from wds_tools.convert import WORK_DIR, convert
from wds_tools.errors import OutputExistsError, TooManyErrorsError
from wds_tools.format.index import load_index
from wds_tools.inspect.verify import verify

ROOT = Path(__file__).resolve().parents[1]
BAD = (5, 14, 23, 31)  # rows whose JPEG is cut short: the header scan passes, decoding fails


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _stamps(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def damaged(tmp_path):
    """40 JPEGs, 4 of them truncated (a decode-stage failure each); returns (manifest, good bytes)."""
    root = tmp_path / "c"
    rows = make_images(root, 40)
    good = {}
    for i in BAD:
        p = root / rows[i]["path"]
        good[p] = p.read_bytes()
        p.write_bytes(good[p][: len(good[p]) // 2])
    return write_manifest(root / "m.csv", rows), good


def _run(manifest, out, **kw):
    return convert(manifest, version="v1", size=32, out=out, shard_size=4, workers=1, progress=False, **kw)


def test_decode_stage_failures_past_the_limit_stop_without_an_index(damaged, tmp_path):
    manifest, _ = damaged
    dest = tmp_path / "out/v1/32"
    with pytest.raises(
        TooManyErrorsError,
        match=r"3 of 40 source files failed \(0 unreadable at the scan, 3 at "
        r"decoding so far\), more than --max-errors allows \(2\)\. Stopped "
        r"with \d+ of \d+ shards .* and no index.json",
    ):
        _run(manifest, tmp_path / "out", max_errors="2")
    assert not (dest / "index.json").exists() and (dest / WORK_DIR / "run.json").exists()
    errors = [json.loads(line) for line in open(dest / "errors.jsonl")]
    assert len(errors) == 3 and {e["stage"] for e in errors} == {"decode"}
    kept, listed = _stamps(dest), (dest / "errors.jsonl").read_bytes()
    assert [n for n in kept if n.endswith(".tar")]  # the shards written so far stay
    # the same command stops again, at once: no shard is decoded or rewritten
    with pytest.raises(TooManyErrorsError, match=r"more than --max-errors allows \(2\)"):
        _run(manifest, tmp_path / "out", max_errors="2")
    assert {n: t for n, t in _stamps(dest).items() if n != "errors.jsonl"} == {
        n: t for n, t in kept.items() if n != "errors.jsonl"
    }
    assert (dest / "errors.jsonl").read_bytes() == listed and not (dest / "index.json").exists()
    # a raised limit finishes: the shards kept are not made again, only the rest is written
    res = _run(manifest, tmp_path / "out", max_errors="4")
    tars = [n for n in kept if n.endswith(".tar")]
    assert res.failed == 4 and res.samples_written == 36 and res.shards_resumed == len(tars)
    assert res.decoded == 36 - res.samples_resumed and all(_stamps(dest)[n] == kept[n] for n in tars)
    ref = _run(manifest, tmp_path / "ref", max_errors="4")
    assert _files(dest) == _files(Path(ref.out_dir)) and verify(dest).ok


def test_repaired_files_make_their_shards_again(damaged, tmp_path):
    manifest, good = damaged
    with pytest.raises(TooManyErrorsError):
        _run(manifest, tmp_path / "out", max_errors="0")
    for p, data in good.items():  # the user repairs every file errors.jsonl names
        p.write_bytes(data)
    res = _run(manifest, tmp_path / "out", max_errors="0")
    assert res.failed == 0 and res.samples_written == 40
    dest = tmp_path / "out/v1/32"
    assert not (dest / "errors.jsonl").exists()
    ref = _run(manifest, tmp_path / "ref")
    assert _files(dest) == _files(Path(ref.out_dir))


def test_cli_exits_non_zero_until_the_limit_is_raised(damaged, tmp_path):
    manifest, _ = damaged
    args = [
        "convert",
        "--source",
        str(manifest),
        "--version",
        "v1",
        "--size",
        "32",
        "--out",
        str(tmp_path / "out"),
        "--shard-size",
        "4",
        "--workers",
        "2",
        "--quiet",
    ]
    for _ in range(2):
        res = CliRunner().invoke(cli, args + ["--max-errors", "3"])
        assert res.exit_code == 3 and "more than --max-errors allows (3)" in res.output
        assert "already converted" not in res.output and "Traceback" not in res.output
        assert not (tmp_path / "out/v1/32/index.json").exists()
    res = CliRunner().invoke(cli, args + ["--max-errors", "10%"])
    assert res.exit_code == 0 and "failed: 4" in res.output and "kept from an interrupted run" in res.output


def test_scan_stage_failures_keep_the_shards_of_an_interrupted_run(tmp_path, interrupt_writes):
    root = tmp_path / "c"
    rows = make_images(root, 30)
    manifest = write_manifest(root / "m.csv", rows)
    written = interrupt_writes(2)
    with pytest.raises(KeyboardInterrupt):
        _run(manifest, tmp_path / "out")
    written.restore()
    dest = tmp_path / "out/v1/32"
    kept = {n: t for n, t in _stamps(dest).items() if n.endswith(".tar")}
    assert len(kept) == 2
    for r in rows[:5]:  # now unreadable: the scan fails them all
        (root / r["path"]).unlink()
    with pytest.raises(TooManyErrorsError, match="5 of 30 source files are unreadable"):
        _run(manifest, tmp_path / "out")
    assert {n: t for n, t in _stamps(dest).items() if n.endswith(".tar")} == kept
    assert (dest / WORK_DIR / "run.json").exists()  # still resumable: the shards are not orphans
    res = _run(manifest, tmp_path / "out", max_errors="5")
    assert res.samples_written == 25 and verify(dest).ok


_KILLED_AFTER_INDEX = r"""
import os, signal, sys
import wds_tools.convert.publish as finish
def die(*a, **kw):
    os.kill(os.getpid(), signal.SIGKILL)
finish.clean_after_index = die
from wds_tools.cli import main
main()
"""


@pytest.mark.parametrize("then", ["same command", "other options"])
def test_a_run_killed_after_its_index_is_cleaned_by_the_next_run(tmp_path, then):
    root = tmp_path / "c"
    rows = make_images(root, 20)
    for r in rows:
        r["sha256"] = __import__("hashlib").sha256((root / r["path"]).read_bytes()).hexdigest()
    manifest = write_manifest(root / "m.csv", rows, fields=("key", "path", "label", "sha256"))
    args = [
        "convert",
        "--source",
        str(manifest),
        "--version",
        "v1",
        "--size",
        "32",
        "--shard-size",
        "4",
        "--workers",
        "1",
        "--quiet",
    ]
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_INDEX, *args, "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert killed.returncode == -signal.SIGKILL
    dest = tmp_path / "out/v1/32"
    assert (dest / "index.json").exists() and (dest / WORK_DIR).is_dir()  # complete, but not cleaned
    assert verify(dest).ok
    cache = tmp_path / "out/.wds-tools-cache/v1/source-hashes.npz"
    assert not cache.exists()
    if then == "same command":
        res = CliRunner().invoke(cli, args + ["--out", str(tmp_path / "out")])
        assert res.exit_code == 0 and "already converted" in res.output
        assert f"removed what an interrupted run left after writing the index ({WORK_DIR}/" in res.output
        assert cache.exists()  # the step the kill skipped: the manifest-hash pairs are saved
    else:
        with pytest.raises(OutputExistsError):
            convert(manifest, version="v1", size=32, out=tmp_path / "out", shard_size=5, progress=False)
    assert not list(dest.glob(".*"))
    ref = subprocess.run(
        [sys.executable, "-m", "wds_tools", *args, "--out", str(tmp_path / "ref")],
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert ref.returncode == 0
    assert _files(dest) == _files(tmp_path / "ref/v1/32")


def test_leftover_temporary_files_go_when_the_index_is_written(corpus, tmp_path, interrupt_writes):
    written = interrupt_writes(1)
    with pytest.raises(KeyboardInterrupt):
        convert(corpus, version="v1", size=32, out=tmp_path / "out", shard_size=8, workers=1, progress=False)
    written.restore()
    dest = tmp_path / "out/v1/32"
    for name in ("samples.npz.tmp-123", "index.json.tmp-99", ".train-000003.tar.partial-77"):  # a kill -9 mid-write
        (dest / name).write_bytes(b"half")
    res = convert(corpus, version="v1", size=32, out=tmp_path / "out", shard_size=8, workers=1, progress=False)
    assert res.shards_resumed == 1
    assert not list(dest.glob("*.tmp-*")) and not list(dest.glob(".*")) and verify(dest).ok
    assert load_index(dest).samples.keys is not None


def _save(out, i):
    from wds_tools.convert.sourcecache import save_pairs

    for j in range(20):
        save_pairs(out, "v1", {f"sha256:{i:02d}{j:062d}": bytes([i, j]) * 8})


def test_concurrent_saves_of_a_versions_hash_pairs_lose_none(tmp_path):
    import multiprocessing

    from wds_tools.convert.sourcecache import load_pairs

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_save, args=(str(tmp_path), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    assert len(load_pairs(tmp_path, "v1")) == 80
