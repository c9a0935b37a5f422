"""What a person reads of a batch (``push_batch``): its progress in one line, and why its
callback waits. Pure functions of a :class:`~celery_outbox.outcomes.Batch`: the CLI, the
dashboard and the HTTP API print the same words."""

from __future__ import annotations

from uuid import UUID

from celery_outbox.outcomes import Batch


def batch_progress(batch: Batch) -> str:
    """``"37 of 1,000 members finished (30 succeeded, 5 failed, 2 cancelled)"``, then what
    became of its callback once the batch completed: ``"; callback made"``, or ``"; no
    callback: not every member succeeded (on success)"``."""
    line = (f"{batch.finished:,} of {batch.total:,} members finished ({batch.succeeded:,} "
            f"succeeded, {batch.failed:,} failed, {batch.cancelled:,} cancelled)")
    if batch.state == "called":
        return f"{line}; callback made"
    if batch.state == "failed":
        return f"{line}; no callback: not every member succeeded (on success)"
    return line


def batch_waiting(batch: Batch, execution_id: UUID) -> str | None:
    """Why the execution ``execution_id`` waits, when it is ``batch``'s callback and the
    batch is not complete: ``"waiting for batch: 37 of 1,000 members finished"``; else
    None (a member, or a callback made already)."""
    if execution_id != batch.callback_id or batch.completed_at is not None:
        return None
    return f"waiting for batch: {batch.finished:,} of {batch.total:,} members finished"
