"""JobSpec (one job's validated options) and JobRegistry (jobs by name).

Options are checked when the job is defined, so a typo or a bad value fails at import time with
the option's name and the allowed values.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from celery_outbox.config import MAX_DURATION, MAX_KEEP, OutboxConfig
from celery_outbox.cron import expression_problem, zone_problem
from celery_outbox.errors import ConfigurationError, JobNameAmbiguous, JobNotRegistered
from celery_outbox.models import MAX_LENGTHS
from celery_outbox.retry import NO_RETRY, RetryPolicy
from celery_outbox.states import Priority

Mode = Literal["queue", "cron"]
Record = Literal["errors", "all", "none"]
RECORD_MODES: tuple[Record, ...] = ("errors", "all", "none")
KEEP_KEYS = ("succeeded", "failed", "cancelled")

OPTIONS = (
    "name", "schema", "cron", "timezone", "retry", "timeout", "priority", "queue", "lock",
    "record", "keep", "description", "parallel", "max_snoozes", "encrypted", "concurrency",
    "concurrency_key", "rate", "rate_per_key",
)
MAX_CONCURRENCY = 10_000
"""The largest ``concurrency`` a job may set (one row of ``<table>_slots`` per slot)."""
RATE_UNITS = {"s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": timedelta(hours=1)}
"""The windows of a ``rate``: ``N/s``, ``N/m``, ``N/h``."""


@dataclass(frozen=True)
class Rate:
    """A rate limit: at most ``starts`` executions begin in each fixed ``window`` (windows
    aligned on the database's epoch: a ``/m`` window begins at each whole minute)."""

    starts: int
    window: timedelta

    @classmethod
    def parse(cls, text: object) -> Rate:
        """``"100/m"``, ``"10/s"``, ``"1000/h"`` (a positive int, a slash, ``s``, ``m`` or
        ``h``); raises :class:`ValueError` saying what is wrong otherwise."""
        if not isinstance(text, str):
            raise ValueError(f"must be a string like '100/m', got {text!r}")
        count, sep, unit = text.strip().partition("/")
        if not sep or unit.strip() not in RATE_UNITS or not count.strip().isdigit() \
                or int(count) < 1:
            raise ValueError(f"must be '<N>/s', '<N>/m' or '<N>/h' with N a positive int, "
                             f"got {text!r}")
        return cls(int(count), RATE_UNITS[unit.strip()])

    def __str__(self) -> str:
        unit = next(u for u, w in RATE_UNITS.items() if w == self.window)
        return f"{self.starts}/{unit}"

MAX_PARALLEL = 256
"""The most handlers of one message a parallel job runs at once (``parallel=``)."""
DEFAULT_MAX_SNOOZES = 100
"""How many times one execution may be snoozed by default (``max_snoozes=``)."""
MAX_SNOOZES = 1_000_000
"""The largest ``max_snoozes`` a job may set."""


@dataclass(frozen=True)
class JobSpec:
    """One registered job: its handler and validated options.

    ``timeout`` is a timedelta or None; ``keep`` maps ``"succeeded"`` / ``"failed"`` /
    ``"cancelled"`` to the rows the trim keeps for this job (None: the config's
    ``keep_succeeded`` / ``keep_failed`` / ``keep_cancelled``); ``parallel``: how many
    executions of one message run at once (1: one after the other); ``max_snoozes``: how
    many times one execution may be snoozed (``ctx.snooze``); the snooze beyond fails it;
    ``encrypted``: the payload is stored encrypted (:mod:`celery_outbox.encryption`);
    ``concurrency``: at most this many executions of the job (per key when
    ``concurrency_key`` is given) run at once, across every worker (None: no limit);
    ``concurrency_key``: a function of the payload (the validated model) answering a str of
    at most 200 characters, the key each limit holds for; ``rate``: at most
    ``rate.starts`` executions begin per ``rate.window`` (per key with ``rate_per_key``).
    """

    name: str
    handler: Callable[..., Any]
    mode: Mode
    schema: type[BaseModel] | None = None
    cron: str | None = None
    timezone: str | None = None
    retry: RetryPolicy = NO_RETRY
    timeout: timedelta | None = None
    priority: Priority = Priority.NORMAL
    queue: str | None = None
    lock: bool = True
    record: Record = "errors"
    keep: Mapping[str, int] | None = None
    description: str | None = None
    parallel: int = 1
    max_snoozes: int = DEFAULT_MAX_SNOOZES
    encrypted: bool = False
    concurrency: int | None = None
    concurrency_key: Callable[[Any], str] | None = None
    rate: Rate | None = None
    rate_per_key: bool = False

    @property
    def limited(self) -> bool:
        """Whether a concurrency or a rate limit holds for the job's executions."""
        return self.concurrency is not None or self.rate is not None

    @classmethod
    def create(cls, handler: Callable[..., Any], **options: Any) -> JobSpec:
        """Validate ``options`` (the ``@outbox_job`` keywords) and build the spec.

        Raises :class:`ConfigurationError` naming the option on an unknown option, a name
        longer than the table's ``job_name`` column (200), schema and cron together or
        neither, a bad cron expression or timezone, a negative timeout, an unknown priority
        or record mode, a malformed ``keep``, a ``parallel`` that is no int in
        1..:data:`MAX_PARALLEL`, ``parallel`` > 1 on an ``async def`` handler (the worker
        calls handlers, it awaits none), a ``max_snoozes`` that is no int in
        0..:data:`MAX_SNOOZES`, or an ``encrypted`` that is no bool or True without the
        ``cryptography`` package (extra ``encryption``), a ``concurrency`` that is no int in
        1..:data:`MAX_CONCURRENCY`, a ``concurrency_key`` that is not callable, a ``rate``
        that is not ``"<N>/s"``, ``"<N>/m"`` or ``"<N>/h"``, a ``rate_per_key`` without a
        ``concurrency_key``, or any of them on a cron job.
        """
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {unknown} for @outbox_job on {_qualname(handler)}; "
                f"known options: {', '.join(OPTIONS)}"
            )
        if not callable(handler):
            raise ConfigurationError(f"@outbox_job needs a function, got {handler!r}")
        name = options.get("name") or _qualname(handler)
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"job name must be a non-empty string, got {name!r}")
        if len(name) > MAX_LENGTHS["job_name"]:
            raise ConfigurationError(
                f"job name {name[:40]!r}... is {len(name)} characters long; "
                f"at most {MAX_LENGTHS['job_name']}"
            )

        def bad(option: str, message: str) -> ConfigurationError:
            return ConfigurationError(f"job {name!r}: option {option!r} {message}")

        schema, cron = options.get("schema"), options.get("cron")
        if (schema is None) == (cron is None):
            raise bad("schema/cron", "exactly one of 'schema' (queue mode) and 'cron' "
                      "(cron mode) must be given")
        if schema is not None and not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise bad("schema", f"must be a pydantic BaseModel subclass, got {schema!r}")
        if cron is not None:
            _check_cron(name, cron)
        tz = options.get("timezone")
        if tz is not None:
            if cron is None:
                raise bad("timezone", "only applies to cron jobs")
            problem = zone_problem(tz)
            if problem is not None:
                raise bad("timezone", f"{problem} (cron {cron!r})")
        retry = options.get("retry") or NO_RETRY
        if not isinstance(retry, RetryPolicy):
            raise bad("retry", f"must be a RetryPolicy, got {retry!r}")
        timeout = options.get("timeout")
        if timeout is not None and (not isinstance(timeout, timedelta)
                                    or not timedelta(0) < timeout <= MAX_DURATION / 2):
            # its lease is 2 x timeout, at most MAX_DURATION
            raise bad("timeout", f"must be a timedelta in (0, {MAX_DURATION / 2}], "
                                 f"got {timeout!r}")
        try:
            priority = Priority.parse(options.get("priority", "normal"))
        except ValueError as exc:
            raise bad("priority", str(exc)) from exc
        queue = options.get("queue")
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise bad("queue", f"must be a non-empty string, got {queue!r}")
        mode: Mode = "cron" if cron is not None else "queue"
        record = options.get("record") or ("all" if mode == "cron" else "errors")
        if record not in RECORD_MODES:
            raise bad("record", f"must be one of {RECORD_MODES}, got {record!r}")
        keep = options.get("keep")
        if keep is not None:
            keep = _check_keep(name, keep)
        if mode == "cron" and options.get("record") is None:
            # A cron job keeps its last success by default, so its last run stays visible.
            keep = {"succeeded": 1, **(keep or {})}
        lock = options.get("lock", True)
        if not isinstance(lock, bool):
            raise bad("lock", f"must be True or False, got {lock!r}")
        parallel = options.get("parallel", 1)
        if not isinstance(parallel, int) or isinstance(parallel, bool) \
                or not 1 <= parallel <= MAX_PARALLEL:
            raise bad("parallel", f"must be an int in 1..{MAX_PARALLEL}, got {parallel!r}")
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
                type(handler).__call__):  # a function, or an object whose __call__ is async
            raise ConfigurationError(
                f"job {name!r}: its handler is an async def: the worker calls a handler and "
                "awaits nothing, so it would never run (and count as a success); make it a "
                "plain function, which may call asyncio.run(...)")
        max_snoozes = options.get("max_snoozes", DEFAULT_MAX_SNOOZES)
        if not isinstance(max_snoozes, int) or isinstance(max_snoozes, bool) \
                or not 0 <= max_snoozes <= MAX_SNOOZES:
            raise bad("max_snoozes", f"must be an int in 0..{MAX_SNOOZES}, got {max_snoozes!r}")
        encrypted = options.get("encrypted", False)
        if not isinstance(encrypted, bool):
            raise bad("encrypted", f"must be True or False, got {encrypted!r}")
        if encrypted and not _importable("cryptography"):
            raise bad("encrypted", "needs the cryptography package: "
                      "pip install 'celery-outbox[encryption]'")
        concurrency, key, rate, per_key = _limits(options, mode, bad)
        return cls(
            name=name, handler=handler, mode=mode, schema=schema, cron=cron, timezone=tz,
            retry=retry, timeout=timeout, priority=priority, queue=queue, lock=lock,
            record=record, keep=keep, description=options.get("description"),
            parallel=parallel, max_snoozes=max_snoozes, encrypted=encrypted,
            concurrency=concurrency, concurrency_key=key, rate=rate, rate_per_key=per_key,
        )

    def lease(self, config: OutboxConfig) -> timedelta:
        """How long one attempt may go without a heartbeat: 2 x timeout, else ``config.lease``."""
        return 2 * self.timeout if self.timeout is not None else config.lease

    def keeps(self, config: OutboxConfig) -> tuple[int, int]:
        """(succeeded rows, failed rows) the trim keeps for this job."""
        keep = self.keep or {}
        return (
            keep.get("succeeded", config.keep_succeeded),
            keep.get("failed", config.keep_failed),
        )

    def keep_cancelled(self, config: OutboxConfig) -> int:
        """Cancelled rows the trim keeps for this job: its ``keep["cancelled"]``, else
        ``config.keep_cancelled``."""
        return (self.keep or {}).get("cancelled", config.keep_cancelled)

    def keep_succeeded_row(self, config: OutboxConfig) -> bool:
        """Whether a success leaves a ``succeeded`` row (else the row is deleted)."""
        return self.record == "all" and self.keeps(config)[0] > 0

    def keep_failed_row(self) -> bool:
        """Whether a final failure leaves a ``failed`` row (else the row is deleted)."""
        return self.record != "none"


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _check_cron(name: str, cron: Any) -> None:
    problem = expression_problem(cron, seconds=False)
    if problem is not None:
        raise ConfigurationError(f"job {name!r}: option 'cron' {cron!r} {problem}")


