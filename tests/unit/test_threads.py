"""tests/threads.run_concurrently: results in order, a thread's exception and a hung thread
fail the calling test (a bare Thread would swallow both)."""

from __future__ import annotations

import threading

import pytest

from tests.threads import run_concurrently


def test_results_come_back_in_index_order() -> None:
    assert run_concurrently(lambda i: i * 10, 4, timeout=10) == [0, 10, 20, 30]


def test_an_exception_in_a_thread_is_raised_with_its_traceback() -> None:
    def target(i: int) -> int:
        if i == 1:
            raise ValueError("boom in thread 1")
        return i

    with pytest.raises(AssertionError, match="1 of 3 thread") as failure:
        run_concurrently(target, 3, timeout=10)
    assert "ValueError: boom in thread 1" in str(failure.value)
    assert isinstance(failure.value.__cause__, ValueError)


def test_a_thread_still_running_at_the_deadline_fails_with_its_stack() -> None:
    release = threading.Event()

    def target(i: int) -> None:
        if i == 0:
            release.wait(30)  # stuck here

    try:
        with pytest.raises(AssertionError, match="1 of 2 thread") as failure:
            run_concurrently(target, 2, timeout=0.5, diagnose=lambda: "sessions: none")
    finally:
        release.set()
    assert "release.wait(30)" in str(failure.value)
    assert "sessions: none" in str(failure.value)
