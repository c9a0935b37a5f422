"""The version is written once (``celery_outbox.__version__``) and the installed
distribution's metadata says the same."""

from __future__ import annotations

from importlib.metadata import version

import celery_outbox
from tests.procs import ROOT


def test_version_is_the_installed_distributions() -> None:
    assert celery_outbox.__version__ == version("celery-outbox")


def test_pyproject_reads_the_version_from_the_package() -> None:
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    assert 'dynamic = ["version"]' in lines
    assert 'version = {attr = "celery_outbox.__version__"}' in lines
    assert not [line for line in lines if line.startswith('version = "')]  # no second source
