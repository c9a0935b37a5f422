"""The sync :class:`~celery_outbox.executors.Executor` protocol on an
:class:`~celery_outbox.executors.sqlalchemy_async.AsyncSqlAlchemyExecutor`: its coroutines run
on an event loop in a thread of its own, so the contract suite drives every transition
through an async driver (psycopg async, asyncpg, aiosqlite) with the same tests.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from celery_outbox.executors.sqlalchemy_async import AsyncSqlAlchemyExecutor
from celery_outbox.queries import Query

R = TypeVar("R")


class AsyncBridge:
    """``run``, ``run_all`` and ``transaction`` of the Executor protocol, each awaited on
    :attr:`loop`. ``join`` is the async executor's own (a store's ``ajoin``)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.inner = AsyncSqlAlchemyExecutor(engine)
        self.engine = engine.sync_engine
        self.aengine = engine
        self.dialect = self.inner.dialect
        self.observers = self.inner.observers
        self.database = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="contract-async-bridge")
        self._thread.start()

    def where(self) -> str:
        return self.inner.where()

    def wait(self, coro: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def run(self, query: Query[R]) -> R:
        return self.wait(self.inner.run(query))

    def run_all(self, queries: Sequence[Query[Any]]) -> list[Any]:
        async def together() -> list[Any]:
            async with self.inner.transaction() as tx:
                return [await tx.run(query) for query in queries]

        return self.wait(together())

    @contextmanager
    def transaction(self) -> Iterator[_SyncTx]:
        opened = self.inner.transaction()
        tx = self.wait(opened.__aenter__())
        try:
            yield _SyncTx(self, tx)
        except BaseException as exc:
            if not self.wait(opened.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self.wait(opened.__aexit__(None, None, None))

    def join(self, caller: Any) -> Any:
        raise NotImplementedError("the bridge runs the store's own transactions only")

    def close(self) -> None:
        self.wait(self.aengine.dispose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class _SyncTx:
    def __init__(self, bridge: AsyncBridge, tx: Any) -> None:
        self.bridge = bridge
        self.tx = tx

    def run(self, query: Query[R]) -> R:
        result: R = self.bridge.wait(self.tx.run(query))
        return result

    def after_commit(self, callback: Any) -> None:
        self.tx.after_commit(callback)
