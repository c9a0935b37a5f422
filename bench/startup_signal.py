"""The one side effect of every handler in ``python -m bench startup``: when it started.

:func:`record` pushes ``"<wall> <cpu>"`` onto the Redis list ``<BENCH_COUNTER>:started``:
``wall``, ``time.time()`` at the handler's first line (seconds; the benchmark subtracts the
``time.time()`` before it started the worker); ``cpu``, the CPU seconds (user + system) the
worker's main process and this pool process had used by then: the work on the way to the
first handler, which the machine's other load does not stretch as it stretches the wall
time. Standard library and redis only, so each app pays the same for it.
"""

from __future__ import annotations

import os
import resource
import time

import redis

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/11")
STARTED = os.environ.get("BENCH_COUNTER", "bench:startup") + ":started"
_TICK = os.sysconf("SC_CLK_TCK")


def record() -> None:
    """Push this handler's start (wall clock) and the CPU used so far (see the module)."""
    wall = time.time()
    own = resource.getrusage(resource.RUSAGE_SELF)
    cpu = own.ru_utime + own.ru_stime + _cpu_of(os.getppid())
    redis.Redis.from_url(BROKER).rpush(STARTED, f"{wall} {cpu}")


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)
