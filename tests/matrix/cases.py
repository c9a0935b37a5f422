"""The cases of the matrix: every (path, query, occurrence) a clean run of each path shows,
times every fault.

:func:`discover` runs each path once with no fault, recording the named queries its step
runs and how often; each occurrence of each query then gets each fault. A query a path
starts to run (or a new path) is in the matrix at the next collection, with no list to
update.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tests.matrix.faults import FAULTS, Fault
from tests.matrix.paths import PATHS
from tests.matrix.world import World


@dataclass(frozen=True)
class Case:
    path: str
    fault: Fault

    @property
    def id(self) -> str:
        return f"{self.path}-{self.fault.query}-{self.fault.occurrence}-{self.fault.kind}"


@dataclass(frozen=True)
class Discovered:
    counts: dict[str, Counter[str]]
    """Per path, how often its clean step ran each named query."""
    clean: dict[str, list[str]]
    """Per path, the violations of its clean run (none: the path itself is sound)."""

    def cases(self) -> list[Case]:
        return [Case(path, Fault(query, k, kind))
                for path, counts in self.counts.items()
                for query, n in counts.items()
                for k in range(1, n + 1)
                if not any((g.query, g.occurrence) == (query, k) for g in PATHS[path].given)
                for kind in FAULTS]

    def pairs(self) -> list[tuple[str, str]]:
        return [(path, query) for path, counts in self.counts.items() for query in counts]


_DISCOVERED: list[Discovered] = []


def discover() -> Discovered:
    """Run each path once with no fault (cached per process)."""
    if not _DISCOVERED:
        counts: dict[str, Counter[str]] = {}
        clean: dict[str, list[str]] = {}
        for name, path in PATHS.items():
            w = World(**path.options)
            try:
                clean[name] = w.scenario(path.seed, path.step, path.given)
                counts[name] = Counter(w.executor.counts)
            finally:
                w.close()
        _DISCOVERED.append(Discovered(counts, clean))
    return _DISCOVERED[0]


def run_case(case: Case) -> tuple[list[str], World]:
    path = PATHS[case.path]
    w = World(**path.options)
    try:
        return w.scenario(path.seed, path.step, [*path.given, case.fault]), w
    finally:
        w.close()
