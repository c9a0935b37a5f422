"""The package's public surface: every error of the error tree is importable from
``celery_outbox`` and listed in its ``__all__``."""

from __future__ import annotations

import inspect

import celery_outbox
from celery_outbox import errors


def test_every_error_in_errors_py_is_exported() -> None:
    public = {
        name for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == errors.__name__
        and not name.startswith("_")
    }
    assert {"LeaseExpired", "ExecutionCancelled", "JobLocked"} <= public
    assert public <= set(celery_outbox.__all__)
    for name in public:
        assert getattr(celery_outbox, name) is getattr(errors, name)


def test_all_names_exist() -> None:
    for name in celery_outbox.__all__:
        assert hasattr(celery_outbox, name), name
