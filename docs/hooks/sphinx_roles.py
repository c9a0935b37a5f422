"""A MkDocs hook: the package's docstrings use Sphinx roles (``:class:`~a.b.C```), which
mkdocstrings renders as Markdown, so a role shows as ``:class:`` before the code. This drops
the role and, for a ``~`` target, keeps its last dotted part, as Sphinx shows it."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj|const):<code>(~?)([^<]*)</code>")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(_shown, html)
