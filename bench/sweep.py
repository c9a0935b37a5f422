"""``python -m bench sweep``: sweep and trim cost on a 1,000,000-row table vs a 1,000-row one.

The sweep and trim cost must grow with the work due, not with the table. One sweep and
one trim are timed on a table holding 1,000,000 finished rows plus 1,000 due rows (``big``),
and on a table holding only the same 1,000 due rows (``small``), side by side in rounds (the
two tables alternate which goes first); the ratio big / small must stay below 2x. The
dispatcher records the ids it is handed and publishes nothing, so the broker is not timed.

The first trim of each table is timed apart: it writes the trim's watermarks (a full count,
a walk over every kept row); the timed trims count what finished since (nothing, or the
surplus rows, which are older than every kept row).

Then the statements of the named queries (``celery_outbox/queries/``) that stage, redispatch,
rescue and trim issued (captured with a ``before_cursor_execute`` listener while a sweep and a
trim run on the big table, each labelled with the query the store's executor ran: an observer
on the executor names them) are run again under ``EXPLAIN (ANALYZE, BUFFERS)``, each in a
transaction rolled back, and their plans summarised: which indexes, any sequential scan of
the table. For the trim, every statement of its first job, in one transaction as the trim
runs them, each labelled with its query's name.

``--backlog N`` adds an experiment on the big table: the stager working through N due
scheduled rows (an outage's backlog, all priorities), with the shipped indexes and then
without the ``(priority, scheduled_at) WHERE status = 'scheduled'`` one.

Options: ``--finished N`` (default 1,000,000), ``--rounds N`` (default 7), ``--surplus N``
(rows the second trim figure deletes, default 1,000), ``--plans`` (print the full plans),
``--backlog N`` (default 0: skipped), ``--quick`` (100,000 finished rows, 3 rounds).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event, text

from bench import sweep_data as data
from celery_outbox import Outbox
from celery_outbox.queries import Query

SWEEP = {"stage": "stage_due", "rescue": "expired_leases", "redispatch": "redispatch_stale"}
"""The sweep transitions explained, each by its first query (the batch it picks or reads)."""
TRIM_LOCK = "trim_lock_marks"
"""The query each job's trim begins with (after creating its watermarks, the first time)."""
TARGET = 2.0


@dataclass
class Table:
    """One side of the comparison: its outbox, dispatcher, and the timings of each figure."""

    name: str
    outbox: Outbox
    dispatcher: data.RecordingDispatcher
    finished: int
    times: dict[str, list[float]] = field(default_factory=dict)

    def add(self, figure: str, seconds: float) -> None:
        self.times.setdefault(figure, []).append(seconds)


@dataclass(frozen=True)
class Captured:
    transition: str
    statement: str
    parameters: Any
    query: str = ""
    """The named query the statement ran for (``trim_measure``), when not the transition's
    own first query."""

    @property
    def label(self) -> str:
        return f"{self.transition} ({self.query})" if self.query else self.transition


FIGURES = {
    "sweep": "one sweep (stage 400, redispatch 300, rescue 300)",
    "trim": "one trim, nothing to delete",
    "trim_surplus": "one trim deleting the surplus",
    "trim_finished": "one trim after rows finished",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sweep",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=1_000_000,
                        help="finished rows in the big table (default 1,000,000)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--surplus", type=int, default=1000,
                        help="rows the second trim figure deletes (default 1,000)")
    parser.add_argument("--plans", action="store_true", help="print the full plans")
    parser.add_argument("--backlog", type=int, default=0,
                        help="also time the stager through N due rows (default 0: skipped)")
    parser.add_argument("--quick", action="store_true", help="100,000 finished rows, 3 rounds")
    args = parser.parse_args(argv)
    finished = 100_000 if args.quick else args.finished
    rounds = 3 if args.quick else args.rounds

    # The services log each run that moved rows (a WARNING for rescues and redispatches).
    logging.getLogger("celery_outbox.maintenance").setLevel(logging.ERROR)
    data.ensure_database()
    print(f"sweep / trim benchmark on {platform.node()}: {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}, {_server_version()}, load average {_load()}")
    print(f"  database {data.DATABASE_URL}; due rows {data.DUE}; "
          f"{rounds} rounds; dispatcher: recording, no broker")
    tables = [_table("big", finished), _table("small", 0)]
    for table in tables:
        started = time.perf_counter()
        data.load(table.outbox, table.finished)
        print(f"  loaded {table.name}: {data.finished_rows(table.outbox):,} finished + "
              f"{data.DUE.total:,} due rows in {time.perf_counter() - started:.1f} s",
              flush=True)
    try:
        for table in tables:  # warm-up: connections, compiled statements, caches
            _sweep(table)
            first = _trim(table)  # counts every kept row: the trim's watermarks are new
            print(f"  first trim of {table.name} (a full count, watermarks written): "
                  f"{first * 1e3:.1f} ms", flush=True)
        for n in range(rounds):
            for table in tables if n % 2 == 0 else tables[::-1]:
                table.add("sweep", _sweep(table))
                table.add("trim", _trim(table))
                table.add("trim_surplus", _trim(table, surplus=args.surplus))
                table.add("trim_finished", _trim(table, finished=args.surplus))
        _report(tables, args.surplus)
        plans = _explain(tables[0])
        _report_plans(plans, full=args.plans, table=tables[0].outbox.tables.executions.name)
        if args.backlog:
            _backlog(tables[0], args.backlog, full=args.plans)
    finally:
        for table in tables:
            table.outbox.engine.dispose()
    print(f"\nload average at the end: {_load()}")
    return 0


