"""A keyed push through Django's connection that waits on another caller's key
(tests/integration/key_wait_django_cases.py) in a pytest process of its own: Django is
configured once per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNUSED_PLUGINS = ("-p", "no:schemathesis", "-p", "no:hypothesispytest", "-p", "no:xdist")
"""Plugins the cases never use: loading them took about a second of the process's start."""

pytestmark = pytest.mark.postgres


def test_django_key_waits_pass_in_a_process_of_their_own() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         *UNUSED_PLUGINS,
         str(ROOT / "tests" / "integration" / "key_wait_django_cases.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
