"""scripts/check_site_links.py, which ``make docs`` runs: on a small site written here (links that work from
disk and links that do not), and on the real site where the docs extra (mkdocs) is installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from check_site_links import bad_links, main  # noqa: E402

INDEX = """<!doctype html><html><head><link rel="stylesheet" href="assets/site.css">
<link rel="preconnect" href="https://fonts.gstatic.com"></head><body id="top">
<a href="guide/a.html">a page</a> <a href="guide/a.html#there">an anchor on it</a> <a href="#top">up</a>
<a href="https://example.org/">elsewhere</a> <a href="mailto:x@example.org">mail</a>
<a href="guide/">a folder</a> <a href="missing.html">gone</a> <a href="guide/a.html#nowhere">no anchor</a>
<a href="../outside.html">outside</a> <img src="assets/logo%20one.png"></body></html>"""


def _site(root: Path) -> Path:
    site = root / "site"
    (site / "guide").mkdir(parents=True)
    (site / "assets").mkdir()
    (site / "index.html").write_text(INDEX)
    (site / "guide" / "a.html").write_text('<h2 id="there">There</h2><a href="../index.html#top">home</a>')
    (site / "assets" / "site.css").write_text("body {}")
    (site / "assets" / "logo one.png").write_bytes(b"\x89PNG")
    (site / "404.html").write_text('<a href="/guide/">served from the root</a>')  # only a server shows it
    (root / "outside.html").write_text("not the site's")
    return site


def test_every_link_that_fails_from_disk_is_named_with_its_reason(tmp_path):
    assert bad_links(_site(tmp_path)) == [
        "index.html: guide/ (a folder: opened from disk, the browser lists it instead of a page)",
        "index.html: missing.html (no such file)",
        "index.html: guide/a.html#nowhere (no anchor #nowhere on guide/a.html)",
        "index.html: ../outside.html (outside the site)",
    ]


def test_the_command_exits_1_listing_them_and_0_once_they_are_fixed(tmp_path, capsys):
    site = _site(tmp_path)
    assert main([str(site)]) == 1
    assert "4 internal link(s) of" in capsys.readouterr().err
    (site / "index.html").write_text(INDEX.split('<a href="guide/">')[0] + "</body></html>")
    assert main([str(site)]) == 0
    assert "every internal link of 3 pages leads to a file" in capsys.readouterr().out
    assert main([str(tmp_path / "nothing")]) == 1
    assert "no index.html; build the site first" in capsys.readouterr().err


@pytest.mark.slow  # 2.2 s (the mkdocs build), measured alone
def test_the_real_site_works_from_disk(tmp_path):
    """mkdocs.yml's use_directory_urls: false, checked on the built site (needs the docs extra)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make docs installs it)")
    out = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)]
    run = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "guide" / "training.html").is_file()
    assert bad_links(out) == []
