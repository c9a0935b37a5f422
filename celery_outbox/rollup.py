"""The worker's stats rollup: what the dashboard's charts read, counted in memory and written
in the background.

Each outcome a worker process writes is counted in memory (:meth:`Rollup.record`: a lock, a
dict entry, two bucket look-ups; never a statement) per (minute, job, tenant): the outcome,
and the wait (due -> start) and run (start -> outcome) times in the log-scale buckets of
:data:`~celery_outbox.models.STATS_BUCKETS`. A thread of the process writes the minutes that
changed every :data:`FLUSH_INTERVAL` (``ExecutionStore.write_stats``: one upsert per (minute,
job, tenant) and per (minute, job) and (minute, tenant) summed, all in one statement) as
absolute values to rows keyed by this process's
``worker`` (``host:pid:nonce``): no other process writes them, so workers never contend, a
failed write is simply written again at the next flush, and readers sum over workers.

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
"""How often a worker process writes the minutes whose counts changed."""
KEEP_MINUTES = 2
"""Minutes kept in memory once written (a late outcome of the previous minute still counts
into the row written before)."""
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
    """What a rollup writes through (``ExecutionStore.write_stats``)."""

    def write_stats(self, found: Sequence[Mapping[str, Any]]) -> None: ...


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
        self._counts: dict[tuple[int, str, str], list[int]] = {}
        self._dirty: set[tuple[int, str, str]] = set()
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
            self._dirty.add(key)

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
        """Write every minute whose counts changed since the last write (absolute values, one
        statement): its (job, tenant) rows that changed, and its sums per job, per tenant
        and of all (``*``); the rows written. A write that raises leaves them to write again,
        and raises (:class:`~celery_outbox.errors.StorageError`)."""
        with self._lock:
            keys = list(self._dirty)
            self._dirty.clear()
            minutes = {k[0] for k in keys}
            sums: dict[tuple[int, str, str], list[int]] = {}
            for (minute, job, org), counts in self._counts.items():
                if minute not in minutes:
                    continue
                for key in {(minute, job, STATS_ALL), (minute, STATS_ALL, org),
                            (minute, STATS_ALL, STATS_ALL)}:
                    total = sums.setdefault(key, [0] * _WIDTH)
                    for i, n in enumerate(counts):
                        total[i] += n
            found = [dict(zip(_COLUMNS, values, strict=True)) | {
                "minute": k[0], "job_name": k[1], "organization_id": k[2]}
                for k, values in [*((k, self._counts[k]) for k in keys), *sums.items()]]
        if not found:
            return 0
        worker = self.worker()
        for row in found:
            row["worker"] = worker
        try:
            self.store.write_stats(found)
        except BaseException:
            with self._lock:
                self._dirty.update(k for k in keys if k in self._counts)
                newest = max(k[0] for k in self._counts)
                for k in [k for k in self._counts if k[0] < newest - KEEP_UNWRITTEN]:
                    del self._counts[k]  # never written: memory stays bounded
                    self._dirty.discard(k)
            raise
        with self._lock:
            newest = max(k[0] for k in self._counts)
            for k in [k for k in self._counts
                      if k[0] < newest - KEEP_MINUTES and k not in self._dirty]:
                del self._counts[k]
        return len(found)

    def close(self) -> None:
        """Write what is left once (a failure logged), then stop the thread: the process
        ends, or its Outbox was replaced."""
        self._stop.set()
        try:
            self.flush()
        except Exception as exc:
            log.warning("celery_outbox: writing the worker's last stats failed: %s", exc)
