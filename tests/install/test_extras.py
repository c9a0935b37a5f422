"""Each extra, installed into a FRESH venv, gives a worker that runs a job.

What a user does: ``python -m venv x && x/bin/pip install 'celery-outbox[redis]'``, then
``celery -A proj worker``. Here the package is this tree, built once into a wheel; each case
makes a venv of its own (no system site-packages, nothing from the test's venv), installs
``wheel[extra]`` with pip's normal resolution (its cache makes a second run quicker), then
from a directory holding only :mod:`tests.install.extras_app`:

1. ``extras_app.check(extra)``: ``celery_outbox`` comes from that venv, and what the extra is
   for imports and works (an async engine runs a query, Django sets up, the dashboard builds);
2. ``celery -A extras_app worker`` starts, ready;
3. ``extras_app.push(name)`` pushes one job in a transaction; the worker runs it (its file
   appears, written by a process of that venv);
4. ``[web]`` only: ``celery -A extras_app outbox web --no-auth`` serves the dashboard and the
   API, which lists the job.

Every process is stopped by its PID when the case ends, failed or not. Brokers: kombu's
SQLAlchemy transport on a SQLite file (core, web, async, django), Redis (redis), RabbitMQ
(amqp), each with a queue of the case's own; a server that does not answer skips the case
locally and fails it when ``CI`` is set.

The default suite runs the bounded cases ``core`` and ``redis`` (the reported bug: kombu's
Redis transport imports ``packaging``), 45 to 70 s on two busy cores with a warm pip cache; CI
runs ``ON_CI``. All eight:
``OUTBOX_TEST_EXTRAS=all`` (``make extras``), or a list: ``OUTBOX_TEST_EXTRAS=web,async``.
The core alone is also installed on every run from the sdist (:mod:`tests.install.test_release`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import procs
from tests.conftest import AMQP_ADDRESS, AMQP_URL, REDIS_ADDRESS, REDIS_URL, require, with_redis_db

pytestmark = pytest.mark.extras

EXTRAS = ("core", "redis", "amqp", "web", "async", "django", "tracing", "metrics")
DEFAULT = ("redis",)  # the core and the Redis extra in one venv: the default suite's bounded case
ON_CI = ("redis", "web")
"""Under CI: the extras whose worker needs more than the core's imports (the dashboard's
server and its packaged assets); the core alone from the wheel, ``[amqp]``, ``[async]`` and
``[django]`` in ``make extras`` (the core alone from the sdist: tests/install/test_release.py,
every run)."""
HERE = Path(__file__).resolve().parent
INSTALL_TIMEOUT = 300.0  # seconds for one venv's pip install (a cold cache downloads a lot)
READY_TIMEOUT = 60.0
RUN_TIMEOUT = 30.0
PARALLEL = 1 if os.environ.get("CI") else 3  # venvs installing at once (CI: beside the suite)


def selected() -> tuple[str, ...]:
    """The extras this run installs: OUTBOX_TEST_EXTRAS ("all" or a comma list), else ON_CI
    under CI (each installed the way a user does, on every CI run), else DEFAULT."""
    raw = os.environ.get("OUTBOX_TEST_EXTRAS", "").strip()
    if not raw:
        return ON_CI if os.environ.get("CI") else DEFAULT
    if raw == "all":
        return EXTRAS
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = set(names) - set(EXTRAS)
    assert not unknown, f"OUTBOX_TEST_EXTRAS names unknown extras {sorted(unknown)}: {EXTRAS}"
    return names


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"


def run(args: list[str], log: Path, timeout: float, **kwargs: object) -> None:
    """Run ``args`` to the end (its output in ``log``); fail with the output's end if it fails.

    ``start_new_session`` and a kill of the group on the timeout: nothing outlives the call.
    """
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(args)}\n".encode())
        out.flush()
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, **kwargs)  # type: ignore[call-overload]
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{args[:3]} still running after {timeout}s:\n"
                                 f"{tail(log)}") from None
        finally:
            procs.stop(proc, grace=0)
    assert code == 0, f"{args[:3]} exited {code}:\n{tail(log)}"


class Installs:
    """The wheel of this tree, built once, and one venv per extra, installed in parallel.

    The first :meth:`venv` call starts every selected extra's install (``PARALLEL`` at once);
    each call then waits for its own. A venv is removed once its case is over.
    """

    def __init__(self, root: Path, extras: tuple[str, ...]) -> None:
        self.root = root
        self.extras = extras
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._wheel: Future[Path] | None = None
        self._venvs: dict[str, Future[Path]] = {}

    def venv(self, extra: str) -> Path:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="extras-install")
                self._wheel = self._pool.submit(self._build_wheel)
                self._venvs = {e: self._pool.submit(self._install, e) for e in self.extras}
        return self._venvs[extra].result()

    def discard(self, extra: str) -> None:
        """Remove ``extra``'s venv in the background (the next cases run meanwhile)."""
        with self._lock:
            if self._pool is not None and extra in self._venvs:
                venv = self.root / f"venv-{extra}"
                self._pool.submit(shutil.rmtree, venv, ignore_errors=True)

    def close(self) -> None:
        """Wait for the installs and removals under way; then remove everything."""
        if self._pool is not None:
            for future in self._venvs.values():
                future.cancel()
            self._pool.shutdown(wait=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def _build_wheel(self) -> Path:
        """``pip wheel`` of a copy of the tree (the build leaves nothing in the work tree)."""
        source = copy_source(self.root / "source")
        out = self.root / "wheel"
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
             str(source)], self.root / "wheel.log", INSTALL_TIMEOUT)
        (wheel,) = out.glob("celery_outbox-*.whl")
        return wheel

    def _install(self, extra: str) -> Path:
        """``python -m venv`` (fresh: no system site-packages) + ``pip install wheel[extra]``.

        The pip of the test's venv installs into the new one (``pip --python``): the same
        resolution as the venv's own pip, without ensurepip's few seconds per venv; and
        ``--no-compile`` (the interpreter compiles what it imports).
        """
        assert self._wheel is not None
        wheel = self._wheel.result()
        venv = self.root / f"venv-{extra}"
        log = self.root / f"install-{extra}.log"
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)], log, INSTALL_TIMEOUT)
        requirement = str(wheel) if extra == "core" else f"{wheel}[{extra}]"
        run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
             "-q", "--no-compile", requirement], log, INSTALL_TIMEOUT, env=clean_env(venv))
        return venv


SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in")
"""What a build reads besides the package (``license-files``, the sdist's ``MANIFEST.in``)."""


def copy_source(dest: Path) -> Path:
    """A copy of what a build of this tree reads, at ``dest`` (a build writes ``build/`` and
    ``*.egg-info`` next to its source: never in the work tree)."""
    shutil.copytree(procs.ROOT / "celery_outbox", dest / "celery_outbox",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in SOURCE_FILES:
        shutil.copy2(procs.ROOT / name, dest / name)
    return dest


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a process of ``venv``: this one's, less what points into the test's
    venv or source tree, and less PYTHONDONTWRITEBYTECODE: the venv is installed without
    compiling, so its first process compiles what it imports and the others reuse it (each
    would otherwise compile Celery and SQLAlchemy again, seconds apiece)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP",
                        "DJANGO_SETTINGS_MODULE", "PYTHONDONTWRITEBYTECODE")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


@pytest.fixture(scope="session")
def installs() -> Iterator[Installs]:
    root = Path(tempfile.mkdtemp(prefix="outbox-extras-"))
    built = Installs(root, selected())
    try:
        yield built
    finally:
        built.close()


@contextmanager
def process(args: list[str], cwd: Path, env: dict[str, str], log: Path,
            ) -> Iterator[subprocess.Popen[bytes]]:
    """A process of the case's venv, stopped by its PID (then its group) when the block ends."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
        finally:
            procs.stop(proc)


def wait_line(proc: subprocess.Popen[bytes], log: Path, text: str, timeout: float,
              what: str) -> None:
    """Wait until ``log`` has ``text``; fail at once, with the log, if ``proc`` exited."""
    def seen() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited ({proc.returncode}):\n{tail(log)}")
        return text in log.read_text(errors="replace")

    procs.wait_for(seen, timeout, what)


def broker_for(extra: str, tmp: Path) -> str:
    if extra == "redis":
        require("Redis", *REDIS_ADDRESS)
        return with_redis_db(REDIS_URL)
    if extra == "amqp":
        require("RabbitMQ", *AMQP_ADDRESS)
        return AMQP_URL
    return f"sqla+sqlite:///{tmp / 'broker.sqlite3'}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str] | None:
    """(status, body) of a GET, or None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except OSError:
        return None