def _check_keep(name: str, keep: Any) -> dict[str, int]:
    if not isinstance(keep, Mapping):
        raise ConfigurationError(f"job {name!r}: option 'keep' must be a mapping, got {keep!r}")
    unknown = sorted(set(keep) - set(KEEP_KEYS))
    if unknown:
        raise ConfigurationError(
            f"job {name!r}: option 'keep' has unknown key(s) {unknown}; known: {KEEP_KEYS}"
        )
    for k, v in keep.items():
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_KEEP:
            raise ConfigurationError(f"job {name!r}: option 'keep[{k!r}]' must be an int in "
                                     f"0..{MAX_KEEP}, got {v!r}")
    return dict(keep)


class Installer(Protocol):
    """What a registry needs of the Outbox its jobs push through (the Outbox is one)."""

    def install_job(self, spec: JobSpec) -> None:
        """Install what ``spec`` needs on the app (a cron job's beat entry)."""
        ...


@dataclass
class JobRegistry:
    """Jobs by name, and the Outbox they push through (set by ``Outbox(app, ...)``)."""

    jobs: dict[str, JobSpec] = field(default_factory=dict)
    outbox: Installer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, spec: JobSpec) -> None:
        """Register ``spec``. Raises ConfigurationError when another job has the same name."""
        with self._lock:
            old = self.jobs.get(spec.name)
            # The same function imported twice (e.g. as __main__ and by name) re-registers.
            if old is not None and _qualname(old.handler) != _qualname(spec.handler):
                raise ConfigurationError(
                    f"job name {spec.name!r} is already registered by {_qualname(old.handler)}"
                )
            self.jobs[spec.name] = spec
            outbox = self.outbox
        if outbox is not None:
            outbox.install_job(spec)  # e.g. the beat entry of a cron job declared late

    def get(self, name: str) -> JobSpec:
        """The job named ``name``. Raises :class:`JobNotRegistered`."""
        try:
            return self.jobs[name]
        except KeyError:
            raise JobNotRegistered(name) from None

    def find(self, name: str) -> JobSpec:
        """The job ``name`` names: its full name, or a short one when it names one job only.

        A short name is a dotted suffix of the full name: ``receipt`` or ``jobs.receipt``
        for ``shop.jobs.receipt``. Raises :class:`JobNameAmbiguous` listing the candidates
        when several jobs end so, :class:`JobNotRegistered` listing close names when none
        does.
        """
        name = name.strip()
        jobs = dict(self.jobs)
        if name in jobs:
            return jobs[name]
        found = sorted(full for full in jobs if full.endswith(f".{name}") and name)
        if len(found) == 1:
            return jobs[found[0]]
        if found:
            raise JobNameAmbiguous(name, tuple(found))
        raise JobNotRegistered(name, close_names(name, jobs))

    def __iter__(self) -> Iterator[JobSpec]:
        return iter(list(self.jobs.values()))

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, name: object) -> bool:
        return name in self.jobs


