"""The in-memory twin cannot drift from the store: each transition of the worker's protocol
(``celery_outbox.store.protocol.WorkerStore``, what the runner, heartbeat and drain call) has
the very signature of the real store's, answer types included, and every other method the twin
shares with the store takes the same arguments (the transaction types differ by design)."""

from __future__ import annotations

import inspect

import pytest

from celery_outbox.store import ExecutionStore
from celery_outbox.store.protocol import WorkerStore
from tests.twin import MemoryStore

PROTOCOL = sorted(name for name in WorkerStore.__dict__
                  if not name.startswith("_") and callable(WorkerStore.__dict__[name]))
SHARED = sorted(name for name in dir(MemoryStore) if not name.startswith("_")
                and callable(getattr(ExecutionStore, name, None)) and name not in PROTOCOL)


def test_the_protocol_names_the_worker_transitions() -> None:
    assert {"claim", "start", "finish", "finish_many", "heartbeat", "release",
            "release_claim", "confirm_stop", "dispatchable"} <= set(PROTOCOL)


@pytest.mark.parametrize("name", PROTOCOL)
def test_the_store_and_the_twin_have_the_protocols_signature(name: str) -> None:
    wanted = inspect.signature(getattr(WorkerStore, name))
    for store in (ExecutionStore, MemoryStore):
        assert str(inspect.signature(getattr(store, name))) == str(wanted), (
            f"{store.__name__}.{name} drifted from the protocol")


@pytest.mark.parametrize("name", SHARED)
def test_the_twins_other_methods_take_the_stores_arguments(name: str) -> None:
    def arguments(fn: object) -> list[tuple[str, object, object]]:
        return [(p.name, p.kind, p.default)
                for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]

    assert arguments(getattr(MemoryStore, name)) == arguments(getattr(ExecutionStore, name))
