"""The stateful model test on SQLite and PostgreSQL (see :mod:`tests.model.machine`).

The default run is bounded and derandomized (fixed seeds): the same examples every run.
``OUTBOX_SOAK_MINUTES=N`` (``make soak MINUTES=N``) instead runs fresh random seeds for a
share of N minutes per database (:mod:`tests.model.soak`: N is the whole soak's) and prints
what it explored.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.machine import (
    DEFECTS,
    H1_STORE_MERGED,
    H3_LIFECYCLE_MERGED,
    OutboxMachine,
    Stats,
)
from tests.model.soak import BUDGET, MODEL, soak
from tests.model.soak import MINUTES as SOAK_MINUTES

DIALECTS = ["sqlite", "postgresql"]
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "model", max_examples=20, stateful_step_count=50, derandomize=True, deadline=None,
    database=None, suppress_health_check=SLOW, print_blob=True,
)
settings.register_profile(
    "soak", max_examples=50, stateful_step_count=80, derandomize=False, deadline=None,
    database=None, suppress_health_check=SLOW, print_blob=True,
)


def machine_for(url: str) -> type[OutboxMachine]:
    return type("OutboxModel", (OutboxMachine,), {"url": url, "stats": Stats()})


def report(dialect: str, stats: Stats, seconds: float, runs: int) -> str:
    rules = ", ".join(f"{name} {n}" for name, n in stats.rules.most_common())
    moves = ", ".join(f"{name} {n}" for name, n in stats.transitions.most_common())
    return (f"\nmodel soak on {dialect}: {seconds / 60:.1f} min, {runs} run(s), "
            f"{stats.examples} examples, {stats.steps} steps, "
            f"{len(stats.states)} distinct states, {stats.spans} handler runs checked for "
            f"overlaps in true time, host clocks off by up to {stats.widest_skew}\n"
            f"  rules: {rules}\n  transitions: {moves}\n"
            f"  flags: H1_STORE_MERGED={H1_STORE_MERGED} "
            f"H3_LIFECYCLE_MERGED={H3_LIFECYCLE_MERGED}, known defects generated: "
            f"{sorted(DEFECTS) or 'none'}")


@pytest.mark.soak(weight=MODEL)
@pytest.mark.timeout(int(SOAK_MINUTES * 60) + 900 if SOAK_MINUTES else 600)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_model(dialect: str, request: pytest.FixtureRequest, capsys: Any) -> None:
    """The outbox agrees with the model after every step of every example."""
    until = BUDGET.take(MODEL) if SOAK_MINUTES else 0.0  # first: a skip hands its share on
    url = str(request.getfixturevalue("sqlite_url" if dialect == "sqlite" else "pg_url"))
    machine = machine_for(url)
    if not SOAK_MINUTES:
        run_state_machine_as_test(machine, settings=settings.get_profile("model"))
        assert machine.stats.examples > 0 and machine.stats.steps > 0
        return
    quiet = logging.getLogger("celery_outbox")  # retries and failures by the thousand
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    request.addfinalizer(lambda: quiet.setLevel(level))
    started = time.monotonic()
    runs = soak(lambda each: run_state_machine_as_test(machine, settings=each),
                settings.get_profile("soak"), until)
    with capsys.disabled():
        print(report(dialect, machine.stats, time.monotonic() - started, runs))
