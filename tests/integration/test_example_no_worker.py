"""``python -m example_project --no-worker`` when no worker is running: it fails after its
timeout without creating or pointing to a worker log (it started no worker), and says what
to start instead.

Embedded default (SQLite database and broker files in the test's own directory).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import procs


def test_no_worker_run_writes_no_worker_log_and_points_to_the_worker_to_start(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOP_")}
    env.update(PYTHONPATH=str(procs.ROOT), SHOP_DATA_DIR=str(tmp_path), SHOP_QUEUE="shop-none")
    done = subprocess.run(
        [sys.executable, "-m", "example_project", "--no-worker", "--timeout-seconds", "1"],
        cwd=procs.ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert not (tmp_path / "worker.log").exists()
    assert "worker log" not in done.stdout
    assert "FAILED: not everything happened within 1 s (is a worker running" in done.stdout
    assert "celery -A example_project worker -Q shop-none" in done.stdout
