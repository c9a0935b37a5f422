"""The dispatch of pushes made in a Django transaction: exactly the rows that committed.

Django's ``transaction.on_commit`` drops a callback when the ``atomic()`` savepoint it was
added in rolls back, but knows nothing of a raw ``transaction.savepoint()`` (a push made
after one that is then rolled back to would still be dispatched), and stops running its
callbacks at the first one that raises (a user's callback added before the push would drop
the dispatch). So each push's dispatch is an entry of its own, :class:`Dispatches`, that

- is added last among the connection's callbacks (``connection.run_on_commit``, whose
  entries are ``(savepoint ids, callback, robust)`` on every Django the package supports),
  as ``on_commit`` adds one: ``captureOnCommitCallbacks()`` takes the callbacks added after
  its start by their position, so nothing may be put before the user's (it would shift an
  older callback into the capture's window and the push out of it), and an entry shared by
  the pushes of a transaction would be missed by a capture begun after its first push. It
  is tied to no savepoint: no savepoint's rollback drops it, a rollback of the whole
  transaction does (in a ``TestCase``'s transaction, which never commits, it is tied to the
  open savepoints as ``on_commit`` ties a callback, and the test's rollback drops it);
- runs first at the commit all the same, with the other entries of the outbox in that
  transaction: :func:`run_first` wraps the connection's ``run_and_clear_commit_hooks``
  (once per connection) to take them out of the list and run them together before the
  others, so no user's callback that raises, added before a push, stops its dispatch;
- after the commit, reads which of its ids have a row (named query ``existing_ids``, on
  Django's connection, by then in autocommit; the entries of one table at the commit in one
  read) and dispatches those only, each push's to its own dispatcher; it never raises into
  the committing caller, and runs once: run early by a capture (``execute=True``), it
  dispatches nothing more at the commit or in an enclosing capture.

A transaction the push opened itself (no ``atomic()`` block around it) holds no savepoint of
the caller's: its entry dispatches without reading the rows back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from sqlalchemy import Table

from celery_outbox.dispatch import Dispatch
from celery_outbox.queries.push import existing_ids

log = logging.getLogger("celery_outbox.executors")

READ_BACK_CHUNK = 5_000
"""Ids per read of the committed rows (one bound parameter each); fewer on a backend whose
``features.max_query_params`` is lower (Django's SQLite: 999, the limit of a SQLite built
with its old default)."""


class Dispatches:
    """The outbox's ``on_commit`` entry for one push in a Django transaction on ``alias``:
    its dispatch (:meth:`add`) of rows of ``table`` (an outbox's executions table)."""

    def __init__(self, alias: str, table: Table, read_back: bool) -> None:
        self.alias = alias
        self.table = table
        self.read_back = read_back
        self.dispatches: list[Dispatch] = []
        self.ran = False

    def add(self, dispatch: Dispatch) -> None:
        self.dispatches.append(dispatch)

    def __call__(self) -> None:
        run_together([self])


def run_together(entries: Iterable[Dispatches]) -> None:
    """Run the entries not run yet (a capture may have run some): per alias and table, one
    read back of the ids whose rows must be checked, then each dispatch of the rows present,
    in the order of the entries. Never raises (after the commit the rows are safe: what is
    not dispatched here, the sweep dispatches)."""
    groups: dict[tuple[str, int], list[Dispatches]] = {}
    for entry in entries:
        if entry.ran:
            continue
        entry.ran = True
        groups.setdefault((entry.alias, id(entry.table)), []).append(entry)
    for group in groups.values():
        try:
            present = _committed(group)
        except Exception:  # after commit the rows are safe; never fail the caller here
            log.exception("celery_outbox: reading back the rows of a Django transaction after "
                          "its commit failed; the sweep dispatches them")
            continue
        for entry in group:
            for dispatch in entry.dispatches:
                items = [i for i in dispatch.items
                         if not entry.read_back or i.execution_id in present]
                if not items:
                    continue
                try:
                    dispatch.dispatcher.dispatch(items)
                except Exception:
                    log.exception("celery_outbox: a dispatch after commit failed (the sweep "
                                  "sends it again)")


def _committed(group: list[Dispatches]) -> set[UUID]:
    """The ids among those of the entries that read back (one alias and table) that have a
    row."""
    from celery_outbox.contrib.django.executor import DjangoTransaction

    ids = [i.execution_id for e in group if e.read_back for d in e.dispatches for i in d.items]
    found: set[UUID] = set()
    if not ids:
        return found
    tx = DjangoTransaction(group[0].alias)
    from django.db import connections

    limit = connections[group[0].alias].features.max_query_params
    chunk = min(READ_BACK_CHUNK, limit) if limit else READ_BACK_CHUNK
    for start in range(0, len(ids), chunk):
        query = existing_ids(group[0].table, ids[start:start + chunk])
        rows: list[UUID] = tx.run(query)
        found.update(rows)
    return found


def dispatches_of(connection: Any, table: Table, read_back: bool) -> Dispatches:
    """A new :class:`Dispatches` entry for a push in ``connection``'s transaction into
    ``table``, added last among its callbacks as ``transaction.on_commit`` adds one, where
    ``captureOnCommitCallbacks()`` (which takes the callbacks added after its start by their
    position) finds it; tied to no savepoint, and run first at the commit
    (:func:`run_first`).

    In the transaction of a Django ``TestCase``, which never commits, it is tied to the
    savepoints open (the test's own among them), as ``transaction.on_commit`` ties a
    callback: the test's rollback drops it (an entry outliving its test would be run by none
    of the next test's captures)."""
    run_first(connection)
    created = Dispatches(connection.alias, table, read_back)
    blocks = connection.atomic_blocks
    testcase = bool(blocks) and getattr(blocks[0], "_from_testcase", False)
    sids = set(connection.savepoint_ids) if testcase else set()
    connection.run_on_commit.append((sids, created, True))
    return created


def run_first(connection: Any) -> None:
    """Make ``connection`` run the outbox's entries (:class:`Dispatches`) before its other
    ``on_commit`` callbacks when it runs them after a commit; once per connection (Django
    keeps one per thread and alias).

    Django runs the callbacks in ``run_and_clear_commit_hooks()``, in the order added, and
    stops at the first one that raises unless it is ``robust``. The entries cannot be put
    first in the list (``captureOnCommitCallbacks()`` counts positions), so the method is
    wrapped on the connection itself: the outbox's entries are taken out of the list and run
    together (they never raise), then Django's own runs the rest, unchanged, in their
    order."""
    if getattr(connection.__dict__.get("run_and_clear_commit_hooks"), "outbox_first", False):
        return
    own = connection.run_and_clear_commit_hooks

    def run_and_clear_commit_hooks() -> None:
        connection.validate_no_atomic_block()
        callbacks = connection.run_on_commit
        ours = [entry[1] for entry in callbacks if isinstance(entry[1], Dispatches)]
        if ours:
            # Out of the list while they run, the user's callbacks with them, as Django's
            # own takes the list out first: a commit made during a dispatch (an eager task
            # writing through the ORM) runs its own callbacks only.
            connection.run_on_commit = []
            run_together(ours)
            connection.run_on_commit = [
                entry for entry in callbacks if not isinstance(entry[1], Dispatches)
            ] + connection.run_on_commit
        own()

    run_and_clear_commit_hooks.outbox_first = True  # type: ignore[attr-defined]
    connection.run_and_clear_commit_hooks = run_and_clear_commit_hooks
