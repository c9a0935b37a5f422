"""The helper threads of a parallel job (``runner._Helpers``): reused while busy, ended once
idle, started again when needed; a call that raises hands its exception to the waiter."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

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


def test_a_helper_closes_old_django_connections_around_each_handler(
    tmp_path: Any,
) -> None:
    """What Celery's Django fix-up does around a task on the task's thread, a helper does
    around each handler on its own (Django's connections are per thread): with Django
    configured, ``close_old_connections`` runs before and after; a real Django in a child
    process, so its settings are its own."""
    script = tmp_path / "django_helper.py"
    script.write_text(
        "import django, threading\n"
        "from django.conf import settings\n"
        "settings.configure(DATABASES={'default': {'ENGINE': 'django.db.backends.sqlite3',"
        " 'NAME': ':memory:'}})\n"
        "django.setup()\n"
        "import django.db\n"
        "calls = []\n"
        "real = django.db.close_old_connections\n"
        "def counted(**kw):\n"
        "    calls.append(threading.current_thread().name)\n"
        "    real(**kw)\n"
        "django.db.close_old_connections = counted\n"
        "from celery_outbox.runner import _Helpers, HELPER_NAME\n"
        "job = _Helpers().submit(lambda: calls.append('handler'))\n"
        "assert job.done.wait(5) and job.raised is None\n"
        "print(calls == [HELPER_NAME, 'handler', HELPER_NAME], calls)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=str(procs.ROOT),
                          env={**os.environ, "PYTHONPATH": str(procs.ROOT)}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True"), done.stdout
