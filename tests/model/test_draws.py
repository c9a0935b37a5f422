"""The model test's draws follow from the draws before them, whatever the state they act on.

What the state machine of :mod:`tests.model.machine` acts on moves with real timing too: the
run times its rows take with jitter are read back from the table, the dispatcher's messages
come in the order threads sent them, and which handlers hang in the background and which
workers are live follow from those. Hypothesis replays the prefix of an earlier example's
draws to make a new one, and raises FlakyStrategyDefinition when a replayed draw is not the
one it recorded (another kind, another range, or one drawn where none was). So the machine
draws the same things whatever that state is (:meth:`OutboxMachine.pick`).

This test shakes the state on purpose: between steps, out of sight of Hypothesis (a coin of
the system's random source), true time moves on and a sweep runs, or not. Each example fails
on purpose once the rules that act on such state ran a few times (a count of the rules run,
whether they found something to do or not: a function of the draws alone), so that
Hypothesis shrinks it, replaying its draws again and again: it must end with that failure, not
with FlakyStrategyDefinition, and the machine must agree with the table all along.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import invariant, run_state_machine_as_test

from tests.model.machine import OutboxMachine, Stats

COIN = random.SystemRandom()
"""Not Hypothesis's (it seeds the ``random`` module's own for each example)."""
MOVES = [timedelta(0), timedelta(minutes=3), timedelta(minutes=31), timedelta(hours=2)]
ACTS = {"deliver", "run_in_background", "open_gate", "race_hanging", "settle", "drain"}
"""The rules that act on what timing moves: which messages were sent, which handlers hang,
which workers are live, which rows are due."""
PLANNED = 2
"""An example fails on purpose once the rules of ACTS have run this many times."""
ROUNDS = 1
"""Searches in a row: each the same draws (derandomized), the state shaken otherwise."""
SHRINK_SECONDS = 5
"""How long Hypothesis shrinks at most (five minutes as it comes): replays enough."""


class ShakenMachine(OutboxMachine):
    """The model test, its state moved between steps by what Hypothesis does not draw."""

    def __init__(self) -> None:
        super().__init__()
        self.acts_before = self.acts()

    def acts(self) -> int:
        """How many times the rules of ACTS ran (did something or found nothing to do)."""
        return sum(n for name, n in self.stats.rules.items() if name.split(" ")[0] in ACTS)

    @invariant()
    def shake(self) -> None:
        if self.outbox is None:
            return
        assert self.acts() - self.acts_before < PLANNED, "the planned end of the example"
        if COIN.random() < 0.5:
            return
        self.advance(self.clock_now + COIN.choice(MOVES))
        self.model.sweep(self.clock_now, held=self.slot_waiting())
        self.outbox.sweeper.run_once()
        self.follow_limited_wakes()


def test_the_draws_do_not_follow_what_timing_moved(sqlite_url: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", SHRINK_SECONDS)
    machine = type("Shaken", (ShakenMachine,), {"url": sqlite_url, "stats": Stats()})
    for _ in range(ROUNDS):
        with pytest.raises(AssertionError, match="the planned end of the example"):
            run_state_machine_as_test(machine, settings=settings(
                max_examples=10, stateful_step_count=30, derandomize=True, deadline=None,
                database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much]))
    assert machine.stats.examples > 1  # the shrink replayed it
