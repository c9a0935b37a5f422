"""What both examples' ``__main__`` do around their app: run a Celery worker and a web server
of the example as real processes (each stopped by its PID, even on failure), call the
server's endpoints, and wait for an outcome with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def process(args: Sequence[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python args...`` from the project's root, its output in ``log``; SIGTERM when the
    block ends, then SIGKILL of its process group if it has not exited within 10 s."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_until(what: str, check: Callable[[], object], timeout: float = 60.0,
               procs: Sequence[tuple[str, subprocess.Popen[bytes], Path]] = ()) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds, or
    at once, with its log, when one of ``procs`` exited."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        for name, proc, log in procs:
            if proc.poll() is not None:
                raise SystemExit(f"the {name} exited ({proc.returncode}):\n"
                                 f"{log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


@contextmanager
def worker_and_server(celery_app: str, queue: str, server: Sequence[str], port: int,
                      logs: Path) -> Iterator[None]:
    """A worker of ``celery_app`` consuming ``queue`` and the web server ``server`` (module
    and arguments, listening on ``port``), both running and ready until the block ends."""
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        worker_log, server_log = logs / "worker.log", logs / "server.log"
        worker = stack.enter_context(process(
            ["-m", "celery", "-A", celery_app, "worker", "-Q", queue, "-c", "2", "-l", "INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat"], worker_log))
        web = stack.enter_context(process(["-m", *server], server_log))
        running = [("worker", worker, worker_log), ("server", web, server_log)]
        wait_until("the worker", lambda: " ready." in worker_log.read_text(errors="replace"),
                   procs=running)
        wait_until(f"the server on port {port}", lambda: listening(port), procs=running)
        print(f"worker (pid {worker.pid}, log {worker_log}) and server (pid {web.pid}, "
              f"http://127.0.0.1:{port}) are running")
        try:
            yield
        finally:  # both stop at once; each is then awaited (and killed if need be)
            for proc in (web, worker):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)


def call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """An HTTP request with a JSON body; the status and the JSON answer (text if not JSON)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def reset_files(data_dir: Path, *names: str) -> None:
    """Delete the embedded default's SQLite files (and their journals): a fresh start."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        for suffix in ("", "-wal", "-shm", "-journal"):
            (data_dir / f"{name}{suffix}").unlink(missing_ok=True)


def serve_forever() -> None:
    """Keep the worker and the server running until Ctrl-C."""
    print("serving until Ctrl-C")
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)
