"""``ExecutionsFailed`` through a result backend's serializers: a JSON backend rebuilds it
from its ``args`` (``cls(*args)``), pickle from its reduce; both keep its fields, and its
text is the count, in the log line and the task events (``repr``)."""

from __future__ import annotations

import pickle

import pytest
from celery import Celery

from celery_outbox import ExecutionsFailed


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_it_survives_the_result_backends_serializer(serializer: str) -> None:
    app = Celery("ef", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.result_serializer = serializer
    app.conf.result_accept_content = [serializer]
    backend = app.backend
    sent = ExecutionsFailed("shop.receipt", 2, 5)
    stored = backend.encode(backend.prepare_exception(sent, serializer))
    back = backend.exception_to_python(backend.decode(stored))
    assert type(back) is ExecutionsFailed
    assert (back.job_name, back.failed, back.of) == ("shop.receipt", 2, 5)
    assert str(back) == ("2 of 5 execution(s) of job 'shop.receipt' in this message failed "
                         "for good; their rows hold the errors")
    assert repr(back) == f"ExecutionsFailed({str(back)!r})"
    assert pickle.loads(pickle.dumps(sent)).failed == 2
