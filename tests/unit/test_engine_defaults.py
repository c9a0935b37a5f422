"""The libpq parameters make_engine ships, and the URL's own winning over them."""

from __future__ import annotations

from celery_outbox.engine import KEEPALIVES, _pg_connect_args, make_engine


def test_shipped_parameters() -> None:
    args = _pg_connect_args({})
    assert args == {
        "connect_timeout": 5,
        "options": "-c statement_timeout=8000 -c lock_timeout=5000",
        **KEEPALIVES,
    }


def test_the_urls_parameters_win() -> None:
    args = _pg_connect_args({"connect_timeout": "2", "options": "-c statement_timeout=0",
                             "keepalives": "0"})
    assert "connect_timeout" not in args and "keepalives" not in args  # the URL's are used
    # libpq applies -c settings in order: the URL's come last, so they win.
    assert args["options"] == ("-c statement_timeout=8000 -c lock_timeout=5000 "
                               "-c statement_timeout=0")


def test_engine_pool_timeout() -> None:
    engine = make_engine("postgresql+psycopg://root@127.0.0.1:1/x")  # never connects
    assert engine.pool.timeout() == 10
    engine.dispose()
