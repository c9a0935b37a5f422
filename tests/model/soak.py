"""The wall time of ``make soak MINUTES=N``: N minutes in all, for every model test that soaks.

``OUTBOX_SOAK_MINUTES=N`` gives the pytest process N minutes from when this module is first
imported (collection). Each test that soaks is marked ``soak`` (``soak(slots=n)``: it soaks
``n`` times, in a process of its own); the selected ones are counted when collection ends
(``tests/model/conftest.py``). Each, first thing, takes its share of what is left
(:meth:`Budget.take`): the time left divided by the slots not yet begun, so what a test ran
over, one that skipped, or one that does not soak (the clock scripts, the findings) comes
out of the shares of those after it, whatever the order. The test of the Django joins takes
the shares of its process's slots at once and hands their end on in ``OUTBOX_SOAK_UNTIL``
(a ``time.time()``); that process splits it over its own slots.

:func:`soak` runs a machine with fresh seeds until its share ends, each run's
``max_examples`` fitted to the time left from what the runs so far took per example, so a run
ends at most about one example after the share.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from hypothesis import settings

MINUTES = float(os.environ.get("OUTBOX_SOAK_MINUTES") or 0)
"""0: no soak (the bounded, derandomized runs)."""
UNTIL_ENV = "OUTBOX_SOAK_UNTIL"
FIRST_RUN = 3
"""The examples of a slot's first run, which measures what one takes."""


class Budget:
    """The soak's end and the slots not yet begun."""

    def __init__(self, until: float) -> None:
        self.until = until
        self.slots = 0

    def add(self, slots: int) -> None:
        """Count ``slots`` more slots that will each :meth:`take` a share."""
        self.slots += slots

    def take(self, slots: int = 1) -> float:
        """The ``time.time()`` the share of the next ``slots`` slots ends at."""
        now = time.time()
        share = max(self.until - now, 0.0) * slots / max(self.slots, slots)
        self.slots = max(self.slots - slots, 0)
        return now + share


def _until() -> float:
    handed = os.environ.get(UNTIL_ENV)
    return float(handed) if handed else time.time() + MINUTES * 60


BUDGET = Budget(_until())


def soak(run: Callable[[settings], object], profile: settings, until: float) -> int:
    """Run ``run`` (a state machine under the settings given) until ``until``; the number
    of runs. Each run draws fresh seeds (the profile is not derandomized)."""
    runs, seconds, examples_run = 0, 0.0, 0
    while (left := until - time.time()) > 0:
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