def _table(name: str, finished: int) -> Table:
    outbox, dispatcher = data.make_outbox(f"bench_sweep_{name}", finished)
    return Table(name, outbox, dispatcher, finished)


def _sweep(table: Table) -> float:
    """Time one sweep on a fresh set of due rows; check it moved all of them."""
    _fresh(table)
    before = table.dispatcher.dispatched
    started = time.perf_counter()
    result = table.outbox.sweep(now=data.NOW)
    elapsed = time.perf_counter() - started
    due = data.DUE
    expected = (due.scheduled, due.running_retry, due.running_fail, due.pending)
    got = (result.staged, result.rescued, result.failed, result.redispatched)
    if got != expected or table.dispatcher.dispatched - before != due.total - due.running_fail:
        raise RuntimeError(f"{table.name}: sweep moved {result}, expected {expected}")
    return elapsed


def _trim(table: Table, surplus: int = 0, finished: int = 0) -> float:
    """Time one trim; with ``surplus``, that many trimmable rows were added first (older than
    every kept row); with ``finished``, that many rows finished since the last trim (newer
    than every row): the big table's jobs then delete as many of their oldest kept rows."""
    _fresh(table, surplus)
    if finished:
        data.add_finished(table.outbox, finished)
    started = time.perf_counter()
    result = table.outbox.trim(now=data.NOW)
    elapsed = time.perf_counter() - started
    if result.deleted != surplus + finished:
        raise RuntimeError(f"{table.name}: trim deleted {result.deleted}, "
                           f"expected {surplus + finished}")
    return elapsed


def _fresh(table: Table, surplus: int = 0) -> None:
    """Due rows as loaded, ``surplus`` trimmable rows, dead rows vacuumed away."""
    data.reset_due(table.outbox)
    if surplus:
        data.add_surplus(table.outbox, surplus)
    data.vacuum(table.outbox)


# -- plans ----------------------------------------------------------------------------------


@contextmanager
def _named(outbox: Outbox, on_statement: Any = lambda cursor, statement, parameters: (
        statement, parameters), named: list[tuple[str, Any]] | None = None,
) -> Iterator[list[tuple[str, Any]]]:
    """Name every statement run on ``outbox.engine`` after the query the store's executor ran
    it for: ``on_statement(cursor, statement, parameters)`` is called before each statement
    runs and its answer kept; when the executor reports the query done (its observer), the
    answers of the statements since the last report are added to ``named`` as ``(query
    name, answer)``; by default the answer is ``(statement, parameters)``. Exact because the
    bench runs one query at a time, and every statement of the sweep and the trim is a
    query's."""
    named = [] if named is None else named
    pending: list[Any] = []

    def listener(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                 executemany: bool) -> None:
        pending.append(on_statement(cursor, statement, parameters))

    def observer(query: Query[Any], seconds: float) -> None:
        named.extend((query.name, answer) for answer in pending)
        pending.clear()

    observers = outbox.store.executor.observers
    observers.append(observer)
    event.listen(outbox.engine, "before_cursor_execute", listener)
    try:
        yield named
    finally:
        event.remove(outbox.engine, "before_cursor_execute", listener)
        observers.remove(observer)


