"""The fault matrix: every (path, named query, occurrence) a clean run shows, times every
fault (:mod:`tests.matrix.faults`), each a scenario checked against the invariants of
:class:`tests.matrix.world.World`. Cases in :data:`tests.matrix.known.KNOWN_FAILING` are
strict xfails. ``pytest tests/matrix`` runs only the matrix; the summary at the end of the
run gives its figures.
"""

from __future__ import annotations

from celery_outbox.queries import QUERIES
from tests.conftest import PG_ADDRESS, require
from tests.matrix.cases import Case, discover, run_case, variants
from tests.matrix.known import KNOWN_FAILING
from tests.matrix.world import DATABASES

NOT_REACHED: dict[str, str] = {
    "existing_ids": "the read-back after a Django commit (tests/model/test_django_joins.py "
                    "runs Django's joins)",
    "database_now": "the matrix's clock stands in for the database's (store.db_clock)",
    "key_rollback": "a keyed push whose insert failed (PostgreSQL: rolls back to its "
                    "savepoint): reached only after a fault",
    "key_holders": "a keyed push whose key is taken (no path pushes a taken key)",
    "key_holder": "an admin retry whose key another active execution holds",
    "trim_measure": "a trim of more rows than its probes settle",
    "trim_count_kept": "a trim of more rows than its probes settle",
    "capped_counts": "the dashboard's reads (no path)",
    "oldest_pending": "the dashboard's reads (no path)",
    "last_finished": "the dashboard's reads (no path)",
    "outcomes_since": "the dashboard's reads (no path)",
    "get_visible": "the dashboard's reads (no path)",
    "recent_failures": "the dashboard's reads (no path)",
    "matching_ids": "the dashboard's reads (no path)",
    "bulk_delete": "the dashboard's bulk delete (no path; tests/web/test_bulk_pages.py)",
    "status_of": "a read no path's step runs",
    "table_gauges": "the metrics' read (no path); one that fails answers table_scrape_ok 0 "
                    "(tests/metrics/test_table.py)",
    "revoke_session": "the dashboard's logout (no path; tests/web/test_sessions.py)",
    "session_revoked": "the dashboard's session check (no path; one that fails answers 503, "
                       "tests/web/test_sessions.py)",
    "purge_revoked_sessions": "the dashboard's logout (no path; tests/web/test_sessions.py)",
    "add_stats": "a worker's rollup flush (its thread writes a failed flush again; "
                 "tests/integration/test_stats.py)",
    "stats_series": "the dashboard's charts (no path; tests/integration/test_stats.py)",
    "stats_backlog": "the dashboard's charts (no path; tests/integration/test_stats.py)",
    "stats_rates": "the dashboard's queues view (no path; tests/integration/test_stats.py)",
    "stats_workers": "the dashboard's workers view (no path; tests/integration/test_stats.py)",
    "running_holders": "the dashboard's workers view (no path; tests/integration/test_stats.py)",
    "active_counts": "the dashboard's queues view (no path; tests/web/test_stats_pages.py)",
    "add_pause": "the admin's pause (no path; tests/integration/test_pauses.py, the e2e "
                 "tests/e2e/test_pause.py)",
    "remove_pause": "the admin's resume (no path; tests/integration/test_pauses.py)",
    "encrypted_payloads": "the key rotation's read (`outbox rotate-keys`, no path; "
                          "tests/integration/test_encryption.py)",
    "rewrite_payload": "the key rotation's write, guarded by the token it replaces (no path; "
                       "tests/integration/test_encryption.py)",
    "batch_by_id": "a batch's read (outbox.batch, the CLI's and the dashboard's; no path; "
                   "tests/integration/test_batches.py)",
    "batch_of_callback": "a callback's ctx.batch, a read in its handler, whose failure is the "
                         "handler's (no path; tests/integration/test_batches.py)",
    "batch_of_execution": "an execution detail's batch (the dashboard's, the CLI's; no path; "
                          "tests/integration/test_batches.py)",
}
"""Named queries no path's clean step runs, and why. A query registered later that no path
reaches fails :func:`test_every_query_is_reached` until a path runs it or it is listed."""


PG_ONLY = {"start_unflushed", "finish_and_start", "key_savepoint", "key_release"}
"""Reached only on PostgreSQL: not reached when no server answers (locally)."""


def test_every_path_is_sound_without_a_fault() -> None:
    found = discover()
    assert {p: v for p, v in found.clean.items() if v} == {}
    assert set(found.counts) == set(variants())


def test_every_query_is_reached() -> None:
    reached = {q for counts in discover().counts.values() for q in counts}
    if "postgresql" not in DATABASES:
        reached |= PG_ONLY
    assert set(QUERIES) - reached - set(NOT_REACHED) == set(), (
        "named queries no path of the matrix runs: add a path (tests/matrix/paths.py) or "
        "list them in NOT_REACHED with the reason")
    assert set(NOT_REACHED) & reached == set(), "NOT_REACHED lists queries a path now runs"
    assert set(NOT_REACHED) <= set(QUERIES), "NOT_REACHED lists queries no longer registered"


def test_known_failing_are_cases() -> None:
    """A KNOWN_FAILING entry names a case the matrix has (a renamed query or path leaves
    none behind): every entry of a variant collected in this run."""
    ids = {case.id for case in discover().cases()}
    collected = set(variants())
    stale = {k for k in KNOWN_FAILING if k.split("-", 1)[0] in collected and k not in ids}
    assert stale == set()


def test_postgresql_subset_runs() -> None:
    require("PostgreSQL", *PG_ADDRESS)  # absent locally: the subset is not collected
    assert "postgresql" in DATABASES
    assert any(v.startswith("pg_") for v in discover().counts)


def test_fault(case: Case) -> None:
    violations, _ = run_case(case)
    assert violations == [], "\n".join(violations)
