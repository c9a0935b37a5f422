"""A model of the Django joins: a Hypothesis state machine runs random transaction trees on
Django's connection, one outermost block after another, and checks after each outermost end
that the ids dispatched are exactly the rows committed (each once), on SQLite and on
PostgreSQL (through its Unix socket when the server has one here).

A tree (:data:`TREES`) is made of ``atomic()`` blocks (with or without a savepoint) left
normally or by an exception, raw ``transaction.savepoint()`` levels ended by
``savepoint_commit``, ``savepoint_rollback`` or left open (for an enclosing one to release or
roll back past), ``set_rollback(True/False)``, a statement that fails and whose error the
caller swallows (PostgreSQL then aborts the transaction, and its COMMIT rolls back while
Django runs the ``on_commit`` callbacks), ``push`` / ``push_many`` (unkeyed and keyed),
and the user's own ``on_commit`` callbacks (robust or not, raising or not, pushing from the
callback or not). Between trees, pushes outside any block. The oracle is the database: which
rows committed is read on the worker's engine, not predicted, so the model needs no copy of
Django's rules.

Run by tests/model/test_django_joins.py in a process of its own (Django is configured once
per process). Bounded and derandomized by default; under ``make soak`` it runs fresh seeds
for a share per database of what ``OUTBOX_SOAK_UNTIL`` leaves (:mod:`tests.model.soak`) and
prints what was explored.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from hypothesis.stateful import run_state_machine_as_test as run_machine
from sqlalchemy import text

from celery_outbox.errors import StorageError
from tests.conftest import PG_ADDRESS, require
from tests.integration.django_joins_cases import TABLE, outbox_on, project  # noqa: F401
from tests.integration.fakes import RecordingDispatcher
from tests.model.soak import BUDGET, DJANGO, soak
from tests.model.soak import MINUTES as SOAK_MINUTES

SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "django-joins", max_examples=25, stateful_step_count=8, derandomize=True, deadline=None,
    database=None, suppress_health_check=SLOW, print_blob=True)
settings.register_profile(
    "django-joins-soak", max_examples=60, stateful_step_count=20, derandomize=False,
    deadline=None, database=None, suppress_health_check=SLOW, print_blob=True)


PUSH_IN_SAVEPOINT = "push in a savepoint"
ROLLED_BACK_SAVEPOINT = "savepoint rolled back with rows pushed in it"


class Boom(Exception):
    """What a block or a user's callback raises."""


# A node is a tuple: ("push", how, key) | ("on_commit", raises, robust, pushes) |
# ("set_rollback", value) | ("fail",): a statement that fails, the error swallowed (on
# PostgreSQL the transaction is aborted until a savepoint before it is rolled back to; its
# COMMIT rolls back) | ("atomic", savepoint, ends, children), ends "leave" or "raise" |
# ("savepoint", ends, children), ends "commit" (savepoint_commit), "rollback"
# (savepoint_rollback) or "open". Children run in order inside their node.
LEAVES = st.one_of(
    st.tuples(st.just("push"), st.sampled_from(["one", "many"]),
              st.none() | st.integers(0, 2)),
    st.tuples(st.just("on_commit"), st.booleans(), st.booleans(), st.booleans()),
    st.tuples(st.just("set_rollback"), st.booleans()),
    st.tuples(st.just("fail")),
)


