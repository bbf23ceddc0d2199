import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from conftest import make_images, write_manifest

from wds_tools.cli import cli


@pytest.fixture
def runner():
    return CliRunner()


def test_every_command_has_help(runner):
    res = runner.invoke(cli, ["--help"])
    assert res.exit_code == 0 and "convert" in res.output
    for name, cmd in cli.commands.items():
        assert cmd.help and len(cmd.help) > 40, name
        out = runner.invoke(cli, [name, "--help"])
        assert out.exit_code == 0 and "Example" in out.output, name
        for param in cmd.params:
            if isinstance(param, click.Option):  # arguments are described in the docstring
                assert param.help, f"{name} --{param.name} has no help"
            else:
                assert param.name.upper() in cmd.help, f"{name} does not describe {param.name.upper()}"


def test_convert_json_summary(runner, corpus, tmp_path):
    res = runner.invoke(
        cli,
        [
            "convert",
            "--source",
            str(corpus),
            "--version",
            "v1",
            "--size",
            "32",
            "--out",
            str(tmp_path / "out"),
            "--workers",
            "1",
            "--shard-size",
            "10",
            "--json",
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    for field in ("samples_written", "failed", "shards", "seconds", "images_per_second"):
        assert field in summary
    assert summary["samples_written"] == 40 and summary["failed"] == 0 and summary["shards"] >= 4
    assert summary["images_per_second"] > 0


def test_convert_text_summary_and_rerun(runner, corpus, tmp_path):
    args = [
        "convert",
        "--source",
        str(corpus),
        "--version",
        "v1",
        "--size",
        "32",
        "--out",
        str(tmp_path / "out"),
        "--workers",
        "1",
        "--quiet",
    ]
    res = runner.invoke(cli, args)
    assert res.exit_code == 0 and "Converted 40 images" in res.output and "train" in res.output
    again = runner.invoke(cli, args)
    assert again.exit_code == 0 and "already converted" in again.output


def test_config_file_supplies_source_and_out(runner, tmp_path, monkeypatch):
    root = tmp_path / "proj"
    manifest = write_manifest(root / "data" / "m.csv", make_images(root / "data", 6))
    (root / "wds-tools.toml").write_text(
        f'source = "data/{manifest.name}"\nout = "myshards"\n[convert]\nworkers = 1\nshard-size = 3\n'
    )
    monkeypatch.chdir(root)
    res = runner.invoke(cli, ["convert", "--version", "v1", "--size", "32", "--quiet"])
    assert res.exit_code == 0, res.output
    assert (root / "myshards/v1/32/index.json").exists()
    assert len(list((root / "myshards/v1/32").glob("*.tar"))) >= 2


def test_bad_config_key_is_named(runner, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('sorce = "x"\n')
    res = runner.invoke(cli, ["--config", str(cfg), "convert", "--version", "v1", "--size", "32", "--source", "x"])
    assert res.exit_code == 2 and "unknown key 'sorce'" in res.output
    # help is the same whatever the config: it is not refused with it
    assert runner.invoke(cli, ["--config", str(cfg), "convert", "--help"]).exit_code == 0
    cfg.write_text("[verify]\nquik = true\n")  # a key naming no option of its command
    res = runner.invoke(cli, ["--config", str(cfg), "verify", str(tmp_path)])
    assert res.exit_code == 2 and "[verify] unknown key 'quik'" in res.output and "quick" in res.output


def test_user_errors_are_messages_not_tracebacks(runner, tmp_path):
    res = runner.invoke(
        cli,
        ["convert", "--source", str(tmp_path / "none.csv"), "--version", "v1", "--size", "32", "--out", str(tmp_path)],
    )
    assert res.exit_code == 2 and "does not exist" in res.output and "Traceback" not in res.output
    res = runner.invoke(
        cli, ["convert", "--source", str(tmp_path), "--version", "v1", "--size", "32", "--max-errors", "lots"]
    )
    assert res.exit_code == 2 and "--max-errors 'lots'" in res.output  # an option value: usage


def test_max_errors_exceeded_exits_non_zero(runner, tmp_path):
    root = tmp_path / "c"
    rows = make_images(root, 20)
    (root / "img/s0003.jpg").write_bytes(b"GIF89a broken")
    manifest = write_manifest(root / "m.csv", rows)

    def args(out, max_errors):
        return [
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
            "--max-errors",
            max_errors,
        ]

    res = runner.invoke(cli, args(tmp_path / "out", "0"))
    assert res.exit_code == 3 and "more than --max-errors allows (0)" in res.output  # ExitCode.DATA
    res = runner.invoke(cli, args(tmp_path / "out2", "1"))
    assert res.exit_code == 0 and "failed: 1" in res.output


def test_python_dash_m_entry_point():
    res = subprocess.run([sys.executable, "-m", "wds_tools", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and "wds-tools" in res.stdout


def test_checksum_reads_every_source(runner, tmp_path):
    root = tmp_path / "c"
    manifest = write_manifest(root / "m.csv", make_images(root, 6))

    def args(version, *extra):
        return [
            "convert",
            "--source",
            str(manifest),
            "--version",
            version,
            "--size",
            "32",
            "--out",
            str(tmp_path / "out"),
            "--workers",
            "1",
            "--quiet",
            "--json",
            *extra,
        ]

    assert runner.invoke(cli, args("v1")).exit_code == 0
    quick = json.loads(runner.invoke(cli, args("v2")).stdout)
    assert (quick["unchanged_by_stat"], quick["sources_read"], quick["checksum"]) == (6, 0, False)
    careful = json.loads(runner.invoke(cli, args("v3", "--checksum")).stdout)
    assert (careful["unchanged_by_stat"], careful["sources_read"], careful["checksum"]) == (0, 6, True)
