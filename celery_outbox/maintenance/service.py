"""What the maintenance services share: option checks, the batch loop, and dispatching.

Each service moves rows in batches of ``batch_size`` with one guarded statement per batch,
and keeps going until a batch comes back short: the rows it moved no longer match its guard,
so the loop ends once the work that was due is done, however many batches that takes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta

from celery_outbox.config import MAX_DURATION
from celery_outbox.dispatch import Dispatcher, DispatchItem
from celery_outbox.errors import ConfigurationError
from celery_outbox.logfields import guarded
from celery_outbox.store import Due

log = guarded(logging.getLogger("celery_outbox.maintenance"))

PUBLISH_WAIT = timedelta(seconds=30)
"""How long one run waits for its dispatches to be published before it returns."""


def check_batch_size(service: str, value: int) -> None:
    """Raise ConfigurationError naming ``service.batch_size`` unless it is an int >= 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{service}.batch_size must be an int >= 1, got {value!r}")


def check_duration(service: str, name: str, value: timedelta) -> None:
    """Raise ConfigurationError naming ``service.name`` unless it is a timedelta in
    0 .. :data:`~celery_outbox.config.MAX_DURATION`."""
    if not isinstance(value, timedelta) or not timedelta(0) <= value <= MAX_DURATION:
        raise ConfigurationError(f"{service}.{name} must be a timedelta in "
                                 f"0..{MAX_DURATION}, got {value!r}")


def check_now(now: datetime) -> datetime:
    """``now`` if it is an aware datetime; else ConfigurationError."""
    if not isinstance(now, datetime) or now.tzinfo is None:
        raise ConfigurationError(f"now must be an aware datetime, got {now!r}")
    return now


def batches(step: Callable[[], list[Due]], batch_size: int) -> Iterator[list[Due]]:
    """Yield ``step()`` until it returns fewer than ``batch_size`` rows (the last, maybe empty,
    batch is yielded only when it holds rows)."""
    while True:
        batch = step()
        if batch:
            yield batch
        if len(batch) < batch_size:
            return


def dispatch(dispatcher: Dispatcher, rows: Sequence[Due]) -> None:
    """Hand ``rows`` to ``dispatcher`` (one call). Never raises: a dispatcher that fails is
    logged, and the rows, committed with ``dispatched_at`` set, are dispatched again by a
    later sweep after ``stale_after``."""
    try:
        dispatcher.dispatch([DispatchItem(r.id, r.job_name, r.priority, r.eta) for r in rows])
    except Exception:
        log.exception("celery_outbox: dispatching %d execution(s) failed; a later sweep "
                      "dispatches them again", len(rows))


def wait_published(dispatcher: Dispatcher, service: str) -> None:
    """Wait up to :data:`PUBLISH_WAIT` for the dispatches of this run to be published.

    A publish that failed or is still waiting is logged; the rows are committed with
    ``dispatched_at`` set, so a later sweep dispatches them again after ``stale_after``.
    """
    if not dispatcher.flush(PUBLISH_WAIT):
        log.warning("celery_outbox: %s: dispatches not all published within %s; a later "
                    "sweep dispatches them again", service, PUBLISH_WAIT)
