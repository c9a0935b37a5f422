"""Test helpers for your own suite: run the outbox against your test database, assert what
was pushed, run what is due inline through the real runner, and move time without sleeping.

```python
from celery_outbox.testing import OutboxTester, assert_pushed

def test_order_sends_a_receipt(outbox_tester):          # the pytest plugin's fixture
    place_order(customer="alice")                        # your code: it pushes
    assert_pushed(send_receipt, payload={"order_id": 1})
    result = outbox_tester.drain()                       # the real runner, inline
    assert result.succeeded == 1
```

- :class:`OutboxTester` (:mod:`celery_outbox.testing.helpers`): one per test, on your
  ``Outbox``: schema ensured, rows cleaned, a :class:`Clock` installed, dispatches recorded
  instead of published; ``drain()``, ``tick(job)``, ``sweep()``, ``assert_pushed(...)``.
- :func:`assert_pushed`, :func:`assert_not_pushed`, :func:`pushed`, :func:`drain`: the same
  on the outbox a job is served by, without a tester.
- The pytest plugin (:mod:`celery_outbox.testing.plugin`, registered by the ``pytest11``
  entry point): the ``outbox_tester`` and ``outbox_clock`` fixtures. Loading it imports
  nothing of the outbox and touches no database until a test asks for a fixture.

The names below are imported on first use, so that the plugin's import costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_outbox.testing.helpers import (
        Clock,
        DrainResult,
        OutboxTester,
        Pushed,
        assert_not_pushed,
        assert_pushed,
        drain,
        pushed,
    )

__all__ = [
    "Clock",
    "DrainResult",
    "OutboxTester",
    "Pushed",
    "assert_not_pushed",
    "assert_pushed",
    "drain",
    "pushed",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from :mod:`celery_outbox.testing.helpers` on first use."""
    if name not in __all__:
        raise AttributeError(f"module 'celery_outbox.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module("celery_outbox.testing.helpers"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
