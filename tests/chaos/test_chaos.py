"""The chaos run, bounded for the default suite (about a minute; ``make chaos`` runs longer).

Real ``celery worker`` processes (prefork, prefork with ``--max-tasks-per-child``, threads,
gevent; two of them holding outcomes for an ``outcome_window``; every one's client clock off,
from 30 s behind to 9 s ahead, with a 3 s lease), a private ``redis-server`` and the
session's PostgreSQL database; faults at seeded moments: workers SIGKILLed and warm-stopped,
pool children killed, backends terminated, the broker restarted. Every execution must
finish, none lost, no attempt begun twice, no two runs of one execution at one moment.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from uuid import uuid4

import pytest
from sqlalchemy import select, update

from celery_outbox.shutdown import SHUTDOWN
from tests.chaos import app as chaos_app
from tests.chaos.app import DOUBLES, RUNS, Work
from tests.chaos.run import SKEWS, Chaos, Plan, chaos, free_port
from tests.conftest import LONG

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

SEED = 8
DURATION = 40.0 if LONG else 25.0
"""Seconds of faults: the default suite's bound (about 8 faults), longer under ``make long``;
``make chaos`` runs as long as asked."""


def test_chaos_run_loses_nothing_and_runs_no_attempt_twice(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = Plan(executions=300, seed=SEED, duration=DURATION, fault_every=3.0,
                pools=("prefork", "prefork-mtpc:window", "threads:window", "gevent"),
                skews=SKEWS)

    outcome = chaos(plan, pg_url, tmp_path)

    with capsys.disabled():  # the figures reach CI's log, passed or failed
        print("\n" + outcome.report())
    assert outcome.ok, outcome.report()
    assert set(outcome.statuses) <= {"succeeded", "failed"}, outcome.report()
    assert len(outcome.pushed) == 300
    assert outcome.spans >= 300, outcome.report()  # every run was timed
    for kind in ("kill", "warm", "pg", "broker", "kill_child"):  # the run was not a calm one
        assert outcome.faults[kind] >= 1, outcome.report()


def test_the_verdict_sees_a_lost_execution_and_a_double_run(pg_url: str, tmp_path: Path
                                                             ) -> None:
    """The checks can fail: an execution never run is lost, a second start is doubled, also
    after a first run that stopped for a shutdown (a hand-back never reuses an attempt); two
    runs of one execution running at one moment overlap, also when the first never recorded
    its end and its process was not seen die."""
    run = Chaos(Plan(pools=("prefork",)), pg_url, tmp_path)
    run.redis.port = free_port()  # nobody listens: the publish fails, the row stays pending
    run.prepare()
    try:
        never = run.outbox.push_many(chaos_app.quick.spec, [Work()])[0]
        run.outcome.pushed.append(never)
        twice = SimpleNamespace(execution_id=uuid4(), attempt=1)
        chaos_app.REGISTRY.outbox = run.outbox
        chaos_app.begin(twice)  # type: ignore[arg-type]
        chaos_app.begin(twice)  # type: ignore[arg-type]
        handed = SimpleNamespace(execution_id=uuid4(), attempt=2)
        chaos_app.begin(handed)  # type: ignore[arg-type]
        with run.outbox.engine.begin() as conn:  # it stopped for a shutdown, then began again
            conn.execute(update(RUNS).where(RUNS.c.execution_id == str(handed.execution_id))
                         .values(ended=time.time(), cancel=SHUTDOWN))
        chaos_app.begin(handed)  # type: ignore[arg-type]
        with run.outbox.engine.connect() as conn:
            assert len(conn.execute(select(RUNS)).all()) == 2
            assert len(conn.execute(select(DOUBLES)).all()) == 2

        run.spans_dir.mkdir()
        at = time.time()

        def span(execution: object, attempt: int, start: float, end: float | None,
                 pid: int = 10, worker: str = "prefork", generation: int = 1) -> list[str]:
            edge = {"id": str(execution), "attempt": attempt, "token": f"{execution}-{attempt}",
                    "pid": pid, "worker": worker, "generation": generation}
            lines = [json.dumps({**edge, "edge": "start", "at": start})]
            if end is not None:
                lines.append(json.dumps({**edge, "edge": "end", "at": end}))
            return lines

        one, two, three = uuid4(), uuid4(), uuid4()
        lines = [
            *span(one, 1, at, at + 1.0), *span(one, 2, at + 0.5, at + 2.0),  # overlap
            *span(two, 1, at, None, pid=11), *span(two, 2, at + 5.0, at + 6.0),  # killed first
            *span(three, 1, at, None, worker="threads"), *span(three, 2, at + 9.0, at + 9.5),
            '{"cut short',
        ]
        (run.spans_dir / "spans-10.jsonl").write_text("\n".join(lines) + "\n")
        run.child_deaths[11] = at + 0.1  # two's first run ended when its pool child was killed

        run.check()

        assert sorted(o["id"] for o in run.outcome.overlapping) == sorted([str(one), str(three)])
        assert (run.outcome.spans, run.outcome.unended) == (6, 1)
        assert [lost["id"] for lost in run.outcome.lost] == [str(never)]
        assert sorted((d["id"], d["attempt"]) for d in run.outcome.doubled) == sorted([
            (str(twice.execution_id), 1), (str(handed.execution_id), 2)])
        assert not run.outcome.ok
    finally:
        run.close()
