"""The matrix's cases, one test each (found at collection by :func:`discover`), and its
figures at the end of the run: pairs (path, named query), scenarios, passes, known failures."""

from __future__ import annotations

import os
import uuid
from collections import Counter

import pytest

from tests.conftest import PG_ADDRESS, PG_ADMIN_URL, port_open
from tests.matrix.cases import discover
from tests.matrix.faults import FAULTS
from tests.matrix.known import KNOWN_FAILING
from tests.matrix.world import DATABASES, dispose

_CREATED: list[str] = []
_OUTCOMES: Counter[str] = Counter()
_PAIRS: set[tuple[str, str]] = set()
_TEST = "test_matrix.py::test_fault["


def pytest_configure(config: pytest.Config) -> None:
    """A PostgreSQL database of the matrix's own, when a server answers (the subset of
    paths on PostgreSQL is collected only then)."""
    if not port_open(*PG_ADDRESS, timeout=0.5):
        return
    from sqlalchemy import create_engine, text

    name = f"outbox_matrix_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
        # Its scenarios commit often and need no durability across a crash of the server.
        conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    admin.dispose()
    _CREATED.append(name)
    DATABASES["postgresql"] = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    dispose()
    if not _CREATED:
        return
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for name in _CREATED:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
    _CREATED.clear()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    params = []
    for case in discover().cases():
        reason = KNOWN_FAILING.get(case.id)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(case, id=case.id, marks=marks))
    metafunc.parametrize("case", params)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _TEST not in report.nodeid:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        case = report.nodeid.split(_TEST, 1)[1].rstrip("]")
        path, query = case.split("-")[:2]
        _PAIRS.add((path, query))
        xfail = hasattr(report, "wasxfail")
        kind = ("known failure" if xfail and report.outcome == "skipped" else
                "XPASS(strict): fixed, remove from KNOWN_FAILING" if xfail else
                report.outcome)
        _OUTCOMES[kind] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _OUTCOMES:
        return
    scenarios = sum(_OUTCOMES.values())
    paths = {p for p, _ in _PAIRS}
    pg = {p for p in paths if p.startswith("pg_")}
    queries = {q for _, q in _PAIRS}
    terminalreporter.section("fault matrix")
    terminalreporter.write_line(
        f"{len(_PAIRS)} (path, query) pairs over {len(paths) - len(pg)} paths on SQLite and "
        f"{len(pg)} on PostgreSQL, {len(queries)} named queries; {scenarios} scenarios (each "
        f"occurrence of each query x each fault: {', '.join(FAULTS)}; exit on the worker's "
        "paths)")
    terminalreporter.write_line(", ".join(f"{n} {k}" for k, n in sorted(_OUTCOMES.items())))
    terminalreporter.write_line(f"KNOWN_FAILING lists {len(KNOWN_FAILING)} cases")
