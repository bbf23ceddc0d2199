"""wds_tools.errors' install hints: the packages they name are the extras' own (pyproject.toml) at the
versions constraints.txt pins, and no message or page tells anyone to install a package that is not
published (``pip install 'wds-tools[heif]'`` was in 17 places; issue 32, point 11)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from wds_tools.errors import EXTRAS, install_hint

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def test_each_hint_names_its_extras_packages_at_the_constraints_pins():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = _pins()
    for extra, packages in EXTRAS.items():
        named = {Requirement(p).name.lower() for p in extras[extra]}
        hinted = dict(p.lower().split("==") for p in packages)
        assert set(hinted) == named, extra  # every package of the extra, and nothing else
        assert hinted == {name: pins[name] for name in hinted}, extra


def test_a_hint_says_the_packages_and_the_checkout_install():
    assert install_hint("heif") == (
        "pip install pillow-heif==1.8.1 (the 'heif' extra: from a checkout, pip install -e '.[heif]' -c constraints.txt)"
    )
    assert install_hint("train", "pyyaml").startswith("pip install pyyaml==6.0.3 (part of the 'train' extra")


def test_no_message_or_page_asks_for_the_unpublished_package():
    pattern = re.compile(r"wds-tools\[")
    places = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("wds_tools/**/*.py")]
    places += [*ROOT.glob("training_adapter/**/*.py"), *ROOT.glob("scripts/*.py")]
    found = [f"{p.relative_to(ROOT)}:{n}" for p in places for n, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line)]  # fmt: skip
    assert not found, f"'wds-tools[...]' is not installable (not on PyPI): {found}"


def test_the_wheel_the_docs_name_is_this_version():
    """README and docs name the wheel `pip wheel` builds; a version bump must not leave them naming another."""
    from wds_tools.version import __version__

    places = [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]
    named = {(p.name, v) for p in places for v in re.findall(r"wds_tools-([^-\s]+)-py3-none-any\.whl", p.read_text())}
    assert {p for p, _ in named} >= {"README.md", "index.md", "SCALE.md"}
    assert {v for _, v in named} == {__version__}, named
