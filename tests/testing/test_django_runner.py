"""Django's test runner (``python -m django test``) on the project in ``djangosite/``: its
Celery module runs ``install(app)`` at import, before the runner renames the database to
``test_<NAME>`` (PostgreSQL) or to a shared in-memory database (SQLite). The outbox must follow
(before: on PostgreSQL the runner could not drop ``test_<NAME>``, "being accessed by other
users"; on SQLite the outbox's engine read the file ``NAME``, "no such table"), and the
project's tests use ``celery_outbox.testing`` (``djangosite/orders/tests.py``)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tests.testing.conftest import ROOT, run


def test_djangos_test_runner_with_the_outbox(database: tuple[str, str],
                                             tmp_path: Path) -> None:
    kind, url = database
    env = {"DJANGO_SETTINGS_MODULE": "tests.testing.djangosite.settings", "OUTBOX_TT_DB": kind,
           "PYTHONPATH": str(ROOT)}
    if kind == "pg":
        parts = urlsplit(url.replace("postgresql+psycopg", "postgresql"))
        env.update(OUTBOX_TT_PG_NAME=parts.path.lstrip("/"),
                   OUTBOX_TT_PG_HOST=parts.hostname or "127.0.0.1",
                   OUTBOX_TT_PG_PORT=str(parts.port or 5432),
                   OUTBOX_TT_PG_USER=parts.username or "root")
    else:
        env["OUTBOX_TT_SQLITE"] = str(tmp_path / "orders.sqlite3")
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
