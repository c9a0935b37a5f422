"""The cases of the matrix that fail today, each for a known defect of the worker or the
executor: strict xfail, so a fix turns them into XPASS(strict) failures and its entries are
removed with it (``python -m tests.matrix`` lists both kinds of change).

Keys are case ids, ``path-query-occurrence-fault`` (:attr:`tests.matrix.cases.Case.id`;
``pg_<path>``: on PostgreSQL, some only with ``OUTBOX_TEST_FAULTS=full``); one list per
defect class, under its reason.
"""

from __future__ import annotations

POOL_TIMEOUT = (
    "the direct psycopg path's pool TimeoutError is not StorageError: the pool's checkout "
    "raises outside the direct path's error mapping, so sqlalchemy.exc.TimeoutError reaches "
    "the caller raw (a push, or Runner.run, which then hands nothing back); raised by the "
    "write of an outcome, it is no StorageError either, so that outcome is not tried again "
    "(pg_hand_back-finish_fenced: on the way out of a run that failed already, the held "
    "success is dropped and its handler runs again)"
)

_POOL_TIMEOUT_CASES = [
    "pg_worker-claim_rows-1-pool",
    "pg_worker-finish_and_start-1-pool",
    "pg_worker-finish_and_start-2-pool",
    "pg_worker-finish_fenced-1-pool",
    "pg_worker_window-claim_rows-1-pool",
    "pg_worker_window-start_unflushed-1-pool",
    "pg_worker_window-start_unflushed-2-pool",
    "pg_worker_window-finish_fenced-1-pool",
    "pg_worker_window-finish_fenced-2-pool",
    "pg_worker_window-finish_fenced-3-pool",
    "pg_push-insert_rows-1-pool",
    "pg_worker_one-claim_rows-1-pool",
    "pg_worker_one-finish_fenced-1-pool",
    "pg_hand_back-claim_rows-1-pool",
    "pg_hand_back-finish_fenced-1-pool",  # raw in the way out: the held success not tried again
    "pg_lease_watch-claim_rows-1-pool",
    "pg_lease_watch-finish_fenced-1-pool",
    "pg_heartbeat-claim_rows-1-pool",
    "pg_heartbeat-finish_and_start-1-pool",
    "pg_heartbeat-finish_fenced-1-pool",
    "pg_lease_watch-finish_and_start-1-pool",
]

KNOWN_FAILING: dict[str, str] = dict.fromkeys(_POOL_TIMEOUT_CASES, POOL_TIMEOUT)
