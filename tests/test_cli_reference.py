"""docs/reference/cli.md against the CLI itself: every option of every command is on the page, and the
page is what scripts/gen_cli_reference.py writes now (so an option added without regenerating fails)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import click
import pytest

from wds_tools.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "cli.md"
REGENERATE = (
    "run `make cli-reference` (or .venv/bin/python scripts/gen_cli_reference.py) and commit docs/reference/cli.md"
)


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "scripts" / "gen_cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _commands(group: click.Group, prefix: str = "wds-tools") -> list[tuple[str, click.Command]]:
    """(full name, command) of the group and every subcommand, found by walking click's tree."""
    found = [(prefix, group)]
    for name in sorted(group.commands):
        command = group.commands[name]
        if command.hidden:
            continue
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix} {name}")
        else:
            found.append((f"{prefix} {name}", command))
    return found


def _sections() -> dict[str, str]:
    """The page's sections by command name (the text under ``## `wds-tools ...` ``)."""
    text = PAGE.read_text(encoding="utf-8")
    parts = re.split(r"^## `([^`]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_page_is_what_the_script_writes_now():
    assert PAGE.exists(), f"{PAGE.relative_to(ROOT)} is missing: {REGENERATE}"
    assert PAGE.read_text(encoding="utf-8") == _generator().render(), f"docs/reference/cli.md is stale: {REGENERATE}"


def test_every_command_and_option_is_on_the_page():
    sections = _sections()
    commands = _commands(cli)
    assert {"wds-tools convert", "wds-tools stats", "wds-tools verify"} <= {name for name, _ in commands}
    missing = []
    for name, command in commands:
        if name not in sections:
            missing.append(f"{name} (the whole command)")
            continue
        body = sections[name]
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            for flag in [*param.opts, *param.secondary_opts]:
                # the flag as a whole word: --group must not pass on the strength of --group-by
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", body):
                    missing.append(f"{name} {flag}")
        for arg in (p for p in command.params if isinstance(p, click.Argument)):
            if arg.make_metavar(click.Context(command)) not in body:
                missing.append(f"{name} argument {arg.name}")
    assert not missing, f"not in docs/reference/cli.md: {', '.join(missing)}; {REGENERATE}"


def test_the_check_fails_on_a_page_that_lacks_an_option(tmp_path, monkeypatch):
    """The comparison can fail: a page with one option's line removed is reported stale."""
    gen = _generator()
    text = gen.render()
    assert "--max-errors" in text
    stale = "\n".join(line for line in text.splitlines() if "--max-errors" not in line) + "\n"
    target = tmp_path / "cli.md"
    target.write_text(stale, encoding="utf-8")
    monkeypatch.setattr(gen, "TARGET", target)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["gen_cli_reference.py", "--check"])
    assert gen.main() == 1
    monkeypatch.setattr(sys, "argv", ["gen_cli_reference.py"])
    assert gen.main() == 0 and target.read_text(encoding="utf-8") == text
    monkeypatch.setattr(sys, "argv", ["gen_cli_reference.py", "--check"])
    assert gen.main() == 0


@pytest.mark.parametrize("columns", ["40", "200"])
def test_page_does_not_depend_on_the_terminal_or_a_local_config(tmp_path, monkeypatch, columns):
    (tmp_path / "wds-tools.toml").write_text('out = "elsewhere"\n[convert]\nworkers = 3\nshard_size = 7\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", columns)
    assert _generator().render() == PAGE.read_text(encoding="utf-8"), REGENERATE
