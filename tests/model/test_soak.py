"""The soak's budget (:mod:`tests.model.soak`) on a clock of the test's own: the shares add
up to the whole, what one test runs over comes out of those after it, and a share's runs stop
about one example after it ends."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings

from tests.model import soak


class Clock:
    """``time.time()`` of the test: it moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(soak, "time", fake)
    return fake


def test_the_shares_add_up_to_the_budget_whatever_a_test_ran_over(clock: Clock) -> None:
    budget = soak.Budget(clock.now + 60)
    for weight in (2, 1, 1):
        budget.add(weight)
    assert budget.take(2) == clock.now + 30
    clock.now += 40  # ran 10 s over its share
    assert budget.take(1) == clock.now + 10
    clock.now += 10
    assert budget.take(1) == budget.until
    clock.now = budget.until + 5
    assert budget.take(1) == clock.now  # nothing left: a share of nothing
    assert budget.weight == 0


def test_a_share_runs_until_it_ends_and_about_an_example_after(clock: Clock) -> None:
    started = clock.now
    asked: list[int] = []

    def run(each: Any) -> None:
        asked.append(each.max_examples)
        clock.now += 2.0 * each.max_examples  # two seconds an example

    profile = settings(max_examples=10, derandomize=False, database=None)
    runs = soak.soak(run, profile, started + 45)
    assert asked[0] == soak.FIRST_RUN and max(asked) <= profile.max_examples
    assert runs == len(asked) > 1
    assert started + 43 <= clock.now <= started + 45 + 2.0
    ended = clock.now
    assert soak.soak(run, profile, ended) == 1  # a share of nothing still runs once
    assert asked[-1] == soak.FIRST_RUN and clock.now == ended + 2.0 * soak.FIRST_RUN