def _levels(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    kids = st.lists(children, max_size=4)
    return st.one_of(
        st.tuples(st.just("atomic"), st.booleans(), st.sampled_from(["leave", "raise"]), kids),
        st.tuples(st.just("savepoint"), st.sampled_from(["commit", "rollback", "open"]), kids),
    )


NODES = st.recursive(LEAVES, _levels, max_leaves=14)
TREES = st.tuples(st.just("atomic"), st.booleans(), st.sampled_from(["leave", "raise"]),
                  st.lists(NODES, min_size=1, max_size=5))
"""One outermost ``atomic()`` block and what runs in it."""


@dataclass
class Stats:
    """What the runs explored."""

    examples: int = 0
    trees: int = 0
    nodes: Counter[str] = field(default_factory=Counter)
    pushed: int = 0
    committed: int = 0

    def line(self, dialect: str, seconds: float, runs: int) -> str:
        nodes = ", ".join(f"{name} {n}" for name, n in self.nodes.most_common())
        return (f"\nDjango joins model on {dialect}: {seconds / 60:.1f} min, {runs} run(s), "
                f"{self.examples} examples, {self.trees} trees, {self.pushed} rows pushed, "
                f"{self.committed} committed\n  nodes: {nodes}")


class DjangoJoins(RuleBasedStateMachine):
    """One example: a clean outbox table, then outermost blocks on ``alias`` one after
    another (each a random tree), and pushes outside any block between them."""

    alias: ClassVar[str]
    outbox: ClassVar[Any]
    recorder: ClassVar[RecordingDispatcher]
    stats: ClassVar[Stats]

    def __init__(self) -> None:
        super().__init__()
        from django.db import connections

        self.connection = connections[self.alias]
        self.prefix = uuid.uuid4().hex[:8]
        self.pushed: set[uuid.UUID] = set()
        self.levels: list[int] = []  # rows pushed in each open savepoint level, innermost last
        self.failed = False  # a statement failed in this outermost block (PostgreSQL)

    @property
    def doomed(self) -> bool:
        """The innermost block is marked for rollback: Django refuses every statement."""
        return bool(self.connection.needs_rollback)

    def committed(self) -> set[uuid.UUID]:
        with self.outbox.engine.connect() as conn:
            return {uuid.UUID(str(r[0]))
                    for r in conn.execute(text(f"SELECT id FROM {TABLE}"))}

    def check(self) -> None:
        """Dispatched == committed, each once (no transaction open)."""
        assert not self.connection.in_atomic_block
        committed = self.committed()
        dispatched = self.recorder.ids
        assert len(dispatched) == len(set(dispatched)), f"dispatched twice: {dispatched}"
        assert set(dispatched) == committed, (
            f"dispatched but not committed: {set(dispatched) - committed}; "
            f"committed but not dispatched: {committed - set(dispatched)}")

    # -- running a tree -----------------------------------------------------------------

    def push(self, how: str, key: int | None) -> None:
        from tests.djangoproj.shop.jobs import send_receipt
        keyed = None if key is None else f"{self.prefix}-{key}"
        try:
            if how == "one":
                got = [send_receipt.push({"order_id": 1}, key=keyed)]
            else:
                got = send_receipt.push_many([{"order_id": i} for i in range(3)],
                                             keys=[keyed, None, None])
        except StorageError:
            assert self.doomed or self.failed, "a push failed in a healthy transaction"
            return
        self.pushed.update(got)
        if self.levels:
            self.levels[-1] += len(got)
            self.stats.nodes[PUSH_IN_SAVEPOINT] += 1

    def leave_level(self, rolled_back: bool) -> None:
        """The innermost savepoint level ends: its rows go with it, or to the level around."""
        rows = self.levels.pop()
        if rolled_back and rows:
            self.stats.nodes[ROLLED_BACK_SAVEPOINT] += 1
        elif self.levels:
            self.levels[-1] += rows

    def run(self, node: Any) -> None:
        from django.db import transaction
        kind = node[0]
        if kind == "push":
            self.stats.nodes[f"push {node[1]}{' keyed' if node[2] is not None else ''}"] += 1
            self.push(node[1], node[2])
        elif kind == "on_commit":
            self.on_commit(*node[1:])
        elif kind == "set_rollback":
            self.stats.nodes[f"set_rollback({node[1]})"] += 1
            transaction.set_rollback(node[1], using=self.alias)
        elif kind == "fail":
            self.fail()
        elif kind == "atomic":
            self.atomic(*node[1:])
        else:
            self.savepoint(*node[1:])

    def on_commit(self, raises: bool, robust: bool, pushes: bool) -> None:
        from django.db import transaction
        self.stats.nodes["on_commit" + "".join(f" {name}" for name, on in (
            ("raising", raises), ("robust", robust), ("pushing", pushes)) if on)] += 1

        def callback() -> None:
            if pushes:
                self.push("one", None)
            if raises:
                raise Boom

        transaction.on_commit(callback, using=self.alias, robust=robust)

    def fail(self) -> None:
        from django.db import DatabaseError, connections
        if self.doomed:
            return
        self.stats.nodes["fail"] += 1
        try:
            with connections[self.alias].cursor() as cur:
                cur.execute("SELECT * FROM no_such_table_here")
        except DatabaseError:
            self.failed = self.failed or self.connection.vendor == "postgresql"

    def atomic(self, savepoint: bool, ends: str, children: list[Any]) -> None:
        from django.db import DatabaseError, transaction
        self.stats.nodes[f"atomic{'' if savepoint else '(savepoint=False)'} {ends}"] += 1
        outermost = not self.connection.in_atomic_block
        level = savepoint and not outermost
        if level:
            self.levels.append(0)
        rolled_back = False  # only when its own exception left it (else counted as kept)
        try:
            with transaction.atomic(using=self.alias, savepoint=savepoint):
                for child in children:
                    self.run(child)
                if ends == "raise":
                    raise Boom
        except Boom:
            # the block's own, or (outermost only) a user's callback after the commit
            rolled_back = True
        except DatabaseError:
            # a savepoint's statement in an aborted transaction (PostgreSQL)
            assert self.failed, "a block's savepoint failed in a healthy transaction"
        if level:
            self.leave_level(rolled_back)
        if outermost:
            self.failed = False

    def savepoint(self, ends: str, children: list[Any]) -> None:
        from django.db import DatabaseError, transaction
        if self.doomed:  # Django refuses the statement: the caller's code stops here
            return
        self.stats.nodes[f"savepoint() {ends}"] += 1
        self.levels.append(0)
        rolled_back = False
        try:
            sid = transaction.savepoint(using=self.alias)
            for child in children:
                self.run(child)
            if self.doomed or ends == "open":
                return
            if ends == "commit":
                transaction.savepoint_commit(sid, using=self.alias)
            else:
                transaction.savepoint_rollback(sid, using=self.alias)
                rolled_back = True
        except DatabaseError:
            assert self.failed, "a raw savepoint's statement failed in a healthy transaction"
        finally:
            self.leave_level(rolled_back)

    # -- rules --------------------------------------------------------------------------

    @initialize()
    def clean(self) -> None:
        self.stats.examples += 1
        with self.outbox.engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {TABLE}"))
        self.recorder.calls.clear()

    @rule(tree=TREES)
    def transaction(self, tree: Any) -> None:
        """One outermost block, to its end."""
        self.run(tree)
        self.stats.trees += 1
        self.check()

    @rule(how=st.sampled_from(["one", "many"]), key=st.none() | st.integers(0, 2))
    def push_alone(self, how: str, key: int | None) -> None:
        """A push outside any block: a transaction of its own, committed at once."""
        self.stats.nodes["push alone"] += 1
        self.push(how, key)
        self.check()

    @invariant()
    def no_transaction_left_open(self) -> None:
        assert not self.connection.in_atomic_block

    def teardown(self) -> None:
        self.stats.pushed += len(self.pushed)
        self.stats.committed += len(self.pushed & self.committed())


def machine_on(alias: str) -> type[DjangoJoins]:
    outbox, recorder = outbox_on(alias)
    return type("DjangoJoinsModel", (DjangoJoins,),
                {"alias": alias, "outbox": outbox, "recorder": recorder, "stats": Stats()})


@pytest.mark.soak(weight=DJANGO)
@pytest.mark.parametrize("alias", ["default", "pg"])
def test_dispatched_is_committed_for_every_django_tree(
    alias: str, project: dict[str, str], capsys: Any,  # noqa: F811
) -> None:
    until = BUDGET.take(DJANGO) if SOAK_MINUTES else 0.0  # first: a skip hands its share on
    if alias == "pg":
        require("PostgreSQL", *PG_ADDRESS)
    machine = machine_on(alias)
    try:
        if not SOAK_MINUTES:
            run_machine(machine, settings=settings.get_profile("django-joins"))
            with capsys.disabled():
                print(machine.stats.line(alias, 0, 1))
            assert machine.stats.trees > 0 and machine.stats.committed > 0
            assert machine.stats.committed < machine.stats.pushed  # some were rolled back
            # the trees reach into savepoints: rows pushed in them, some rolled back with them
            assert machine.stats.nodes[PUSH_IN_SAVEPOINT] > 0, machine.stats.nodes
            assert machine.stats.nodes[ROLLED_BACK_SAVEPOINT] > 0, machine.stats.nodes
            return
        started = time.monotonic()
        runs = soak(lambda each: run_machine(machine, settings=each),
                    settings.get_profile("django-joins-soak"), until)
        with capsys.disabled():
            print(machine.stats.line(alias, time.monotonic() - started, runs))
    finally:
        machine.outbox.runner.heartbeat.stop()
        machine.outbox.engine.dispose()
