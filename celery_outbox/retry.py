"""RetryPolicy: from a failed attempt to the next run time, or give up.

Attempt ``n`` (1-based, the attempt that just failed) waits ``backoff * 2**(n-1)``, capped at
``backoff_max``; with ``jitter`` the wait is drawn uniformly from ``[0, that]`` ("full jitter",
as Celery's ``retry_jitter``). Source: DESIGN.md section 2, Celery's ``retry_backoff``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from celery_outbox.errors import ConfigurationError


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed execution is retried.

    - ``retries``: retries after the first attempt (``max_attempts = retries + 1``), >= 0.
    - ``backoff``: the wait after the first failure; doubles each attempt.
    - ``backoff_max``: the cap on one wait.
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
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ConfigurationError(
                f"RetryPolicy.retries must be an int >= 0, got {self.retries!r}"
            )
        for field in ("backoff", "backoff_max"):
            value = getattr(self, field)
            if not isinstance(value, timedelta) or value < timedelta(0):
                raise ConfigurationError(
                    f"RetryPolicy.{field} must be a timedelta >= 0, got {value!r}"
                )
        if self.when is not None and not callable(self.when):
            raise ConfigurationError(f"RetryPolicy.when must be callable, got {self.when!r}")

    @property
    def max_attempts(self) -> int:
        """``retries + 1``."""
        return self.retries + 1

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> timedelta:
        """The wait before the attempt after ``attempt`` (1-based): a timedelta >= 0."""
        exponent = max(attempt - 1, 0)
        # Cap the exponent so huge attempt counts do not overflow timedelta arithmetic.
        base = self.backoff * (2 ** min(exponent, 40)) if self.backoff else timedelta(0)
        capped = min(base, self.backoff_max)
        if self.jitter:
            return capped * rng()
        return capped

    def should_retry(self, exc: BaseException, attempt: int, max_attempts: int) -> bool:
        """True when ``exc`` raised in ``attempt`` of ``max_attempts`` deserves another attempt."""
        if attempt >= max_attempts:
            return False
        return self.when is None or bool(self.when(exc))


NO_RETRY = RetryPolicy()
