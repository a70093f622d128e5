"""The ledger's SQLite connection, owned on one thread of its own, through public APIs only.

`sqlite3` is synchronous; the pipeline is not. Every call on the connection runs on one worker thread
(a `ThreadPoolExecutor` of one: in the order asked, one at a time), so the event loop never waits on
the disk, and `run(fn, *args)` runs a whole function on that thread in one trip: a group commit of
many changes, or a check that reads the whole ledger, costs one hand-over, not one per statement.

A call whose caller is cancelled still runs to its end on the thread (a `COMMIT` asked for is never
skipped, leaving a transaction open); only its result is dropped.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

Params = Sequence[Any] | dict[str, Any]


class Connection:
    """One SQLite connection and the thread it lives on. Open with `await Connection.open(...)`."""

    def __init__(self, executor: ThreadPoolExecutor, conn: sqlite3.Connection, name: str) -> None:
        self._executor = executor
        self._conn = conn
        self.name = name  # what it was opened on, for messages
        self.closed = False

    @classmethod
    async def open(cls, database: str | os.PathLike[str], *, uri: bool = False) -> Connection:
        """A connection in autocommit mode (transactions are said, `BEGIN IMMEDIATE` … `COMMIT`), rows as
        `sqlite3.Row`, created on its own thread (sqlite3 then checks that no other thread uses it)."""
        executor = ThreadPoolExecutor(1, thread_name_prefix="ledger")

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(database, isolation_level=None, uri=uri)
            conn.row_factory = sqlite3.Row
            return conn

        try:
            conn = await asyncio.wrap_future(executor.submit(connect))
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(executor, conn, str(database))

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(connection, *args)` on the connection's thread, after everything asked before it; await the
        result."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def work(conn: sqlite3.Connection) -> None:  # on the connection's thread
            try:
                result = fn(conn, *args)
            except BaseException as e:
                _tell(loop, done, None, e)
            else:
                _tell(loop, done, result, None)

        self.post(work)
        return done

    def post(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        """`fn(connection)` on the connection's thread, after everything asked before it, nothing handed
        back: `fn` tells its caller itself (the group commit's one callback per commit)."""
        if self.closed:
            raise sqlite3.ProgrammingError(f"{self.name}: the connection is closed")
        self._executor.submit(fn, self._conn)

    async def execute(self, sql: str, parameters: Params = ()) -> None:
        """One statement, its rows (if any) discarded."""
        await self.run(_execute, sql, parameters)

    async def execute_fetchall(self, sql: str, parameters: Params = ()) -> list[sqlite3.Row]:
        return await self.run(_fetchall, sql, parameters)

    async def executescript(self, script: str) -> None:
        await self.run(_executescript, script)

    async def create_function(self, name: str, narg: int, fn: Callable[..., Any], *, deterministic: bool) -> None:
        await self.run(_create_function, name, narg, fn, deterministic)

    async def set_authorizer(
        self, authorizer: Callable[[int, str | None, str | None, str | None, str | None], int] | None
    ) -> None:
        await self.run(_set_authorizer, authorizer)

    async def close(self) -> None:
        """Closed after everything asked before it; later calls raise `sqlite3.ProgrammingError`."""
        if self.closed:
            return
        closing = self.run(_close)
        self.closed = True
        try:
            await closing
        finally:
            self._executor.shutdown(wait=False)


def _tell(loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Hand a result to the loop's future; a loop already closed (its caller gone) is told nothing."""
    try:
        loop.call_soon_threadsafe(_settle, done, result, error)
    except RuntimeError:
        pass


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.cancelled():  # its caller was cancelled: the work ran all the same
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)


def _execute(conn: sqlite3.Connection, sql: str, parameters: Params) -> None:
    conn.execute(sql, parameters).close()


def _fetchall(conn: sqlite3.Connection, sql: str, parameters: Params) -> list[sqlite3.Row]:
    return conn.execute(sql, parameters).fetchall()


def _executescript(conn: sqlite3.Connection, script: str) -> None:
    conn.executescript(script)


def _create_function(
    conn: sqlite3.Connection, name: str, narg: int, fn: Callable[..., Any], deterministic: bool
) -> None:
    conn.create_function(name, narg, fn, deterministic=deterministic)


def _set_authorizer(conn: sqlite3.Connection, authorizer: Any) -> None:
    conn.set_authorizer(authorizer)


def _close(conn: sqlite3.Connection) -> None:
    conn.close()
