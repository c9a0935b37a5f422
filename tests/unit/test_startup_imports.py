"""What a worker imports: start-up time is import time.

- Celery's command line loads every ``celery.commands`` entry point whatever the command
  (``celery worker`` of any app): the ``outbox`` one imports click and nothing of the outbox.
- An app with an Outbox and a job, and its first execution, import neither the admin, the
  command line, the dashboard, Django's or the async pieces, the metrics (unless asked for),
  nor SQLAlchemy's ORM or asyncio extension: a worker serves jobs with SQLAlchemy Core; nor
  OpenTelemetry, installed but not set up by the application.

Each check runs in a fresh interpreter (``sys.modules`` of this one holds everything).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from celery_outbox import command
from tests.procs import ROOT

NEVER_IN_A_WORKER = (
    "celery_outbox.admin", "celery_outbox.cli", "celery_outbox.web", "celery_outbox.dashboard",
    "celery_outbox.contrib", "celery_outbox.executors.sqlalchemy_async", "sqlalchemy.orm",
    "sqlalchemy.ext.asyncio", "rich", "fastapi", "alembic", "jinja2", "opentelemetry",
    "celery_outbox.metrics", "prometheus_client",  # without metrics=True
)
"""``opentelemetry`` is installed here (the test extra has its SDK): tracing costs no import
unless the application imported it and set a tracer provider (celery_outbox.tracing)."""


def _modules(code: str, tmp_path: Path) -> set[str]:
    """The modules a fresh interpreter has imported after running ``code``."""
    out = tmp_path / "modules.json"
    script = f"{code}\nimport json, sys\njson.dump(sorted(sys.modules), open({str(out)!r}, 'w'))\n"
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120)
    return set(json.loads(out.read_text()))


def _loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are one of ``prefixes`` or inside one."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_celerys_command_line_does_not_import_the_outbox(tmp_path: Path) -> None:
    modules = _modules("import celery.bin.celery", tmp_path)
    assert "celery_outbox.command" in modules  # the entry point was loaded
    assert _loaded(modules, ("celery_outbox",)) == ["celery_outbox", "celery_outbox.command"]
    assert _loaded(modules, ("sqlalchemy", "pydantic", "psycopg", "rich")) == []


def test_an_outbox_app_and_its_first_execution_import_no_admin_cli_orm_or_async(
    tmp_path: Path,
) -> None:
    code = f"""
from celery import Celery
from pydantic import BaseModel
from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

app = Celery("startup", broker="memory://")
app.conf.task_always_eager = True
registry = JobRegistry()
outbox = Outbox(app, database_url="sqlite:///{tmp_path / 'outbox.db'}", registry=registry)
outbox.create_schema()

class Item(BaseModel):
    n: int

ran = []

@outbox_job(schema=Item, name="startup.job", registry=registry)
def job(ctx: JobContext[Item]) -> None:
    ran.append(ctx.payload.n)

job.push({{"n": 1}})
assert ran == [1], ran
"""
    modules = _modules(code, tmp_path)
    assert "celery_outbox.runner" in modules
    assert _loaded(modules, NEVER_IN_A_WORKER) == []


def test_the_stand_in_is_the_real_group_once_used() -> None:
    from celery_outbox.cli import outbox as real

    assert real.help is not None
    assert real.help.splitlines()[0] == command.HELP
    assert command.outbox.name == real.name
    ctx = command.outbox.make_context("outbox", ["status", "--help"],
                                      resilient_parsing=True)
    assert ctx.command is real
    assert command.outbox.list_commands(ctx) == real.list_commands(ctx)
    status = command.outbox.get_command(ctx, "status")
    assert isinstance(status, click.Command)
    assert status is real.get_command(ctx, "status")
