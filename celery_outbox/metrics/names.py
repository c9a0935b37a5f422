"""What the metrics are called: every series name the package exports.

The shipped Grafana dashboard and alert rules (``deploy/``) may name these and only these
(``tests/metrics/test_deploy.py``).
"""

from __future__ import annotations

PREFIX = "celery_outbox_"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's multiprocess directory (see :mod:`celery_outbox.metrics`)."""

TABLE_METRICS = (
    "executions", "oldest_pending_age_seconds", "oldest_overdue_scheduled_age_seconds",
    "running", "expired_leases", "oldest_dispatched_age_seconds", "tenant_executions",
    "table_scrape_ok", "table_scrape_seconds",
    "loop_last_run_age_seconds", "loop_interval_seconds", "loop_late",
)
"""The gauges of :class:`~celery_outbox.metrics.table.TableCollector` and
:class:`~celery_outbox.metrics.table.LoopCollector`, without the prefix."""
HISTOGRAMS = ("handler_duration_seconds", "wait_seconds")
EVENT_METRICS = (
    "pushes_total", "dispatches_total", "claims_total", "starts_total", "successes_total",
    "failures_total", "retries_total", "rescues_total", "hand_backs_total", "cancels_total",
    "snoozes_total", *HISTOGRAMS,
)
"""The counters and histograms of :mod:`celery_outbox.metrics.events`, without the prefix."""


def exported_names() -> frozenset[str]:
    """Every series name exported (``celery_outbox_...``; a histogram's name with its
    ``_bucket`` / ``_count`` / ``_sum``)."""
    names = {PREFIX + n for n in TABLE_METRICS + EVENT_METRICS}
    for histogram in HISTOGRAMS:
        names.update(PREFIX + histogram + s for s in ("_bucket", "_count", "_sum"))
    return frozenset(names)
