"""Named queries: pure functions from (tables, dialect, arguments) to a :class:`Query`.

No engine, no I/O: a query is a statement, its parameters, the shape of its result and a
mapper; an executor (:mod:`celery_outbox.executors`) runs it. Every builder is registered in
:data:`QUERIES` under its name with a one-line purpose; statements that do not depend on the
arguments' shape are built once per table. One module per area of the store.
"""

from __future__ import annotations

# Every area's builders, so QUERIES names them all once the package is imported.
from celery_outbox.queries import (
    admin,
    batches,
    cron,
    dashboard,
    debounce,
    identity,
    keys,
    loop,
    metrics,
    pauses,
    push,
    sessions,
    stats,
    sweep,
    trim,
    worker,
)
from celery_outbox.queries.base import (
    QUERIES,
    Named,
    Plan,
    Query,
    Row,
    Shape,
    adrive,
    drive,
    execute,
    first,
    named,
    rowcount,
    rows,
    single,
)

__all__ = [
    "QUERIES",
    "Named",
    "Plan",
    "Query",
    "Row",
    "Shape",
    "admin",
    "adrive",
    "batches",
    "cron",
    "dashboard",
    "debounce",
    "drive",
    "execute",
    "first",
    "identity",
    "keys",
    "loop",
    "metrics",
    "named",
    "pauses",
    "push",
    "rowcount",
    "rows",
    "sessions",
    "single",
    "stats",
    "sweep",
    "trim",
    "worker",
]
