"""OutboxConfig: every setting of the outbox, validated once and frozen.

Settings come from the keywords of ``Outbox(app, **settings)`` and from ``app.conf.outbox_<name>``
(keywords win). Durations are ``timedelta``; a plain number is read as seconds. An unknown
setting fails loudly with its name and the known ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, field_validator

from celery_outbox.encryption import key_problem, split_keys
from celery_outbox.errors import ConfigurationError

PREFIX = "outbox_"
WEB_PREFIX = "outbox_web_"
"""``app.conf.outbox_web_*`` belongs to the dashboard (:mod:`celery_outbox.web`), not here."""

MAX_DURATION = timedelta(days=3650)
"""The longest duration a setting (and a job's lease) may hold: a time past it cannot be
scheduled reliably (``now + duration`` must stay a date)."""

MAX_KEEP = 2**31 - 1
"""The most rows a ``keep`` may ask for (the trim's watermark stores it as a 32-bit int)."""


KEY_WAIT = timedelta(seconds=10)
"""The default ``key_wait``: how long a keyed push waits, in all, on another transaction
holding its key uncommitted."""

MAX_WINDOW = timedelta(seconds=60)
"""The longest ``outcome_window`` (the age of the oldest held outcome at which the runner
writes the held ones before beginning the next row)."""


class OutboxConfig(BaseModel):
    """The validated, frozen settings of one :class:`~celery_outbox.Outbox`.

    Attributes (defaults in brackets):

    - ``sweep_schedule`` [60 s]: how often beat runs the sweep: a timedelta or a cron expression.
    - ``trim_schedule`` ["0 * * * *"]: how often beat runs the trim.
    - ``stale_after`` [5 min]: a pending row last dispatched longer ago is dispatched again.
    Durations are at most :data:`MAX_DURATION`, counts at most :data:`MAX_KEEP`.

    - ``lease`` [30 min]: how long a running row may go without a heartbeat; a job's ``timeout``
      makes it 2 x timeout. The heartbeat renews leases every lease / 3.
    - ``max_eta`` [5 min]: scheduled rows due within this get a Celery ``eta``; later ones wait
      in the database for the sweep.
    - ``keep_succeeded`` / ``keep_failed`` / ``keep_cancelled`` [10 / 10 / 10]: rows the trim
      keeps per job and status.
    - ``log_max_entries`` [100]: log records kept per execution.
    - ``drain_timeout`` [30 s]: how long a stopping worker waits for running handlers.
    - ``batch_size`` [500]: rows per batch in sweep and trim.
    - ``dispatch_chunk_size`` [50]: execution ids carried by one Celery message at most.
    - ``outcome_window`` [0]: how long a worker may hold the outcomes of one message's
      finished attempts to write them together, in one transaction (one commit for many);
      0 writes each outcome at once. Opt-in, for throughput: a worker killed mid-message
      then loses the held outcomes too (their attempts are rescued as a dead worker's:
      retried, or failed when the job allows no retry), and each later row's start mark is
      committed without waiting for the WAL flush (a crash of the database server can lose
      it, and a row whose worker also died then begins the same attempt again).
    - ``cron_catchup`` [5 min]: a cron tick at most this old (30 s at least) still runs, once,
      when beat fires it late (it was down); older missed ticks are skipped and logged.
    - ``key_wait`` [10 s]: how long a keyed push waits, in all, on another transaction that
      holds the same key uncommitted (PostgreSQL: in rounds of the engine's lock timeout,
      5 s on the engine the outbox builds, so the wait is rounded up to whole rounds); then
      :class:`~celery_outbox.errors.KeyBusy`, nothing written and the caller's transaction
      still usable. 0: one round.
    - ``table_name`` ["celery_outbox_executions"]: the outbox table.
    - ``metrics`` [False]: count this process's events for Prometheus
      (:mod:`celery_outbox.metrics`, extra ``metrics``; imported only when True).
    - ``metrics_interval`` [15 s]: how long the table's gauges (one aggregate statement) are
      reused by every scrape before the statement runs again; > 0.
    - ``metrics_tenants`` [False]: add rows per tenant (a series per ``organization_id``).
    - ``encryption_keys`` [()]: Fernet keys (a list, or one comma-separated string), newest
      first, for jobs declared ``encrypted=True`` (:mod:`celery_outbox.encryption`): the
      first encrypts, every one decrypts. Empty: the environment variable
      ``CELERY_OUTBOX_ENCRYPTION_KEYS``. Held as ``SecretStr`` (never printed).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    sweep_schedule: timedelta | str = timedelta(seconds=60)
    trim_schedule: timedelta | str = "0 * * * *"
    stale_after: timedelta = timedelta(minutes=5)
    lease: timedelta = timedelta(minutes=30)
    max_eta: timedelta = timedelta(minutes=5)
    keep_succeeded: int = 10
    keep_failed: int = 10
    keep_cancelled: int = 10
    log_max_entries: int = 100
    drain_timeout: timedelta = timedelta(seconds=30)
    batch_size: int = 500
    dispatch_chunk_size: int = 50
    outcome_window: timedelta = timedelta(0)
    cron_catchup: timedelta = timedelta(minutes=5)
    key_wait: timedelta = KEY_WAIT
    table_name: str = "celery_outbox_executions"
    metrics: bool = False
    metrics_interval: timedelta = timedelta(seconds=15)
    metrics_tenants: bool = False
    encryption_keys: tuple[SecretStr, ...] = ()

    @field_validator("stale_after", "lease", "max_eta", "drain_timeout", "cron_catchup",
                     "key_wait")
    @classmethod
    def _non_negative(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("must be a duration >= 0")
        if value > MAX_DURATION:
            raise ValueError(f"must be a duration <= {MAX_DURATION}")
        return value

    @field_validator("outcome_window")
    @classmethod
    def _window(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= MAX_WINDOW:
            raise ValueError(f"must be a duration in 0..{MAX_WINDOW}")
        return value

    @field_validator("metrics_interval")
    @classmethod
    def _interval(cls, value: timedelta) -> timedelta:
        if not timedelta(0) < value <= MAX_DURATION:
            raise ValueError(f"must be a duration in (0, {MAX_DURATION}]")
        return value

    @field_validator("encryption_keys", mode="before")
    @classmethod
    def _keys(cls, value: Any) -> tuple[Any, ...]:
        keys = split_keys(value)
        for index, key in enumerate(keys):
            raw = key.get_secret_value() if isinstance(key, SecretStr) else key
            problem = key_problem(raw)
            if problem is not None:  # never the key itself in the message
                raise ValueError(f"key [{index}] {problem}")
        return keys

    @field_validator("lease")
    @classmethod
    def _positive_lease(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be a duration > 0")
        return value

    @field_validator("keep_succeeded", "keep_failed", "keep_cancelled", "log_max_entries")
    @classmethod
    def _count(cls, value: int) -> int:
        if not 0 <= value <= MAX_KEEP:
            raise ValueError(f"must be in 0..{MAX_KEEP}")
        return value

    @field_validator("batch_size", "dispatch_chunk_size")
    @classmethod
    def _batch(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be >= 1")
        return value

    @field_validator("sweep_schedule", "trim_schedule")
    @classmethod
    def _schedule(cls, value: timedelta | str) -> timedelta | str:
        if isinstance(value, timedelta):
            if not timedelta(0) < value <= MAX_DURATION:
                raise ValueError(f"must be a duration in (0, {MAX_DURATION}] or a cron "
                                 "expression")
            return value
        from croniter import croniter

        if not croniter.is_valid(value):
            raise ValueError(f"{value!r} is not a valid cron expression")
        return value

    @field_validator("table_name")
    @classmethod
    def _table_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", value):
            raise ValueError("must be a plain SQL identifier (letters, digits, underscore)")
        return value

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any], conf: Mapping[str, Any] | None = None
    ) -> OutboxConfig:
        """Build the config from ``app.conf.outbox_*`` (``conf``) and keyword ``overrides``.

        Raises :class:`ConfigurationError` naming the setting when one is unknown or invalid.
        """
        values: dict[str, Any] = {
            key[len(PREFIX) :]: value
            for key, value in (conf or {}).items()
            if isinstance(key, str) and key.startswith(PREFIX) and not key.startswith(WEB_PREFIX)
        }
        values.update(overrides)
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            known = ", ".join(sorted(cls.model_fields))
            raise ConfigurationError(
                f"unknown outbox setting(s) {unknown}; known settings: {known}"
            )
        try:
            return cls(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = ".".join(str(p) for p in first["loc"])
            if name.startswith("encryption_keys"):  # a secret: never its value, nor chained
                raise ConfigurationError(
                    f"invalid outbox setting {name!r}: {first['msg']}") from None
            raise ConfigurationError(
                f"invalid outbox setting {name!r}: {first['msg']} (got {first.get('input')!r})"
            ) from exc
