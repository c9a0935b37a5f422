"""A Flask + Flask-SQLAlchemy app whose signup endpoint writes a row and pushes a job in the
same transaction, with ``session=db.session`` (a ``scoped_session``).

- ``POST /signups`` ``{"email": ...}``: adds a :class:`Signup` and pushes ``send_welcome``;
  ``db.session.commit()`` commits both, then the job is dispatched. An address at
  ``blocked.example`` is refused after the push: ``db.session.rollback()`` drops the row and
  the push together (422). An unexpected error does the same: Flask-SQLAlchemy removes the
  session at the end of the request, which rolls it back (500).
- ``GET /signups/<id>``: the signup, with how many times its welcome ran.

The worker: ``celery -A examples.flask_app.app:celery worker -Q flask-example``; its job
handler uses the same ``db`` inside an app context. Settings from the environment:
``FLASK_EXAMPLE_DATABASE_URL`` (default: a SQLite file in ``FLASK_EXAMPLE_DATA_DIR``, by
default this directory), ``FLASK_EXAMPLE_BROKER_URL`` (default: kombu's SQLAlchemy transport
on another SQLite file), ``FLASK_EXAMPLE_QUEUE`` (default ``flask-example``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from pydantic import BaseModel
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

DATA_DIR = Path(os.environ.get("FLASK_EXAMPLE_DATA_DIR") or Path(__file__).resolve().parent)
DATABASE_URL = (os.environ.get("FLASK_EXAMPLE_DATABASE_URL")
                or f"sqlite:///{DATA_DIR / 'flask_example.sqlite3'}")
BROKER_URL = (os.environ.get("FLASK_EXAMPLE_BROKER_URL")
              or f"sqla+sqlite:///{DATA_DIR / 'flask_broker.sqlite3'}")
QUEUE = os.environ.get("FLASK_EXAMPLE_QUEUE") or "flask-example"
OUTBOX_TABLE = "flask_example_outbox"
BLOCKED_DOMAIN = "blocked.example"


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Signup(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "flask_example_signups"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    welcomed: Mapped[int] = mapped_column(default=0)
    """How many times ``send_welcome`` ran for this signup (the worker increments it)."""
    welcomed_by_pid: Mapped[int | None] = mapped_column(default=None)


class Welcome(BaseModel):
    signup_id: int


class Blocked(Exception):
    """The address may not sign up: raised after the push, so the push must go too."""


REGISTRY = JobRegistry()


@outbox_job(name="flask_example.send_welcome", schema=Welcome, record="all",
            registry=REGISTRY)
def send_welcome(ctx: JobContext[Welcome]) -> None:
    """"Send" the welcome: mark the signup, through the app's own ``db``."""
    with app.app_context():
        signup = db.session.get(Signup, ctx.payload.signup_id)
        if signup is None:  # cannot happen: the row committed with the push
            raise LookupError(f"no signup {ctx.payload.signup_id}")
        signup.welcomed += 1
        signup.welcomed_by_pid = os.getpid()
        db.session.commit()
        ctx.log.info("welcomed %s", signup.email)


def create_app(database_url: str = DATABASE_URL) -> Flask:
    flask_app = Flask(__name__)
    flask_app.config["SQLALCHEMY_DATABASE_URI"] = database_url
    if database_url.startswith("sqlite"):  # the worker writes the same file: wait, not fail
        flask_app.config["SQLALCHEMY_ENGINE_OPTIONS"] = {"connect_args": {"timeout": 30}}
    db.init_app(flask_app)

    @flask_app.post("/signups")
    def create_signup() -> tuple[dict[str, Any], int]:
        email = str(request.get_json()["email"])
        signup = Signup(email=email)
        db.session.add(signup)
        db.session.flush()  # the id, for the payload
        execution_id = send_welcome.push(Welcome(signup_id=signup.id), session=db.session)
        try:
            check(email)
        except Blocked as exc:
            db.session.rollback()  # the signup and its push, together
            return {"error": str(exc)}, 422
        db.session.commit()  # both rows; then the job is dispatched
        return {"id": signup.id, "execution_id": str(execution_id)}, 201

    @flask_app.get("/signups/<int:signup_id>")
    def show_signup(signup_id: int) -> dict[str, Any]:
        signup = db.get_or_404(Signup, signup_id)
        return {"id": signup.id, "email": signup.email, "welcomed": signup.welcomed}

    return flask_app


def check(email: str) -> None:
    """Refuse blocked addresses; ``crash@`` stands for an unexpected error (a bug)."""
    if email.endswith(f"@{BLOCKED_DOMAIN}"):
        raise Blocked(f"{email}: sign-ups from {BLOCKED_DOMAIN} are closed")
    if email.startswith("crash@"):
        raise RuntimeError(f"unexpected failure for {email}")


app = create_app()
celery = Celery("flask_example", broker=BROKER_URL)
celery.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True)
with app.app_context():  # db.engine needs the app: the outbox shares the app's engine
    outbox = Outbox(celery, engine=db.engine, registry=REGISTRY, table_name=OUTBOX_TABLE)


def create_tables() -> None:
    """The app's tables and the outbox's (drop first: the demo starts empty)."""
    with app.app_context():
        outbox.drop_schema()
        db.drop_all()
        db.create_all()
        outbox.create_schema()
