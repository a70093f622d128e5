"""The ledger's SQLite connection, owned on one thread of its own, through public APIs only.

`sqlite3` is synchronous; the pipeline is not. Every call on the connection runs on its own thread,
one at a time in the order asked, so the event loop never waits on the disk, and `run(fn, *args)`
runs a whole function there in one trip: a group commit of many changes, or a check that reads the
whole ledger, costs one hand-over, not one per statement. The thread is a plain loop over a
`queue.SimpleQueue` (a `ThreadPoolExecutor` of one does the same with a lock and a future more per
call: measurably slower on the ledger's small writes).

A call whose caller is cancelled still runs to its end on the thread (a `COMMIT` asked for is never
skipped, leaving a transaction open); only its result is dropped.

The same thread serves either backend (`backend.py`): a SQLite file through `sqlite3`, or a PostgreSQL
server through `asyncpg` (`postgres.py`). What a call gets is a `Session`: the few DB-API calls the ledger
makes, with positional parameters written `$1`, `$2`, … in its statements (the one placeholder form both
engines read natively; SQLite binds them by number, PostgreSQL by position).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

Params = Sequence[Any] | dict[str, Any]
# A call for the thread: fn(conn, *args), its outcome told to `done` on `loop` (None: not told).
_Call = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop | None, "asyncio.Future[Any] | None"]


class ConnectionLost(Exception):
    """The session's connection to its database server went away (the server restarted, the session was
    ended, the network dropped). Nothing of a write transaction it was in is committed — a COMMIT whose
    outcome was unknown was looked up first (`postgres.PgSession`) — so the whole call can be asked
    again on a new connection (`Session.call`)."""


class Cursor(Protocol):
    """What `Session.execute` returns: the rows of one statement."""

    description: Any

    def fetchall(self) -> list[Any]: ...

    def fetchone(self) -> Any: ...

    def close(self) -> None: ...


class Session(Protocol):
    """One database session as the ledger's thread uses it: `SqliteSession` or `postgres.PgSession`."""

    dialect: str  # "sqlite" | "postgresql": which statement a call says where the two differ

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Params = ...) -> Any: ...

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]]) -> Any: ...

    def executescript(self, script: str) -> Any: ...

    def begin_write(self) -> None: ...

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(self, *args)`: the one way the ledger's thread runs a call (again on a new connection while
        the server cannot be reached, on PostgreSQL)."""
        ...

    def close(self) -> None: ...


def placeholders(count: int, first: int = 1) -> str:
    """`count` positional parameters from `$first` on, comma-separated: an `IN (…)` list's."""
    return ",".join(f"${i}" for i in range(first, first + count))


# The few statements PostgreSQL says differently, each written whole in both dialects beside each other
# (`store`, `chain`): the SQLite text, which the code names, → the PostgreSQL text, which a PostgreSQL
# session runs in its place (`said`). An exact look-up of a whole statement: no text is ever converted.
# Every other statement is portable as written.
POSTGRESQL: dict[str, str] = {}


def said(sql: str, dialect: str) -> str:
    """`sql` as `dialect` says it: itself, unless it is one PostgreSQL says differently (`POSTGRESQL`)."""
    return POSTGRESQL.get(sql, sql) if dialect == "postgresql" else sql


def numbered(parameters: Params) -> dict[str, Any]:
    """Positional parameters as SQLite binds `$1`, `$2`, …: by their names "1", "2", …."""
    if isinstance(parameters, dict):
        return parameters
    return {str(i): v for i, v in enumerate(parameters, 1)}


class SqliteCursor(sqlite3.Cursor):
    """A cursor of a `SqliteSession`: positional parameters bound to `$1`, `$2`, … by number."""

    def execute(self, sql: str, parameters: Params = (), /) -> SqliteCursor:  # type: ignore[override]
        return super().execute(sql, numbered(parameters))

    def executemany(self, sql: str, seq_of_parameters: Iterable[Params], /) -> SqliteCursor:  # type: ignore[override]
        return super().executemany(sql, map(numbered, seq_of_parameters))


class SqliteSession(sqlite3.Connection):
    """The ledger's SQLite connection: statements with `$n` parameters, a write transaction begun
    `BEGIN IMMEDIATE` (the file's write lock taken at once, so a transaction never fails half way for it)."""

    dialect = "sqlite"

    def cursor(self, factory: Any = None) -> SqliteCursor:  # type: ignore[override]
        return super().cursor(factory or SqliteCursor)

    def execute(self, sql: str, parameters: Params = (), /) -> SqliteCursor:  # type: ignore[override]
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Params], /) -> SqliteCursor:  # type: ignore[override]
        return self.cursor().executemany(sql, seq_of_parameters)

    def begin_write(self) -> None:
        super().execute("BEGIN IMMEDIATE")

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(self, *args)`: a file has no connection to lose."""
        return fn(self, *args)


def sqlite_session(database: str | os.PathLike[str], *, uri: bool = False) -> SqliteSession:
    """A `SqliteSession` in autocommit mode (transactions are said), rows as `sqlite3.Row`."""
    conn = sqlite3.connect(database, isolation_level=None, uri=uri, factory=SqliteSession)
    conn.row_factory = sqlite3.Row
    return conn


class Connection:
    """One database session and the thread it lives on. Open with `await Connection.open(...)` (SQLite)
    or `await postgres.connect(url)` (PostgreSQL)."""

    def __init__(self, name: str, dialect: str = "sqlite") -> None:
        self.name = name  # what it was opened on, for messages
        self.dialect = dialect
        self.closed = False
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()

    @classmethod
    async def open(cls, database: str | os.PathLike[str], *, uri: bool = False, name: str | None = None) -> Connection:
        """A connection in autocommit mode (transactions are said, `BEGIN IMMEDIATE` … `COMMIT`), rows as
        `sqlite3.Row`, made on its own thread (sqlite3 then checks that no other thread uses it).
        `name`: what messages call it (`database` by default; a URI's file, say)."""
        return await cls.serve(name or str(database), "sqlite", lambda: sqlite_session(database, uri=uri))

    @classmethod
    async def serve(cls, name: str, dialect: str, connect: Callable[[], Session]) -> Connection:
        """A connection whose session `connect()` makes, on the connection's own thread."""
        self = cls(name, dialect)
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()
        thread = threading.Thread(target=self._serve, args=(connect, loop, opened), name="ledger", daemon=True)
        thread.start()
        try:
            await opened
        except BaseException:
            self.closed = True
            self._calls.put(None)  # the thread ends (and with it a connection made meanwhile)
            raise
        return self

    def _serve(
        self, connect: Callable[[], Session], loop: asyncio.AbstractEventLoop, opened: asyncio.Future[None]
    ) -> None:
        """The connection's thread: connect, then run each call in turn until told to stop (None)."""
        try:
            conn = connect()
        except BaseException as e:
            _tell(loop, opened, None, e)
            return
        _tell(loop, opened, None, None)
        calls = self._calls
        while (call := calls.get()) is not None:
            fn, args, caller, done = call
            try:
                result = conn.call(fn, *args)
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

    def post(self, fn: Callable[[Any], None]) -> None:
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


def _execute(conn: Session, sql: str, parameters: Params) -> None:
    conn.execute(sql, parameters).close()


def _fetchall(conn: Session, sql: str, parameters: Params) -> list[Any]:
    rows: list[Any] = conn.execute(sql, parameters).fetchall()
    return rows


def _executescript(conn: sqlite3.Connection, script: str) -> None:
    conn.executescript(script)


def _create_function(
    conn: sqlite3.Connection, name: str, narg: int, fn: Callable[..., Any], deterministic: bool
) -> None:
    conn.create_function(name, narg, fn, deterministic=deterministic)


def _set_authorizer(conn: sqlite3.Connection, authorizer: Any) -> None:
    conn.set_authorizer(authorizer)


def _close(conn: Session) -> None:
    conn.close()
