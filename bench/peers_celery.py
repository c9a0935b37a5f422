"""Celery and the outbox in ``python -m bench peers``: ``bench.app``'s Celery app and Outbox
with one more task and job whose handlers do the peers' Redis side effect
(:mod:`bench.peers_signal`), and the floor's task (:mod:`bench.peers_floor`).

``peer_job_parallel`` is the same job with ``parallel=PARALLEL``: a message's executions
run up to that many at once (the "drain parallel" figure).

The worker: ``celery -A bench.peers_celery worker -P prefork -c 2`` (:func:`bench.worker.
celery_worker`), which runs both.
"""

from __future__ import annotations

from pydantic import BaseModel

from bench import peers_floor
from bench.app import app, outbox, registry
from bench.peers_signal import record
from celery_outbox import JobContext, outbox_job

__all__ = ["PARALLEL", "app", "outbox", "peer", "peer_job", "peer_job_parallel", "peers_floor"]


class Total(BaseModel):
    total: int


@app.task(name="bench.peer")
def peer(total: int) -> None:
    """Plain Celery: a no-op task plus the side effect."""
    record(total)


@outbox_job(schema=Total, name="bench.peer_job", registry=registry)
def peer_job(ctx: JobContext[Total]) -> None:
    """The outbox: a no-op job plus the side effect."""
    record(ctx.payload.total)


PARALLEL = 10
"""``parallel=`` of :data:`peer_job_parallel`."""


@outbox_job(schema=Total, name="bench.peer_job_parallel", registry=registry, parallel=PARALLEL)
def peer_job_parallel(ctx: JobContext[Total]) -> None:
    """The outbox, ``parallel=PARALLEL``: a no-op job plus the side effect."""
    record(ctx.payload.total)
