"""The standalone Alembic environment of celery_outbox (``script_location =
celery_outbox:migrations``).

The database URL comes from ``-x url=...``, else the ``CELERY_OUTBOX_DATABASE_URL``
environment variable, else ``sqlalchemy.url`` in the config. A caller may also hand over an
open connection in ``config.attributes["connection"]``. The revisions applied are recorded in
their own version table, ``celery_outbox_alembic_version``, so this environment can live
beside an application's own.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from celery_outbox.models import metadata

VERSION_TABLE = "celery_outbox_alembic_version"
URL_VARIABLE = "CELERY_OUTBOX_DATABASE_URL"

config = context.config
if config.config_file_name and config.file_config.has_section("loggers"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get(URL_VARIABLE)
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise SystemExit(
            f"celery_outbox migrations: no database URL; pass -x url=..., set {URL_VARIABLE}, "
            "or set sqlalchemy.url in the Alembic config"
        )
    return url


def run_offline() -> None:
    context.configure(
        url=database_url(), target_metadata=metadata, literal_binds=True,
        dialect_opts={"paramstyle": "named"}, version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online(connection: Connection) -> None:
    context.configure(
        connection=connection, target_metadata=metadata, version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
elif config.attributes.get("connection") is not None:
    run_online(config.attributes["connection"])
else:
    engine = create_engine(database_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            run_online(conn)
    finally:
        engine.dispose()
