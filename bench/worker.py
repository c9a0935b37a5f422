"""Real worker processes for the end-to-end figures (``celery worker`` and others), each in a
process group of its own, stopped by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             interval: float = 0.005) -> None:
    """Poll ``predicate`` until truthy; raise TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@contextmanager
def celery_worker(queue: str, *, concurrency: int = 2, app: str = "bench.app"
                  ) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A app worker -P prefork -c concurrency -Q queue``, in its own process
    group; SIGTERM then SIGKILL by PID when the block ends. The log goes to a temp file whose
    path is printed if the worker dies early."""
    args = [sys.executable, "-m", "celery", "-A", app, "worker", "-P", "prefork",
            "-c", str(concurrency), "-Q", queue, "-n", f"{queue}@%h",
            "--loglevel=WARNING", "--without-gossip",
            "--without-mingle", "--without-heartbeat"]
    with process_group(args, "worker") as proc:
        yield proc


@contextmanager
def process_group(args: list[str], name: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` from the repository's root in a process group of its own; SIGTERM then
    SIGKILL by its PID when the block ends, whatever raised. Its output goes to a temp file,
    whose path is printed if it exited otherwise than on that SIGTERM."""
    log_path = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        _stop(proc)
        if proc.returncode not in (0, -signal.SIGTERM):
            print(f"  ({name} exited with {proc.returncode}; log: {log_path})")
        else:
            log_path.unlink(missing_ok=True)


def _stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
