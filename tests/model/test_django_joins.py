"""The model of the Django joins (tests/model/django_joins_cases.py) in a pytest process of
its own: Django is configured once per process. ``OUTBOX_SOAK_MINUTES`` (``make soak``)
reaches it through the environment; what it explored is printed then."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOAK_MINUTES = float(os.environ.get("OUTBOX_SOAK_MINUTES") or 0)


@pytest.mark.timeout(int(SOAK_MINUTES * 60) + 600)
def test_django_joins_model_passes_in_a_process_of_its_own(capsys: Any) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:randomly", "-p",
         "no:cacheprovider", "-p", "no:logging",
         str(ROOT / "tests" / "model" / "django_joins_cases.py")],
        cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=int(SOAK_MINUTES * 60) + 540, check=False)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    if SOAK_MINUTES:
        with capsys.disabled():
            print("".join(line + "\n" for line in done.stdout.splitlines()
                          if line.startswith(("Django joins model", "  nodes"))))
