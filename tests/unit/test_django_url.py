"""The workers' SQLAlchemy URL derived from a Django ``DATABASES`` entry
(``celery_outbox.contrib.django.conf.url_of``): what psycopg is given from it equals what
Django's connection is given (host, port, name, user, password, libpq options), for every
shape of entry Django documents: a TCP host, an empty one (libpq's default socket), a Unix
socket's directory, several hosts, names and passwords needing quoting, ``OPTIONS``."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import make_url
from sqlalchemy.dialects.postgresql import psycopg

from celery_outbox.contrib.django.conf import url_of
from celery_outbox.errors import ConfigurationError

PG = "django.db.backends.postgresql"


def connect_args(db: dict[str, Any]) -> dict[str, Any]:
    """What SQLAlchemy's psycopg dialect passes ``psycopg.connect`` for the derived URL."""
    url = make_url(url_of(db))
    assert url.drivername == "postgresql+psycopg"
    _, kwargs = psycopg.dialect().create_connect_args(url)  # type: ignore[no-untyped-call]
    return {key: str(value) for key, value in kwargs.items()}


@pytest.mark.parametrize(("db", "wanted"), [
    ({"ENGINE": PG, "NAME": "shop", "USER": "app", "PASSWORD": "pw", "HOST": "db.internal",
      "PORT": "5433"},
     {"dbname": "shop", "user": "app", "password": "pw", "host": "db.internal",
      "port": "5433"}),
    # Django's documented Unix-socket form: HOST is the socket's directory
    ({"ENGINE": PG, "NAME": "shop", "USER": "app", "HOST": "/var/run/postgresql",
      "PORT": "5432"},
     {"dbname": "shop", "user": "app", "host": "/var/run/postgresql", "port": "5432"}),
    ({"ENGINE": PG, "NAME": "shop", "HOST": "/tmp", "PORT": ""},
     {"dbname": "shop", "host": "/tmp"}),
    # empty HOST and PORT: libpq's defaults, as Django leaves them
    ({"ENGINE": PG, "NAME": "shop", "USER": "", "PASSWORD": "", "HOST": "", "PORT": ""},
     {"dbname": "shop"}),
    ({"ENGINE": PG, "NAME": "shop", "PORT": 6432}, {"dbname": "shop", "port": "6432"}),
    ({"ENGINE": PG, "NAME": "shop", "HOST": "::1", "PORT": "5432"},
     {"dbname": "shop", "host": "::1", "port": "5432"}),
    ({"ENGINE": PG, "NAME": "shop", "HOST": "a.example,b.example", "PORT": "5432"},
     {"dbname": "shop", "host": "a.example,b.example", "port": "5432,5432"}),
    # libpq options pass; Django's own do not
    ({"ENGINE": PG, "NAME": "shop", "HOST": "h", "OPTIONS": {
        "sslmode": "require", "connect_timeout": 3, "application_name": "shop web",
        "options": "-c search_path=app,public", "isolation_level": 2,
        "server_side_binding": True, "pool": {"min_size": 2}}},
     {"dbname": "shop", "host": "h", "sslmode": "require", "connect_timeout": "3",
      "application_name": "shop web", "options": "-c search_path=app,public"}),
    ({"ENGINE": PG, "NAME": "", "OPTIONS": {"service": "shop"}}, {"service": "shop"}),
    ({"ENGINE": PG, "NAME": "shop", "HOST": "/var/run/postgresql",
      "OPTIONS": {"sslmode": "disable"}},
     {"dbname": "shop", "host": "/var/run/postgresql", "sslmode": "disable"}),
])
def test_psycopg_gets_what_django_gives(db: dict[str, Any], wanted: dict[str, str]) -> None:
    assert connect_args(db) == wanted


@pytest.mark.parametrize("name", ["my db", "a/b", "a?b", "a#b", "50%", "a@b:c", "é",
                                  "a&b=c"])
@pytest.mark.parametrize("host", ["db.internal", "/var/run/postgresql"])
def test_names_and_passwords_are_quoted(name: str, host: str) -> None:
    got = connect_args({"ENGINE": PG, "NAME": name, "USER": f"u{name}", "PASSWORD": f"p{name}",
                        "HOST": host, "PORT": "5432"})
    assert got == {"dbname": name, "user": f"u{name}", "password": f"p{name}", "host": host,
                   "port": "5432"}


def test_a_socket_host_is_not_read_as_part_of_the_name() -> None:
    url = make_url(url_of({"ENGINE": PG, "NAME": "shop", "HOST": "/var/run/postgresql",
                           "PORT": "5432"}))
    assert url.database == "shop" and url.host is None
    assert url.query["host"] == "/var/run/postgresql"


def test_sqlite_is_an_absolute_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert url_of({"ENGINE": "django.db.backends.sqlite3", "NAME": "shop.sqlite3"}) == \
        f"sqlite:///{tmp_path}/shop.sqlite3"


@pytest.mark.parametrize(("db", "match"), [
    ({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, "in-memory"),
    ({"ENGINE": "django.db.backends.sqlite3", "NAME": ""}, "in-memory"),
    ({"ENGINE": "django.db.backends.mysql", "NAME": "shop"}, "mysql"),
    ({"ENGINE": PG, "NAME": "shop", "PORT": "fivefour"}, "PORT"),
])
def test_what_the_workers_cannot_reach_is_refused(db: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        url_of(db)


def test_a_sqlite_name_may_be_a_path_object(tmp_path: Any) -> None:
    """Django's default settings name the file ``BASE_DIR / "db.sqlite3"``."""
    assert url_of({"ENGINE": "django.db.backends.sqlite3", "NAME": tmp_path / "db.sqlite3"}) \
        == f"sqlite:///{tmp_path}/db.sqlite3"
