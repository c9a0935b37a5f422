"""Debounce and coalesce on push, on SQLite and PostgreSQL, through the real Runner
(OutboxTester's drain, its clock): a push of a key whose row waits replaces the payload and
moves the run time, never beyond the first push + max_wait; a push while the key's row runs
is absorbed, or with coalesce kept as one follow-up; encrypted jobs stay encrypted on a
replace; bad arguments name themselves; two PostgreSQL transactions pushing one key at once
leave one waiting row and one follow-up at most."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import select

from celery_outbox import ConfigurationError, JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.states import Status
from celery_outbox.testing import Clock, OutboxTester
from tests.integration.conftest import MakeOutbox, Order

SECOND = timedelta(seconds=1)


@pytest.fixture
def state() -> dict[str, Any]:
    return {"runs": [], "inside": None}


@pytest.fixture
def jobs(registry: JobRegistry, state: dict[str, Any]) -> dict[str, Any]:
    @outbox_job(schema=Order, name="t.deb", record="all", registry=registry)
    def deb(ctx: JobContext[Order]) -> None:
        state["runs"].append(ctx.payload.order_id)
        inside = state["inside"]
        if inside is not None:
            inside(ctx)

    return {"deb": deb}


@pytest.fixture
def outbox(db_url: str, registry: JobRegistry, jobs: dict[str, Any],
           make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry)


@pytest.fixture
def tester(outbox: Outbox) -> Iterator[OutboxTester]:
    at = datetime.now(timezone.utc).replace(microsecond=0)
    with OutboxTester(outbox, clock=Clock(at)) as started:
        yield started


def _rows(outbox: Outbox) -> list[dict[str, Any]]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(t).order_by(t.c.created_at))]


def test_pushes_of_a_key_replace_the_waiting_row_within_max_wait(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    deb = jobs["deb"]
    first_at = tester.clock()
    first = deb.push({"order_id": 1}, key="k", debounce=2 * SECOND, max_wait=5 * SECOND)
    [row] = _rows(outbox)
    assert (row["status"], row["scheduled_at"]) == ("scheduled", first_at + 2 * SECOND)
    assert row["debounce_deadline"] == first_at + 5 * SECOND
    for n in range(2, 6):  # every second: each push moves the run time 2 s on, up to 5 s
        tester.advance(seconds=1)
        assert tester.drain().claimed == 0
        same = deb.push({"order_id": n}, key="k", debounce=2 * SECOND, max_wait=5 * SECOND)
        assert same == first
    [row] = _rows(outbox)
    assert row["payload"] == {"order_id": 5}
    assert row["scheduled_at"] == first_at + 5 * SECOND  # clamped: 4 s + 2 s > 5 s
    tester.advance(seconds=1)
    assert tester.drain().succeeded == 1
    assert state["runs"] == [5]
    # The key is free again: a new push makes a new row.
    again = deb.push({"order_id": 6}, key="k", debounce=SECOND)
    assert again != first
    assert tester.drain(within=SECOND).succeeded == 1
    assert state["runs"] == [5, 6]


def test_a_push_while_the_key_runs_is_absorbed_or_kept_as_one_follow_up(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    deb = jobs["deb"]
    answers: list[Any] = []

    def inside(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id != 1:
            return
        answers.append(deb.push({"order_id": 2}, key="k", debounce=SECOND))
        for n in (3, 4, 5):
            answers.append(deb.push({"order_id": n}, key="k", debounce=SECOND, coalesce=True))

    state["inside"] = inside
    first = deb.push({"order_id": 1}, key="k", debounce=SECOND, coalesce=True)
    assert tester.drain(within=SECOND).succeeded == 1
    assert tester.drain(within=SECOND).succeeded == 1  # the follow-up, a second later
    assert state["runs"] == [1, 5]  # one follow-up, with the last payload
    assert answers[0] == first  # without coalesce: absorbed by the running row
    assert answers[1] == answers[2] == answers[3] != first
    rows = _rows(outbox)
    assert [(r["unique_key"], r["follow_key"], r["status"]) for r in rows] == [
        ("k", None, "succeeded"), (None, "k", "succeeded")]


def test_a_follow_up_waiting_takes_later_pushes_and_a_new_key_row_follows_it(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    deb = jobs["deb"]
    first = deb.push({"order_id": 1}, key="k", coalesce=True)  # debounce zero: due now
    claimed = outbox.store.claim([first], "t.deb", "w1", tester.clock(), timedelta(minutes=1))
    assert [c.id for c in claimed] == [first]
    follow = deb.push({"order_id": 2}, key="k", coalesce=True)
    assert deb.push({"order_id": 3}, key="k", coalesce=True) == follow
    rows = {r["id"]: r for r in _rows(outbox)}
    assert rows[follow]["payload"] == {"order_id": 3}
    assert rows[follow]["follow_key"] == "k" and rows[follow]["unique_key"] is None
    waiting = [r for r in rows.values() if r["status"] in ("pending", "scheduled")]
    assert len(waiting) == 1


def test_an_encrypted_job_stays_encrypted_on_replace(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    pytest.importorskip("cryptography")
    from cryptography.fernet import Fernet

    seen: list[int] = []

    @outbox_job(schema=Order, name="t.secret", encrypted=True, registry=registry)
    def secret(ctx: JobContext[Order]) -> None:
        seen.append(ctx.payload.order_id)

    outbox = make_outbox(db_url, registry, encryption_keys=[Fernet.generate_key().decode()])
    with OutboxTester(outbox) as tester:
        secret.push({"order_id": 41}, key="s", debounce=SECOND)
        secret.push({"order_id": 42}, key="s", debounce=SECOND)
        [row] = _rows(outbox)
        assert "order_id" not in str(row["payload"])
        assert tester.drain(within=SECOND).succeeded == 1
    assert seen == [42]


@pytest.mark.parametrize(("options", "field"), [
    ({"debounce": SECOND}, "key"),
    ({"debounce": -SECOND, "key": "k"}, "debounce"),
    ({"debounce": SECOND, "max_wait": -SECOND, "key": "k"}, "max_wait"),
    ({"debounce": 2 * SECOND, "max_wait": SECOND, "key": "k"}, "max_wait"),
    ({"max_wait": SECOND, "key": "k"}, "max_wait"),
    ({"debounce": SECOND, "key": "k", "delay": SECOND}, "delay"),
    ({"coalesce": True}, "key"),
    ({"debounce": 1.0, "key": "k"}, "debounce"),
])
def test_bad_debounce_arguments_name_themselves(
        outbox: Outbox, jobs: dict[str, Any], options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field) as raised:
        jobs["deb"].push({"order_id": 1}, **options)
    assert isinstance(raised.value, ValueError) and raised.value.field == field
    assert _rows(outbox) == []


def test_push_many_and_apush_debounce_too(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    import asyncio

    deb = jobs["deb"]
    ids = deb.push_many([{"order_id": 1}, {"order_id": 2}, {"order_id": 3}],
                        keys=["a", "b", "a"], debounce=SECOND, max_wait=3 * SECOND)
    assert ids[0] == ids[2] != ids[1]
    again = asyncio.run(deb.apush({"order_id": 4}, key="b", debounce=SECOND))
    assert again == ids[1]
    assert tester.drain(within=SECOND).succeeded == 2
    assert sorted(state["runs"]) == [3, 4]


def test_concurrent_transactions_pushing_one_key_keep_one_waiting_row(
        pg_url: str, registry: JobRegistry, jobs: dict[str, Any],
        make_outbox: MakeOutbox) -> None:
    """Two sessions push the same key in open transactions at once (PostgreSQL): the second
    waits on the first's lock, then replaces its row; with the key's row running, both
    coalesced pushes land on one follow-up."""
    from sqlalchemy.orm import Session

    outbox = make_outbox(pg_url, registry)
    deb = jobs["deb"]
    for running in (False, True):
        key = f"c{running}"
        if running:
            first = deb.push({"order_id": 0}, key=key)
            outbox.store.claim([first], "t.deb", "w", outbox._now(), timedelta(minutes=1))
        inserted = threading.Event()
        answers: dict[str, Any] = {}
        with Session(outbox.engine) as one:
            answers["one"] = deb.push({"order_id": 1}, key=key, debounce=SECOND,
                                      coalesce=True, session=one)
            inserted.set()

            def second(key: str = key, answers: dict[str, Any] = answers) -> None:
                with Session(outbox.engine) as two:
                    answers["two"] = deb.push({"order_id": 2}, key=key, debounce=SECOND,
                                              coalesce=True, session=two)
                    two.commit()

            thread = threading.Thread(target=second)
            thread.start()
            thread.join(0.5)
            assert thread.is_alive()  # waits on the first transaction's lock
            one.commit()
        thread.join(10)
        assert not thread.is_alive()
        assert answers["one"] == answers["two"]
        rows = [r for r in _rows(outbox) if key in (r["unique_key"], r["follow_key"])]
        waiting = [r for r in rows if r["status"] in (Status.PENDING, Status.SCHEDULED)]
        assert len(waiting) == 1 and waiting[0]["payload"] == {"order_id": 2}
        assert len(rows) == (2 if running else 1)


@pytest.mark.parametrize("coalesce", [False, True])
def test_threads_pushing_one_key_at_once_leave_one_waiting_row(
        outbox: Outbox, jobs: dict[str, Any], coalesce: bool) -> None:
    """Four threads push one key 25 times each, at once (SQLite's write lock or PostgreSQL's
    row and advisory locks serialise them): one waiting row holds the key, with one of the
    payloads pushed, and every push answered its id."""
    deb = jobs["deb"]
    start = threading.Barrier(4)
    answers: list[Any] = []
    errors: list[BaseException] = []

    def pusher(base: int) -> None:
        start.wait()
        try:
            for n in range(25):
                answers.append(deb.push({"order_id": base + n}, key="t", debounce=SECOND,
                                        coalesce=coalesce))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=pusher, args=(1000 * i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    [row] = _rows(outbox)
    assert row["status"] == "scheduled" and row["unique_key"] == "t"
    assert set(answers) == {row["id"]} and len(answers) == 100
    assert row["payload"]["order_id"] % 1000 < 25


def _retry(outbox: Outbox, row_id: Any, run_at: datetime, now: datetime) -> None:
    """Claim ``row_id`` and write its attempt's retry (scheduled at ``run_at``): the key's
    row has begun an attempt and waits for the next."""
    from celery_outbox.outcomes import Fence, Retrying

    [claimed] = outbox.store.claim([row_id], "t.deb", "w-retry", now, timedelta(minutes=1))
    fence = Fence(row_id, "w-retry", claimed.attempt)
    assert outbox.store.finish(Retrying(run_at, "boom"), fence, now).hit


def test_a_push_replaces_the_follow_up_never_the_retrying_row_of_its_key(
        outbox: Outbox, jobs: dict[str, Any], tester: OutboxTester) -> None:
    """The key's own row runs, a coalesced push makes its follow-up, then the own row's
    attempt fails and waits to be retried (scheduled, attempt 1): a later push replaces the
    follow-up alone. The retry keeps its payload and its backoff (never moved earlier), and
    the push dispatches the row it replaced."""
    deb = jobs["deb"]
    now = tester.clock()
    own = deb.push({"order_id": 1}, key="k", coalesce=True)
    outbox.store.claim([own], "t.deb", "w1", now, timedelta(minutes=1))
    follow = deb.push({"order_id": 2}, key="k", debounce=SECOND, coalesce=True)
    assert follow != own
    # The own row's attempt ends in a retry an hour on (its fence: the claim above).
    from celery_outbox.outcomes import Fence, Retrying
    [row] = [r for r in _rows(outbox) if r["id"] == own]
    backoff_at = now + timedelta(hours=1)
    assert outbox.store.finish(Retrying(backoff_at, "boom"),
                               Fence(own, "w1", row["attempt"]), now).hit
    before = len(tester.dispatched)
    answer = deb.push({"order_id": 3}, key="k", debounce=SECOND, coalesce=True)
    assert answer == follow
    rows = {r["id"]: r for r in _rows(outbox)}
    assert (rows[own]["payload"], rows[own]["scheduled_at"]) == ({"order_id": 1}, backoff_at)
    assert rows[follow]["payload"] == {"order_id": 3}
    assert [d.execution_id for d in tester.dispatched[before:]] == [follow]


def test_without_coalesce_a_retrying_row_of_the_key_absorbs_the_push(
        outbox: Outbox, jobs: dict[str, Any], tester: OutboxTester) -> None:
    """A key's debounced row whose attempt failed and waits for its retry has begun: a push
    of the key without coalesce is absorbed by it, as by a running row (its payload and its
    run time left as they are); with coalesce it becomes the key's follow-up."""
    deb = jobs["deb"]
    now = tester.clock()
    own = deb.push({"order_id": 1}, key="k", debounce=SECOND, max_wait=10 * SECOND)
    tester.advance(seconds=1)
    backoff_at = tester.clock() + timedelta(hours=1)
    _retry(outbox, own, backoff_at, tester.clock())
    assert deb.push({"order_id": 2}, key="k", debounce=SECOND) == own
    [row] = _rows(outbox)
    assert (row["payload"], row["scheduled_at"]) == ({"order_id": 1}, backoff_at)
    assert row["scheduled_at"] > now + 10 * SECOND  # the deadline bounds a replace only
    follow = deb.push({"order_id": 3}, key="k", debounce=SECOND, coalesce=True)
    assert follow != own
    rows = {r["id"]: r for r in _rows(outbox)}
    assert (rows[own]["payload"], rows[own]["scheduled_at"]) == ({"order_id": 1}, backoff_at)
    assert (rows[follow]["payload"], rows[follow]["follow_key"]) == ({"order_id": 3}, "k")


def test_a_snoozed_row_of_the_key_is_never_replaced(
        outbox: Outbox, jobs: dict[str, Any], tester: OutboxTester) -> None:
    """A snooze gives the attempt back (attempt 0 again) but the row's handler ran: it has
    begun, so a push does not replace it nor move it earlier."""
    from celery_outbox.outcomes import Fence, Snoozed

    deb = jobs["deb"]
    own = deb.push({"order_id": 1}, key="k", debounce=SECOND)
    tester.advance(seconds=1)
    now = tester.clock()
    [claimed] = outbox.store.claim([own], "t.deb", "w-s", now, timedelta(minutes=1))
    later = now + timedelta(hours=1)
    assert outbox.store.finish(Snoozed(later), Fence(own, "w-s", claimed.attempt), now).hit
    assert deb.push({"order_id": 2}, key="k", debounce=SECOND) == own
    [row] = _rows(outbox)
    assert (row["attempt"], row["payload"], row["scheduled_at"]) == (0, {"order_id": 1}, later)
