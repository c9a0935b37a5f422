"""The helper threads of a parallel job (``runner._Helpers``): reused while busy, ended once
idle, started again when needed; a call that raises hands its exception to the waiter."""

from __future__ import annotations

import threading

import pytest

from celery_outbox import runner as runner_module
from celery_outbox.runner import HELPER_NAME, _Helpers
from tests import procs


def helper_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == HELPER_NAME}


def test_idle_helpers_end_and_new_ones_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "HELPER_IDLE", 0.05)
    before = helper_threads()  # other tests' (a process running the whole suite)
    helpers = _Helpers()
    together = threading.Barrier(3, timeout=5)
    jobs = [helpers.submit(together.wait) for _ in range(2)]
    together.wait()  # both ran at once, each on a thread of its own
    for job in jobs:
        assert job.done.wait(5) and job.raised is None
    mine = helper_threads() - before
    assert len(mine) == 2
    procs.wait_for(lambda: not any(t.is_alive() for t in mine), 5, "the idle helpers to end")

    again = helpers.submit(lambda: "ran")
    assert again.done.wait(5) and again.result == "ran"


def test_a_call_that_raises_hands_its_exception_over() -> None:
    class Stop(BaseException):
        pass

    def stop() -> None:
        raise Stop()

    job = _Helpers().submit(stop)
    assert job.done.wait(5)
    assert isinstance(job.raised, Stop) and job.result is None
