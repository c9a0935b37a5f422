"""The worker's stats rollup: what the dashboard's charts read, counted in memory and written
in the background.

Each outcome a worker process writes is counted in memory (:meth:`Rollup.record`: a lock, a
dict entry, two bucket look-ups; never a statement) per (minute, job, tenant): the outcome,
and the wait (due -> start) and run (start -> outcome) times in the log-scale buckets of
:data:`~celery_outbox.models.STATS_BUCKETS`. A thread of the process writes what was counted
since its last write every :data:`FLUSH_INTERVAL` (``ExecutionStore.add_stats``: one
additive upsert per (minute, job, tenant) and per (minute, job) and (minute, tenant)
summed, all in one statement), added to rows keyed by this process's ``worker``
(``host:pid:nonce``): no other process writes them, so workers never contend, and readers
sum over workers. What is written is let go from memory: a late outcome of a minute
written before adds to its row (never replaces it). A write that fails puts its counts back,
written at the next flush. Flushes never overlap (the thread's, the last one at exit).

A rollup counts only once enabled (:meth:`Rollup.enable`: the Outbox enables its own when a
Celery worker starts), so an application that only pushes, or runs eagerly, keeps nothing.
After a fork the child starts afresh (its own worker id, rows and thread).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from celery_outbox.logfields import guarded
from celery_outbox.models import STATS_ALL, STATS_BUCKETS, STATS_OUTCOMES

log = guarded(logging.getLogger(__name__))

FLUSH_INTERVAL = timedelta(seconds=5)
"""How often a worker process writes what it counted since its last write."""
KEEP_UNWRITTEN = 60
"""Minutes kept in memory while the writes fail (the database down, or not migrated to the
stats table yet): older counts are dropped."""

_BUCKETS = len(STATS_BUCKETS) + 1
_OUTCOME = {name: i for i, name in enumerate(STATS_OUTCOMES)}
_WAIT = len(STATS_OUTCOMES)
_RUN = _WAIT + _BUCKETS
_WIDTH = _RUN + _BUCKETS
_COLUMNS = (*STATS_OUTCOMES, *(f"wait_{i}" for i in range(_BUCKETS)),
            *(f"run_{i}" for i in range(_BUCKETS)))


class StatsWriter(Protocol):
    """What a rollup writes through (``ExecutionStore.add_stats``)."""

    def add_stats(self, found: Sequence[Mapping[str, Any]]) -> None: ...


def bucket(seconds: float) -> int:
    """The histogram bucket of a duration of ``seconds`` (0 .. len(STATS_BUCKETS))."""
    return bisect_left(STATS_BUCKETS, seconds)


def summed(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``found`` (stats rows of (job, tenant): ``minute``, ``job_name``,
    ``organization_id``, ``worker`` and counts) with the rows a flush writes beside them:
    per (minute, worker) the sums per job, per tenant and of all (``*``). For a writer of
    its own (a fixture, a backfill) that reads back as the rollup's rows do."""
    out = [dict(r) for r in found]
    sums: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in found:
        for job, org in {(r["job_name"], STATS_ALL), (STATS_ALL, r["organization_id"]),
                         (STATS_ALL, STATS_ALL)}:
            key = (r["minute"], r["worker"], job, org)
            total = sums.setdefault(key, {"minute": r["minute"], "worker": r["worker"],
                                          "job_name": job, "organization_id": org})
            for column in _COLUMNS:
                total[column] = total.get(column, 0) + int(r.get(column, 0))
    return out + list(sums.values())


_ROLLUPS: weakref.WeakSet[Rollup] = weakref.WeakSet()


