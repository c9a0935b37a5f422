"""A second SIGTERM (or drain signal) arriving while the first one's handler is starting the
drain thread runs :meth:`Drain.start` again, on the same thread, inside the first call. It
must answer at once (the drain is under way), never wait on the lock the interrupted call
holds: a worker sent two SIGTERMs back to back hung until it was killed. Found by the
review of the suite's slow teardowns."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from celery_outbox import JobRegistry, OutboxConfig, shutdown
from celery_outbox.runner import Runner
from celery_outbox.shutdown import Drain
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def test_a_start_interrupted_by_a_second_signal_answers_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recording = Recording()
    runner = Runner(MemoryStore(), JobRegistry(), OutboxConfig(), lambda: recording,
                    clock=lambda: T0)
    drain = Drain(runner, timedelta(seconds=1))
    inner: list[bool] = []
    started: list[threading.Thread] = []
    real = threading.Thread

    class Interrupted(real):
        def start(self) -> None:  # the second signal lands here, on the starting thread
            inner.append(drain.on_signal() is None and drain.start())
            started.append(self)
            super().start()

    monkeypatch.setattr(shutdown.threading, "Thread", Interrupted)
    outer: list[bool] = []
    caller = real(target=lambda: outer.append(drain.start()), daemon=True)
    caller.start()
    caller.join(timeout=10)
    monkeypatch.undo()
    try:
        assert not caller.is_alive(), "Drain.start waited on the lock its own frame holds"
        assert outer == [True] and inner == [False]
        assert len(started) == 1, "one drain thread per process"
        assert drain.wait(timedelta(seconds=10))
    finally:
        runner.heartbeat.stop()
