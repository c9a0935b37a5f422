"""celery_outbox's Alembic migrations, for an application's own Alembic environment.

Two ways to use them (docs/guides/upgrades.md, "Alembic", shows both in full):

- Inside your Alembic environment: add :data:`VERSION_LOCATION` to ``version_locations`` in
  your ``alembic.ini`` (with ``path_separator = space``: the location contains a colon), then
  ``alembic upgrade heads``. The outbox revisions form their own branch, labelled
  :data:`BRANCH`, so ``alembic upgrade celery_outbox@head`` upgrades the outbox alone.
- Standalone: ``script_location = celery_outbox:migrations`` (:data:`SCRIPT_LOCATION`); its
  ``env.py`` reads the database URL and keeps its own version table,
  ``celery_outbox_alembic_version``.

A table name other than the default (``Outbox(table_name=...)``) is given to the migrations
with ``-x celery_outbox_table=NAME`` or ``celery_outbox_table = NAME`` in ``alembic.ini``.
"""

from __future__ import annotations

SCRIPT_LOCATION = "celery_outbox:migrations"
"""``script_location`` of the standalone environment."""

VERSION_LOCATION = "celery_outbox:migrations/versions"
"""What to add to an application's ``version_locations``."""

BRANCH = "celery_outbox"
"""The branch label of the outbox revisions."""

DEFAULT_TABLE = "celery_outbox_executions"
TABLE_OPTION = "celery_outbox_table"


def table_name() -> str:
    """The outbox table the running migration works on.

    From ``-x celery_outbox_table=NAME``, else the ``celery_outbox_table`` option of the Alembic
    config, else ``celery_outbox_executions``. Call it inside a migration only.
    """
    from alembic import context

    x_args = context.get_x_argument(as_dictionary=True)
    name = x_args.get(TABLE_OPTION) or context.config.get_main_option(TABLE_OPTION)
    return name or DEFAULT_TABLE