@pytest.mark.parametrize("extra", selected())  # the others are not collected: no skips
def test_extra_installs_a_worker_that_runs_a_job(extra: str, installs: Installs,
                                                tmp_path: Path) -> None:
    broker = broker_for(extra, tmp_path)  # before the install: an absent server skips at once
    venv = installs.venv(extra)
    app_dir, out = tmp_path / "app", tmp_path / "out"
    app_dir.mkdir()
    out.mkdir()
    shutil.copy2(HERE / "extras_app.py", app_dir / "extras_app.py")
    queue = f"outbox-extras-{extra}-{uuid.uuid4().hex[:10]}"
    env = clean_env(venv, EXTRAS_BROKER=broker, EXTRAS_DB=f"sqlite:///{tmp_path / 'db.sqlite3'}",
                    EXTRAS_QUEUE=queue, EXTRAS_OUT=str(out))
    try:
        run_case(extra, venv, app_dir, out, env, tmp_path)
    finally:
        installs.discard(extra)
        forget_queue(extra, broker, queue)


def run_case(extra: str, venv: Path, app_dir: Path, out: Path, env: dict[str, str],
             tmp_path: Path) -> None:
    """The check, then a worker of the venv runs one pushed job; then [web]'s server."""
    bin_ = venv / "bin"
    python = str(bin_ / "python")
    queue = env["EXTRAS_QUEUE"]
    run([python, "-c", f"import extras_app; extras_app.check({extra!r})"], tmp_path / "check.log",
        60, cwd=app_dir, env=env)

    worker_log = tmp_path / "worker.log"
    with process([str(bin_ / "celery"), "-A", "extras_app", "worker", "-P", "prefork", "-c", "1",
                  "-Q", queue, "-n", f"{queue}@%h", "--loglevel=INFO", "--without-gossip",
                  "--without-mingle", "--without-heartbeat"],
                 app_dir, env, worker_log) as worker:
        wait_line(worker, worker_log, " ready.", READY_TIMEOUT, f"[{extra}] worker to be ready")
        push_log = tmp_path / "push.log"
        run([python, "-c", "import extras_app; extras_app.push('one')"], push_log, 60,
            cwd=app_dir, env=env)
        execution_id = push_log.read_text().strip().splitlines()[-1]

        def ran() -> dict[str, object] | None:
            if worker.poll() is not None:
                raise AssertionError(f"worker exited ({worker.returncode}):\n{tail(worker_log)}")
            done = out / "one"
            return json.loads(done.read_text()) if done.exists() else None

        try:
            done = procs.wait_for(ran, RUN_TIMEOUT, f"[{extra}] job to run")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nworker log:\n{tail(worker_log)}") from None
        assert isinstance(done, dict)
        assert done["execution_id"] == execution_id
        assert done["attempt"] == 1
        assert Path(str(done["prefix"])).resolve() == venv.resolve()
        assert done["pid"] != worker.pid  # a prefork child ran it

    if extra == "web":
        check_web(bin_, app_dir, env, tmp_path / "web.log")


def forget_queue(extra: str, broker: str, queue: str) -> None:
    """Leave nothing of the case's queue on a shared broker (the worker is gone)."""
    if extra == "redis":
        import redis

        client = redis.Redis.from_url(broker)
        try:
            client.delete(queue, *(f"{prefix}.{queue}"
                                   for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        finally:
            client.close()
    elif extra == "amqp":
        from kombu import Connection

        with Connection(broker, connect_timeout=5) as conn:
            channel = conn.default_channel
            channel.queue_delete(queue)
            channel.exchange_delete(queue)


def check_web(bin_: Path, app_dir: Path, env: dict[str, str], log: Path) -> None:
    """``celery outbox web`` from the venv serves the dashboard and the API."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with process([str(bin_ / "celery"), "-A", "extras_app", "outbox", "web", "--no-auth",
                  "--port", str(port), "--log-level", "warning"], app_dir, env, log) as web:
        def jobs() -> tuple[int, str] | None:
            if web.poll() is not None:
                raise AssertionError(f"the web server exited ({web.returncode}):\n{tail(log)}")
            return http_get(f"{base}/api/v1/jobs")

        status, body = procs.wait_for(jobs, READY_TIMEOUT, "the web server to answer")  # type: ignore[misc]
        assert status == 200, body
        assert "extras.note" in body
        page = http_get(f"{base}/")
        assert page is not None and page[0] == 200, page
        assert "<html" in page[1].lower()