def _firsts(captured: list[tuple[str, Any]]) -> dict[str, Captured]:
    """The first statement of each sweep transition (:data:`SWEEP`) among ``captured``."""
    firsts: dict[str, Captured] = {}
    for transition, query in SWEEP.items():
        found = next(((statement, parameters) for name, (statement, parameters) in captured
                      if name == query), None)
        if found is not None:
            firsts[transition] = Captured(transition, *found)
    return firsts


def _explain(table: Table) -> list[tuple[Captured, list[str]]]:
    """Plans on ``table``: the first statement of each sweep transition, captured during
    one sweep and run again under EXPLAIN (ANALYZE, BUFFERS) on the same rows (due rows as
    before the sweep), rolled back; then every statement of the trim of the first job,
    explained where it runs (:func:`_explain_in_place`), in a trim of 1,000 surplus rows
    and in a trim after 1,000 rows finished."""
    _fresh(table)
    with _named(table.outbox) as captured:
        table.outbox.sweep(now=data.NOW)
    firsts = _firsts(captured)
    sweep = [firsts[t] for t in ("stage", "redispatch", "rescue")]
    _fresh(table)
    plans = [(c, _explain_one(table.outbox, [c])[0]) for c in sweep]
    _fresh(table, 1000)
    with _explain_in_place(table.outbox, "trim, 1,000 surplus") as surplus:
        table.outbox.trim(now=data.NOW)
    _fresh(table)
    data.add_finished(table.outbox, 1000)
    with _explain_in_place(table.outbox, "trim, 1,000 finished") as finished:
        table.outbox.trim(now=data.NOW)
    return plans + surplus + finished


@contextmanager
def _explain_in_place(
    outbox: Outbox, label: str
) -> Iterator[list[tuple[Captured, list[str]]]]:
    """EXPLAIN (ANALYZE, BUFFERS) each statement of the first job's trim just before it
    runs, on its own connection and transaction, inside a savepoint rolled back: the plans
    of the very rows and watermarks that statement sees (a statement run again after the
    trim would find its rows deleted and its watermark moved)."""
    plans: list[tuple[Captured, list[str]]] = []
    named: list[tuple[str, Any]] = []

    def explain(cursor: Any, statement: str, parameters: Any) -> Any:
        if sum(name == TRIM_LOCK for name, _ in named) > 1:
            return None  # the second job's trim has begun: nothing more to explain
        first = parameters[0] if isinstance(parameters, list) else parameters
        cursor.execute("SAVEPOINT bench_explain")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, first)
        lines = [row[0] for row in cursor.fetchall()]
        cursor.execute("ROLLBACK TO SAVEPOINT bench_explain")
        return statement, parameters, lines

    with _named(outbox, explain, named):
        yield plans
    locks = 0
    for name, answer in named:  # the first job's: from its first lock to the second's
        locks += name == TRIM_LOCK
        if locks == 1 and answer is not None:
            statement, parameters, lines = answer
            plans.append((Captured(label, statement, parameters, name), lines))


def _explain_one(outbox: Outbox, statements: list[Captured]) -> list[list[str]]:
    """EXPLAIN (ANALYZE, BUFFERS) of captured statements, one after the other in ONE
    transaction rolled back (what a statement sets for its transaction, the next sees)."""
    plans = []
    with outbox.engine.connect() as conn:
        trans = conn.begin()
        try:
            for c in statements:
                parameters = c.parameters[0] if isinstance(c.parameters, list) else c.parameters
                result = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + c.statement,
                                              parameters)
                plans.append([row[0] for row in result])
        finally:
            trans.rollback()
    return plans


def _plan_summary(lines: list[str], table: str) -> tuple[str, list[str], bool]:
    """(execution time, the scans used, whether the table is read by a sequential scan)."""
    scans = []
    for line in lines:
        m = re.search(r"((?:Bitmap Index|Index Only|Index|Seq|Tid) Scan)(?: using| on) (\S+)"
                      r"(?: on (\S+))?", line)
        if m:
            scans.append(f"{m.group(1)} {m.group(2)}")
    seq = any(f"Seq Scan on {table}" in line for line in lines)
    total = next((line.split(":", 1)[1].strip() for line in lines
                  if line.startswith("Execution Time")), "?")
    return total, list(dict.fromkeys(scans)), seq


