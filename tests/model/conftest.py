"""The soak's weights (:mod:`tests.model.soak`): each selected test marked ``soak``, counted
once collection (and any ``-k``) is done, so the shares of ``make soak`` add up to its
MINUTES."""

from __future__ import annotations

import pytest

from tests.model.soak import BUDGET, MINUTES


def pytest_collection_finish(session: pytest.Session) -> None:
    if not MINUTES:
        return
    for item in session.items:
        marker = item.get_closest_marker("soak")
        if marker is not None:
            BUDGET.add(float(marker.kwargs["weight"]))
