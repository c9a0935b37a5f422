"""The model of the Django joins (tests/model/django_joins_cases.py) in a pytest process of
its own: Django is configured once per process. Under ``make soak`` it takes the share of
that process's two tests (one per database, :mod:`tests.model.soak`) and hands their end on
through the environment; what it explored is printed then."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.model.soak import BUDGET, DJANGO, UNTIL_ENV
from tests.model.soak import MINUTES as SOAK_MINUTES

ROOT = Path(__file__).resolve().parents[2]
WEIGHT = 2 * DJANGO
"""The process's soaking tests: the model on SQLite and on PostgreSQL."""


@pytest.mark.soak(weight=WEIGHT)
@pytest.mark.timeout(int(SOAK_MINUTES * 60) + 600)
def test_django_joins_model_passes_in_a_process_of_its_own(capsys: Any) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if SOAK_MINUTES:
        env[UNTIL_ENV] = repr(BUDGET.take(WEIGHT))
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
