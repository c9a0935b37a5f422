"""A ``ctx.cancel`` called inside a ``ctx.transaction()`` block dies with the block when it
rolls back (``JobContext._withdraw_own_cancel``), and a runner's cancel that came meanwhile
(swallowed: the handler's was set first) takes its place instead of being lost."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone
from typing import Any

from celery_outbox import JobContext
from celery_outbox.context import Stop


def ctx() -> JobContext[Any]:
    return JobContext(None, uuid.uuid4(), "j", 1, 3, datetime.now(timezone.utc),
                      logging.getLogger("t"))


def test_the_handlers_cancel_in_a_rolled_back_block_is_withdrawn() -> None:
    c = ctx()
    c._own_cancel_scope(True)
    c.cancel("not wanted")
    assert c.cancelled.is_set() and c.cancelled_by_handler
    c._withdraw_own_cancel()
    c._own_cancel_scope(False)
    assert not c.cancelled.is_set() and not c.cancelled_by_handler


def test_a_runners_cancel_swallowed_meanwhile_takes_its_place() -> None:
    c = ctx()
    c._own_cancel_scope(True)
    c.cancel("not wanted")
    c._interrupt(Stop.SHUTDOWN)  # the handler's was first: swallowed
    c._withdraw_own_cancel()
    assert c.cancelled.is_set() and not c.cancelled_by_handler
    assert c.cancel_reason == Stop.SHUTDOWN


def test_a_cancel_from_before_the_block_stays() -> None:
    c = ctx()
    c.cancel("before")
    c._own_cancel_scope(True)
    c._withdraw_own_cancel()
    assert c.cancelled.is_set() and c.cancel_reason == "before"
    outside = ctx()
    outside.cancel("no block")
    outside._withdraw_own_cancel()  # no block open: nothing withdrawn
    assert outside.cancelled.is_set()
