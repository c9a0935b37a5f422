"""Where the shop keeps its data and its messages, from the environment.

- ``SHOP_DATABASE_URL``: the shop's database, which also holds the outbox table.
  Default: a SQLite file ``shop.sqlite3`` in ``SHOP_DATA_DIR``.
- ``SHOP_BROKER_URL``: the Celery broker. Default: kombu's SQLAlchemy transport on a SQLite file
  ``broker.sqlite3`` in ``SHOP_DATA_DIR`` (``sqla+sqlite:///...``), so nothing needs installing.
- ``SHOP_DATA_DIR``: where the default files go (default: this package's directory).
- ``SHOP_QUEUE``: the Celery queue of the shop's messages (default ``shop``).
- ``SHOP_WEB_USERS``: the dashboard's users for ``celery -A example_project outbox web``, a
  JSON list of objects with the fields of ``celery_outbox.web.User``, e.g.
  ``[{"name": "ops", "password_hash": "pbkdf2_sha256$...", "access": "operate"}]`` (the hash
  from ``celery -A example_project outbox hash-secret``); becomes ``outbox_web_users``.
  Default: none (every request answers 401). Not JSON, or not a list: ValueError naming it.

Production: ``SHOP_DATABASE_URL=postgresql+psycopg://root@127.0.0.1/shop`` and
``SHOP_BROKER_URL=redis://127.0.0.1:6379/0`` (or ``amqp://guest:guest@127.0.0.1:5672//``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DATA_DIR = Path(os.environ.get("SHOP_DATA_DIR") or Path(__file__).resolve().parent)
DATABASE_FILE = DATA_DIR / "shop.sqlite3"
BROKER_FILE = DATA_DIR / "broker.sqlite3"
DATABASE_URL = os.environ.get("SHOP_DATABASE_URL") or f"sqlite:///{DATABASE_FILE}"
BROKER_URL = os.environ.get("SHOP_BROKER_URL") or f"sqla+sqlite:///{BROKER_FILE}"
QUEUE = os.environ.get("SHOP_QUEUE") or "shop"
EMBEDDED = DATABASE_URL.startswith("sqlite") and BROKER_URL.startswith("sqla+sqlite")
"""True when both defaults are in use (the files are the demo's own: reset on each run)."""


def web_users(text: str | None) -> list[dict[str, Any]]:
    """``SHOP_WEB_USERS`` parsed: a JSON list of objects (blank or unset: none).

    Raises ValueError naming ``SHOP_WEB_USERS`` when it is not a JSON list of objects.
    """
    if text is None or not text.strip():
        return []
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"SHOP_WEB_USERS: not JSON: {exc}") from None
    if not isinstance(found, list) or not all(isinstance(u, dict) for u in found):
        raise ValueError("SHOP_WEB_USERS: must be a JSON list of objects "
                         '([{"name": ..., "password_hash": ..., "access": ...}])')
    return found


WEB_USERS = web_users(os.environ.get("SHOP_WEB_USERS"))
