"""Issue 25, point 4: one CLI vocabulary. Every command has -q/--quiet and --json and help on every
option; --workers is the command's own parallelism;
help does not depend on the folder; exit codes are the table in docs/exit-codes.md; progress is
plain lines off a terminal; stats models the reader make_loader would use."""

import io
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import convert_images, make_images, write_manifest
from shardkit import copy_tars

from wds_tools import progress as progress_module
from wds_tools.cli import cli
from wds_tools.cli.defaults import load_cli_defaults
from wds_tools.exitcodes import EXIT_CODES, ExitCode
from wds_tools.inspect.stats.figures import distribute

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """30 real JPEGs at 16 px, shards of 8: train 4 shards, val 1 shard (every 6th row)."""
    return convert_images(tmp_path_factory.mktemp("vocab"), 30, size=16, shard_size=8, val_every=6)


# ------------------------------------------------------------------ the options of every command


def _options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option)]


def test_every_command_has_quiet_json_and_help_on_every_option():
    assert set(cli.commands) == {"convert", "diff", "dups", "index", "report", "stats", "verify"}
    for name, cmd in cli.commands.items():
        spellings = {o: p for p in _options(cmd) for o in p.opts + p.secondary_opts}
        assert {"-q", "--quiet", "--json"} <= set(spellings), name
        assert spellings["-q"] is spellings["--quiet"] and spellings["--quiet"].is_flag, name
        for p in _options(cmd):
            assert p.help and len(p.help) > 10, f"{name} {p.opts[0]} has no help"
            assert not p.hidden, f"{name} {p.opts[0]} is hidden"
        visible = {o for p in _options(cmd) for o in p.opts}
        assert "--threads" not in visible, name
        assert "--loader-workers" not in visible or name in ("stats", "report"), name  # report shows stats' epoch


def test_workers_is_the_commands_own_parallelism():
    """--workers exists (visible) only where the command itself runs workers: convert's decode processes,
    verify's threads; stats' DataLoader workers are --loader-workers."""
    with_workers = {
        name for name, cmd in cli.commands.items() for p in _options(cmd) if "--workers" in p.opts and not p.hidden
    }
    assert with_workers == {"convert", "verify"}
    help_of = {
        name: next(p.help for p in _options(cli.commands[name]) if "--workers" in p.opts) for name in with_workers
    }
    assert "processes" in help_of["convert"] and "Threads" in help_of["verify"]
    stats_help = next(p.help for p in _options(cli.commands["stats"]) if "--loader-workers" in p.opts)
    assert "DataLoader workers per rank" in stats_help


def test_the_two_versions_say_which_they_are(runner):
    group = runner.invoke(cli, ["--help"]).output
    assert re.search(r"--version\s+Show the program's version", group)
    conv = " ".join(runner.invoke(cli, ["convert", "--help"]).output.split())
    assert "Name of the dataset version to write" in conv and "wds-tools --version" in conv
    assert runner.invoke(cli, ["--version"]).output.startswith("wds-tools, version ")


def test_workers_options_and_their_toml_keys_work_without_a_word(runner, converted, tmp_path, monkeypatch):
    """What the tests of the removed old spellings (verify --threads, stats --workers) also checked of the
    new ones: they run with nothing on stderr, from the command line and from wds-tools.toml."""
    new = runner.invoke(cli, ["verify", str(converted), "--workers", "1", "--json", "-q"])
    assert new.exit_code == 0 and new.stderr == "" and json.loads(new.stdout)["ok"] is True
    new = runner.invoke(cli, ["stats", str(converted), "--loader-workers", "3", "--json"])
    assert new.stderr == "" and json.loads(new.stdout)["workers"] == 3
    (tmp_path / "wds-tools.toml").write_text("[stats]\nloader-workers = 4\n")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(cli, ["stats", str(converted), "--json"])
    assert json.loads(res.stdout)["workers"] == 4 and res.stderr == ""
    for old in (["verify", str(converted), "--threads", "1"], ["stats", str(converted), "--workers", "3"]):
        assert runner.invoke(cli, old).exit_code == 2  # the old spellings are gone (0.1.0 never had users)


