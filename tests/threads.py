"""Threads a test starts: every outcome surfaces, a hung thread fails the test with its stack.

A bare ``threading.Thread`` swallows its exception (printed to stderr, lost to the assertion)
and ``join(timeout)`` returns silently when the thread is still running, so a test only sees
a missing result. :func:`run_concurrently` re-raises the first exception of any thread (with
every thread's traceback in the message) and, when a thread outlives the deadline, fails with
the stack it is stuck in and whatever ``diagnose()`` reports (e.g. the database's sessions).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_concurrently(
    target: Callable[[int], T],
    n: int,
    *,
    timeout: float = 60.0,
    diagnose: Callable[[], str] | None = None,
) -> list[T]:
    """Run ``target(i)`` for i in 0..n-1 on ``n`` threads released together by a barrier.

    Returns the results in index order. Raises AssertionError when a thread is still running
    ``timeout`` seconds (one deadline for all) after the start, with its current stack and
    ``diagnose()``'s text; re-raises the first exception a thread raised, with the formatted
    tracebacks of all failed threads attached as a note in the message.
    """
    barrier = threading.Barrier(n)
    results: dict[int, T] = {}
    errors: dict[int, BaseException] = {}

    def body(i: int) -> None:
        try:
            barrier.wait(timeout)
        except BaseException as exc:
            errors[i] = exc
            barrier.abort()  # a thread that fails before the start releases the others
            return
        # Past the barrier, a failure must not abort it: threads still waking from wait()
        # would see a broken barrier and fail too.
        try:
            results[i] = target(i)
        except BaseException as exc:
            errors[i] = exc

    threads = [threading.Thread(target=body, args=(i,), name=f"concurrent-{i}", daemon=True)
               for i in range(n)]
    deadline = time.monotonic() + timeout
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t for t in threads if t.is_alive()]
    if hung:
        frames = sys._current_frames()
        stacks = "\n".join(
            f"--- {t.name} is still running after {timeout:.0f}s:\n"
            + "".join(traceback.format_stack(frames[t.ident])) if t.ident in frames else ""
            for t in hung
        )
        report = f"\n--- diagnosis:\n{diagnose()}" if diagnose is not None else ""
        raise AssertionError(f"{len(hung)} of {n} thread(s) did not finish\n{stacks}{report}")
    if errors:
        first = errors[min(errors)]
        details = "\n".join(
            f"--- thread {i}:\n" + "".join(traceback.format_exception(exc))
            for i, exc in sorted(errors.items())
        )
        raise AssertionError(f"{len(errors)} of {n} thread(s) raised:\n{details}") from first
    return [results[i] for i in range(n)]
