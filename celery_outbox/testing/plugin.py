"""The pytest plugin of :mod:`celery_outbox.testing`, registered by the ``pytest11`` entry
point ``celery_outbox``: installed with the package, active in every pytest run.

Fixtures:

- ``outbox_tester``: an :class:`~celery_outbox.testing.OutboxTester` on your app's Outbox,
  started for the test (schema ensured, rows cleaned, a clock installed, dispatches
  recorded) and closed after it. Which Outbox: the ini option ``celery_outbox``
  (``"proj.celery:outbox"``, a module and the name of an Outbox or of a Celery app that
  has one), else a fixture of yours named ``outbox``, else the Outbox serving the default
  job registry (the one your app module made when the test imported it).
- ``outbox_clock``: the tester's :class:`~celery_outbox.testing.Clock` (a new one per test,
  following the system's time until moved).

Loading the plugin imports neither the outbox, SQLAlchemy nor anything else of the package,
and touches no database: all of it happens when a test asks for a fixture. Disable it with
``-p no:celery_outbox``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from celery_outbox.outbox import Outbox
    from celery_outbox.testing.helpers import Clock, OutboxTester

INI_OPTION = "celery_outbox"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI_OPTION, "the Outbox the outbox_tester fixture serves: 'module:name' "
                  "naming an Outbox or a Celery app with one", default="")


def _from_ini(path: str) -> Outbox:
    from celery_outbox.errors import ConfigurationError
    from celery_outbox.outbox import Outbox

    module, _, name = path.partition(":")
    if not module or not name:
        raise ConfigurationError(f"ini option {INI_OPTION} = {path!r}: expected 'module:name'")
    value = getattr(importlib.import_module(module), name)
    if isinstance(value, Outbox):
        return value
    return Outbox.of(value)  # a Celery app: ConfigurationError when none is installed


def find_outbox(request: pytest.FixtureRequest) -> Outbox:
    """The Outbox the fixtures serve (see the module's docstring). Raises
    :class:`~celery_outbox.ConfigurationError` when there is none."""
    from celery_outbox.errors import ConfigurationError
    from celery_outbox.outbox import Outbox
    from celery_outbox.registry import default_registry

    path = str(request.config.getini(INI_OPTION) or "")
    if path:
        return _from_ini(path)
    try:
        value = request.getfixturevalue("outbox")
    except pytest.FixtureLookupError:
        value = None
    if value is not None:
        if not isinstance(value, Outbox):
            raise ConfigurationError(f"the fixture 'outbox' must give an Outbox, got {value!r}")
        return value
    if default_registry.outbox is None:
        raise ConfigurationError(
            "outbox_tester: no Outbox found. Import your app's module (the one that makes "
            f"Outbox(app, ...)), set the ini option {INI_OPTION} = 'proj.celery:app', or "
            "define a fixture named 'outbox'")
    return default_registry.outbox  # type: ignore[return-value]


@pytest.fixture
def outbox_clock() -> Clock:
    """The test's clock (:class:`~celery_outbox.testing.Clock`), installed on the outbox
    by ``outbox_tester``: ``outbox_clock.advance(minutes=5)``."""
    from celery_outbox.testing.helpers import Clock

    return Clock()


@pytest.fixture
def outbox_tester(request: pytest.FixtureRequest, outbox_clock: Clock
                  ) -> Iterator[OutboxTester]:
    """Your Outbox made ready for this test (:class:`~celery_outbox.testing.OutboxTester`):
    ``outbox_tester.drain()``, ``.assert_pushed(job, ...)``, ``.advance(minutes=5)``,
    ``.tick(cron_job)``."""
    from celery_outbox.testing.helpers import OutboxTester

    options: dict[str, Any] = {}
    marker = request.node.get_closest_marker("outbox_tester")
    if marker is not None:
        options.update(marker.kwargs)
    with OutboxTester(find_outbox(request), clock=outbox_clock, **options) as tester:
        yield tester


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "outbox_tester(record=True, create_schema=True, clean=True): options of "
                   "the outbox_tester fixture (celery_outbox.testing.OutboxTester)")
