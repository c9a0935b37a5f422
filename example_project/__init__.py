"""A small shop on celery_outbox: orders, receipts pushed in the order's transaction, a flaky
warehouse call with retries, a keyed daily report, and a plain Celery task beside them.

``python -m example_project`` runs the whole flow (see ``__main__``); a production worker is
``celery -A example_project worker`` (settings from the environment: see ``settings``).
"""

from example_project import jobs
from example_project.celery_app import app, outbox

__all__ = ["app", "jobs", "outbox"]
