"""Concurrency and rate limits with real worker processes (Redis + PostgreSQL), prefork and
threads pools: the number of running executions of a ``concurrency=3`` job, sampled from the
database every few milliseconds, never exceeds 3 and every one finishes; a per-key limit of
one over 20 keys never has two running with one key; a ``10/s`` job never starts more than 10
in one (fixed, whole) second.

The default suite runs bounded sizes (2 workers, tens of executions); ``make long`` the full
ones (4 workers, 500 executions, 100 at 10/s)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from tests import procs
from tests.conftest import LONG, variants
from tests.e2e.app import Mark
from tests.e2e.harness import Stack, Worker, marker, stack
from tests.e2e.limits_app import LIMIT3, PER_KEY, Keyed, limit3, per_key, rated

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

SIZES = {"bounded": (2, 60, 20, 30), "full": (4, 500, 200, 100)}
"""(workers, executions of the limit-3 job, of the per-key job, of the 10/s job)."""


@pytest.fixture(scope="module", params=variants(("bounded",), ("full",)))
def size(request: pytest.FixtureRequest) -> tuple[int, int, int, int]:
    return SIZES[request.param]


@pytest.fixture(scope="module", params=["prefork", "threads"])
def limits_stack(request: pytest.FixtureRequest, size: tuple[int, int, int, int],
                 pg_url: str, redis_url: str,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack per pool and size, shared by the module's tests (each its own job)."""
    queue = f"e2e-limits-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("limits")
    workers = [Worker(f"l{i}", queue, logs / f"l{i}.log", concurrency=3,
                      pool=request.param) for i in range(size[0])]
    try:
        with stack(redis_url, pg_url, queue, workers, app="tests.e2e.limits_app") as s:
            s.outbox._celery_dispatcher.chunk_size = 4  # messages of several ids
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, *(f"{prefix}.{queue}"
                               for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


class Sampler:
    """Reads ``probe`` on its own connection every few milliseconds until stopped; keeps the
    largest answer and how many samples it took."""

    def __init__(self, s: Stack, probe: Callable[[Any], int]) -> None:
        self.s, self.probe = s, probe
        self.most, self.samples = 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.s.outbox.engine.connect() as conn:
            while not self.stop.is_set():
                self.most = max(self.most, self.probe(conn))
                conn.commit()  # each sample its own snapshot
                self.samples += 1
                time.sleep(0.003)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def running_of(s: Stack, job: str) -> Any:
    t = s.outbox.tables.executions
    return (t.c.job_name == job, t.c.status == "running", t.c.started_at.is_not(None))


def wait_all_finished(s: Stack, ids: list[uuid.UUID], timeout: float) -> None:
    t = s.outbox.tables.executions

    def finished() -> bool:
        with s.outbox.engine.connect() as conn:
            return conn.execute(select(func.count()).where(
                t.c.id.in_(ids), t.c.status == "succeeded")).scalar_one() == len(ids)

    procs.wait_for(finished, timeout, f"{len(ids)} limited executions to succeed")


def test_a_global_limit_of_3_holds_across_workers(limits_stack: Stack,
                                                  size: tuple[int, int, int, int]) -> None:
    s, n = limits_stack, size[1]
    where = running_of(s, LIMIT3)
    with Sampler(s, lambda conn: conn.execute(select(func.count()).where(*where))
                 .scalar_one()) as sampler:
        ids = limit3.push_many([Mark(marker=marker(), sleep_seconds=0.02) for _ in range(n)])
        wait_all_finished(s, ids, timeout=60 + n * 0.1)
    assert sampler.samples > 50, "the sampler must have watched the run"
    assert 1 <= sampler.most <= 3, f"{sampler.most} ran at once under concurrency=3"
    if LONG or n >= 60:
        assert sampler.most == 3, "the limit, not a lack of work, bounded the run"
    slots = s.outbox.tables.slots

    def slots_left() -> bool:
        with s.outbox.engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(slots)
                                .where(slots.c.job_name == LIMIT3)).scalar_one() == 0

    # A slot is deleted by its runner once the handler returned and its outcome committed,
    # a statement of its own just after, so the last ones may still be there for a moment.
    procs.wait_for(slots_left, 30, "every slot row deleted after its outcome")


def test_a_per_key_limit_of_1_holds_per_key(limits_stack: Stack,
                                            size: tuple[int, int, int, int]) -> None:
    s, n = limits_stack, size[2]
    t = s.outbox.tables.executions
    where = running_of(s, PER_KEY)
    doubled = (select(t.c.concurrency_key).where(*where).group_by(t.c.concurrency_key)
               .having(func.count() > 1))
    most_keys = (select(func.count(func.distinct(t.c.concurrency_key))).where(*where))
    seen_keys = [0]

    def probe(conn: Any) -> int:
        seen_keys[0] = max(seen_keys[0], conn.execute(most_keys).scalar_one())
        return len(conn.execute(doubled).all())

    keys = [f"customer-{i % 20}" for i in range(n)]
    with Sampler(s, probe) as sampler:
        ids = per_key.push_many([Keyed(marker=marker(), key=k, sleep_seconds=0.02)
                                 for k in keys])
        wait_all_finished(s, ids, timeout=60 + n * 0.1)
    assert sampler.samples > 20
    assert sampler.most == 0, "two executions of one key ran at once"
    assert seen_keys[0] >= 2, "keys ran side by side (the limit is per key, not global)"


def test_a_rate_of_10_per_second_holds_across_workers(limits_stack: Stack,
                                                      size: tuple[int, int, int, int]) -> None:
    s, n = limits_stack, size[3]
    ids = rated.push_many([Mark(marker=marker()) for _ in range(n)])
    wait_all_finished(s, ids, timeout=30 + n / 10 * 3)
    t = s.outbox.tables.executions
    with s.outbox.engine.connect() as conn:
        started = [r[0] for r in conn.execute(select(t.c.started_at).where(t.c.id.in_(ids)))]
    assert len(started) == n and all(isinstance(a, datetime) for a in started)
    per_second = Counter(a.astimezone(timezone.utc).replace(microsecond=0) for a in started)
    assert max(per_second.values()) <= 10, f"a second started {max(per_second.values())}"
    took = max(started) - min(started)
    assert took >= timedelta(seconds=n / 10 - 2), f"{n} at 10/s ran in {took}"
