"""OutboxConfig: defaults, app.conf.outbox_* reading, unknown and invalid settings."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from pydantic import ValidationError

from celery_outbox import ConfigurationError, JobRegistry, Outbox, OutboxConfig

UNREACHABLE = "postgresql+psycopg://root@127.0.0.1:1/x"


def test_defaults_are_the_documented_ones() -> None:
    c = OutboxConfig.load({})
    assert c.sweep_schedule == timedelta(seconds=60)
    assert c.trim_schedule == "0 * * * *"
    assert c.stale_after == timedelta(minutes=5)
    assert c.lease == timedelta(minutes=30)
    assert c.max_eta == timedelta(minutes=5)
    assert (c.keep_succeeded, c.keep_failed) == (10, 10)
    assert c.log_max_entries == 100
    assert c.drain_timeout == timedelta(seconds=30)
    assert c.batch_size == 500
    assert c.table_name == "celery_outbox_executions"


def test_config_is_frozen() -> None:
    c = OutboxConfig.load({})
    with pytest.raises(ValidationError):
        c.lease = timedelta(seconds=1)  # type: ignore[misc]


def test_reads_outbox_prefixed_conf_and_keywords_win() -> None:
    conf = {"outbox_lease": timedelta(minutes=2), "outbox_keep_failed": 3, "broker_url": "x",
            "outbox_max_eta": timedelta(seconds=30)}
    c = OutboxConfig.load({"max_eta": timedelta(seconds=10)}, conf)
    assert c.lease == timedelta(minutes=2)
    assert c.keep_failed == 3
    assert c.max_eta == timedelta(seconds=10)


def test_a_number_is_read_as_seconds() -> None:
    c = OutboxConfig.load({"stale_after": 90})
    assert c.stale_after == timedelta(seconds=90)


def test_outbox_reads_app_conf() -> None:
    app = Celery("cfg", broker="memory://")
    app.conf.outbox_lease = timedelta(minutes=3)
    app.conf.outbox_batch_size = 7
    outbox = Outbox(app, database_url=UNREACHABLE, registry=JobRegistry(),
                    keep_succeeded=4)
    assert outbox.config.lease == timedelta(minutes=3)
    assert outbox.config.batch_size == 7
    assert outbox.config.keep_succeeded == 4


def test_outbox_reads_database_url_from_app_conf() -> None:
    app = Celery("cfg-url", broker="memory://")
    app.conf.outbox_database_url = UNREACHABLE
    outbox = Outbox(app, registry=JobRegistry())
    assert outbox.engine.url.port == 1


def test_outbox_without_database_says_how_to_give_one() -> None:
    with pytest.raises(ConfigurationError, match="database_url"):
        Outbox(Celery("nodb", broker="memory://"), registry=JobRegistry())


def test_unknown_setting_is_named_with_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"'leese'") as info:
        OutboxConfig.load({"leese": timedelta(seconds=1)})
    assert "lease" in str(info.value).split("known settings:")[1]


def test_unknown_app_conf_setting_is_named() -> None:
    app = Celery("cfg-unknown", broker="memory://")
    app.conf.outbox_stale_afterr = 5
    with pytest.raises(ConfigurationError, match="stale_afterr"):
        Outbox(app, database_url=UNREACHABLE, registry=JobRegistry())


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("lease", timedelta(0)),
        ("lease", timedelta(seconds=-1)),
        ("stale_after", timedelta(seconds=-1)),
        ("max_eta", "soon"),
        ("keep_succeeded", -1),
        ("batch_size", 0),
        ("dispatch_chunk_size", 0),
        ("sweep_schedule", "every minute"),
        ("sweep_schedule", timedelta(0)),
        ("trim_schedule", "61 * * * *"),
        ("table_name", "drop table; --"),
        ("table_name", "1abc"),
        # Out of range: each would only fail later, in a worker (now + lease overflows, the
        # trim's watermark cannot store the keep).
        ("lease", timedelta.max),
        ("lease", timedelta(days=3651)),
        ("stale_after", timedelta.max),
        ("max_eta", timedelta(days=10**6)),
        ("drain_timeout", timedelta.max),
        ("cron_catchup", timedelta.max),
        ("sweep_schedule", timedelta.max),
        ("keep_succeeded", 2**40),
        ("keep_failed", 2**31),
    ],
)
def test_invalid_value_names_the_setting(setting: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=f"invalid outbox setting '{setting}'"):
        OutboxConfig.load({setting: value})


def test_cron_schedules_are_accepted() -> None:
    c = OutboxConfig.load({"sweep_schedule": "*/2 * * * *"})
    assert c.sweep_schedule == "*/2 * * * *"
