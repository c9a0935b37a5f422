"""A separate process pushing one keyed execution in a Session it holds open:
``python -m tests.integration.key_push_proc DB_URL TABLE KEY``.

Prints ``pushed <id>`` once the push returned (uncommitted), then reads one line from stdin:
``commit`` or ``rollback``; prints ``done`` after it."""

from __future__ import annotations

import sys
import uuid
from typing import Any

from celery import Celery
from pydantic import BaseModel
from sqlalchemy.orm import Session

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from tests.integration.fakes import RecordingDispatcher


class Order(BaseModel):
    order_id: int


def main(url: str, table: str, key: str) -> None:
    registry = JobRegistry()

    @outbox_job(name="w.keyed", schema=Order, registry=registry)
    def job(ctx: JobContext[Any]) -> None:
        pass

    ob = Outbox(Celery(f"k-{uuid.uuid4().hex[:8]}", broker="memory://"), database_url=url,
                registry=registry, dispatcher=RecordingDispatcher(), table_name=table)
    with Session(ob.engine) as session:
        execution_id = job.push({"order_id": 1}, key=key, session=session)
        print(f"pushed {execution_id}", flush=True)
        if sys.stdin.readline().strip() == "commit":
            session.commit()
        else:
            session.rollback()
    print("done", flush=True)
    ob.engine.dispose()


if __name__ == "__main__":
    main(*sys.argv[1:4])
