"""Integrations with other frameworks, built on the outbox's public seams (the executor
protocols and :class:`~celery_outbox.Outbox`). The core never imports them."""
