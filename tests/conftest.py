"""Shared fixtures: real servers, a fresh PostgreSQL database per test session, SQLite files.

A test that needs a server skips when the server is absent locally and FAILS when ``CI`` is
set, so CI can never go green by skipping.
"""

from __future__ import annotations

import gc
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

CI = bool(os.environ.get("CI"))
LONG = os.environ.get("OUTBOX_TEST_LONG") == "1"
"""``make long``: the variants the default suite leaves out (each test keeps one variant in it,
so no path goes untested on a change; the others are not collected, so nothing is skipped)."""


def variants(default: tuple[str, ...], more: tuple[str, ...]) -> tuple[str, ...]:
    """The parameters of a test: ``default`` in every run, ``more`` too under ``make long``."""
    return default + more if LONG else default
# Rich sizes the CLI's tables to the terminal; under pytest (and its xdist workers) there is
# none, so give every test the same width whatever runs them.
os.environ.setdefault("COLUMNS", "200")
PG_ADMIN_URL = os.environ.get("OUTBOX_TEST_PG", "postgresql+psycopg://root@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("OUTBOX_TEST_REDIS", "redis://127.0.0.1:6379")
AMQP_URL = os.environ.get("OUTBOX_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")


def address(url: str, default_port: int) -> tuple[str, int]:
    """The (host, port) a server URL points to: ``redis://h:6380/1`` -> ("h", 6380); the
    scheme's usual port when the URL names none."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def with_redis_db(url: str) -> str:
    """``url`` with a Redis database number: ``/0`` added only when it names none."""
    if urlsplit(url).path.strip("/").isdigit():
        return url
    return url.rstrip("/") + "/0"


PG_ADDRESS = address(PG_ADMIN_URL, 5432)
REDIS_ADDRESS = address(REDIS_URL, 6379)
AMQP_ADDRESS = address(AMQP_URL, 5672)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (CI) when ``name`` does not answer on host:port."""
    if port_open(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if CI:
        pytest.fail(f"{message} (CI is set: server tests must not skip)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    require("PostgreSQL", *PG_ADDRESS)
    from sqlalchemy import create_engine, text

    name = f"outbox_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}_other" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_other_url(pg_url: str) -> str:
    """A second PostgreSQL database on the same server (``<session database>_other``),
    created once if absent and dropped with the session's: a caller's transaction on another
    database than the outbox's."""
    from sqlalchemy import create_engine, text

    name = pg_url.rsplit("/", 1)[1] + "_other"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"),
                                  {"name": name}).first()
            if exists is None:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return pg_url.rsplit("/", 1)[0] + f"/{name}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def pg_2pc_url() -> Iterator[str]:
    """A PostgreSQL of this test session's own with ``max_prepared_transactions=10`` (the
    shared server has none: two-phase commits need it), its database ``postgres`` and a
    second one, ``other``. Started from ``/usr/lib/postgresql/*/bin`` (as ``postgres`` when
    run as root) on a free port in a temporary directory, stopped by its PID; without those
    binaries it skips locally and fails under ``CI``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        message = "no PostgreSQL server binaries (initdb) for a two-phase server"
        if CI:
            pytest.fail(f"{message} (CI is set: server tests must not skip)")
        pytest.skip(message)
    bin_dir = os.path.dirname(found[-1])
    root = tempfile.mkdtemp(prefix="outbox-2pc-")
    data = os.path.join(root, "data")
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        shutil.chown(root, "postgres", "postgres")
        as_user = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
    subprocess.run([*as_user, f"{bin_dir}/initdb", "-D", data, "-U", "root", "--auth=trust",
                    "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
    port = _free_port()
    server = subprocess.Popen(
        [*as_user, f"{bin_dir}/postgres", "-D", data, "-p", str(port), "-k", root,
         "-c", "listen_addresses=127.0.0.1", "-c", "max_prepared_transactions=10",
         "-c", "fsync=off"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            ready = subprocess.run([f"{bin_dir}/pg_isready", "-h", "127.0.0.1", "-p",
                                    str(port)], capture_output=True)
            if ready.returncode == 0:
                break
            assert server.poll() is None, "the two-phase PostgreSQL exited at start"
            assert time.monotonic() < deadline, "the two-phase PostgreSQL never got ready"
            time.sleep(0.1)
        subprocess.run([f"{bin_dir}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U",
                        "root", "other"], check=True, capture_output=True)
        yield f"postgresql+psycopg://root@127.0.0.1:{port}/postgres"
    finally:
        server.terminate()  # by its PID: a smart shutdown
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    """A SQLite database file of this test's own."""
    return f"sqlite:///{tmp_path}/outbox.sqlite3"  # type: ignore[str-bytes-safe]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test using it runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(scope="session")
def redis_url() -> str:
    require("Redis", *REDIS_ADDRESS)
    return with_redis_db(REDIS_URL)


@pytest.fixture(scope="session")
def amqp_url() -> str:
    require("RabbitMQ", *AMQP_ADDRESS)
    return AMQP_URL


@pytest.fixture
def queue_name() -> str:
    """A Celery queue of this test's own, so tests sharing a broker never see each other."""
    return f"outbox-test-{uuid.uuid4().hex[:10]}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """pytest-xdist sends each report to the controller as UTF-8: a lone surrogate a test's
    handler logged (tests of undecodable file names) would crash the run, so the captured
    sections carry it as its ``\\udcff`` escape instead."""
    report.sections = [(title, _escaped(content)) for title, content in report.sections]


def _escaped(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


@pytest.fixture
def fast_pushes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of messages of each push the Redis fast publish path made (in the
    publishing thread), in order."""
    from celery_outbox.redis_publish import RedisPath

    counts: list[int] = []
    push = RedisPath.push

    def counting(self: RedisPath, messages: object, retries: int) -> bool:
        counts.append(len(messages))  # type: ignore[arg-type]
        return push(self, messages, retries)  # type: ignore[arg-type]

    monkeypatch.setattr(RedisPath, "push", counting)
    return counts


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Collect the session's garbage now, then freeze what is left (``gc.freeze``).

    After this hook an xdist worker reports itself finished, and execnet gives it 5 s to end
    before it sends it a SIGINT. pytest then runs two full collections (its unraisable
    exceptions' check, in ``pytest_unconfigure`` and at cleanup): over the heap a worker's
    share of the suite builds, a full collection took seconds, so the two outlasted the 5 s
    and the SIGINT landed in whatever ran then (hypothesis's gc callback), printing a
    ``KeyboardInterrupt`` traceback after a green run. Collected here, before the worker
    reports, what a finalizer raises is still reported; frozen, the two passes after are
    quick.
    """
    gc.collect()
    gc.freeze()
