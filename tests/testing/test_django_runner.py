"""Django's test runner (``python -m django test``) on the project in ``djangosite/``: its
Celery module runs ``install(app)`` at import, before the runner renames the database to
``test_<NAME>`` (PostgreSQL) or to a shared in-memory database (SQLite). The outbox must follow
(before: on PostgreSQL the runner could not drop ``test_<NAME>``, "being accessed by other
users"; on SQLite the outbox's engine read the file ``NAME``, "no such table"), and the
project's tests use ``celery_outbox.testing`` (``djangosite/orders/tests.py``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from celery_outbox.contrib.django.conf import url_of
from tests.testing.conftest import HERE, ROOT, run


def _env(kind: str, url: str, tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"DJANGO_SETTINGS_MODULE": "tests.testing.djangosite.settings", "OUTBOX_TT_DB": kind,
           "PYTHONPATH": path}
    if kind == "pg":
        parts = urlsplit(url.replace("postgresql+psycopg", "postgresql"))
        env.update(OUTBOX_TT_PG_NAME=parts.path.lstrip("/"),
                   OUTBOX_TT_PG_HOST=parts.hostname or "127.0.0.1",
                   OUTBOX_TT_PG_PORT=str(parts.port or 5432),
                   OUTBOX_TT_PG_USER=parts.username or "root")
    else:
        env["OUTBOX_TT_SQLITE"] = str(tmp_path / "orders.sqlite3")
    return env


def test_djangos_test_runner_with_the_outbox(database: tuple[str, str],
                                             tmp_path: Path) -> None:
    kind, url = database
    env = _env(kind, url, tmp_path)
    done = run(["-m", "django", "test", "tests.testing.djangosite.orders", "--noinput",
                "-v", "2"], env, ROOT)
    assert done.returncode == 0, f"Django's test runner failed on {kind}"
    assert "Ran 7 tests" in done.stderr and "\nOK" in done.stderr
    assert "being accessed by other users" not in done.stderr
    if kind == "pg":
        from sqlalchemy import create_engine, text

        from tests.conftest import PG_ADMIN_URL

        admin = create_engine(PG_ADMIN_URL)
        try:
            with admin.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM pg_database WHERE datname = "
                                         ":name"), {"name": "test_" + env["OUTBOX_TT_PG_NAME"]})
                assert left.scalar() == 0  # the runner dropped its test database
        finally:
            admin.dispose()
    else:
        assert not (tmp_path / "orders.sqlite3").exists()  # nothing went to the file NAME


def test_pytest_django_with_the_plugin(database: tuple[str, str], tmp_path: Path) -> None:
    """A pytest-django suite (``pytestdjango/``) whose Outbox comes from the ini option,
    imported once pytest-django made the test database: on SQLite, Django's shared in-memory
    database by its URI. pytest-django is in the test extra; our own runs keep its plugin
    out (``-p no:django``), this suite's run loads it by its entry point."""
    kind, url = database
    suite = tmp_path / "suite"
    shutil.copytree(HERE / "pytestdjango", suite, ignore=shutil.ignore_patterns("__pycache__"))
    done = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                "--ds=tests.testing.djangosite.settings", f"--rootdir={suite}", str(suite)],
               _env(kind, url, tmp_path), suite)
    assert done.returncode == 0, f"the pytest-django suite failed on {kind}"
    assert "2 passed" in done.stdout


def test_the_url_of_djangos_sqlite_test_database() -> None:
    """``install()`` after the test runner renamed the alias (pytest-django, an ini option
    imported late): the shared in-memory database by its URI; any other in-memory database
    is still refused."""
    from celery_outbox import ConfigurationError

    name = "file:memorydb_default?mode=memory&cache=shared"
    assert url_of({"ENGINE": "django.db.backends.sqlite3", "NAME": name}) == (
        f"sqlite:///{name}&uri=true")
    with pytest.raises(ConfigurationError, match="in-memory"):
        url_of({"ENGINE": "django.db.backends.sqlite3", "NAME": "file:x?mode=memory"})
