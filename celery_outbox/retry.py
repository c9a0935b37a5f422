"""RetryPolicy: from a failed attempt to the next run time, or give up.

Attempt ``n`` (1-based, the attempt that just failed) waits ``backoff * 2**(n-1)``, capped at
``backoff_max``; with ``jitter`` the wait is drawn uniformly from ``[0, that]`` ("full jitter",
as Celery's ``retry_jitter``). Source: Celery's ``retry_backoff`` / ``retry_jitter``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from celery_outbox.errors import ConfigurationError

MAX_RETRIES = 10_000
"""The most retries a policy may ask for (``max_attempts`` is ``retries + 1``)."""

MAX_WAIT = timedelta(days=3650)
"""The longest ``backoff`` / ``backoff_max`` (and so the longest wait) a policy may ask for."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed execution is retried.

    - ``retries``: retries after the first attempt (``max_attempts = retries + 1``), an int
      in 0 .. :data:`MAX_RETRIES`.
    - ``backoff``: the wait after the first failure; doubles each attempt. 0 .. :data:`MAX_WAIT`.
    - ``backoff_max``: the cap on one wait. 0 .. :data:`MAX_WAIT`.
    - ``jitter``: randomise each wait in ``[0, wait]`` so retries do not stampede.
    - ``when``: ``when(exc) -> bool``; False fails the execution at once. None retries all.

    Raises :class:`ConfigurationError` naming the field when a value is out of range.
    """

    retries: int = 0
    backoff: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=10)
    jitter: bool = True
    when: Callable[[BaseException], bool] | None = None

    def __post_init__(self) -> None:
        retries = self.retries
        if (not isinstance(retries, int) or isinstance(retries, bool)
                or not 0 <= retries <= MAX_RETRIES):
            raise ConfigurationError(
                f"RetryPolicy.retries must be an int in 0..{MAX_RETRIES}, got {retries!r}"
            )
        for field in ("backoff", "backoff_max"):
            value = getattr(self, field)
            if not isinstance(value, timedelta) or not timedelta(0) <= value <= MAX_WAIT:
                raise ConfigurationError(
                    f"RetryPolicy.{field} must be a timedelta in 0..{MAX_WAIT}, got {value!r}"
                )
        if self.when is not None and not callable(self.when):
            raise ConfigurationError(f"RetryPolicy.when must be callable, got {self.when!r}")

    @property
    def max_attempts(self) -> int:
        """``retries + 1``."""
        return self.retries + 1

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> timedelta:
        """The wait before the attempt after ``attempt`` (1-based): a timedelta in
        ``0 .. backoff_max``, for any ``attempt`` (never overflows)."""
        exponent = min(max(attempt - 1, 0), 64)  # 2**64 * MAX_WAIT is still a finite float
        # In float seconds, capped before it becomes a timedelta: backoff * 2**n alone
        # overflows timedelta long before the cap applies (1 h * 2**35 is past its range).
        seconds = min(self.backoff.total_seconds() * 2.0**exponent,
                      self.backoff_max.total_seconds())
        if self.jitter:
            seconds *= rng()
        return timedelta(seconds=seconds)

    def should_retry(self, exc: BaseException, attempt: int, max_attempts: int) -> bool:
        """True when ``exc`` raised in ``attempt`` of ``max_attempts`` deserves another attempt."""
        if attempt >= max_attempts:
            return False
        return self.when is None or bool(self.when(exc))


NO_RETRY = RetryPolicy()
