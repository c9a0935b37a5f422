"""``python -m example_project``: run the shop's whole flow against a real Celery worker.

1. Start from an empty shop (the demo drops and recreates its tables; on the embedded default
   it also empties the broker file: both SQLite files stay, so a dashboard still running on
   them shows the new run). With ``--dashboard``, first check that the port is free.
2. Start a real worker process (``celery -A example_project worker``), unless ``--no-worker``
   says one is already running (the production way, e.g. on PostgreSQL + Redis).
3. Place three orders (each pushes ``send_receipt`` in the order's transaction; the first also
   pushes the flaky ``notify_warehouse``), one order whose payment is declined (its transaction
   rolls back), push the keyed ``build_sales_report`` twice, and call the plain Celery task
   ``audit.delay()``.
4. Wait with a progress bar until all of it has happened, stop the worker (by PID), print
   the executions and the orders, and exit 0 only if every order's receipt was sent and every
   other expectation held. With ``--dashboard``: keep that worker running, seed one failing
   execution (``send_receipt`` for order 42, which does not exist) and serve the dashboard
   until Ctrl-C, then stop the worker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import IO
from uuid import UUID

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table
from sqlalchemy import MetaData, create_engine, delete, func, select

from celery_outbox import ExecutionNotFound, OutboxJob
from example_project import settings
from example_project.celery_app import outbox
from example_project.jobs import (
    Receipt,
    SalesDay,
    audit,
    build_sales_report,
    notify_warehouse,
    send_receipt,
)
from example_project.models import audit_log, metadata, orders, sales_reports
from example_project.shop import PaymentDeclined, place_order

ROOT = Path(__file__).resolve().parent.parent
JOBS: tuple[OutboxJob[object], ...] = (send_receipt, notify_warehouse, build_sales_report)
CUSTOMERS = (("alice", 2500, True), ("bob", 1200, False), ("carol", 4999, False))
FINISHED = {"succeeded", "failed", "cancelled"}
MISSING_ORDER = 42  # --dashboard seeds a receipt for this order, which never exists


@dataclass
class Run:
    """What this run did, to check against what the worker did."""

    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    placed: list[tuple[int, str]] = field(default_factory=list)
    pushed: list[UUID] = field(default_factory=list)
    shipment: UUID | None = None
    declined: PaymentDeclined | None = None
    reports: list[UUID] = field(default_factory=list)


# -- set-up ---------------------------------------------------------------------------------


def reset() -> None:
    """An empty shop: fresh tables everywhere, and no messages left in the embedded broker.

    The SQLite files themselves stay (their tables are dropped and recreated, the broker's
    messages deleted), so a dashboard still running on them shows the new run's data.
    """
    if settings.EMBEDDED:
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        empty_broker_file()
    outbox.drop_schema()
    metadata.drop_all(outbox.engine)
    outbox.create_schema()
    metadata.create_all(outbox.engine)


def empty_broker_file() -> None:
    """Delete every row of the embedded broker's tables (kombu's ``kombu_message`` and
    ``kombu_queue``), in place: the file stays."""
    if not settings.BROKER_FILE.exists():
        return
    engine = create_engine(f"sqlite:///{settings.BROKER_FILE}",
                           connect_args={"timeout": 30})
    try:
        tables = MetaData()
        tables.reflect(engine)
        with engine.begin() as conn:
            for table in reversed(tables.sorted_tables):
                conn.execute(delete(table))
    finally:
        engine.dispose()


def port_in_use(port: int) -> bool:
    """True when nothing may listen on ``127.0.0.1:port`` (something already does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def start_worker(log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``celery -A example_project worker`` as a process group of its own."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "SHOP_DATABASE_URL": settings.DATABASE_URL,
        "SHOP_BROKER_URL": settings.BROKER_URL,
    }
    pool = ["-P", "prefork", "-c", "2"]  # Celery's default pool, as in production
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "example_project", "worker", *pool,
         "-Q", settings.QUEUE, "-n", f"shop-{os.getpid()}@%h", "--loglevel=INFO",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """Warm shutdown: SIGTERM to the worker's main process, which stops its pool children
    (a SIGTERM to every child at once can leave the pool waiting on a dead child's lock).
    SIGKILL the whole process group after 15 s, and whatever is left of it once it exited."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)


# -- the flow -------------------------------------------------------------------------------


def shop(run: Run) -> None:
    """Everything a day at the shop pushes."""
    for customer, total, ship in CUSTOMERS:
        order_id, receipt, shipment = place_order(customer, total, ship=ship)
        run.placed.append((order_id, customer))
        run.pushed.append(receipt)
        if shipment is not None:
            run.shipment = shipment
            run.pushed.append(shipment)
    try:
        place_order("dave", 900, card_ok=False)
    except PaymentDeclined as declined:
        run.declined = declined
    # The same report pushed twice under one key: one execution (the second push returns
    # the first one's id). Delayed 2 s, so the first is still waiting when the second comes.
    today = SalesDay(day=date.today())
    for _ in range(2):
        run.reports.append(build_sales_report.push(
            today, key=f"sales-report-{today.day}", delay=timedelta(seconds=2)))
    run.pushed.append(run.reports[0])
    audit.delay(f"run {run.token}: {len(run.placed)} orders placed, 1 declined")


def progress_counts(run: Run) -> dict[str, int]:
    """How much of each expectation has happened so far."""
    with outbox.engine.connect() as conn:
        receipts = conn.execute(
            select(func.count()).where(orders.c.receipt_sent_at.is_not(None))).scalar_one()
        warehouse = conn.execute(
            select(func.count()).where(orders.c.warehouse_notified_at.is_not(None))).scalar_one()
        reports = conn.execute(select(func.count()).select_from(sales_reports)).scalar_one()
        audits = conn.execute(select(func.count()).where(
            audit_log.c.message.like(f"run {run.token}:%"))).scalar_one()
    finished = sum(1 for i in run.pushed if status_of(i) in FINISHED)
    return {"receipts": receipts, "warehouse": warehouse, "report": reports, "audit": audits,
            "finished": finished}


def status_of(execution_id: UUID) -> str | None:
    try:
        return outbox.admin.get_execution(execution_id).status
    except ExecutionNotFound:
        return None


def wait(run: Run, console: Console, timeout: float,
         alive: Callable[[], bool]) -> bool:
    """Show progress until every execution finished and the audit task ran (True), or
    ``timeout`` s passed or the worker died (False)."""
    goals = {
        "receipts": ("receipts sent (pushed in each order's transaction)", len(run.placed)),
        "warehouse": ("warehouse notified (attempt 1 fails, the retry succeeds)", 1),
        "report": ("sales report built (pushed twice, one key)", 1),
        "audit": ("audit logged (plain Celery task, .delay())", 1),
        "finished": ("executions finished", len(run.pushed)),
    }
    deadline = time.monotonic() + timeout
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), console=console,
                  transient=False) as bar:
        tasks = {k: bar.add_task(text, total=total) for k, (text, total) in goals.items()}
        while True:
            counts = progress_counts(run)
            for k, task in tasks.items():
                bar.update(task, completed=min(counts[k], goals[k][1]))
            if counts["finished"] >= len(run.pushed) and counts["audit"] >= 1:
                return True  # every execution is final: the verdict tells how it ended
            if time.monotonic() > deadline or not alive():
                return False
            time.sleep(0.2)


# -- the report -----------------------------------------------------------------------------


def show(run: Run, console: Console) -> None:
    executions = Table(title="Executions (celery_outbox table)")
    for column in ("job", "key", "status", "attempt", "last error", "captured log"):
        executions.add_column(column)
    for job in JOBS:
        for view in reversed(outbox.admin.list_executions(job.name, limit=200)):
            logs = outbox.admin.get_execution(view.id).logs
            executions.add_row(
                job.name.rsplit(".", 1)[-1], view.unique_key or "", view.status,
                f"{view.attempt}/{view.max_attempts}", view.error or "",
                logs[-1].message if logs else "",
            )
    console.print(executions)
    shop_orders = Table(title="Orders (the shop's own table)")
    for column in ("order", "customer", "total", "receipt sent", "warehouse notified"):
        shop_orders.add_column(column)
    with outbox.engine.connect() as conn:
        for row in conn.execute(select(orders).order_by(orders.c.id)):
            shop_orders.add_row(
                str(row.id), row.customer, f"{row.total_cents / 100:.2f}",
                "yes" if row.receipt_sent_at else "NO",
                "yes" if row.warehouse_notified_at else "",
            )
    console.print(shop_orders)


def verdict(run: Run) -> list[str]:
    """Check every expectation; print one line each. Returns the failures."""
    failures: list[str] = []

    def check(ok: bool, good: str, bad: str) -> None:
        print(good if ok else f"FAILED: {bad}")
        if not ok:
            failures.append(bad)

    with outbox.engine.connect() as conn:
        sent = dict(conn.execute(select(orders.c.id, orders.c.receipt_sent_at)).all())
        customers = set(conn.execute(select(orders.c.customer)).scalars())
        reports = conn.execute(select(func.count()).select_from(sales_reports)).scalar_one()
        audits = conn.execute(select(func.count()).where(
            audit_log.c.message.like(f"run {run.token}:%"))).scalar_one()
    for order_id, customer in run.placed:
        check(sent.get(order_id) is not None, f"receipt sent for order {order_id} ({customer})",
              f"receipt missing for order {order_id} ({customer})")
    declined = run.declined
    check(declined is not None and "dave" not in customers
          and status_of(declined.receipt) is None,
          "declined order rolled back: no order row, no execution, no receipt",
          "the declined order left something behind")
    shipment = outbox.admin.get_execution(run.shipment) if run.shipment else None
    check(shipment is not None and shipment.status == "succeeded" and shipment.attempt == 2,
          "warehouse notified: attempt 1 failed, attempt 2 succeeded",
          f"warehouse notice ended {shipment.status if shipment else 'missing'}")
    check(len(set(run.reports)) == 1 and reports == 1,
          "sales report pushed twice under one key: one execution, built once",
          f"sales report: {len(set(run.reports))} execution(s), built {reports} time(s)")
    check(audits == 1, "audit logged by a plain Celery task served by the same worker",
          f"audit task ran {audits} time(s)")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_project", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-worker", action="store_true",
                        help="use a worker you started yourself (celery -A example_project "
                             "worker); the shop's and the outbox's tables in SHOP_DATABASE_URL "
                             "are still dropped and recreated")
    parser.add_argument("--timeout-seconds", type=float, default=60.0,
                        help="how long to wait for the worker (default 60)")
    parser.add_argument("--dashboard", action="store_true",
                        help="afterwards, keep the dashboard running on this run's data "
                             "(http://127.0.0.1:PORT/, loopback only, no login) until Ctrl-C, "
                             "the worker still running behind it, with one seeded failure "
                             "(send_receipt for order 42)")
    parser.add_argument("--dashboard-port", type=int, default=8000,
                        help="the dashboard's port (default 8000)")
    args = parser.parse_args(argv)
    if args.dashboard and port_in_use(args.dashboard_port):
        # Before the flow: a re-run must not reset the data only to fail at the end.
        print(f"error: --dashboard-port: port {args.dashboard_port} on 127.0.0.1 is already "
              f"in use (a dashboard still running?); stop it, or pick another port: "
              f"python -m example_project --dashboard --dashboard-port "
              f"{args.dashboard_port + 10}", file=sys.stderr)
        return 2
    console = Console()
    if not console.is_terminal:  # piped or captured: room for the tables
        console = Console(width=120)
    console.print(f"database: {outbox.engine.url.render_as_string(hide_password=True)}")
    console.print(f"broker:   {settings.BROKER_URL}")
    reset()
    run = Run()
    worker: subprocess.Popen[bytes] | None = None
    log_path = settings.DATA_DIR / "worker.log"  # only when this run starts the worker
    with contextlib.ExitStack() as stack:
        if not args.no_worker:
            worker = start_worker(stack.enter_context(open(log_path, "wb")))
            stack.callback(stop_worker, worker)  # also after the dashboard, on Ctrl-C
            console.print(f"worker:   pid {worker.pid}, log {log_path}")
        try:
            shop(run)
            done = wait(run, console, args.timeout_seconds,
                        alive=lambda: worker is None or worker.poll() is None)
        finally:
            if worker is not None and not args.dashboard:
                stop_worker(worker)
            outbox.flush(timedelta(seconds=5))
        show(run, console)
        if not done:
            hint = (f"worker log: {log_path}" if worker is not None else
                    f"is a worker running on this database and broker, consuming queue "
                    f"{settings.QUEUE!r}? celery -A example_project worker -Q {settings.QUEUE}; "
                    f"see its own log")
            print(f"FAILED: not everything happened within {args.timeout_seconds:.0f} s "
                  f"({hint})")
        failures = verdict(run)
        ok = done and not failures
        if ok:
            print(f"OK: every order's receipt was sent ({len(run.placed)}/{len(run.placed)})")
        if args.dashboard:
            seed_failure()
            serve_dashboard(args.dashboard_port, worker)
    return 0 if ok else 1


def seed_failure() -> None:
    """Dashboard mode only: one execution that fails, so the Failures page, an execution's
    attempts and a Retry have something to show: ``send_receipt`` for order 42, which does
    not exist (each of its 4 attempts raises ``NoResultFound``, 1 s apart)."""
    execution_id = send_receipt.push(Receipt(order_id=MISSING_ORDER),
                                     key=f"receipt-{MISSING_ORDER}")
    outbox.flush(timedelta(seconds=5))
    print(f"seeded:   send_receipt for order {MISSING_ORDER} (no such order), execution "
          f"{execution_id}: fails after 4 attempts (see Failures; Retry it for a lineage)")


def serve_dashboard(port: int, worker: subprocess.Popen[bytes] | None) -> None:
    """The dashboard on the run's data, on loopback without a login, until Ctrl-C; the
    worker this run started (if any) keeps running behind it, so triggers and retries run."""
    import uvicorn

    from celery_outbox.web import create_app

    behind = (f"worker pid {worker.pid} still running behind it" if worker is not None else
              "no worker of its own (--no-worker): yours runs what it triggers")
    print(f"dashboard: http://127.0.0.1:{port}/ (loopback only, no login: auth=None; "
          f"{behind}); Ctrl-C to stop", flush=True)
    uvicorn.run(create_app(outbox, auth=None), host="127.0.0.1", port=port,
                log_level="warning")


if __name__ == "__main__":
    sys.exit(main())
