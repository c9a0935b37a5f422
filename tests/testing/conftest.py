"""The test helpers' own tests: a user's suite and a Django project run in subprocesses, as a
user runs them, against SQLite and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PG_ADDRESS, PG_ADMIN_URL, require

collect_ignore = ["usersuite", "pytestdjango"]  # users' suites: run in subprocesses

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@pytest.fixture(params=["sqlite", "pg"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(kind, SQLAlchemy URL) of an empty database of this test's own: a SQLite file, or a
    PostgreSQL database created now and dropped after (skipped locally when no server
    answers, failed under CI)."""
    if request.param == "sqlite":
        yield "sqlite", f"sqlite:///{tmp_path / 'shop.sqlite3'}"
        return
    require("PostgreSQL", *PG_ADDRESS)
    from sqlalchemy import create_engine, text

    name = f"outbox_tt_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield "pg", PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)'))
        admin.dispose()


def run(args: list[str], env: dict[str, str], cwd: Path,
        timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python args...`` in a fresh interpreter (this one's), with ``env`` added; its
    output is printed when a test fails."""
    done = subprocess.run([sys.executable, *args], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)
    print(done.stdout[-20000:], done.stderr[-20000:], sep="\n")
    return done
