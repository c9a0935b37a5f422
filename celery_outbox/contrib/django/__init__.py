"""celery_outbox in a Django project: pushes join Django's ``transaction.atomic()``.

- ``INSTALLED_APPS += ["celery_outbox.contrib.django"]``; ``manage.py migrate`` creates the
  outbox's tables (:mod:`~celery_outbox.contrib.django.schema`).
- ``settings.CELERY_OUTBOX`` (:mod:`~celery_outbox.contrib.django.conf`): the alias, the
  table name, every :class:`~celery_outbox.config.OutboxConfig` setting.
- :func:`install` builds the Celery app's :class:`~celery_outbox.Outbox`: workers use a
  SQLAlchemy engine on the same database; a push given neither ``session`` nor
  ``connection`` writes through Django's connection (:class:`DjangoTransaction`), so it
  commits or rolls back with the caller's models and dispatches on ``transaction.on_commit``.
- :func:`using` pushes through another alias.

Importing this package does not import Django's models, so it may be imported from the
project's Celery module before ``django.setup()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

from celery import Celery
from sqlalchemy import Engine, event, exc

from celery_outbox.contrib.django.conf import DEFAULT_ALIAS, database_url, outbox_settings
from celery_outbox.dispatch import Dispatcher
from celery_outbox.engine import make_engine
from celery_outbox.errors import ConfigurationError
from celery_outbox.executors import Transaction
from celery_outbox.outbox import Outbox
from celery_outbox.registry import JobRegistry

__all__ = ["DjangoJoiner", "database_url", "install", "using"]

_alias: ContextVar[str | None] = ContextVar("celery_outbox_django_alias", default=None)


class DjangoJoiner:
    """The Outbox's joiner: a push writes through Django's connection ``alias`` (or the one
    :func:`using` names), in the caller's ``atomic()`` block or, outside one, in a
    transaction of its own that commits at once."""

    def __init__(self, alias: str = DEFAULT_ALIAS) -> None:
        self.alias = alias

    def __call__(self) -> AbstractContextManager[Transaction]:
        from django.db import connections

        from celery_outbox.contrib.django.executor import joined

        alias = _alias.get() or self.alias
        if alias not in connections.settings:
            raise ConfigurationError(
                f"Django database alias {alias!r} is not in settings.DATABASES "
                f"({', '.join(sorted(connections.settings))})")
        return joined(alias)


@contextmanager
def using(alias: str) -> Iterator[None]:
    """Pushes in this block (this thread or task) write through Django's connection
    ``alias``: ``with using("other"): job.push(...)``. It must reach the database the
    workers read (the outbox's ``database``), e.g. a second alias of the same database."""
    token = _alias.set(alias)
    try:
        yield
    finally:
        _alias.reset(token)


def install(
    app: Celery,
    *,
    registry: JobRegistry | None = None,
    dispatcher: Dispatcher | None = None,
    **overrides: Any,
) -> Outbox:
    """The :class:`~celery_outbox.Outbox` of ``app`` in a Django project.

    Settings: ``settings.CELERY_OUTBOX``, then ``overrides`` (keywords win): ``database``
    (the alias, default ``"default"``), ``database_url`` (the workers' SQLAlchemy URL;
    default derived from ``DATABASES[database]``, see :func:`database_url`), and every
    :class:`~celery_outbox.config.OutboxConfig` setting. Raises
    :class:`~celery_outbox.ConfigurationError` on a bad setting.
    """
    options = {**outbox_settings(), **overrides}
    alias = options.pop("database", DEFAULT_ALIAS)
    if not isinstance(alias, str) or not alias:
        raise ConfigurationError(f"CELERY_OUTBOX['database'] must be an alias, got {alias!r}")
    url = options.pop("database_url", None)
    engine = None
    if not url:
        engine = make_engine(database_url(alias))
        _follow_test_database(engine, alias)
    return Outbox(app, database_url=url, engine=engine, registry=registry,
                  dispatcher=dispatcher, joiner=DjangoJoiner(alias), **options)


def _follow_test_database(engine: Engine, alias: str) -> None:
    """Each connection of ``engine`` (derived from ``DATABASES[alias]``) opens the database
    Django's connection ``alias`` names when it opens: Django's test runner (``manage.py
    test``, pytest-django) points the alias at ``test_<NAME>`` after the project's Celery
    module ran :func:`install`. SQLite's default test database, in memory with a shared
    cache (``file:memorydb_<alias>?mode=memory&cache=shared``), is opened by that URI: this
    process's connections reach it while Django's connection keeps it alive (a worker
    process cannot). A pooled connection opened on another name (before the rename, or
    after the test database was destroyed) is replaced at its next checkout."""
    from django.db import connections

    def current() -> str:
        return str(connections[alias].settings_dict.get("NAME") or "")

    # SQLAlchemy runs do_connect listeners in the order added and stops at the first that
    # opens the connection (make_engine's own): the name is set first, then they run.
    others = list(engine.dialect.dispatch.do_connect)
    for fn in others:
        event.remove(engine, "do_connect", fn)

    def _current_name(dialect: Any, record: Any, cargs: list[Any],
                      cparams: dict[str, Any]) -> Any:
        name = current()
        record.info[_NAME_KEY] = name
        if name and dialect.name == "postgresql":
            cparams["dbname"] = name
        elif name.startswith("file:") and cargs:
            cargs[0] = name  # Django's shared in-memory test database, by its URI
            cparams["uri"] = True
        elif name and name != ":memory:" and cargs:
            cargs[0] = os.path.abspath(name)
        for fn in others:
            opened = fn(dialect, record, cargs, cparams)
            if opened is not None:
                return opened
        return None

    def _same_name(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        opened = record.info.get(_NAME_KEY)
        if opened is not None and opened != current():
            raise exc.DisconnectionError(
                f"Django's {alias!r} now names {current()!r}, not {opened!r}")

    event.listen(engine, "do_connect", _current_name)
    event.listen(engine, "checkout", _same_name)
    _dispose_before_destroy(engine, connections[alias].creation)


def _dispose_before_destroy(engine: Engine, creation: Any) -> None:
    """Close ``engine``'s connections before Django's test runner drops the test database
    (PostgreSQL refuses to drop a database other sessions are connected to: "database
    test_<NAME> is being accessed by other users"). ``creation`` is the alias's
    ``DatabaseCreation`` of this thread, the test runner's."""
    destroy = creation.destroy_test_db
    if getattr(destroy, "_celery_outbox_engines", None) is not None:
        destroy._celery_outbox_engines.append(engine)
        return
    engines = [engine]

    def destroy_test_db(*args: Any, **kwargs: Any) -> Any:
        for each in engines:
            each.dispose()
        return destroy(*args, **kwargs)

    destroy_test_db._celery_outbox_engines = engines  # type: ignore[attr-defined]
    creation.destroy_test_db = destroy_test_db


_NAME_KEY = "celery_outbox_django_name"
"""The database name a connection was opened on (its pool record's ``info``)."""