def _backlog(table: Table, count: int, *, full: bool) -> None:
    """Time the stager through ``count`` due rows, with and without the priority index."""
    outbox = table.outbox
    print(f"\nstager through a backlog of {count:,} due rows on the big table "
          f"(batches of {outbox.config.batch_size}):")
    print("\n| indexes | stage, s | batches | first batch's pick |\n|---|---:|---:|---|")
    for without in (False, True):
        if without:
            data.priority_index(outbox, present=False)
        try:
            _fresh(table)
            data.add_backlog(outbox, count)
            data.vacuum(outbox)
            with _named(outbox) as captured:
                started = time.perf_counter()
                staged = outbox.sweeper.stager.run_once(data.NOW).staged
                elapsed = time.perf_counter() - started
            if staged != count + data.DUE.scheduled:
                raise RuntimeError(f"staged {staged}, expected {count + data.DUE.scheduled}")
            _fresh(table)
            data.add_backlog(outbox, count)
            data.vacuum(outbox)
            [lines] = _explain_one(outbox, [_firsts(captured)["stage"]])
            _total, scans, _seq = _plan_summary(lines, outbox.tables.executions.name)
            sort = next((line.strip() for line in lines if "Sort Method" in line), "no sort")
            label = "shipped without (priority, scheduled_at)" if without else "shipped"
            batches = sum(1 for name, _ in captured if name == SWEEP["stage"])
            print(f"| {label} | {elapsed:.2f} | {batches} | {'; '.join(scans)}; {sort} |")
            if full:
                print("\n".join(lines))
        finally:
            if without:
                data.priority_index(outbox, present=True)
            data.reset_due(outbox)


# -- report ---------------------------------------------------------------------------------


def _report(tables: list[Table], surplus: int) -> None:
    big, small = tables
    print(f"\nfigures (median of {len(big.times['sweep'])} rounds, milliseconds):")
    rows = []
    for key, label in FIGURES.items():
        if key == "trim_surplus":
            label = f"one trim deleting {surplus:,} rows"
        if key == "trim_finished":
            label = f"one trim after {surplus:,} rows finished (deleting as many)"
        b, s = big.times[key], small.times[key]
        ratios = [x / y for x, y in zip(b, s, strict=True)]
        ratio = statistics.median(ratios)
        verdict = "ok" if ratio < TARGET else "MISSED"
        rows.append((label, statistics.median(b) * 1e3, statistics.median(s) * 1e3, ratio,
                     verdict, ratios, b, s))
        print(f"  {label:<46} big {statistics.median(b) * 1e3:8.1f}  small "
              f"{statistics.median(s) * 1e3:8.1f}  ratio {ratio:5.2f}x  {verdict}")
    print(f"\nas Markdown:\n\n| figure | {big.finished:,} finished + 1,000 due, ms | "
          f"1,000 due only, ms | ratio (target < {TARGET:g}x) | | rounds, big / small ms |")
    print("|---|---:|---:|---:|---|---|")
    for label, b_ms, s_ms, ratio, verdict, _ratios, b, s in rows:
        per_round = ", ".join(f"{x * 1e3:.0f}/{y * 1e3:.0f}" for x, y in zip(b, s, strict=True))
        print(f"| {label} | {b_ms:.1f} | {s_ms:.1f} | {ratio:.2f}x | {verdict} | {per_round} |")


def _report_plans(plans: list[tuple[Captured, list[str]]], *, full: bool, table: str) -> None:
    print(f"\nplans on the big table ({table}), EXPLAIN (ANALYZE, BUFFERS) of the captured "
          "statements:")
    print("\n| transition | execution time | scans | sequential scan of the table |\n"
          "|---|---:|---|---|")
    for c, lines in plans:
        total, scans, seq = _plan_summary(lines, table)
        print(f"| {c.label} | {total} | {'; '.join(scans) or '-'} | {'YES' if seq else 'no'} |")
    if full:
        for c, lines in plans:
            print(f"\n-- {c.label}:\n{c.statement}\n")
            print("\n".join(lines))


def _server_version() -> str:
    from sqlalchemy import create_engine

    engine = create_engine(data.DATABASE_URL)
    try:
        with engine.connect() as conn:
            version = str(conn.execute(text("SHOW server_version")).scalar_one())
    finally:
        engine.dispose()
    return f"PostgreSQL {version.split()[0]}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
