"""The paths of the fault matrix: what the worker, heartbeat, lease watch, sweep, trim, push
and admin do, each as a seed (set-up, never faulted) and a step (the statements faulted).

Each path is short and deterministic; its named queries are found by running it once with
no fault (:func:`tests.matrix.cases.discover`), so a query a path starts to run is in the
matrix without touching this file. A path whose step must end in a particular state says
so in ``World.expect`` (by default each row must end as its plan says).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session

from celery_outbox.models import WAITING_SLOT
from celery_outbox.states import Status
from celery_outbox.ticker import TickOutcome
from tests.matrix.faults import Fault
from tests.matrix.world import (
    CRON,
    JOB,
    LEASE,
    LIM,
    LIM_RATE,
    NOKEEP,
    ONCE,
    PAR,
    PAR_NOKEEP,
    STALE_AFTER,
    TRIM,
    Push,
    World,
)


@dataclass(frozen=True)
class Path:
    name: str
    seed: Callable[[World], None]
    step: Callable[[World], None]
    options: dict[str, Any] = field(default_factory=dict)
    """World options (``outcome_window``)."""
    given: tuple[Fault, ...] = ()
    """Faults of the path itself, in every case of it: what it takes to reach statements
    that run only after a failure (a hand-back)."""


def _nothing(w: World) -> None:
    pass


# -- push ----------------------------------------------------------------------------------


def push_one(w: World) -> None:
    w.push([w.plan("ok")])


def push_keyed(w: World) -> None:
    w.push([w.plan("ok")], keys=["k1"])


def push_many(w: World) -> None:
    w.push([w.plan("ok"), w.plan("ok"), w.plan("fail", "ok")])


def push_many_keyed(w: World) -> None:
    w.push([w.plan("ok"), w.plan("ok")], keys=[None, "k1"])


def push_session(w: World) -> None:
    with Session(w.engine) as session, session.begin():
        w.push([w.plan("ok"), w.plan("ok")], session=session)


def push_session_other_url(w: World) -> None:
    """A Session on another engine of the outbox's database, by a URL that does not tell
    (SQLite's ``file:`` URI): the outbox asks each side which database it is on."""
    assert w.engine.dialect.name == "sqlite"
    other = create_engine(f"sqlite:///file:{w.engine.url.database}?uri=true")
    try:
        with Session(other) as session, session.begin():
            w.push([w.plan("ok")], session=session)
    finally:
        other.dispose()


# -- worker --------------------------------------------------------------------------------


def _seed_message(*plans: tuple[str, ...]) -> Callable[[World], None]:
    """Push one row per plan: the step's message. A plan that has an admin cancel its row
    (``cancel_self``) ends cancelled."""
    def seed(w: World) -> None:
        w.seeded = w.push([w.plan(*steps) for steps in plans])  # type: ignore[attr-defined]
        for i, steps in zip(w.seeded, plans, strict=True):  # type: ignore[attr-defined]
            if any("cancel_self" in step for step in steps):
                w.expect[i] = {Status.CANCELLED}

    return seed


def push_batch(w: World) -> None:
    w.push_batch([w.plan("ok"), w.plan("fail", "ok")], w.plan("ok"))


def _seed_batch(*plans: tuple[str, ...], on: str = "finish") -> Callable[[World], None]:
    """A batch of one member per plan, its callback a plain success: the step's message is
    its members; the outcome of the last one makes the callback, which the worker
    dispatches after its commit (or, failing that, the sweep)."""
    def seed(w: World) -> None:
        w.seeded = w.push_batch([w.plan(*steps) for steps in plans],  # type: ignore[attr-defined]
                                w.plan("ok"), on=on)

    return seed


def run_seeded(w: World) -> None:
    w.run(JOB, w.seeded)  # type: ignore[attr-defined]


def _seed_parallel(w: World) -> None:
    """A message of the parallel job: two waves of two, each with a retry or a stop."""
    plans = [("ok",), ("fail", "ok"), ("stop",), ("cancel",)]
    w.seeded = w.push([w.plan(*steps) for steps in plans], job=PAR)  # type: ignore[attr-defined]


def run_parallel(w: World) -> None:
    w.run(PAR, w.seeded)  # type: ignore[attr-defined]


def _seed_parallel_nokeep(w: World) -> None:
    """A message of the parallel job that keeps no row: every wave's outcomes delete."""
    plans = [("ok",), ("ok",), ("stop",), ("ok",)]
    w.seeded = w.push([w.plan(*steps) for steps in plans],  # type: ignore[attr-defined]
                      job=PAR_NOKEEP)
    for i in w.seeded:  # type: ignore[attr-defined]
        w.expect[i] = {None}


def run_parallel_nokeep(w: World) -> None:
    w.run(PAR_NOKEEP, w.seeded)  # type: ignore[attr-defined]


def run_then_exit(w: World) -> None:
    """The message, then the worker process's exit (what its retry threads still hold is
    tried once more, at a point the scenario chooses)."""
    try:
        run_seeded(w)
    finally:
        w.exit_process()


def _seed_skip(w: World) -> None:
    """A message whose first id is finished already: the runner marks the first row it
    claimed started itself."""
    (done,) = w.push([w.plan("ok")])
    w.run(JOB, [done])
    w.messages.clear()
    w.seeded = [done, *w.push([w.plan("ok"), w.plan("ok")])]  # type: ignore[attr-defined]
    w.delivered = len(w.dispatcher.items)


# -- debounce ------------------------------------------------------------------------------

BOUNCE: dict[str, Any] = {"debounce": timedelta(seconds=2), "max_wait": timedelta(seconds=5)}


def push_debounced(w: World) -> None:
    """A first debounced push of a key: the replace misses, the keyed insert makes it."""
    w.push([w.plan("ok")], keys=["d1"], **BOUNCE)


def seed_debounced(w: World) -> None:
    w.push([w.plan("ok")], keys=["d1"], **BOUNCE)
    w.now += timedelta(seconds=1)


def push_debounced_again(w: World) -> None:
    """A second push of the key: its waiting row takes the payload and a later run time."""
    w.push([w.plan("ok")], keys=["d1"], **BOUNCE)


def seed_debounced_running(w: World) -> None:
    """The key's debounced row claimed by a worker that died (the rescuer runs it again)."""
    (i,) = w.push([w.plan("ok")], keys=["c1"], **BOUNCE)
    w.now += BOUNCE["debounce"]  # due
    w.claim_dead(JOB, [i])
    w.delivered = len(w.dispatcher.items)


def push_coalesced(w: World) -> None:
    """While the key's row runs: a push absorbed by it, then two coalesced pushes, the first
    making the follow-up row, the second replacing its payload (only the last recorded: the
    others leave no row of their payload's tag)."""
    spec = w.registry.get(JOB)
    w.outbox.push_many(spec, [w.plan("ok")], keys=["c1"], **BOUNCE)
    w.outbox.push_many(spec, [w.plan("ok")], keys=["c1"], coalesce=True, **BOUNCE)
    w.push([w.plan("ok")], keys=["c1"], coalesce=True, **BOUNCE)


LOCKED: dict[str, Any] = {"debounce": timedelta(0), "max_wait": timedelta(seconds=5)}


def seed_locked(w: World) -> None:
    w.seeded = w.push([w.plan("ok")], keys=["l1"], **LOCKED)  # type: ignore[attr-defined]


def run_locked(w: World) -> None:
    """The row's message reaches the worker while a caller's open transaction holds the row
    locked (a debounced push replaced it; PostgreSQL): the claim skips it, the ids it left
    are read again (``claim_skipped``) and the locked one published again; the caller
    rolls back, and the message published again runs the row. SQLite: no caller's write
    can be open beside the claim (one writer), the message runs it."""
    (i,) = w.seeded  # type: ignore[attr-defined]
    if w.engine.dialect.name == "postgresql":
        with Session(w.engine) as caller:
            w.outbox.push_many(w.registry.get(JOB), [w.plan("ok")], keys=["l1"],
                               session=caller, **LOCKED)
            w.run(JOB, [i])
            caller.rollback()
    w.run(JOB, [i])


# -- sweep ---------------------------------------------------------------------------------


def seed_sweep(w: World) -> None:
    """One row for each thing a sweep does: stage (scheduled past max_eta, now due),
    redispatch (pending, its message lost), rescue into a retry (begun by a dead worker),
    hand back (claimed with it, never begun), fail (begun, no retry left), delete (the same,
    of a job that keeps no failed row)."""
    w.push([w.plan("ok")], delay=timedelta(hours=1))
    w.push([w.plan("ok")])
    w.delivered = len(w.dispatcher.items)  # the pending row's message is lost
    begun, unbegun = w.push([w.plan("ok"), w.plan("ok")])
    w.claim_dead(JOB, [begun, unbegun])
    (once,) = w.push([w.plan("ok")], job=ONCE)
    w.claim_dead(ONCE, [once])
    w.expect[once] = {Status.FAILED}
    (nokeep,) = w.push([w.plan("ok")], job=NOKEEP)
    w.claim_dead(NOKEEP, [nokeep])
    w.expect[nokeep] = {None}
    w.delivered = len(w.dispatcher.items)
    w.now += max(LEASE, STALE_AFTER, timedelta(hours=1)) + timedelta(seconds=1)


def sweep(w: World) -> None:
    w.outbox.sweep()


# -- trim ----------------------------------------------------------------------------------


def seed_trim(w: World) -> None:
    """Three succeeded rows of a job that keeps one, and one running."""
    done = []
    for _ in range(3):
        (i,) = w.push([w.plan("ok")], job=TRIM)
        w.run(TRIM, [i])
        done.append(i)
        w.now += timedelta(seconds=1)
    for i in done[:-1]:
        w.expect[i] = {Status.SUCCEEDED, None}
    w.push([w.plan("ok")], job=TRIM)
    w.messages.clear()
    w.delivered = len(w.dispatcher.items) - 1


def trim(w: World) -> None:
    w.outbox.trim(w.now)


# -- cron ----------------------------------------------------------------------------------


def cron_tick(w: World) -> None:
    """Beat fires the job's tick: one execution, dispatched once committed."""
    result = w.outbox.ticker.fire(CRON, now=w.now)
    if result.outcome is TickOutcome.CREATED:
        assert result.execution_id is not None
        if result.execution_id not in w.table():
            w.violations.append(f"tick created {result.execution_id}: no row committed")
        if result.execution_id not in {d.execution_id for d in w.dispatcher.items}:
            w.violations.append(f"tick created {result.execution_id}: not dispatched")


# -- admin ---------------------------------------------------------------------------------


def seed_pending(w: World) -> None:
    (w.target,) = w.push([w.plan("ok")])  # type: ignore[attr-defined]
    w.expect[w.target] = {Status.SUCCEEDED, Status.CANCELLED}  # type: ignore[attr-defined]


def admin_cancel(w: World) -> None:
    w.outbox.admin.cancel(w.target, cancelled_by="matrix")  # type: ignore[attr-defined]
    w.expect[w.target] = {Status.CANCELLED}  # type: ignore[attr-defined]


def seed_failed(w: World) -> None:
    (w.target,) = w.push([w.plan("stop")])  # type: ignore[attr-defined]
    w.run(JOB, [w.target])  # type: ignore[attr-defined]
    w.messages.clear()
    w.delivered = len(w.dispatcher.items)


def admin_retry(w: World) -> None:
    tag = w.table()[w.target]["payload"]["tag"]  # type: ignore[attr-defined]
    push = Push([tag], len(w.dispatcher.items), frozenset({w.target}))  # type: ignore
    w.pushes.append(push)
    push.ids = [w.outbox.admin.retry(w.target, triggered_by="matrix")]  # type: ignore


def admin_reads(w: World) -> None:
    admin = w.outbox.admin
    admin.status(now=w.now)
    admin.list_jobs()
    admin.list_executions(JOB)
    admin.page_executions(JOB)
    admin.get_execution(w.target)  # type: ignore[attr-defined]


def seed_retried(w: World) -> None:
    """A failed row already retried once (its retry failed too)."""
    seed_failed(w)
    retry = w.outbox.admin.retry(w.target, triggered_by="matrix")  # type: ignore[attr-defined]
    w.run(JOB, [retry])
    w.messages.clear()
    w.delivered = len(w.dispatcher.items)


def _seed_limited(w: World) -> None:
    w.seeded = w.push([w.plan("ok"), w.plan("fail", "ok")], job=LIM)  # type: ignore[attr-defined]


def _seed_limited_beat(w: World) -> None:
    """A row of the limited job whose handler asks for a heartbeat as it runs."""
    w.seeded = w.push([w.plan("beat+ok")], job=LIM)  # type: ignore[attr-defined]


def run_limited(w: World) -> None:
    """A message of the limited job: each row's claim takes the slot and counts its start,
    its outcome frees the slot (and wakes none: nobody waits)."""
    w.run(LIM, w.seeded)  # type: ignore[attr-defined]


def _seed_limit_held(w: World) -> None:
    """The limited job's slot held by a worker that died right after its claim (its row
    running until the rescuer takes it), and a row of it to run."""
    held, w.seeded = w.push([w.plan("ok"), w.plan("ok")], job=LIM)  # type: ignore[attr-defined]
    w.claim_dead_limited(LIM, held)


def run_limit_held(w: World) -> None:
    """The claim finds the one slot held (the stale-slot reap frees nothing: its holder
    runs): the row waits, marked, until the rescuer frees the slot and the sweep sends it
    again."""
    w.run(LIM, [w.seeded])  # type: ignore[attr-defined]


def _seed_waiting(w: World) -> None:
    """A row of the limited job that waited for a slot (marked so), its slot free now."""
    w.seeded = w.push([w.plan("ok")], job=LIM)  # type: ignore[attr-defined]
    t = w.outbox.tables.executions
    with w.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id.in_(w.seeded))  # type: ignore[attr-defined]
                     .values(waiting=WAITING_SLOT))


