"""The model's clock checks, on fixed scripts of its rules (no search): they pass on the outbox
as it is, and fail on a mutant that puts a fixed defect back (see ``OutboxMachine.mutant``).

A script replays the machine's rules with chosen draws (:class:`Script`): each draw takes the
value given for its label, else the first choice of its strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import strategies as st

from celery_outbox import RetryPolicy
from celery_outbox.states import Status
from tests.model.machine import OutboxMachine, Stats


class Script:
    """A stand-in for Hypothesis's ``data``: ``given[label]`` (a value, or a list of values
    taken in turn), else the first value of the strategy (sampled_from, booleans: False,
    integers: the lowest, lists: as short as allowed)."""

    def __init__(self, **given: Any) -> None:
        self.given = given

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        if label is not None and label in self.given:
            value = self.given[label]
            if isinstance(value, list) and label != "ids" and label != "plan":
                return value.pop(0)
            return value
        return first(strategy)


def first(strategy: Any) -> Any:
    inner = getattr(strategy, "wrapped_strategy", strategy)
    kind = type(inner).__name__
    if kind == "SampledFromStrategy":
        return inner.elements[0]
    if kind == "BooleansStrategy":
        return False
    if kind == "IntegersStrategy":
        return inner.start
    if kind == "ListStrategy":
        return [first(inner.element_strategy) for _ in range(inner.min_size)]
    raise AssertionError(f"the script gives no value for a draw of {strategy!r}")


SETUP = dict(lease=timedelta(minutes=1), stale_after=timedelta(minutes=1),
             max_eta=timedelta(0), jobs=1, record="all", timeout=None, priority=0,
             policy=(RetryPolicy(retries=2, backoff=timedelta(0), backoff_max=timedelta(0),
                                 jitter=False), "none"))


def machine(url: str, mutant: str, **offsets: float) -> OutboxMachine:
    """A machine on ``url`` set up with one job (two retries, no backoff), a lease of a
    minute, and host clocks off by ``offsets`` (in leases; worker_2, the second runner's, is
    drawn as the "worker offset")."""
    cls = type("Scripted", (OutboxMachine,), {"url": url, "stats": Stats(), "mutant": mutant})
    m: OutboxMachine = cls()
    given = {**SETUP, "app": 0.0, "sweeper-1": 0.0, "sweeper-2": 0.0, "worker offset": 0.0,
             **{"worker offset" if k == "worker_2" else k.replace("_", "-"): v
                for k, v in offsets.items()}}
    m.setup(data=Script(**given))
    m.check()
    return m


def steps(m: OutboxMachine, *rules: tuple[Callable[..., None], Script | None]) -> None:
    for rule, data in rules:
        if data is None:
            rule()
        else:
            rule(data=data)
        m.check()


def overlap_after_rescue(m: OutboxMachine) -> None:
    """A worker whose clock is 3 leases behind starts a handler that hangs; a sweep; another
    worker runs the execution now. (A rule picks a runner or a row by its index among the
    live runners, the rows: :meth:`OutboxMachine.pick`.)"""
    job = sorted(m.model.jobs.values(), key=lambda j: j.name)[0]
    steps(m, (m.push, Script(job=job, plan=["ok"])))
    assert len(m.model.rows) == 1  # the row each rule below picks (index 0)
    steps(m,
          (m.run_in_background, Script(job=job, id=0, runner=1, cooperative=False,
                                       watched=True)),
          (m.sweep, Script(sweeper=m.sweepers[0])),
          (m.run, Script(job=job, id=0, runner=0)))
    assert m.stats.rules["run_in_background"] == 1 and m.stats.rules["run"] == 1


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_a_worker_clock_behind_never_gets_a_live_run_rescued(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue("sqlite_url" if dialect == "sqlite" else "pg_url"))
    m = machine(url, "", worker_2=-3.0)
    try:
        overlap_after_rescue(m)
        assert len(m.background) == 1, "the hanging run was rescued"
        # Its lease runs out in true time only: the watch stops the handler just before.
        m.advance(m.clock_now + timedelta(minutes=2))
        m.check()
        assert m.stats.rules["watch_stop"] == 1 and not m.background
        steps(m, (m.sweep, Script(sweeper=m.sweepers[1])))
        (row,) = m.model.rows.values()
        assert (row.status, row.attempt) == (Status.SCHEDULED, 1), "rescued into a retry"
    finally:
        m.teardown()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_overlap_check_catches_leases_on_the_worker_clock(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    """The mutant writes leases from the worker's clock (as before they were in the
    database's): the sweep rescues the hanging run at once, and the second run overlaps."""
    url = str(request.getfixturevalue("sqlite_url" if dialect == "sqlite" else "pg_url"))
    m = machine(url, "worker-clock-leases", worker_2=-3.0)
    try:
        with pytest.raises(AssertionError, match="runs overlap in true time"):
            overlap_after_rescue(m)
    finally:
        m.teardown()


def test_the_script_draws_what_it_is_given() -> None:
    script = Script(x=[1, 2], ids=[3])
    assert script.draw(st.integers(0, 9), label="x") == 1
    assert script.draw(st.integers(0, 9), label="x") == 2
    assert script.draw(st.integers(4, 9), label="y") == 4
    assert script.draw(st.lists(st.booleans(), min_size=2), label="ids") == [3]
    assert script.draw(st.lists(st.booleans(), min_size=2)) == [False, False]
