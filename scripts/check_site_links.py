"""Check that the built documentation site works opened from disk: every internal link leads to a file.

    .venv/bin/python scripts/check_site_links.py site     # exit 1, listing each bad link, when one fails

``make docs`` runs it after ``mkdocs build``. Opened as ``file://.../site/index.html``, a link to a
folder (``guide/convert/``, what mkdocs writes by default) shows the browser's directory listing, not
the page; so every ``href`` and ``src`` of every ``.html`` page that is not an external URL (a scheme
such as ``https:`` or ``mailto:``) must name a file that exists, and a ``#fragment`` into an HTML page
must name an ``id`` (or ``name``) on it. ``404.html`` is left out: only a web server shows it, for a
missing URL, and its links are absolute from the server's root. Standard library only.
"""

from __future__ import annotations

import argparse
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    """The links (href, src) and the anchors (id, name) of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.anchors: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("href", "src") and not (tag == "link" and ("rel", "preconnect") in attrs):
                self.links.append(value)
            elif name == "id" or (name == "name" and tag == "a"):
                self.anchors.add(value)


def _parse(path: Path, cache: dict[Path, _Page]) -> _Page:
    if path not in cache:
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        cache[path] = page
    return cache[path]


def bad_links(site: Path) -> list[str]:
    """Each internal link of ``site``'s pages that leads to no file (or to no anchor), as 'page: link (why)'."""
    site = site.resolve()
    cache: dict[Path, _Page] = {}
    problems = []
    for page_path in sorted(site.rglob("*.html")):
        if page_path == site / "404.html":
            continue
        page = _parse(page_path, cache)
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:  # https:, mailto:, data:, //host: not ours to check
                continue
            where = f"{page_path.relative_to(site)}: {link}"
            target = (page_path.parent / unquote(parts.path)).resolve() if parts.path else page_path
            if not target.is_relative_to(site):
                problems.append(f"{where} (outside the site)")
            elif target.is_dir():
                problems.append(f"{where} (a folder: opened from disk, the browser lists it instead of a page)")
            elif not target.is_file():
                problems.append(f"{where} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in _parse(target, cache).anchors:
                    problems.append(f"{where} (no anchor #{parts.fragment} on {target.relative_to(site)})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built site folder (mkdocs' site_dir)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"{args.site}: no index.html; build the site first (make docs)", file=sys.stderr)
        return 1
    problems = bad_links(args.site)
    pages = sum(1 for _ in args.site.rglob("*.html"))
    if problems:
        print(f"{len(problems)} internal link(s) of {args.site} lead to no file:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"{args.site}: every internal link of {pages} pages leads to a file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
