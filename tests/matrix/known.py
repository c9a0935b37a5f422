"""The cases of the matrix that fail today, each for a known defect of the worker or the
executor: strict xfail, so a fix turns them into XPASS(strict) failures and its entries are
removed with it (``python -m tests.matrix`` lists both kinds of change).

Keys are case ids, ``path-query-occurrence-fault`` (:attr:`tests.matrix.cases.Case.id`;
``pg_<path>``: on PostgreSQL, some only with ``OUTBOX_TEST_FAULTS=full``); one list per
defect class, under its reason, as

    _REASON = "what the defect is, and what the cases show of it"
    KNOWN_FAILING = dict.fromkeys(["pg_push-insert_rows-1-pool", ...], _REASON)

None today: the last class (the direct psycopg path's pool ``TimeoutError`` reaching the
caller raw) went with the executors' mapping of every database error to ``StorageError``.
"""

from __future__ import annotations

KNOWN_FAILING: dict[str, str] = {}
