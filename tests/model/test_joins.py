"""The joins model (:mod:`tests.model.joins`) for every join kind, on SQLite and PostgreSQL.

Each run first replays the scripted trees (:func:`tests.model.joins.scripted_trees`: a push in
a savepoint rolled back with inner ones open, a COPY-sized batch rolled back, a commit after
released savepoints, an exception out of a nested savepoint, an apush cancelled at its INSERT,
a rollback) through the machine, then lets Hypothesis draw. The default run is bounded and
derandomized (fixed seeds). ``OUTBOX_SOAK_MINUTES=N`` (``make soak``) runs fresh random seeds,
longer examples, for a share of N minutes per kind and database (:mod:`tests.model.soak`: N
is the whole soak's). After either, what the trees covered is checked against floors
(:func:`tests.model.joins.floors`; in the default run the drawn examples against
``DRAWN_FLOORS`` too), so a change that stops the trees pushing fails.

Two-phase runs on a PostgreSQL of the session's own (``pg_2pc_url``, tests/conftest.py).
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.joins import (
    ASYNC_KINDS,
    DRAWN_FLOORS,
    KINDS,
    TWO_PHASE_KINDS,
    below,
    floors,
    machine_for,
    replay,
    scripted_trees,
)
from tests.model.soak import BUDGET, JOIN_KIND, soak
from tests.model.soak import MINUTES as SOAK_MINUTES

SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "joins", max_examples=3, stateful_step_count=12, derandomize=True, deadline=None,
    database=None, suppress_health_check=SLOW, print_blob=True,
)
settings.register_profile(
    "joins-soak", max_examples=40, stateful_step_count=40, derandomize=False, deadline=None,
    database=None, suppress_health_check=SLOW, print_blob=True,
)


CASES = [(kind, dialect) for kind in KINDS for dialect in ("sqlite", "postgresql")
         if not (kind in TWO_PHASE_KINDS and dialect == "sqlite")]


@pytest.mark.soak(weight=JOIN_KIND)
@pytest.mark.timeout(int(SOAK_MINUTES * 60) + 600 if SOAK_MINUTES else 300)
@pytest.mark.parametrize(("kind", "dialect"), CASES, ids=[f"{k}-{d}" for k, d in CASES])
def test_joins(kind: str, dialect: str, request: pytest.FixtureRequest, tmp_path: object,
               capsys: pytest.CaptureFixture[str]) -> None:
    """Exact dispatch through every transaction tree Hypothesis builds in this kind."""
    until = BUDGET.take(JOIN_KIND) if SOAK_MINUTES else 0.0  # first: a skip hands its share on
    if kind in ASYNC_KINDS:
        pytest.importorskip("greenlet")
        pytest.importorskip("aiosqlite" if dialect == "sqlite" else "psycopg")
    if dialect == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
        other = f"sqlite:///{tmp_path}/other.sqlite3"
    elif kind in TWO_PHASE_KINDS:
        url = str(request.getfixturevalue("pg_2pc_url"))
        other = url.rsplit("/", 1)[0] + "/other"
    else:
        url = str(request.getfixturevalue("pg_url"))
        other = str(request.getfixturevalue("pg_other_url"))
    machine = machine_for(kind, url, other, dialect)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's on the savepoint trees it is given
        replay(machine, scripted_trees(kind))
        scripted = Counter(machine.tally)
        if not SOAK_MINUTES:
            run_state_machine_as_test(machine, settings=settings.get_profile("joins"))
        else:
            soak(lambda each: run_state_machine_as_test(machine, settings=each),
                 settings.get_profile("joins-soak"), until)
    assert machine.stats["begin"] > 0
    # The coverage the run claims, checked: a change to the rules or the scripts that loses
    # a kind of tree fails here instead of passing on trees that no longer push.
    lost = below(machine.tally, floors(kind, dialect))
    assert not lost, f"joins {kind} on {dialect} covered less than its floors: {lost}"
    if not SOAK_MINUTES:
        drawn = below(machine.tally - scripted, DRAWN_FLOORS)
        assert not drawn, f"the drawn examples of {kind} on {dialect} covered less: {drawn}"
    if SOAK_MINUTES:
        with capsys.disabled():
            print(f"\njoins {kind} on {dialect}: {dict(machine.stats.most_common())}\n"
                  f"  covered: {dict(machine.tally.most_common())}")
