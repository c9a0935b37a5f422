"""A FastAPI app on ``celery_outbox``: a sync endpoint (``push``), an async one (``apush``)
and an admin read (:mod:`examples.fastapi_app.app`). ``python -m examples.fastapi_app`` runs
it with a worker."""