def _seed_wake_lost(w: World) -> None:
    """A row of the limited job waiting for a slot, the slot free and its wake lost (the
    freeing process died between the free and the wake; its push's message long gone)."""
    _seed_waiting(w)
    w.delivered = len(w.dispatcher.items)


def _seed_rate(w: World) -> None:
    w.seeded = w.push([w.plan("ok"), w.plan("ok")], job=LIM_RATE)  # type: ignore[attr-defined]


def run_rate(w: World) -> None:
    """Two rows of a 1/m job in one message: the second is put back to the next window."""
    w.run(LIM_RATE, w.seeded)  # type: ignore[attr-defined]


PATHS: dict[str, Path] = {p.name: p for p in [
    Path("push", _nothing, push_one),
    Path("push_keyed", _nothing, push_keyed),
    Path("push_debounced", _nothing, push_debounced),
    Path("push_debounced_again", seed_debounced, push_debounced_again),
    Path("push_coalesced", seed_debounced_running, push_coalesced),
    Path("worker_locked", seed_locked, run_locked),
    Path("push_many", _nothing, push_many),
    Path("push_many_keyed", _nothing, push_many_keyed),
    Path("push_session", _nothing, push_session),
    Path("push_session_other_url", _nothing, push_session_other_url),
    Path("worker_one", _seed_message(("ok",)), run_seeded),
    Path("worker", _seed_message(("ok",), ("fail", "ok"), ("ok",)), run_seeded),
    Path("worker_outcomes", _seed_message(("stop",), ("cancel",), ("ok",)), run_seeded),
    Path("worker_window", _seed_message(("ok",), ("fail", "ok"), ("ok",)), run_seeded,
         {"outcome_window": timedelta(minutes=1)}),
    Path("worker_parallel", _seed_parallel, run_parallel),
    Path("worker_parallel_nokeep", _seed_parallel_nokeep, run_parallel_nokeep),
    Path("heartbeat", _seed_message(("beat+ok",), ("ok",)), run_seeded),
    Path("lease_watch", _seed_message(("age+ok",), ("ok",)), run_seeded),
    Path("worker_skip", _seed_skip, run_seeded),
    Path("cancel_running", _seed_message(("cancel_self+ok",)), run_seeded),
    # The heartbeat finds the row cancelled meanwhile (an admin's cancel on another host).
    Path("heartbeat_lost", _seed_message(("cancel_self+beat+ok",), ("ok",)), run_seeded),
    # The renewal before the second row begins fails: that row is handed back.
    Path("hand_back", _seed_message(("age+ok",), ("ok",)), run_seeded,
         given=(Fault("extend_leases", 1, "error"),)),
    # The claim applies, its answer is lost: the worker releases the claim by its token.
    Path("lost_claim", _seed_message(("ok",), ("ok",)), run_seeded,
         given=(Fault("claim_rows", 1, "lost"),)),
    # Its release fails too: a retry thread holds it, the process's exit tries it.
    Path("lost_claim_retry", _seed_message(("ok",), ("ok",)), run_then_exit,
         given=(Fault("claim_rows", 1, "lost"), Fault("release_claim_rows", 1, "error"))),
    # The outcome + next start statement, then the outcome alone, both fail: the outcome
    # goes to a retry thread, whose write the process's exit tries.
    Path("outcome_retry", _seed_message(("ok",), ("ok",)), run_then_exit,
         given=(Fault("finish_fenced", 1, "error"), Fault("finish_fenced", 2, "error"))),
    # The hand-back fails too: a retry thread holds it, the process's exit tries it.
    Path("hand_back_retry", _seed_message(("age+ok",), ("ok",)), run_then_exit,
         given=(Fault("extend_leases", 1, "error"), Fault("release_fenced", 1, "error"))),
    Path("push_batch", _nothing, push_batch),
    Path("worker_batch", _seed_batch(("ok",), ("fail", "ok"), ("stop",)), run_seeded),
    Path("worker_batch_success", _seed_batch(("ok",), ("cancel",), on="success"),
         run_seeded),
    Path("sweep", seed_sweep, sweep),
    Path("trim", seed_trim, trim, {"jobs": (TRIM,)}),
    Path("admin_cancel", seed_pending, admin_cancel),
    Path("admin_retry", seed_failed, admin_retry),
    Path("admin_retry_again", seed_retried, admin_retry),
    Path("admin_reads", seed_pending, admin_reads),
    Path("cron", _nothing, cron_tick, {"jobs": (CRON,)}),
    Path("worker_limited", _seed_limited, run_limited, {"jobs": (LIM,)}),
    # The heartbeat renews the slot with the row's lease while the handler runs.
    Path("heartbeat_limited", _seed_limited_beat, run_limited, {"jobs": (LIM,)}),
    Path("limit_held", _seed_limit_held, run_limit_held, {"jobs": (LIM,)}),
    Path("rate_limited", _seed_rate, run_rate, {"jobs": (LIM_RATE,)}),
    # A row that waited for a slot is claimed: its mark cleared with the claim.
    Path("limit_waited", _seed_waiting, run_limited, {"jobs": (LIM,)}),
    # The sweep wakes a row waiting for a free slot (never resends it): its wake was lost.
    Path("sweep_wake", _seed_wake_lost, sweep, {"jobs": (LIM,)}),
    # The limited claim applies (its slot taken), its answer is lost: the worker releases
    # the claim by its token and frees the slot it took in the same transaction.
    Path("lost_limited_claim", _seed_limited, run_limited, {"jobs": (LIM,)},
         given=(Fault("take_slot", 1, "lost"),)),
]}
