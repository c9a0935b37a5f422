"""Django edges (tests/e2e/django_edges_cases.py) in a pytest process of their own: Django is
configured once per process, and test_django.py configures it differently."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNUSED_PLUGINS = ("-p", "no:schemathesis", "-p", "no:hypothesispytest", "-p", "no:xdist")
"""Plugins the cases never use: loading them took about a second of the process's start."""


def test_django_edges_pass_in_a_process_of_their_own() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         *UNUSED_PLUGINS,
         str(ROOT / "tests" / "e2e" / "django_edges_cases.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
