"""The ledger's SQLite connection, owned on one thread of its own, through public APIs only.

`sqlite3` is synchronous; the pipeline is not. Every call on the connection runs on its own thread,
one at a time in the order asked, so the event loop never waits on the disk, and `run(fn, *args)`
runs a whole function there in one trip: a group commit of many changes, or a check that reads the
whole ledger, costs one hand-over, not one per statement. The thread is a plain loop over a
`queue.SimpleQueue` (a `ThreadPoolExecutor` of one does the same with a lock and a future more per
call: measurably slower on the ledger's small writes).

A call whose caller is cancelled still runs to its end on the thread (a `COMMIT` asked for is never
skipped, leaving a transaction open); only its result is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

Params = Sequence[Any] | dict[str, Any]
# A call for the thread: fn(conn, *args), its outcome told to `done` on `loop` (None: not told).
_Call = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop | None, "asyncio.Future[Any] | None"]


class Connection:
    """One SQLite connection and the thread it lives on. Open with `await Connection.open(...)`."""

    def __init__(self, name: str) -> None:
        self.name = name  # what it was opened on, for messages
        self.closed = False
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()

    @classmethod
    async def open(cls, database: str | os.PathLike[str], *, uri: bool = False, name: str | None = None) -> Connection:
        """A connection in autocommit mode (transactions are said, `BEGIN IMMEDIATE` … `COMMIT`), rows as
        `sqlite3.Row`, made on its own thread (sqlite3 then checks that no other thread uses it).
        `name`: what messages call it (`database` by default; a URI's file, say)."""
        self = cls(name or str(database))
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()
        thread = threading.Thread(target=self._serve, args=(database, uri, loop, opened), name="ledger", daemon=True)
        thread.start()
        try:
            await opened
        except BaseException:
            self.closed = True
            self._calls.put(None)  # the thread ends (and with it a connection made meanwhile)
            raise
        return self

    def _serve(
        self, database: str | os.PathLike[str], uri: bool, loop: asyncio.AbstractEventLoop, opened: asyncio.Future[None]
    ) -> None:
        """The connection's thread: connect, then run each call in turn until told to stop (None)."""
        try:
            conn = sqlite3.connect(database, isolation_level=None, uri=uri)
            conn.row_factory = sqlite3.Row
        except BaseException as e:
            _tell(loop, opened, None, e)
            return
        _tell(loop, opened, None, None)
        calls = self._calls
        while (call := calls.get()) is not None:
            fn, args, caller, done = call
            try:
                result = fn(conn, *args)
            except BaseException as e:
                if caller is None or done is None:
                    log.error("%s: a call on the ledger's thread failed: %s", self.name, e)
                else:
                    _tell(caller, done, None, e)
            else:
                if caller is not None and done is not None:
                    _tell(caller, done, result, None)
        conn.close()  # closed already by `close()`'s own call, or now when opening was abandoned

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(connection, *args)` on the connection's thread, after everything asked before it; await the
        result."""
        if self.closed:
            raise sqlite3.ProgrammingError(f"{self.name}: the connection is closed")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        self._calls.put((fn, args, loop, done))
        return done

    def post(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        """`fn(connection)` on the connection's thread, after everything asked before it, nothing handed
        back: `fn` tells its caller itself (the group commit's one callback per commit)."""
        if self.closed:
            raise sqlite3.ProgrammingError(f"{self.name}: the connection is closed")
        self._calls.put((fn, (), None, None))

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
        finished = self.run(_close)  # after the calls before it
        self.closed = True
        self._calls.put(None)  # then the thread closes the connection and ends
        await finished


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
