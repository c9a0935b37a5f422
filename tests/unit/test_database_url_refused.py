"""A database the outbox cannot run on is refused when the Outbox is built, naming it: a URL
that is no URL, ``postgres://``, another database, an asyncio driver's URL (the ``apush``
side's), an AsyncEngine given as ``engine=``. Before, each failed later or elsewhere with
SQLAlchemy's own error (``Can't load plugin``, ``MissingGreenlet`` at the first query,
``'AsyncEngine' object has no attribute ...`` at ``create_schema()``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery

from celery_outbox import ConfigurationError, Outbox


def _app() -> Celery:
    return Celery(f"url-{uuid.uuid4().hex[:8]}", broker="memory://")


@pytest.mark.parametrize(("url", "match"), [
    ("shop.sqlite3", "not a database URL"),
    ("postgres://root:secret@127.0.0.1/shop", "postgresql\\+psycopg://root:\\*\\*\\*@127"),
    ("mysql+pymysql://root@127.0.0.1/shop", "PostgreSQL .* or SQLite .*not 'mysql'"),
    ("sqlite+aiosqlite:////tmp/shop.sqlite3", "asyncio driver \\(aiosqlite\\).*'sqlite:////tmp/"),
    ("postgresql+asyncpg://root@127.0.0.1/shop", "asyncio driver \\(asyncpg\\).*psycopg://"),
    ("postgresql+psycopg_async://root@127.0.0.1/shop", "asyncio driver \\(psycopg_async\\)"),
])
def test_a_url_the_outbox_cannot_run_on_is_refused(url: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as info:
        Outbox(_app(), database_url=url)
    assert "secret" not in str(info.value)


def test_an_async_engine_is_refused(tmp_path: Any) -> None:
    pytest.importorskip("aiosqlite")
    from sqlalchemy.ext.asyncio import create_async_engine
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/a.sqlite3")
    with pytest.raises(ConfigurationError, match=r"AsyncEngine.*apush"):
        Outbox(_app(), engine=engine)  # type: ignore[arg-type]


def test_the_urls_the_outbox_runs_on_are_taken(tmp_path: Any) -> None:
    for url in (f"sqlite:///{tmp_path}/s.sqlite3", "postgresql://root@127.0.0.1:1/x",
                "postgresql+psycopg://root@127.0.0.1:1/x"):  # never connects
        Outbox(_app(), database_url=url).engine.dispose()