def _after_fork() -> None:
    for rollup in list(_ROLLUPS):
        rollup._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Rollup:
    """One process's counts, written by a thread of its own every ``interval`` to the rows of
    ``worker()`` (this process's ``host:pid:nonce``) through ``store``."""

    def __init__(self, store: StatsWriter, worker: Callable[[], str],
                 interval: timedelta = FLUSH_INTERVAL) -> None:
        self.store = store
        self.worker = worker
        self.interval = interval
        self.enabled = False
        """Whether :meth:`record` counts (set by :meth:`enable`)."""
        self._reset()
        _ROLLUPS.add(self)

    def _reset(self) -> None:
        """Start afresh (made, or in a forked child): no counts, no thread, a new lock."""
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._counts: dict[tuple[int, str, str], list[int]] = {}
        """Counted since the last write (what the next flush adds)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def enable(self) -> None:
        """Count from now on (the thread starts at the first count)."""
        self.enabled = True

    def record(self, job_name: str, organization_id: str | None, outcome: str,
               due: datetime | None, began: datetime | None, ended: datetime | None) -> None:
        """Count one written outcome (``outcome``: one of
        :data:`~celery_outbox.models.STATS_OUTCOMES`; another is ignored) of ``job_name``
        for ``organization_id``, in the minute of ``ended`` (aware; None: nothing counted);
        its wait ``began - due`` and run ``ended - began`` when known. No I/O."""
        index = _OUTCOME.get(outcome)
        if not self.enabled or index is None or ended is None:
            return
        key = (int(ended.timestamp() // 60), job_name, organization_id or "")
        wait = run = -1
        if began is not None:
            run = _RUN + bucket(max((ended - began).total_seconds(), 0.0))
            if due is not None:
                wait = _WAIT + bucket(max((began - due).total_seconds(), 0.0))
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                self._start()
            counts = self._counts.get(key)
            if counts is None:
                counts = self._counts[key] = [0] * _WIDTH
            counts[index] += 1
            if run >= 0:
                counts[run] += 1
            if wait >= 0:
                counts[wait] += 1

    def _start(self) -> None:
        """Start the flushing thread (caller holds the lock)."""
        self._pid = os.getpid()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="celery-outbox-rollup",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        failing = False
        while not self._stop.wait(self.interval.total_seconds()):
            try:
                self.flush()
            except Exception as exc:  # flush() raises the store's error: tried again later
                # Once at WARNING (a database not migrated yet fails every time), then DEBUG.
                log.log(logging.DEBUG if failing else logging.WARNING,
                        "celery_outbox: writing the worker's stats failed (%s); trying again "
                        "every %s s", " ".join(str(exc).split())[:300],
                        self.interval.total_seconds())
                failing = True
            else:
                failing = False

    def flush(self) -> int:
        """Add what was counted since the last write to the rows (one statement): each
        (job, tenant) row counted, and its minute's sums per job, per tenant and of all
        (``*``); the rows written. One flush at a time (a second waits for the first). A
        write that raises puts its counts back, to add at the next flush, and raises
        (:class:`~celery_outbox.errors.StorageError`)."""
        with self._flushing:
            with self._lock:
                taken, self._counts = self._counts, {}
            if not taken:
                return 0
            sums: dict[tuple[int, str, str], list[int]] = {}
            for (minute, job, org), counts in taken.items():
                for key in {(minute, job, STATS_ALL), (minute, STATS_ALL, org),
                            (minute, STATS_ALL, STATS_ALL)}:
                    total = sums.setdefault(key, [0] * _WIDTH)
                    for i, n in enumerate(counts):
                        total[i] += n
            worker = self.worker()
            found = [dict(zip(_COLUMNS, values, strict=True)) | {
                "minute": k[0], "job_name": k[1], "organization_id": k[2], "worker": worker}
                for k, values in [*taken.items(), *sums.items()]]
            try:
                self.store.add_stats(found)
            except BaseException:
                self._put_back(taken)
                raise
            return len(found)

    def _put_back(self, taken: dict[tuple[int, str, str], list[int]]) -> None:
        """Counts a write did not add: back into memory, with those counted meanwhile; the
        minutes older than :data:`KEEP_UNWRITTEN` before the newest are dropped (memory
        stays bounded while the writes fail)."""
        with self._lock:
            for key, counts in taken.items():
                mine = self._counts.get(key)
                if mine is None:
                    self._counts[key] = counts
                else:
                    for i, n in enumerate(counts):
                        mine[i] += n
            newest = max(k[0] for k in self._counts)
            for k in [k for k in self._counts if k[0] < newest - KEEP_UNWRITTEN]:
                del self._counts[k]  # never written

    def close(self) -> None:
        """Stop the thread and write what is left once (a failure logged): the process
        ends (after its drain handed back and wrote what it held), or its Outbox was
        replaced. Waits for a flush under way."""
        self._stop.set()
        try:
            self.flush()
        except Exception as exc:
            log.warning("celery_outbox: writing the worker's last stats failed: %s", exc)
