"""The processes of a chaos run: Celery workers that come and go, and a private Redis.

Every process is started with ``start_new_session=True`` (its own process group) and kept in
a :class:`Processes` book; :meth:`Processes.stop_all` stops each by its PID (then its group)
when the run ends, even on failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests import procs
from tests.conftest import port_open


@dataclass(frozen=True)
class Pool:
    """One kind of worker: its label, Celery pool, concurrency and extra arguments."""

    name: str
    pool: str
    concurrency: int
    extra: tuple[str, ...] = ()


POOLS: dict[str, Pool] = {p.name: p for p in (
    Pool("prefork", "prefork", 2),
    Pool("prefork-mtpc", "prefork", 2, ("--max-tasks-per-child", "3")),
    Pool("threads", "threads", 4),
    Pool("gevent", "gevent", 8),
)}


class Processes:
    """Every process a run started, to stop them all by PID at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def spawn(self, args: list[str], env: Mapping[str, str] | None = None,
              log: IO[bytes] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, cwd=procs.ROOT, env=dict(env) if env else None,
                                stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.started.append(proc)
        return proc

    def stop_all(self, grace: float = 20.0) -> None:
        """SIGTERM every live process at once, wait up to ``grace`` seconds in all for them
        to exit, then SIGKILL what is left of each, by its PID and group.

        One SIGTERM each: ``procs.stop`` sends another to a process still running, and a
        second SIGTERM that reaches a worker's main process while it starts its drain can
        leave it hung until the SIGKILL."""
        for proc in self.started:
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.started:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        for proc in self.started:
            procs.stop(proc, grace=0)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and its process group (a cold stop: pool children too)."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ")"
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@dataclass
class Worker:
    """One worker slot: restarted after each stop; its generations share one log file.
    ``label``: the slot's name (default: the pool's)."""

    pool: Pool
    env: dict[str, str]
    queue: str
    log_path: Path
    book: Processes
    label: str = ""
    proc: subprocess.Popen[bytes] | None = None
    generation: int = 0
    state: str = "down"  # up | stopping | down
    since: float = field(default_factory=time.monotonic)
    restart_at: float = 0.0
    _log: IO[bytes] | None = None

    def __post_init__(self) -> None:
        self.label = self.label or self.pool.name

    def start(self) -> None:
        self.generation += 1
        if self._log is None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by close()
        self._log.write(f"\n=== chaos: start generation {self.generation}\n".encode())
        self._log.flush()
        args = [sys.executable, "-m", "celery", "-A", "tests.chaos.app", "worker",
                "-P", self.pool.pool, "-c", str(self.pool.concurrency), "-Q", self.queue,
                "-n", f"{self.label.replace(':', '-')}-{self.generation}-{self.queue}@%h",
                "--loglevel=INFO", "--without-gossip", "--without-mingle",
                "--without-heartbeat", *self.pool.extra]
        env = {**os.environ, "PYTHONPATH": str(procs.ROOT), **self.env,
               "CHAOS_WORKER": self.label, "CHAOS_GENERATION": str(self.generation)}
        self.proc = self.book.spawn(args, env, self._log)
        self.state, self.since = "up", time.monotonic()

    def note(self, line: str) -> None:
        if self._log is not None:
            self._log.write(f"=== chaos: {line}\n".encode())
            self._log.flush()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def generation_text(self) -> str:
        """The log of the current generation only."""
        return self.text().rpartition(f"=== chaos: start generation {self.generation}\n")[2]


class Redis:
    """A private ``redis-server`` on ``port`` (never the shared 6379), restartable."""

    def __init__(self, port: int, book: Processes) -> None:
        assert port != 6379, "never touch the shared Redis"
        self.port = port
        self.book = book
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = self.book.spawn([exe, "--port", str(self.port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no"])
        procs.wait_for(lambda: port_open("127.0.0.1", self.port), 10,
                       f"redis-server on {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
            self.proc = None
