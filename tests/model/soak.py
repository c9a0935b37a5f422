"""The wall time of ``make soak MINUTES=N``: N minutes in all, for every model test that soaks.

``OUTBOX_SOAK_MINUTES=N`` gives the soak N minutes from ``OUTBOX_SOAK_STARTED`` (a
``time.time()``: ``make soak`` sets it as its command starts, so the interpreter's start and
the collection count too), or else from when this module is first imported. Each test that
soaks is marked ``soak(weight=w)``; the weights of the selected ones are summed when
collection ends (``tests/model/conftest.py``). Each such test, first thing, takes its share
of what is left (:meth:`Budget.take`): the time left times its weight over the weights not
yet begun, so what a test ran over, one that skipped, or one that does not soak (the clock
scripts, the findings) comes out of the shares of those after it, whatever the order. The
test of the Django joins takes the share of its process's tests and hands its end on in
``OUTBOX_SOAK_UNTIL`` (a ``time.time()``); that process splits it over its own.

:func:`soak` runs a machine with fresh seeds until its share ends, each run's
``max_examples`` fitted to the time left from what the runs so far took per example, so a run
ends about one example after the share. Every share runs once at least (a short first run),
so a budget smaller than one such run per test is exceeded by what those runs take.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from hypothesis import settings

MINUTES = float(os.environ.get("OUTBOX_SOAK_MINUTES") or 0)
"""0: no soak (the bounded, derandomized runs)."""
STARTED_ENV = "OUTBOX_SOAK_STARTED"
UNTIL_ENV = "OUTBOX_SOAK_UNTIL"
FIRST_RUN = 3
"""The examples of a share's first run, which measures what one takes."""

MODEL = 6
"""The weight of the state machine on each database (tests/model/test_model.py)."""
JOIN_KIND = 1
"""The weight of the joins model of each join kind on each database (test_joins.py)."""
DJANGO = 3
"""The weight of the Django joins model on each database (django_joins_cases.py)."""


class Budget:
    """The soak's end and the weight of the tests not yet begun."""

    def __init__(self, until: float) -> None:
        self.until = until
        self.weight = 0.0

    def add(self, weight: float) -> None:
        """Count a test of ``weight`` that will :meth:`take` its share."""
        self.weight += weight

    def take(self, weight: float) -> float:
        """The ``time.time()`` the share of a test of ``weight`` ends at."""
        now = time.time()
        share = max(self.until - now, 0.0) * weight / max(self.weight, weight)
        self.weight = max(self.weight - weight, 0.0)
        return now + share


def _until() -> float:
    handed = os.environ.get(UNTIL_ENV)
    if handed:
        return float(handed)
    return float(os.environ.get(STARTED_ENV) or time.time()) + MINUTES * 60


BUDGET = Budget(_until())


def soak(run: Callable[[settings], object], profile: settings, until: float) -> int:
    """Run ``run`` (a state machine under the settings given) until ``until``, once at
    least; the number of runs. Each run draws fresh seeds (the profile is not
    derandomized)."""
    runs, seconds, examples_run = 0, 0.0, 0
    while not runs or (left := until - time.time()) > 0:
        examples = min(profile.max_examples, FIRST_RUN)
        if examples_run:
            fits = int(left / (seconds / examples_run))
            if fits < 1:
                break
            examples = min(profile.max_examples, fits)
        started = time.time()
        run(settings(profile, max_examples=examples))
        seconds += time.time() - started
        examples_run += examples
        runs += 1
    return runs
