"""TEMPORARY (drop when the sweep/trim/admin/dashboard areas are on the seam): the old
StoreBase plumbing those areas still call, so the suite runs on this branch alone."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from celery_outbox.errors import StorageError
from celery_outbox.outcomes import Fence
from celery_outbox.queries.clauses import active, fenced, upsert
from celery_outbox.store.base import StoreBase


class LegacyStore(StoreBase):
    @contextmanager
    def begin(self, *, autocommit: bool = False) -> Iterator[Connection]:
        engine = self.executor._autocommit if autocommit else self.engine
        try:
            with engine.begin() as conn:
                yield conn
        except DBAPIError as exc:
            raise StorageError(f"database error on {self._where()}: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database error on {self._where()}: {exc}") from exc

    def _where(self) -> str:
        return self.executor.where()

    def _insert(self) -> Any:
        return upsert(self.t, self.dialect)

    def _active(self) -> Any:
        return active(self.t)

    def _fenced(self, fence: Fence) -> Any:
        return fenced(self.t, fence)

    def _prebuilt(self, shape: Hashable, build: Callable[[], Any]) -> Any:
        cache = self.__dict__.setdefault("_trim_statements", {})
        stmt = cache.get(shape)
        if stmt is None:
            stmt = cache[shape] = build()
        return stmt
