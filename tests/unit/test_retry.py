"""RetryPolicy: exponential backoff, its cap, jitter bounds, ``when`` and should_retry."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest

from celery_outbox import ConfigurationError, RetryLater, RetryPolicy
from celery_outbox.retry import MAX_RETRIES, MAX_WAIT, NO_RETRY

S = timedelta(seconds=1)


def test_defaults() -> None:
    p = RetryPolicy()
    assert (p.retries, p.backoff, p.backoff_max, p.jitter, p.when) == (
        0, S, timedelta(minutes=10), True, None,
    )
    assert p.max_attempts == 1
    assert NO_RETRY.max_attempts == 1
    assert RetryPolicy(retries=3).max_attempts == 4


def test_backoff_doubles_per_attempt() -> None:
    p = RetryPolicy(retries=10, backoff=S, backoff_max=timedelta(hours=1), jitter=False)
    assert [p.delay(n) for n in range(1, 6)] == [S, 2 * S, 4 * S, 8 * S, 16 * S]


def test_backoff_is_capped() -> None:
    p = RetryPolicy(retries=10, backoff=S, backoff_max=timedelta(seconds=5), jitter=False)
    assert [p.delay(n) for n in range(1, 6)] == [S, 2 * S, 4 * S, 5 * S, 5 * S]


def test_huge_attempt_numbers_do_not_overflow() -> None:
    p = RetryPolicy(retries=10, backoff=S, backoff_max=timedelta(minutes=10), jitter=False)
    assert p.delay(10_000) == timedelta(minutes=10)


def test_zero_backoff_is_zero_for_every_attempt() -> None:
    p = RetryPolicy(retries=3, backoff=timedelta(0), jitter=True)
    assert {p.delay(n) for n in range(1, 5)} == {timedelta(0)}


def test_jitter_scales_the_capped_wait_by_the_random_draw() -> None:
    p = RetryPolicy(retries=10, backoff=S, backoff_max=timedelta(seconds=6), jitter=True)
    assert p.delay(3, rng=lambda: 0.0) == timedelta(0)
    assert p.delay(3, rng=lambda: 0.5) == 2 * S
    assert p.delay(5, rng=lambda: 0.5) == 3 * S  # cap applies before the jitter


def test_jitter_stays_within_zero_and_the_capped_wait() -> None:
    p = RetryPolicy(retries=10, backoff=S, backoff_max=timedelta(seconds=6), jitter=True)
    rng = random.Random(7)
    for attempt in range(1, 8):
        cap = min(S * 2 ** (attempt - 1), timedelta(seconds=6))
        draws = [p.delay(attempt, rng=rng.random) for _ in range(200)]
        assert all(timedelta(0) <= d <= cap for d in draws)
        assert len(set(draws)) > 1  # genuinely randomised


def test_should_retry_stops_at_max_attempts() -> None:
    p = RetryPolicy(retries=2)
    exc = RuntimeError("x")
    assert p.should_retry(exc, attempt=1, max_attempts=3)
    assert p.should_retry(exc, attempt=2, max_attempts=3)
    assert not p.should_retry(exc, attempt=3, max_attempts=3)
    assert not p.should_retry(exc, attempt=4, max_attempts=3)


def test_when_decides_which_errors_are_retried() -> None:
    seen: list[BaseException] = []

    def transient(exc: BaseException) -> bool:
        seen.append(exc)
        return isinstance(exc, ConnectionError)

    p = RetryPolicy(retries=5, when=transient)
    conn_err, value_err = ConnectionError("down"), ValueError("bad")
    assert p.should_retry(conn_err, 1, 6)
    assert not p.should_retry(value_err, 1, 6)
    assert seen == [conn_err, value_err]
    # No attempts left: ``when`` is not even asked.
    assert not p.should_retry(conn_err, 6, 6)
    assert len(seen) == 2


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("retries", {"retries": -1}),
        ("retries", {"retries": 1.5}),
        ("retries", {"retries": True}),
        ("backoff", {"backoff": timedelta(seconds=-1)}),
        ("backoff", {"backoff": 5}),
        ("backoff_max", {"backoff_max": timedelta(seconds=-1)}),
        ("retries", {"retries": 10**9}),
        ("backoff", {"backoff": timedelta(days=10**6)}),
        ("backoff_max", {"backoff_max": timedelta.max}),
        ("when", {"when": "ConnectionError"}),
    ],
)
def test_invalid_values_name_the_field(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=f"RetryPolicy.{field} "):
        RetryPolicy(**kwargs)


def test_backoff_is_capped_before_it_can_overflow() -> None:
    # Regression: 1 h * 2**35 overflowed timedelta before the cap applied.
    p = RetryPolicy(retries=60, backoff=timedelta(hours=1), backoff_max=timedelta(hours=1),
                    jitter=False)
    assert {p.delay(n) for n in (1, 36, 60, 10**6)} == {timedelta(hours=1)}
    jittered = RetryPolicy(retries=60, backoff=timedelta(hours=1), backoff_max=timedelta(hours=1))
    assert jittered.delay(36, rng=lambda: 0.5) == timedelta(minutes=30)


def test_the_largest_allowed_policy_computes_every_wait() -> None:
    p = RetryPolicy(retries=MAX_RETRIES, backoff=MAX_WAIT, backoff_max=MAX_WAIT, jitter=False)
    assert {p.delay(n) for n in (1, 2, MAX_RETRIES)} == {MAX_WAIT}


def test_retry_later_needs_a_non_negative_timedelta() -> None:
    assert RetryLater(timedelta(seconds=3)).delay == timedelta(seconds=3)
    with pytest.raises(ConfigurationError, match="RetryLater delay"):
        RetryLater(timedelta(seconds=-1))
    with pytest.raises(ConfigurationError, match="RetryLater delay"):
        RetryLater(3)  # type: ignore[arg-type]