def test_load_cli_defaults_reads_a_file_without_a_warning(tmp_path):
    p = tmp_path / "wds-tools.toml"
    p.write_text('out = "sh"\n[convert]\nworkers = 2\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = load_cli_defaults(p)
    assert new["convert"] == {"workers": 2} and new["out"].endswith("sh")


def test_wds_tools_toml_keys_are_the_options_long_names(runner, converted, tmp_path, monkeypatch):
    (tmp_path / "wds-tools.toml").write_text('out = "nowhere"\n[stats]\njson = true\nloader_workers = 3\n')
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(cli, ["stats", str(converted)])  # json: --json, loader_workers: --loader-workers
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["workers"] == 3
    res = runner.invoke(cli, ["diff", str(converted), str(converted), "--json"])  # out: not an option of diff
    assert res.exit_code == 0, res.output
    (tmp_path / "wds-tools.toml").write_text("[stats]\nloader-wrkers = 3\n")
    res = runner.invoke(cli, ["stats", str(converted)])
    assert res.exit_code == 2 and "[stats] unknown key 'loader-wrkers'; expected one of" in res.output
    assert "loader-workers" in res.output and "world-size" in res.output


def test_help_is_the_same_in_a_folder_with_a_wds_tools_toml(runner, tmp_path, monkeypatch):
    bare, configured = tmp_path / "bare", tmp_path / "configured"
    bare.mkdir()
    configured.mkdir()
    (configured / "wds-tools.toml").write_text(
        'out = "elsewhere"\n[convert]\nresize = "pad"\nworkers = 7\nmax-errors = "5%"\n'
        "[dups]\nlimit = 3\n[verify]\nworkers = 2\n"
    )

    def helps(folder):
        monkeypatch.chdir(folder)
        out = {}
        for args in ([], *([name] for name in cli.commands)):
            res = runner.invoke(cli, [*args, "--help"])
            assert res.exit_code == 0, res.output
            out[" ".join(args)] = res.output
        return out

    without, with_toml = helps(bare), helps(configured)
    assert with_toml == without
    convert_help = " ".join(without["convert"].split())  # the help wraps lines at any width
    assert "[default: center-crop]" in convert_help and "[default: 1%]" in convert_help
    assert "[default: shards]" in convert_help and "[default: elsewhere]" not in convert_help
    assert "[default: pad]" not in convert_help and "[default: 5%]" not in convert_help
    for name in cli.commands:
        assert "from wds-tools.toml when one applies" in " ".join(without[name].split()), name
    # and the file does apply to a run in that folder
    monkeypatch.chdir(configured)
    res = runner.invoke(cli, ["dups", "--json"])  # out = "elsewhere": the newest version under it
    assert res.exit_code == 1 and "no converted dataset under elsewhere" in res.output


# ------------------------------------------------------------------ exit codes


def _documented() -> dict[int, tuple[str, str]]:
    rows = {}
    for line in (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8").splitlines():
        m = re.fullmatch(r"\| (\d+) \| `(\w+)` \| (.+) \|", line)
        if m:
            rows[int(m.group(1))] = (m.group(2), m.group(3))
    return rows


def test_the_documented_table_is_the_codes():
    assert _documented() == {int(c): (c.name, text) for c, text in EXIT_CODES.items()}
    assert set(EXIT_CODES) == set(ExitCode)
    # the shell's status of a command a signal ended: 128 + SIGINT (2) and + SIGTERM (15)
    assert (ExitCode.OK, ExitCode.USAGE, ExitCode.SIGINT, ExitCode.SIGTERM) == (0, 2, 130, 143)


def test_real_failures_return_the_documented_codes(runner, converted, tmp_path, monkeypatch):
    doc = _documented()
    assert runner.invoke(cli, ["verify", str(converted), "-q"]).exit_code == 0
    # usage: an unknown option (click), a PATH that is not there, a value only the library can judge
    assert runner.invoke(cli, ["verify", "--no-such-option"]).exit_code == 2 and doc[2][0] == "USAGE"
    res = runner.invoke(cli, ["stats", str(tmp_path / "nothere")])
    assert res.exit_code == 2 and "no such shards folder" in res.output
    res = runner.invoke(cli, ["convert", "--source", str(tmp_path / "none.csv"), "--version", "v1", "--size", "8"])
    assert res.exit_code == 2 and "does not exist" in res.output
    # error: a folder of tars without an index, asked for its index
    bare = copy_tars(converted, tmp_path / "bare")
    res = runner.invoke(cli, ["diff", str(bare), str(converted)])
    assert res.exit_code == 1 and doc[1][0] == "ERROR" and "no index at" in res.output and "Traceback" not in res.output
    # data: a damaged shard
    damaged = copy_tars(converted, tmp_path / "damaged")
    for name in ("index.json", "samples.npz"):
        (damaged / name).write_bytes((converted / name).read_bytes())
    tar = damaged / "train-000001.tar"
    tar.write_bytes(tar.read_bytes()[:-1024])
    res = runner.invoke(cli, ["verify", str(damaged), "-q"])
    assert res.exit_code == 3 and doc[3][0] == "DATA" and "train-000001.tar" in res.output
    # the same statuses from the real command (python -m wds_tools: main(), the signal handlers)
    for args, code in ((["verify", str(damaged), "-q"], 3), (["stats", str(tmp_path / "nothere")], 2)):
        proc = subprocess.run([sys.executable, "-m", "wds_tools", *args], capture_output=True, text=True)
        assert proc.returncode == code, (args, proc.stderr)
    # internal: a bug (here: a library function that raises what no user can cause)
    import wds_tools.inspect.diff as diff_module

    def broken(old, new):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(diff_module, "diff_versions", broken)
    res = runner.invoke(cli, ["diff", str(converted), str(converted)])
    assert res.exit_code == 4 and doc[4][0] == "INTERNAL"
    assert "Traceback" in res.stderr and "ZeroDivisionError: a bug" in res.stderr and "please report" in res.stderr


def test_convert_past_max_errors_is_a_data_failure(runner, tmp_path):
    rows = make_images(tmp_path / "c", 10)
    (tmp_path / "c" / rows[3]["path"]).write_bytes(b"not an image")
    manifest = write_manifest(tmp_path / "c" / "m.csv", rows)
    args = ["convert", "--source", str(manifest), "--version", "v1", "--size", "8", "--out", str(tmp_path / "o")]
    res = runner.invoke(cli, [*args, "--workers", "1", "-q", "--max-errors", "0"])
    assert res.exit_code == ExitCode.DATA == 3 and "--max-errors" in res.output


# ------------------------------------------------------------------ progress: a bar on a terminal only


def test_progress_off_a_terminal_is_plain_lines_at_each_tenth(monkeypatch):
    monkeypatch.setattr(progress_module, "MIN_SECONDS", 0.0)
    out = io.StringIO()
    with progress_module.progress(20, "work", "item", stream=out) as p:
        for _ in range(20):
            p.update()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # 20 items: a line at every second item (each tenth), the last one 100%
    assert [line.split(",")[0] for line in lines] == [f"work: {2 * k}/20 item ({10 * k}%)" for k in range(1, 11)]


def test_progress_lines_are_few_for_short_work_and_a_bar_needs_a_terminal():
    out = io.StringIO()
    with progress_module.progress(1000, "quick", "item", stream=out) as p:
        p.update(1000)  # done at once: within MIN_SECONDS of the start, so one line, the last
    assert out.getvalue().count("\n") == 1 and out.getvalue().startswith("quick: 1,000/1,000 item (100%)")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    with progress_module.progress(10, "bar", "item", stream=term) as p:
        p.update(10)
    assert "\r" in term.getvalue() and "bar" in term.getvalue()  # tqdm's bar
    silent = io.StringIO()
    with progress_module.progress(10, "none", "item", stream=silent, enabled=False) as p:
        p.update(10)
    assert silent.getvalue() == ""


def test_convert_and_verify_print_lines_not_carriage_returns_when_piped(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(progress_module, "MIN_SECONDS", 0.0)
    manifest = write_manifest(tmp_path / "c" / "m.csv", make_images(tmp_path / "c", 30))
    out = tmp_path / "o"
    args = ["convert", "--source", str(manifest), "--version", "v1", "--size", "8", "--out", str(out)]
    res = runner.invoke(cli, [*args, "--workers", "1", "--shard-size", "4", "--json"])
    assert res.exit_code == 0, res.output
    assert "\r" not in res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("convert 8: ")]
    assert len(lines) >= 5 and lines[-1].startswith("convert 8: 30/30 img (100%)"), res.stderr
    assert any(line.startswith("scan: 30/30 file (100%)") for line in res.stderr.splitlines())
    json.loads(res.stdout)  # stdout is the JSON alone
    res = runner.invoke(cli, ["verify", str(out / "v1" / "8")])
    assert res.exit_code == 0 and "\r" not in res.output
    assert re.search(r"^verify: \d+/\d+ shard \(100%\)", res.stderr, re.M), res.stderr
    # -q: no progress and no informational line; the result still prints
    quiet = runner.invoke(cli, ["verify", str(out / "v1" / "8"), "-q"])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout.strip()
    again = runner.invoke(cli, [*args, "--workers", "1", "--shard-size", "4", "-q"])
    assert again.exit_code == 0 and again.stderr == ""


# ------------------------------------------------------------------ stats models the loader's reader


def test_distribute_with_the_index_reader_deals_samples():
    # 8 + 8 + 8 + 6 = 30 samples over 4 ranks: 7 each (rank r reads every 4th of the permutation), 2 left out
    d = distribute([8, 8, 8, 6], world_size=4, workers=3, reader="index")
    assert (d.reader, d.rank_samples, d.left_out, d.idle_workers, d.warnings) == ("index", [7] * 4, 2, 0, [])
    assert d.rank_shards is d.worker_shards is d.worker_samples is d.even_shards_above is None
    # one shard of 6 for 2 workers: streaming leaves a worker without a shard, the index reader does not
    assert distribute([6], 1, 2, reader="stream").warnings[0].startswith("1 shard for 1 rank × 2 workers")
    assert distribute([6], 1, 2, reader="index").warnings == []
    # 3 samples for 5 workers: 2 workers get no batch whatever the batch size
    few = distribute([3], 1, 5, reader="index")
    assert few.idle_workers == 2 and "3 samples per rank for 5 workers: 2 workers per rank get no batch" in few.warnings
    none = distribute([1, 1], 3, 1, reader="index")
    assert none.rank_samples == [0, 0, 0] and "every rank gets no sample" in none.warnings[0]


def test_stats_models_the_index_reader_where_the_loader_would_use_it(runner, converted):
    """As `make demo` runs it: a split of one shard and 2 loader workers is fine for the index reader."""
    res = runner.invoke(cli, ["stats", str(converted), "--loader-workers", "2"])
    assert res.exit_code == 0, res.output
    assert "training loader modelled: the index reader" in res.output
    assert "gets no shard" not in res.output and "use at least" not in res.output
    d = json.loads(runner.invoke(cli, ["stats", str(converted), "--loader-workers", "2", "--json"]).stdout)
    assert d["reader"] == "index" and d["splits"]["val"]["distribution"]["reader"] == "index"
    assert d["splits"]["val"]["shards"] == 1 and d["splits"]["val"]["distribution"]["warnings"] == []
    stream = runner.invoke(cli, ["stats", str(converted), "--loader-workers", "2", "--reader", "stream"])
    assert "training loader modelled: the streaming reader" in stream.output
    assert "warning: 1 shard for 1 rank × 2 workers = 2 readers: 1 reader gets no shard" in stream.output
    scan = json.loads(runner.invoke(cli, ["stats", str(converted), "--scan", "--json"]).stdout)
    assert scan["reader"] == "stream"  # the tars alone: a loader given them streams
