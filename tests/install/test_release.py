"""The release: what ``python -m build`` makes of this tree is fit to publish.

The release is built and published with ``python -m build && twine check --strict dist/* &&
twine upload dist/*``. Here, from a copy of the tree (:func:`copy_source`, the files a build
reads):

1. ``python -m build`` makes the sdist, then the wheel from that sdist (so a file the sdist
   lacks fails the wheel's build);
2. ``twine check --strict`` passes both (the README renders as PyPI will show it);
3. the sdist carries the LICENSE, the README, the CHANGELOG and the package's data files; the
   wheel's metadata names the licence (``License-Expression: MIT``, ``License-File``, the
   file under ``.dist-info/licenses/``) and the version ``celery_outbox.__version__`` says;
4. the sdist, installed into a FRESH venv the way pip installs one from an index (built, its
   dependencies resolved), gives a worker that runs a job on SQLite (the broker too: kombu's
   SQLAlchemy transport), as :mod:`tests.install.test_extras` does for the wheel and each
   extra (its helpers, the same app: :mod:`tests.install.extras_app`).

About 30 s with a warm pip cache: two isolated builds, one pip install with the core's
dependencies (pip's cache, ``--no-compile``), a worker. The venv is removed at the end.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import celery_outbox
from tests.install.test_extras import (
    HERE,
    INSTALL_TIMEOUT,
    SOURCE_FILES,
    clean_env,
    copy_source,
    run,
    run_case,
)

pytestmark = pytest.mark.extras

VERSION = celery_outbox.__version__


@dataclass(frozen=True)
class Dist:
    root: Path
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def dist() -> Iterator[Dist]:
    """``python -m build`` of a copy of the tree: the sdist, and the wheel built from it."""
    root = Path(tempfile.mkdtemp(prefix="outbox-release-"))
    try:
        source = copy_source(root / "source")
        out = root / "dist"
        run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
            root / "build.log", INSTALL_TIMEOUT)
        (sdist,) = out.glob("*.tar.gz")
        (wheel,) = out.glob("*.whl")
        yield Dist(root, sdist, wheel)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_files_are_named_after_the_version(dist: Dist) -> None:
    assert dist.sdist.name == f"celery_outbox-{VERSION}.tar.gz"
    assert dist.wheel.name == f"celery_outbox-{VERSION}-py3-none-any.whl"


def test_twine_check_strict_passes(dist: Dist) -> None:
    run([sys.executable, "-m", "twine", "check", "--strict", str(dist.sdist), str(dist.wheel)],
        dist.root / "twine.log", 120)
    assert "PASSED" in (dist.root / "twine.log").read_text()


def test_the_sdist_carries_the_licence_readme_changelog_and_data(dist: Dist) -> None:
    top = f"celery_outbox-{VERSION}"
    with tarfile.open(dist.sdist) as sdist:
        names = {name.removeprefix(f"{top}/") for name in sdist.getnames()}
        pkg_info = sdist.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        metadata = pkg_info.read().decode()
    assert set(SOURCE_FILES) <= names
    assert {"celery_outbox/py.typed", "celery_outbox/migrations/alembic.ini",
            "celery_outbox/web/templates/base.html"} <= names, sorted(names)
    assert any(n.startswith("celery_outbox/migrations/versions/") for n in names)
    assert any(n.startswith("celery_outbox/contrib/django/migrations/") for n in names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "\nLicense-Expression: MIT\n" in metadata


def test_the_wheel_names_its_licence_and_version(dist: Dist) -> None:
    info = f"celery_outbox-{VERSION}.dist-info"
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"{info}/METADATA").decode()
        licence = wheel.read(f"{info}/licenses/LICENSE").decode()
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "\nLicense-Expression: MIT\n" in metadata
    assert "\nLicense-File: LICENSE\n" in metadata
    assert "Description-Content-Type: text/markdown" in metadata
    assert licence.startswith("MIT License") and "the celery_outbox authors" in licence
    assert "celery_outbox/py.typed" in names
    assert not [n for n in names if not n.startswith(("celery_outbox/", f"{info}/"))], (
        sorted(names))


def test_the_sdist_installs_a_worker_that_runs_a_job(dist: Dist, tmp_path: Path) -> None:
    """pip builds and installs the sdist into a fresh venv (no system site-packages); its
    ``__version__`` is its metadata's; a worker of that venv runs one pushed job."""
    venv = dist.root / "venv"
    log = tmp_path / "install.log"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], log, INSTALL_TIMEOUT)
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "-q", "--no-compile", str(dist.sdist)], log, INSTALL_TIMEOUT, env=clean_env(venv))
    python = str(venv / "bin" / "python")
    versions = subprocess.run(
        [python, "-c", "import celery_outbox, importlib.metadata as m; "
                       "print(celery_outbox.__version__, m.version('celery-outbox'))"],
        cwd=tmp_path, env=clean_env(venv), capture_output=True, text=True, timeout=60)
    assert versions.returncode == 0, versions.stderr
    assert versions.stdout.split() == [VERSION, VERSION]

    app_dir, out = tmp_path / "app", tmp_path / "out"
    app_dir.mkdir()
    out.mkdir()
    shutil.copy2(HERE / "extras_app.py", app_dir / "extras_app.py")
    env = clean_env(venv, EXTRAS_BROKER=f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}",
                    EXTRAS_DB=f"sqlite:///{tmp_path / 'db.sqlite3'}",
                    EXTRAS_QUEUE=f"outbox-release-{uuid.uuid4().hex[:10]}", EXTRAS_OUT=str(out))
    run_case("core", venv, app_dir, out, env, tmp_path)
