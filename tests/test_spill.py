"""Several sizes in one run (pipeline + spill): one read and decode per source, and every folder
byte-identical to a run at that size alone."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_images, write_manifest
from PIL import Image

from wds_tools.convert import ConvertResults, convert
from wds_tools.synth import jpeg_bytes, photo_like

ROOT = Path(__file__).resolve().parents[1]
SIZES = (32, 64, 96)  # on 640x480 photos these draft to 1/8, 1/4 and 1/4: shared and separate decodes


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _corpus(root: Path, n: int = 24) -> tuple[Path, list[dict]]:
    """Photos of two aspects and EXIF orientations, a PNG, a truncated JPEG (fails at decode) and a
    missing file (fails at the scan)."""
    rows = make_images(root, n, size=(640, 480))
    for i, r in enumerate(rows[::5]):
        exif = Image.Exif()
        exif[0x0112] = (6, 3, 8)[i % 3]
        (root / r["path"]).write_bytes(jpeg_bytes(photo_like(480, 640, seed=500 + i), exif=exif.tobytes()))
    photo_like(300, 200, seed=7).save(root / "img/p.png")
    good = (root / rows[1]["path"]).read_bytes()
    (root / "img/trunc.jpg").write_bytes(good[: len(good) // 2])
    rows += [
        {"key": "png", "path": "img/p.png", "label": "a"},
        {"key": "trunc", "path": "img/trunc.jpg", "label": "b"},
        {"key": "gone", "path": "img/gone.jpg", "label": "c"},
    ]
    return write_manifest(root / "m.csv", rows), rows


def _convert(manifest, out, size, **kw):
    kw.setdefault("workers", 1)
    return convert(
        manifest,
        version=kw.pop("version", "v1"),
        size=size,
        out=out,
        shard_size="40KB",
        max_errors="10%",
        val_fraction=0.2,
        progress=False,
        **kw,
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_multi_size_run_equals_separate_runs(tmp_path, workers):
    manifest, _ = _corpus(tmp_path / "c")
    res = _convert(manifest, tmp_path / "multi", ",".join(map(str, SIZES)), workers=workers)
    assert isinstance(res, ConvertResults) and [r.size for r in res.results] == sorted(SIZES, reverse=True)
    first = res.results[0]
    assert first.shared_decode == [64, 32] and first.decoded == 25 and first.failed == 2
    # one read per source for all three sizes; a second decode only where a size drafts to another scale
    assert 25 <= first.decodes <= 2 * 26
    shards = set()
    for size in SIZES:
        alone = _convert(manifest, tmp_path / "alone", size)
        assert _files(tmp_path / f"multi/v1/{size}") == _files(tmp_path / f"alone/v1/{size}"), size
        assert not (tmp_path / f"multi/v1/{size}/.wds-tools-work").exists()
        shards.add(alone.shards)
    assert len(shards) == 3  # each size has its own plan: the spill is really needed


def test_multi_size_incremental_equals_separate_incremental_runs(tmp_path):
    manifest, rows = _corpus(tmp_path / "c")
    _convert(manifest, tmp_path / "multi", "32,64")
    _convert(manifest, tmp_path / "alone", 32)
    _convert(manifest, tmp_path / "alone", 64)
    rows = rows[2:]  # removed
    rows[0]["label"] = "c" if rows[0]["label"] != "c" else "a"  # relabeled
    (tmp_path / "c/img/new.jpg").write_bytes(jpeg_bytes(photo_like(640, 480, seed=999)))
    rows.append({"key": "new", "path": "img/new.jpg", "label": "b"})  # added
    v2 = write_manifest(tmp_path / "c/v2.csv", rows)
    res = _convert(v2, tmp_path / "multi", "32,64", version="v2")
    for r in res.results:
        assert (r.base, r.decoded, r.relabeled, r.removed) == ("v1", 1, 1, 2)
    for size in (32, 64):
        alone = _convert(v2, tmp_path / "alone", size, version="v2")
        assert alone.decoded == 1
        a, b = _files(tmp_path / f"multi/v2/{size}"), _files(tmp_path / f"alone/v2/{size}")
        assert a == b, size


def test_a_size_already_converted_is_kept_and_the_other_made(tmp_path):
    manifest, _ = _corpus(tmp_path / "c")
    _convert(manifest, tmp_path / "multi", 64)
    before = _files(tmp_path / "multi/v1/64")
    res = _convert(manifest, tmp_path / "multi", "32,64")
    assert res.results[0].already_complete and not res.results[1].already_complete
    assert _files(tmp_path / "multi/v1/64") == before
    _convert(manifest, tmp_path / "alone", 32)
    assert _files(tmp_path / "multi/v1/32") == _files(tmp_path / "alone/v1/32")


def test_cli_multi_size_text_and_json(tmp_path):
    from click.testing import CliRunner

    from wds_tools.cli import cli

    manifest, _ = _corpus(tmp_path / "c", 6)
    args = [
        "convert",
        "--source",
        str(manifest),
        "--version",
        "v1",
        "--size",
        "32,64",
        "--out",
        str(tmp_path / "out"),
        "--workers",
        "1",
        "--quiet",
        "--max-errors",
        "2",
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "out/v1/64" in res.output and "out/v1/32" in res.output and "All sizes" in res.output
    again = CliRunner().invoke(cli, args + ["--json"])
    import json

    summary = json.loads(again.stdout)
    assert [r["size"] for r in summary["results"]] == [64, 32]
    assert all(r["already_complete"] for r in summary["results"])
    bad = CliRunner().invoke(cli, args[:6] + ["32,x"] + args[7:])
    assert bad.exit_code != 0 and "--size" in bad.output and "224,384" in bad.output


@pytest.mark.parametrize("phase", ["largest size", "spilled size"])
def test_killed_multi_size_run_resumes_byte_identical(tmp_path, phase):
    """kill -9 while the 64 px shards are written (phase 1, the 32 px pixels going to the spill),
    or while the 32 px shards are written from the spill (phase 2); the same command again ends
    with both folders equal to separate runs."""
    root = tmp_path / "c"
    rows = make_images(root, 150, size=(640, 480))
    manifest = write_manifest(root / "m.csv", rows)

    def command(out, size="32,64"):
        return [
            sys.executable,
            "-m",
            "wds_tools",
            "convert",
            "--source",
            str(manifest),
            "--version",
            "v1",
            "--size",
            size,
            "--out",
            str(out),
            "--shard-size",
            "6",
            "--workers",
            "2",
            "--quiet",
        ]

    # two shards finished: their resume markers (the meta beside run.json, written last) are there
    watch = tmp_path / "out/v1" / ("64" if phase == "largest size" else "32") / ".wds-tools-work"
    proc = subprocess.Popen(command(tmp_path / "out"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while (
        len([p for p in watch.glob("*.json") if p.name != "run.json"]) < 2
        and time.time() < deadline
        and proc.poll() is None
    ):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (tmp_path / "out/v1/32/index.json").exists(), "the run finished before it could be killed"
    if phase == "largest size":
        assert not (tmp_path / "out/v1/64/index.json").exists()
        assert list((tmp_path / "out/v1/32/.wds-tools-work/spill").glob("*.npz"))  # spilled so far
    done = subprocess.run(command(tmp_path / "out") + ["--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import json

    big, small = json.loads(done.stdout)["results"]
    assert small["decodes"] == 0  # every 32 px sample from the spill, of this run or the killed one
    if phase == "spilled size":
        assert big["already_complete"]
    else:
        assert big["shards_resumed"] >= 2 and big["decodes"] < 2 * 150
    for size in ("32", "64"):
        ref = subprocess.run(command(tmp_path / "ref", size), cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert ref.returncode == 0, ref.stderr
        assert _files(tmp_path / f"out/v1/{size}") == _files(tmp_path / f"ref/v1/{size}"), size
        assert not list((tmp_path / f"out/v1/{size}").glob(".*"))
