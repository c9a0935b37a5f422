"""Processes a test starts: each is stopped by its PID when the test ends, even on failure."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
              interval: float = 0.05) -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process, SIGKILL its group if it has not exited after ``grace`` s, and
    SIGKILL whatever is left of the group once it has.

    SIGTERM goes to the leader only: a Celery worker's main process stops its pool children
    itself; a SIGTERM to the whole group kills them mid-write and can leave billiard's pool
    waiting forever on a lock a dead child held.
    """
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)


@contextmanager
def celery_worker(
    app: str,
    env: Mapping[str, str],
    *,
    queues: str | None = None,
    pool: str = "prefork",
    concurrency: int = 2,
    extra: tuple[str, ...] = (),
    log_path: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``celery -A app worker`` as a real process; stopped (group) when the block ends."""
    args = [sys.executable, "-m", "celery", "-A", app, "worker", "-P", pool,
            "-c", str(concurrency), "--loglevel=INFO", "--without-gossip", "--without-mingle",
            "--without-heartbeat", *extra]
    if queues:
        args += ["-Q", queues]
    log_file = open(log_path or tempfile.mktemp(suffix=".worker.log"), "wb")  # noqa: SIM115
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    proc = subprocess.Popen(args, cwd=ROOT, env=full_env, stdout=log_file,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        stop(proc)
        log_file.close()


@contextmanager
def redis_server(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A private ``redis-server`` on 127.0.0.1:``port`` (never the shared 6379)."""
    assert port != 6379, "never touch the shared Redis"
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        from tests.conftest import port_open

        wait_for(lambda: port_open("127.0.0.1", port), 10, f"redis-server on {port}")
        yield proc
    finally:
        stop(proc)
