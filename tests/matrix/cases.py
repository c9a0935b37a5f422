"""The cases of the matrix: every (path, query, occurrence) a clean run of each path shows,
times every fault.

:func:`discover` runs each path once with no fault, recording the named queries its step
runs and how often; each occurrence of each query then gets each fault. A query a path
starts to run (or a new path) is in the matrix at the next collection, with no list to
update. ``exit`` (SystemExit) goes only to the paths that run a worker (their step claims):
elsewhere no code tells it from ``interrupt`` (KeyboardInterrupt), which every path gets.
Every path runs on SQLite; those of :data:`PG_PATHS` also on PostgreSQL (named
``pg_<path>``) when a server answers (:data:`tests.matrix.world.DATABASES`), for its own
statements (the combined outcome and start, the unflushed start, the keyed push's
savepoints) and the executor's direct psycopg path.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from tests.matrix.faults import FAULTS, Fault
from tests.matrix.paths import PATHS, Path
from tests.matrix.world import DATABASES, World

PG_PATHS = ("worker", "worker_window", "worker_parallel", "worker_parallel_nokeep", "push",
            "push_many_keyed", "push_session", "worker_batch", "push_coalesced",
            "worker_locked")
"""The paths run on PostgreSQL too in the default suite: those whose statements or executor
path differ there (the combined outcome and start, the unflushed start, the direct psycopg
path alone and in a caller's transaction, the keyed push's savepoints, the batch triggers'
PL/pgSQL, the debounced push's per-key lock, a claim skipping a row a caller holds
locked)."""
PG_PATHS_FULL = (*PG_PATHS, "worker_one", "hand_back", "lease_watch", "heartbeat",
                 "admin_retry", "sweep", "lost_claim", "push_batch", "worker_batch_success")
"""The paths run on PostgreSQL with ``OUTBOX_TEST_FAULTS=full`` (``make faults``)."""
PG = "pg_"


def variants() -> list[str]:
    """Every path name, then the PostgreSQL ones (``pg_<path>``) when a server answers."""
    if "postgresql" not in DATABASES:
        return list(PATHS)
    full = os.environ.get("OUTBOX_TEST_FAULTS") == "full"
    return [*PATHS, *(PG + name for name in (PG_PATHS_FULL if full else PG_PATHS))]


def resolve(variant: str) -> tuple[Path, str]:
    """The path of ``variant`` and its database."""
    if variant.startswith(PG):
        return PATHS[variant.removeprefix(PG)], "postgresql"
    return PATHS[variant], "sqlite"


@dataclass(frozen=True)
class Case:
    path: str
    """The path's variant name (``pg_`` first on PostgreSQL)."""
    fault: Fault

    @property
    def id(self) -> str:
        return f"{self.path}-{self.fault.query}-{self.fault.occurrence}-{self.fault.kind}"


@dataclass(frozen=True)
class Discovered:
    counts: dict[str, Counter[str]]
    """Per variant, how often its clean step ran each named query."""
    clean: dict[str, list[str]]
    """Per variant, the violations of its clean run (none: the path itself is sound)."""

    def cases(self) -> list[Case]:
        return [Case(variant, Fault(query, k, kind))
                for variant, counts in self.counts.items()
                # Sorted: the order a path ran its queries in may differ between processes
                # (the rescuer's verdicts follow the rows' random ids), and pytest-xdist
                # needs every worker to collect the same cases in the same order.
                for query, n in sorted(counts.items())
                for k in range(1, n + 1)
                if not any((g.query, g.occurrence) == (query, k)
                           for g in resolve(variant)[0].given)
                for kind in FAULTS
                if kind != "exit" or "claim_rows" in counts]

    def pairs(self) -> list[tuple[str, str]]:
        return [(variant, query) for variant, counts in self.counts.items()
                for query in counts]


_DISCOVERED: list[Discovered] = []


def discover() -> Discovered:
    """Run each variant once with no fault but its path's own (cached per process)."""
    if not _DISCOVERED:
        counts: dict[str, Counter[str]] = {}
        clean: dict[str, list[str]] = {}
        for variant in variants():
            path, database = resolve(variant)
            w = World(database=database, **path.options)
            try:
                clean[variant] = w.scenario(path.seed, path.step, path.given)
                counts[variant] = Counter(w.executor.counts)
            finally:
                w.close()
        _DISCOVERED.append(Discovered(counts, clean))
    return _DISCOVERED[0]


def run_case(case: Case) -> tuple[list[str], World]:
    path, database = resolve(case.path)
    w = World(database=database, **path.options)
    try:
        return w.scenario(path.seed, path.step, [*path.given, case.fault]), w
    finally:
        w.close()
