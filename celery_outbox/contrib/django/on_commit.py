"""The dispatch of pushes made in a Django transaction: exactly the rows that committed.

Django's ``transaction.on_commit`` drops a callback when the ``atomic()`` savepoint it was
added in rolls back, but knows nothing of a raw ``transaction.savepoint()`` (a push made
after one that is then rolled back to would still be dispatched), and stops running its
callbacks at the first one that raises (a user's callback added before the push would drop
the dispatch). So the pushes of one transaction share one entry, :class:`Dispatches`, that

- is added last among the connection's callbacks (``connection.run_on_commit``, whose
  entries are ``(savepoint ids, callback, robust)`` on every Django the package supports),
  as ``on_commit`` adds one: ``captureOnCommitCallbacks()`` takes the callbacks added after
  its start by their position, so nothing may be put before the user's (it would shift an
  older callback into the capture's window and the push out of it). It is tagged with no
  savepoint: no savepoint's rollback drops it, a rollback of the whole transaction does (in
  a ``TestCase``'s transaction, which never commits, each push gets an entry of its own,
  tied to the open savepoints as ``on_commit`` ties a callback, where the test's rollback
  drops it);
- runs first at the commit all the same: :func:`run_first` wraps the connection's
  ``run_and_clear_commit_hooks`` (once per connection) to run the outbox's entries before
  the others, so no user's callback that raises, added before the push, stops it;
- after the commit, reads which of its ids have a row (named query ``existing_ids``, on
  Django's connection, by then in autocommit) and dispatches those only, each push's to its
  own dispatcher; it never raises into the committing caller, and runs once: run early by a
  capture (``execute=True``), it dispatches nothing more at the commit.

A transaction the push opened itself (no ``atomic()`` block around it) holds no savepoint of
the caller's: its entry dispatches without reading the rows back.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from sqlalchemy import Table

from celery_outbox.dispatch import Dispatch
from celery_outbox.queries.push import existing_ids

log = logging.getLogger("celery_outbox.executors")

READ_BACK_CHUNK = 5_000
"""Ids per read of the committed rows (one bound parameter each)."""


class Dispatches:
    """The outbox's one ``on_commit`` entry in one Django transaction on ``alias``: the
    dispatches of the pushes made in it into ``table`` (an outbox's executions table; the
    pushes of outboxes sharing it share the entry, each dispatched to its own dispatcher)."""

    def __init__(self, alias: str, table: Table, read_back: bool) -> None:
        self.alias = alias
        self.table = table
        self.read_back = read_back
        self.dispatches: list[Dispatch] = []
        self.ran = False

    def add(self, dispatch: Dispatch) -> None:
        self.dispatches.append(dispatch)

    def __call__(self) -> None:
        if self.ran:  # a capture ran it before the commit, or an outer capture again
            return
        self.ran = True
        try:
            present = self._committed()
        except Exception:  # after commit the rows are safe; never fail the caller here
            log.exception("celery_outbox: reading back the rows of a Django transaction after "
                          "its commit failed; the sweep dispatches them")
            return
        for dispatch in self.dispatches:
            items = [i for i in dispatch.items if present is None or i.execution_id in present]
            if not items:
                continue
            try:
                dispatch.dispatcher.dispatch(items)
            except Exception:
                log.exception("celery_outbox: a dispatch after commit failed (the sweep sends "
                              "it again)")

    def _committed(self) -> set[UUID] | None:
        """The ids among the dispatches' that have a row; None: all of them (nothing to
        read back)."""
        if not self.read_back:
            return None
        from celery_outbox.contrib.django.executor import DjangoTransaction

        ids = [i.execution_id for d in self.dispatches for i in d.items]
        tx = DjangoTransaction(self.alias)
        found: set[UUID] = set()
        for start in range(0, len(ids), READ_BACK_CHUNK):
            query = existing_ids(self.table, ids[start:start + READ_BACK_CHUNK])
            rows: list[UUID] = tx.run(query)
            found.update(rows)
        return found


def dispatches_of(connection: Any, table: Table, read_back: bool) -> Dispatches:
    """The :class:`Dispatches` entry of ``connection``'s transaction for ``table``: the one
    its callbacks hold (not run yet), else a new one added last among them, tied to no
    savepoint, and run first at the commit (:func:`run_first`).

    In the transaction of a Django ``TestCase``, which never commits, each push gets an entry
    of its own, added last and tied to the savepoints open (the test's own among them), as
    ``transaction.on_commit`` adds a callback: ``captureOnCommitCallbacks()`` takes the
    callbacks added after its start by their position, and the test's rollback drops them
    (an entry shared across tests, or begun before the capture, would never be captured)."""
    blocks = connection.atomic_blocks
    if blocks and getattr(blocks[0], "_from_testcase", False):
        created = Dispatches(connection.alias, table, read_back)
        connection.run_on_commit.append((set(connection.savepoint_ids), created, True))
        return created
    for entry in connection.run_on_commit:
        found = entry[1]
        if isinstance(found, Dispatches) and found.table is table and not found.ran:
            found.read_back = found.read_back or read_back
            return found
    run_first(connection)
    created = Dispatches(connection.alias, table, read_back)
    connection.run_on_commit.append((set(), created, True))
    return created


def run_first(connection: Any) -> None:
    """Make ``connection`` run the outbox's entries (:class:`Dispatches`) before its other
    ``on_commit`` callbacks when it runs them after a commit; once per connection (Django
    keeps one per thread and alias).

    Django runs the callbacks in ``run_and_clear_commit_hooks()``, in the order added, and
    stops at the first one that raises unless it is ``robust``. The entry cannot be put first
    in the list (``captureOnCommitCallbacks()`` counts positions), so the method is wrapped on
    the connection itself: the outbox's entries are taken out of the list and run (they never
    raise), then Django's own runs the rest, unchanged, in their order."""
    if getattr(connection.__dict__.get("run_and_clear_commit_hooks"), "outbox_first", False):
        return
    own = connection.run_and_clear_commit_hooks

    def run_and_clear_commit_hooks() -> None:
        connection.validate_no_atomic_block()
        callbacks = connection.run_on_commit
        ours = [entry[1] for entry in callbacks if isinstance(entry[1], Dispatches)]
        if ours:
            connection.run_on_commit = [entry for entry in callbacks
                                        if not isinstance(entry[1], Dispatches)]
            for entry in ours:
                entry()
        own()

    run_and_clear_commit_hooks.outbox_first = True  # type: ignore[attr-defined]
    connection.run_and_clear_commit_hooks = run_and_clear_commit_hooks
