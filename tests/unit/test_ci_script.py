"""`.ci/run`, the script CI runs in a fresh clone: it must parse, and run the README's test
command last, after its set-up (strict mode first, then the servers and Chromium)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "run"


def commands() -> list[str]:
    lines = (line.strip() for line in SCRIPT.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_the_ci_script_parses() -> None:
    checked = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_the_ci_script_sets_strict_mode_first_and_runs_make_test_last() -> None:
    run = commands()
    assert run[0] == "set -euo pipefail"
    assert run[-1] == "make test"
    assert run.count("make test") == 1
