"""``celery outbox``, as Celery's command line finds it (the ``celery.commands`` entry point).

Celery loads every ``celery.commands`` entry point each time its command line starts, whatever
the command: ``celery worker``, ``celery beat``, ``celery inspect``, for any app of an
environment where celery_outbox is installed. :data:`outbox` is a stand-in for
:data:`celery_outbox.cli.outbox` that imports nothing but click: the real group (and with it
SQLAlchemy, pydantic, rich and the rest of the package) is imported only when ``celery outbox``
itself runs, completes or shows its help.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

HELP = "See and steer celery_outbox executions of the app given with -A."
"""The first line of the real group's help, which ``celery --help`` lists."""


class LazyGroup(click.Group):
    """A click group that is :data:`celery_outbox.cli.outbox` once used: parsing, running,
    help and completion go to the real group, imported on first use."""

    def __init__(self) -> None:
        super().__init__(name="outbox", help=HELP)

    @staticmethod
    def real() -> click.Group:
        """The real ``outbox`` group (imports :mod:`celery_outbox.cli`)."""
        from celery_outbox.cli import outbox

        return outbox

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        # What a parent group calls before it invokes ``context.command``: the real group.
        return self.real().make_context(info_name, args, parent=parent, **extra)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        return self.real().main(args, prog_name, complete_var, standalone_mode, **extra)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self.real().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self.real().get_command(ctx, cmd_name)


outbox = LazyGroup()
