"""``python -m celery_outbox.cli -A proj <command> ...``: ``celery -A proj outbox <command>``
without Celery's command line.

The same commands, options, output and exit statuses (it is the same click group); only the
start differs: Celery's command line imports every one of its own sub-commands and every
``celery.commands`` plug-in installed (Flower's, for one) before it loads the app, about 0.3
s of CPU per call on the test machine, none of which an outbox command uses. Here the app
named by ``-A`` (or ``CELERY_APP``) is loaded as Celery loads it (``proj``, ``proj.celery``,
``proj:app``: :func:`celery.app.utils.find_app`, the working directory importable), then the
command runs. Celery's other global options (``-b``, ``--config``, ``--loader``, ...) are
not taken: the app's own configuration applies.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import SimpleNamespace
from typing import Any

import click

from celery_outbox.cli import _OutboxGroup, outbox

__all__ = ["main"]


def _load(ctx: click.Context, app: str) -> Any:
    """The Celery app ``app`` names (a usage error naming ``-A`` when it cannot be loaded)."""
    from celery.app.utils import find_app

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `celery -A` finds the project's modules
    try:
        return find_app(app)
    except ModuleNotFoundError as exc:
        ctx.fail(f"-A {app}: cannot load the Celery app: no module named {exc.name!r}")
    except Exception as exc:
        detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        ctx.fail(f"-A {app}: cannot load the Celery app: {detail}")


def _root(ctx: click.Context, app: str) -> None:
    ctx.obj = SimpleNamespace(app=_load(ctx, app))
    if outbox.callback is not None:
        ctx.invoke(outbox.callback)  # the app's task modules, as `celery ... outbox` does


main = _OutboxGroup(
    name="python -m celery_outbox.cli",
    commands=outbox.commands,
    callback=click.pass_context(_root),
    params=[click.Option(["-A", "--app"], required=True, envvar="CELERY_APP",
                         metavar="APP", help="The Celery app: proj, proj.celery, proj:app.")],
    help=f"{outbox.help}\n\nThe commands of `celery -A APP outbox`, without Celery's "
         "command line (a faster start).",
)
"""The root group: ``-A APP``, then any ``outbox`` command."""


if __name__ == "__main__":
    main(prog_name="python -m celery_outbox.cli")
