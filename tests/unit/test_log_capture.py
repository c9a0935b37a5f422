"""LogCapture without a database: thread locality, nesting, bounds, odd records."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from celery_outbox.logs import LogCapture


@pytest.fixture
def other() -> Iterator[logging.Logger]:
    logger = logging.getLogger("tests.unit.other")
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(logging.NOTSET)


def messages(capture: LogCapture) -> list[str]:
    return [e["message"] for e in capture.entries()]


def test_captures_ctx_log_and_the_threads_loggers_only_while_entered(
    other: logging.Logger,
) -> None:
    capture = LogCapture("celery_outbox.job.unit", 10)
    other.info("before")
    with capture:
        capture.logger.info("ctx %s", 1)
        other.info("std")
        worker = threading.Thread(target=other.info, args=("other thread",))
        worker.start()
        worker.join()
    other.info("after")
    capture.logger.info("ctx after exit")  # ctx.log always feeds its own capture

    assert messages(capture) == ["ctx 1", "std", "ctx after exit"]
    assert [e["logger"] for e in capture.entries()] == [
        "celery_outbox.job.unit", "tests.unit.other", "celery_outbox.job.unit"]


def test_an_inner_capture_takes_the_records_until_it_exits(other: logging.Logger) -> None:
    outer, inner = LogCapture("job.outer", 10), LogCapture("job.inner", 10)
    with outer:
        other.info("outer 1")
        with inner:
            other.info("inner")
        other.info("outer 2")
    assert messages(outer) == ["outer 1", "outer 2"]
    assert messages(inner) == ["inner"]


def test_bounds_and_the_dropped_entry(other: logging.Logger) -> None:
    capture = LogCapture("job.bounded", 3)
    with capture:
        for i in range(10):
            other.info("n%d", i)
    entries = capture.entries()
    assert [e["message"] for e in entries[:3]] == ["n0", "n1", "n2"]
    assert entries[3]["message"].startswith("7 more log record(s) dropped: at most 3")
    assert capture.dropped == 7

    nothing = LogCapture("job.zero", 0)
    with nothing:
        other.info("x")
    assert [e["level"] for e in nothing.entries()] == ["WARNING"]

    with pytest.raises(ValueError, match="max_entries"):
        LogCapture("job.bad", -1)


def test_a_bad_format_string_is_kept_not_raised(other: logging.Logger) -> None:
    capture = LogCapture("job.bad_format", 5)
    with capture:
        capture.logger.info("%d apples", "three")
    [entry] = capture.entries()
    assert "could not format" in entry["message"] and "apples" in entry["message"]


def test_ctx_log_captures_info_even_when_the_application_logs_warnings_only() -> None:
    assert logging.getLogger("celery_outbox.job.quiet").getEffectiveLevel() >= logging.WARNING
    capture = LogCapture("celery_outbox.job.quiet", 5)
    with capture:
        capture.logger.info("kept")
        capture.logger.debug("not kept")
    assert messages(capture) == ["kept"]


def test_the_root_handler_keeps_pythons_last_resort_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # With no handler configured, Python prints WARNING+ to stderr ("last resort"); the
    # capture's root handler must not silence that.
    root = logging.getLogger()
    saved = [h for h in root.handlers if type(h).__name__ != "_ThreadCaptureHandler"]
    for h in saved:
        root.removeHandler(h)
    try:
        with LogCapture("job.last_resort", 5):
            pass
        logging.getLogger("tests.unit.unconfigured").warning("still printed")
    finally:
        for h in saved:
            root.addHandler(h)
    assert "still printed" in capsys.readouterr().err


class _LogsWhenFormatted:
    """An argument whose ``str()`` logs (a model whose ``__str__`` logs a lazy load, say)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def __str__(self) -> str:
        self.logger.info("formatting")
        return "formatted"


def test_a_record_whose_argument_logs_when_formatted_does_not_hang_the_handler(
    other: logging.Logger,
) -> None:
    capture = LogCapture("celery_outbox.job.reentrant", 10)

    def handler() -> None:
        with capture:
            other.info("outer %s", _LogsWhenFormatted(other))
            capture.logger.info("ctx %s", _LogsWhenFormatted(capture.logger))

    worker = threading.Thread(target=handler, daemon=True)
    worker.start()
    worker.join(10)  # stdlib logging allows it (its handlers' locks are reentrant)
    assert not worker.is_alive(), "the handler's thread is stuck in the log capture"
    kept = messages(capture)
    # Each handler on the way (pytest's too) formats the record again, and so logs again.
    assert {"outer formatted", "ctx formatted", "formatting"} == set(kept)
    assert kept.count("outer formatted") == kept.count("ctx formatted") == 1


def test_what_a_handler_sets_on_ctx_log_before_its_first_record_stays_set() -> None:
    capture = LogCapture("celery_outbox.job.configured", 10)
    logger = capture.logger
    logger.setLevel(logging.DEBUG)  # the handler's own choice, before it logs anything
    logger.propagate = False
    with capture:
        logger.debug("debug kept")
    assert messages(capture) == ["debug kept"]
    assert logger.level == logging.DEBUG
    assert logger.propagate is False
