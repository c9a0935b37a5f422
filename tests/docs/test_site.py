"""The documentation site builds with ``mkdocs build --strict`` (a broken reference, a link to a
page or anchor that does not exist, a docstring mkdocstrings cannot render: each fails the
build), and every link in the built site resolves.

The link check reads the built HTML with the standard library's parser: every relative
``href`` / ``src`` must name a file of the site, and every ``#fragment`` an ``id`` (or
``name``) in the page it points to. Links to other sites are not followed (the build machine
has no network); ``mailto:`` and the like are skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]

if not os.environ.get("CI"):  # under CI (`make test` installs the [docs] extra) never skipped
    pytest.importorskip("mkdocs", reason="the [docs] extra is not installed")


class _Page(HTMLParser):
    """The ids a page defines and the links it makes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (name == "name" and tag == "a"):
                self.ids.add(value)
            elif name in ("href", "src"):
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _target(site: Path, page: Path, path: str) -> Path | None:
    """The built file a link's path names (a directory means its index.html), or None."""
    base = site if path.startswith("/") else page.parent
    target = (base / unquote(path).lstrip("/")).resolve()
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_file() else None


def broken_links(site: Path) -> list[str]:
    """Every relative link of the built site that names no file, or no id in its page."""
    pages = {p.resolve(): _parse(p) for p in site.rglob("*.html")}
    broken = []
    for path, page in pages.items():
        where = path.relative_to(site.resolve())
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            target = _target(site, path, parts.path) if parts.path else path
            if target is None:
                broken.append(f"{where}: {link} (no such file)")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where}: {link} (no id {parts.fragment!r})")
    return broken


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_the_site_builds_strict_and_has_every_page(site: Path) -> None:
    for page in ("index.html", "getting-started/index.html", "reference/api/index.html",
                 "guides/testing/index.html", "troubleshooting/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text(encoding="utf-8")
    # mkdocstrings rendered the docstrings, not just the headings
    assert "push_many" in api and "create_schema" in api


def test_every_link_of_the_built_site_resolves(site: Path) -> None:
    broken = broken_links(site)
    assert not broken, "\n".join(broken[:50])


def test_every_relative_link_of_the_readme_resolves(site: Path) -> None:
    """The README is the landing page on the repository's host: its links into docs/ name
    pages of the site (and their anchors ids of the built page), its other links files."""
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text("utf-8")):
        parts = urlsplit(link)
        if parts.scheme or parts.netloc:
            continue
        target = ROOT / unquote(parts.path)
        if not target.exists():
            broken.append(f"{link} (no such file)")
        elif parts.fragment and target.suffix == ".md":
            page = target.relative_to(ROOT / "docs").with_suffix("")
            built = site / ("index.html" if page.name == "index" else page / "index.html")
            if unquote(parts.fragment) not in _parse(built).ids:
                broken.append(f"{link} (no id {parts.fragment!r} in the built page)")
    assert not broken, "\n".join(broken)


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text(
        '<h1 id="top">A</h1><a href="#top">ok</a><a href="../b/">ok</a>'
        '<a href="../b/#here">ok</a><a href="../c/">gone</a><a href="../b/#nowhere">gone</a>'
        '<a href="https://example.com/x">external</a><img src="../img.png">')
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "index.html").write_text('<p id="here">B</p>')
    assert sorted(broken_links(tmp_path)) == [
        "a/index.html: ../b/#nowhere (no id 'nowhere')",
        "a/index.html: ../c/ (no such file)",
        "a/index.html: ../img.png (no such file)",
    ]