def close_names(name: str, names: Iterable[str], most: int = 3) -> tuple[str, ...]:
    """Up to ``most`` of ``names`` that look like ``name`` (a typo, another case, a part of
    it), best first: compared whole and by their last dotted part."""
    wanted = name.lower()
    by_key: dict[str, list[str]] = {}
    for full in sorted(names):
        for key in {full.lower(), full.rsplit(".", 1)[-1].lower()}:
            by_key.setdefault(key, []).append(full)
    found: list[str] = []
    contained = [full for key, fulls in by_key.items() if wanted and wanted in key
                 for full in fulls]
    close = [full for key in difflib.get_close_matches(wanted, by_key, n=most, cutoff=0.6)
             for full in by_key[key]]
    for full in close + contained:
        if full not in found:
            found.append(full)
    return tuple(found[:most])


default_registry = JobRegistry()
"""Where ``@outbox_job`` registers jobs unless told otherwise (as ``@shared_task`` does)."""


def _limits(options: Mapping[str, Any], mode: Mode,
            bad: Callable[[str, str], ConfigurationError]
            ) -> tuple[int | None, Callable[[Any], str] | None, Rate | None, bool]:
    """The checked ``concurrency``, ``concurrency_key``, ``rate`` and ``rate_per_key`` of
    :meth:`JobSpec.create` (``concurrency`` 1 when only a key is given)."""
    concurrency = options.get("concurrency")
    key = options.get("concurrency_key")
    rate_text = options.get("rate")
    per_key = options.get("rate_per_key", False)
    if mode == "cron":
        for option in ("concurrency", "concurrency_key", "rate"):
            if options.get(option) is not None:
                raise bad(option, "only applies to queue jobs")
    if key is not None and not callable(key):
        raise bad("concurrency_key", f"must be a function of the payload answering a str, "
                                     f"got {key!r}")
    if concurrency is None and key is not None:
        concurrency = 1
    if concurrency is not None and (not isinstance(concurrency, int)
                                    or isinstance(concurrency, bool)
                                    or not 1 <= concurrency <= MAX_CONCURRENCY):
        raise bad("concurrency", f"must be an int in 1..{MAX_CONCURRENCY}, got {concurrency!r}")
    rate = None
    if rate_text is not None:
        try:
            rate = Rate.parse(rate_text)
        except ValueError as exc:
            raise bad("rate", str(exc)) from None
    if not isinstance(per_key, bool):
        raise bad("rate_per_key", f"must be True or False, got {per_key!r}")
    if per_key and (key is None or rate is None):
        raise bad("rate_per_key", "needs a 'rate' and a 'concurrency_key' (the key counted)")
    return concurrency, key, rate, per_key
