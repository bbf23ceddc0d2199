"""Every code block of README.md, docs/index.md and docs/guide/*.md runs, so an example cannot rot.

Python blocks are exec'ed, shell blocks (bash, console, shell, sh) run with this interpreter's bin
folder first on PATH (so ``wds-tools`` and ``python`` are this checkout's), both in one folder where
the Quick start's demo corpus has been made and converted (``corpus/``, ``shards/v1/224``).
A shell block may only call ``wds-tools`` or ``python``; it must exit 0, or the code an
``<!-- exit: N -->`` line right before it states. A block that cannot run here (it needs S3, a GPU,
a dataset, a network install) says why in an ``<!-- not-run: reason -->`` line right before it.
Every fence names its language, so no block escapes by having none.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
SHELL = {"bash", "console", "shell", "sh"}
RUN = SHELL | {"python"}
OPTIONAL = {"torchvision", "albumentations"}  # extras a recipe may import; without them the block is skipped
MARKER = re.compile(r"^<!--\s*(not-run|exit)\s*:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)```(.*)$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    markers: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the marker comments on the lines right before it."""
    lines = page.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page.relative_to(ROOT)}:{i + 1}: a code block that is never closed"
        markers, k = {}, i - 1
        while k >= 0 and MARKER.match(lines[k].strip()):
            kind, value = MARKER.match(lines[k].strip()).groups()
            markers[kind] = value.strip()
            k -= 1
        code = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
        found.append(Block(page, i + 1, lang, code + "\n", markers))
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]
RUNNABLE = list(  # a block repeated word for word (docs/index.md repeats the README's Quick start) runs once
    {(b.lang, b.code): b for b in reversed(ALL) if b.lang in RUN and "not-run" not in b.markers}.values()
)[::-1]


