"""``python -m example_project`` around a dashboard (and ``SHOP_WEB_USERS``, the example's
dashboard users): ``--dashboard`` on a port already in use
fails at once (before resetting any data) naming ``--dashboard-port``; and a re-run resets the
embedded SQLite files in place (same files, empty tables), so a dashboard still running on
them shows the new run's data instead of a deleted file's.

Embedded default (SQLite database and broker files in the test's own directory).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests import procs


def example_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOP_")}
    env.update(PYTHONPATH=str(procs.ROOT), SHOP_DATA_DIR=str(data_dir))
    return env


def test_dashboard_on_a_busy_port_fails_before_the_flow_naming_the_flag(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "example_project", "--dashboard", "--dashboard-port",
             str(port)],
            cwd=procs.ROOT, env=example_env(tmp_path), capture_output=True, text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--dashboard-port: port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "--dashboard-port" in done.stderr.split("pick another port:", 1)[1]
    assert done.stdout == ""  # no flow: no database line, no worker, no checks
    assert list(tmp_path.iterdir()) == []  # nothing reset, created or started
    assert time.monotonic() - started < 30


RESET_TWICE = """
import os
from sqlalchemy import func, insert, select
from example_project import settings
from example_project.__main__ import reset
from example_project.celery_app import outbox
from example_project.jobs import audit
from example_project.models import audit_log

reset()
with outbox.engine.begin() as conn:
    conn.execute(insert(audit_log).values(message="before"))
audit.delay("a message left in the broker")
inodes = [os.stat(f).st_ino for f in (settings.DATABASE_FILE, settings.BROKER_FILE)]
reset()
assert [os.stat(f).st_ino for f in (settings.DATABASE_FILE, settings.BROKER_FILE)] == inodes
with outbox.engine.connect() as conn:
    assert conn.execute(select(func.count()).select_from(audit_log)).scalar_one() == 0
from sqlalchemy import create_engine, text
broker = create_engine(f"sqlite:///{settings.BROKER_FILE}")
with broker.connect() as conn:
    assert conn.execute(text("SELECT count(*) FROM kombu_message")).scalar_one() == 0
print("reset in place")
"""


def test_a_rerun_resets_the_embedded_files_in_place(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", RESET_TWICE], cwd=procs.ROOT,
                          env=example_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("reset in place")


WEB_USERS_CHECK = """
from celery_outbox.web.auth import Auth
from example_project import app
auth = Auth.from_settings(app.conf)
assert auth.configured, app.conf.outbox_web_users
print("users:", [u["name"] for u in app.conf.outbox_web_users])
"""


def test_shop_web_users_become_the_dashboards_users(tmp_path: Path) -> None:
    from celery_outbox.web.auth import hash_secret

    users = json.dumps([{"name": "ops", "password_hash": hash_secret("s3cret"),
                         "access": "operate"}])
    env = {**example_env(tmp_path), "SHOP_WEB_USERS": users}
    done = subprocess.run([sys.executable, "-c", WEB_USERS_CHECK], cwd=procs.ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "users: ['ops']" in done.stdout
    env["SHOP_WEB_USERS"] = '{"name": "ops"}'
    bad = subprocess.run([sys.executable, "-c", "import example_project"], cwd=procs.ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "SHOP_WEB_USERS: must be a JSON list of objects" in bad.stderr
