"""A user's own pytest suite (``usersuite/``: an app, a conftest, tests) run in a subprocess
of its own, as the user runs it: the plugin comes from the ``pytest11`` entry point alone (no
``-p``, no ``pytest_plugins``), and its fixtures drive the user's Outbox on SQLite and on
PostgreSQL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.testing.conftest import HERE, run


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    shutil.copytree(HERE / "usersuite", suite,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return suite


def test_the_users_suite_passes_with_the_plugin(database: tuple[str, str],
                                                tmp_path: Path) -> None:
    kind, url = database
    suite = _suite(tmp_path)
    done = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                "-W", "error::sqlalchemy.exc.SAWarning", str(suite)],
               {"SHOP_DB": url, "PYTHONPATH": str(suite)}, suite)
    assert done.returncode == 0, f"the user's suite failed on {kind}"
    assert "9 passed" in done.stdout


def test_without_the_plugin_the_fixtures_are_unknown(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    done = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:celery_outbox",
                "-p", "no:xdist", str(suite / "test_shop.py"), "-k", "starts_clean"],
               {"SHOP_DB": f"sqlite:///{tmp_path / 'x.sqlite3'}", "PYTHONPATH": str(suite)},
               suite)
    assert done.returncode != 0
    assert "fixture 'outbox_tester' not found" in done.stdout


def test_loading_the_plugin_imports_nothing_of_the_outbox(tmp_path: Path) -> None:
    """A suite that never asks for a fixture: the plugin is loaded, and neither the outbox,
    SQLAlchemy nor pydantic is imported by it."""
    suite = tmp_path / "plain"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "modules.json"
    (suite / "conftest.py").write_text(
        "import json, sys\n"
        "def pytest_sessionfinish(session):\n"
        f"    json.dump(sorted(sys.modules), open({str(out)!r}, 'w'))\n")
    (suite / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    done = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                "--trace-config", str(suite)], {}, suite)
    assert done.returncode == 0
    assert "celery_outbox.testing.plugin" in done.stdout  # loaded by its entry point
    modules = set(json.loads(out.read_text()))
    assert sorted(m for m in modules if m.startswith("celery_outbox")) == [
        "celery_outbox", "celery_outbox.testing", "celery_outbox.testing.plugin"]
    assert "celery_outbox.outbox" not in modules


def test_the_outbox_from_a_fixture_or_the_ini_option(tmp_path: Path) -> None:
    """The user's fixture ``outbox``, else the ini option: each names an Outbox on another
    app with a registry of its own, never the default registry's (``shop.outbox``)."""
    suite = _suite(tmp_path)
    (suite / "other.py").write_text(
        "import os\n"
        "from celery import Celery\n"
        "from celery_outbox import JobRegistry, Outbox\n"
        "app = Celery('other', broker='memory://')\n"
        "box = Outbox(app, database_url=os.environ['SHOP_DB'], registry=JobRegistry())\n")
    (suite / "test_which.py").write_text(
        "import other\n"
        "import shop\n"
        "def test_which(outbox_tester):\n"
        "    assert outbox_tester.outbox is other.box is not shop.outbox\n")
    conftest = (suite / "conftest.py").read_text()
    env = {"SHOP_DB": f"sqlite:///{tmp_path / 'which.sqlite3'}", "PYTHONPATH": str(suite)}
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            str(suite / "test_which.py")]
    (suite / "conftest.py").write_text(conftest + (
        "\n\n@pytest.fixture\n"
        "def outbox():\n"
        "    import other\n"
        "    return other.box\n"))
    done = run(args, env, suite)
    assert done.returncode == 0 and "1 passed" in done.stdout
    (suite / "conftest.py").write_text(conftest)
    (suite / "pytest.ini").write_text("[pytest]\ncelery_outbox = other:app\n")
    done = run(args, env, suite)
    assert done.returncode == 0 and "1 passed" in done.stdout