def commands(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and a ``$ `` prompt dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if line and not line.startswith("#"):
            out.append(line)
    return out


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> Path:
    """A folder as after the Quick start's first step: the demo corpus, converted into shards/v1/224."""
    ws = tmp_path_factory.mktemp("docs-examples")
    (ws / "scripts").symlink_to(ROOT / "scripts", target_is_directory=True)
    env = _env()
    for cmd in (
        [sys.executable, "scripts/make_demo_corpus.py", "--out", "corpus", "--count", "300"],
        [sys.executable, "-m", "wds_tools", "convert", "--source", "corpus/manifest.csv", "--version", "v1"]
        + ["--size", "224", "--out", "shards", "--shard-size", "64", "--max-errors", "5%", "--workers", "2"],
    ):
        done = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    assert (ws / "shards" / "v1" / "224" / "index.json").is_file()
    return ws


def run_shell(cmds: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The commands in bash (stopping at the first that fails), this checkout's wds-tools and python first on PATH."""
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", "\n".join(cmds)],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("COLUMNS", None)
    return env


def test_the_pages_have_runnable_blocks():
    """The walk finds blocks at all (a parser that finds none would pass everything below)."""
    by_page = {b.page.name for b in RUNNABLE}
    assert {"README.md", "training.md", "inspect.md", "convert.md"} <= by_page
    assert sum(b.lang == "python" for b in RUNNABLE) >= 6 and sum(b.lang in SHELL for b in RUNNABLE) >= 4


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_every_block_names_its_language_and_not_run_blocks_say_why(block):
    assert block.lang, f"{block.id}: a fence without a language; name it (python, bash, text, toml, yaml ...)"
    if "not-run" in block.markers:
        assert block.markers["not-run"], f"{block.id}: <!-- not-run: --> needs a reason"
        assert block.lang in RUN, f"{block.id}: not-run marks a {block.lang} block, which is never run anyway"
    if "exit" in block.markers:
        assert block.markers["exit"].isdigit(), f"{block.id}: <!-- exit: N --> needs a number"


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_block_runs(block, demo, monkeypatch):
    if block.lang == "python":
        monkeypatch.chdir(demo)
        try:
            exec(compile(block.code, block.id, "exec"), {"__name__": "__docs_example__"})
        except ModuleNotFoundError as e:
            if e.name not in OPTIONAL:
                raise
            pytest.skip(f"{block.id} needs {e.name}, not installed here")
        return
    cmds = commands(block.code)
    assert cmds, f"{block.id}: an empty shell block"
    for cmd in cmds:
        assert cmd.split()[0] in {"wds-tools", "python"}, (
            f"{block.id}: {cmd!r}: a shell block here may only run wds-tools or python; "
            "if it cannot run in the test, put <!-- not-run: reason --> right before it"
        )
    want = int(block.markers.get("exit", "0"))
    done = run_shell(cmds, demo)
    assert done.returncode == want, (
        f"{block.id} exited {done.returncode}, the page says {want}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def test_readme_fits_a_screenful_of_reading():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines; at most 200 (move detail into docs/guide/)"


def test_readme_links_lead_to_files():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10
    missing = [link for link in local if not (ROOT / link).exists() and link != "LICENSE"]
    assert not missing, f"README.md links to missing files: {missing}"


def test_commands_parses_continuations_comments_and_prompts():
    code = "# a comment\n$ wds-tools stats a \\\n    --json   # trailing\n\npython x.py\n"
    assert commands(code) == ["wds-tools stats a      --json   # trailing", "python x.py"]


def test_markers_and_exit_codes_on_a_page_of_our_own(tmp_path):
    """The parser and runner on a page written here: the markers are read, a stated exit code is what runs."""
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- exit: 3 -->\n```bash\npython -c 'import sys; sys.exit(3)'\n```\n\n"
        "<!-- not-run: -->\n```python\nraise SystemExit\n```\n\n```\nno language\n```\n"
    )
    first, second, third = blocks(page)
    assert (first.lang, first.line, first.markers) == ("bash", 4, {"exit": "3"})
    assert (second.lang, second.markers) == ("python", {"not-run": ""})  # an empty reason, which the test refuses
    assert third.lang == "" and third.code == "no language\n"
    assert run_shell(commands(first.code), tmp_path).returncode == 3
    assert run_shell(["python -c 'import wds_tools, sys; print(wds_tools.__file__)'"], tmp_path).stdout.startswith(
        str(ROOT)
    )


def test_make_demo_writes_where_the_quick_start_reads():
    """make demo makes corpus/ and shards/v1/224 in the checkout's root, with the Quick start's convert
    options, so the Quick start's next command (wds-tools stats shards/v1/224) works after make demo."""
    target = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    demo = [line.strip().lstrip("@").split()[1:] for line in target]  # each without $(BIN)/python or wds-tools
    assert demo[0] == ["scripts/make_demo_corpus.py", "--out", "corpus", "--count", "300"]
    readme = [c for b in blocks(ROOT / "README.md") if b.lang in SHELL for c in commands(b.code)]
    (quick,) = [c.split() for c in readme if c.startswith("wds-tools convert --source corpus/manifest.csv")]
    assert demo[1][0] == "convert" and [o for o in demo[1] if o != "--workers" and o != "2"] == quick[1:]
    assert "wds-tools stats shards/v1/224" in readme and all("demo/" not in " ".join(c) for c in demo), demo


CODE_BOX = 88  # characters a line of a code box shows on the docs site before it scrolls


def test_commands_fit_their_code_boxes():
    """A shell block's lines, and a text block of command synopses, fit the site's code box: a long
    command is broken with backslashes, a long comment put on its own line (issue 38, point 20)."""
    pages = [*PAGES, ROOT / "docs" / "SCALE.md", ROOT / "docs" / "READERS.md"]
    long = [
        f"{b.page.relative_to(ROOT)}:{b.line + 1 + i}: {len(line)} characters"
        for page in pages
        for b in blocks(page)
        if b.lang in SHELL or (b.lang == "text" and b.code.lstrip().startswith(("wds-tools ", "make ")))
        for i, line in enumerate(b.code.splitlines())
        if len(line) > CODE_BOX
    ]
    assert not long, "break these lines (a backslash, or the comment on its own line):\n" + "\n".join(long)
