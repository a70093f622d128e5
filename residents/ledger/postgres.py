"""The ledger's PostgreSQL session: `asyncpg` driven from the ledger's own thread (`connection.py`).

Why this shape: the ledger's contract is `run(fn)`, a whole function run on the connection's thread in
one trip, in the order asked (a group commit, a check that reads the whole ledger). On PostgreSQL that
thread owns a private event loop and one `asyncpg` connection; each statement a call says is run on that
loop to its end before the next (`loop.run_until_complete`), so the pipeline's own loop never waits on
the network, and both backends keep one order of calls and one writer per process.

A write transaction takes the ledger's transaction-scoped advisory lock first (`begin_write`): writes,
and with them the chain's appends, are serialised in the database itself, as SQLite's `BEGIN IMMEDIATE`
does for a file, whichever process or connection asks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import urllib.parse
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import asyncpg

from .connection import Connection, Params, said

T = TypeVar("T")

# The advisory lock keys of a ledger (one database): its write transactions, and its one writer process.
WRITE_LOCK = 0x7265736964656E74  # "resident"
WRITER_LOCK = 0x6C65646765727731  # "ledgerw1"


# Who holds an advisory lock (its key as pg_locks shows it: classid, objid), as that session named itself.
WRITER_HOLDER = (
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database"
    " WHERE datname = current_database()) AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid"
    " AND l.objsubid = 1 LIMIT 1"
)


def lock_key_parts(key: int) -> tuple[int, int]:
    """A bigint advisory lock key as pg_locks shows it: its high and low 32 bits."""
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF


def reason(e: BaseException) -> str:
    """What went wrong, in one line: the server's message, or the connection's failure."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text


def is_url(location: str) -> bool:
    """Whether `--db`/`ledger:` names a PostgreSQL server (a `postgresql://` or `postgres://` URL)."""
    return urllib.parse.urlsplit(location).scheme in ("postgresql", "postgres")


def shown(url: str) -> str:
    """A URL as messages name it: its password left out."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class PgCursor:
    """The rows of one statement, read as a `sqlite3.Cursor`'s are (`asyncpg.Record`: by name or index)."""

    def __init__(self, rows: list[asyncpg.Record], names: list[str]) -> None:
        self._rows = rows
        self._at = 0
        self.description = [(n, None, None, None, None, None, None) for n in names] if names else None

    def fetchall(self) -> list[asyncpg.Record]:
        rows, self._at = self._rows[self._at :], len(self._rows)
        return rows

    def fetchone(self) -> asyncpg.Record | None:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def __iter__(self) -> Iterator[asyncpg.Record]:
        return iter(self.fetchall())

    def close(self) -> None:
        pass


class PgSession:
    """One `asyncpg` connection used synchronously from the thread that made it (see the module's doc)."""

    dialect = "postgresql"

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: asyncpg.Connection) -> None:
        self._loop = loop
        self._conn = conn
        self.description: list[tuple[Any, ...]] | None = None

    @classmethod
    def connect(cls, url: str, *, read_only: bool = False) -> PgSession:
        loop = asyncio.new_event_loop()
        try:
            settings = {"application_name": f"{os.getpid()} {socket.gethostname()}"[:63]}
            if read_only:
                settings["default_transaction_read_only"] = "on"
            conn = loop.run_until_complete(asyncpg.connect(url, server_settings=settings))
        except BaseException:
            loop.close()
            raise
        return cls(loop, conn)

    @property
    def in_transaction(self) -> bool:
        return self._conn.is_in_transaction()

    def execute(self, sql: str, parameters: Params = ()) -> PgCursor:
        cursor = self._loop.run_until_complete(self._fetch(sql, parameters))
        self.description = cursor.description  # as a DB-API cursor: the last statement's columns
        return cursor

    async def _fetch(self, sql: str, parameters: Params) -> PgCursor:
        if isinstance(parameters, dict):
            raise TypeError("the ledger's PostgreSQL statements take positional parameters ($1, $2, …)")
        rows = await self._conn.fetch(
            said(sql, self.dialect), *parameters
        )  # prepared once per connection (asyncpg's cache)
        return PgCursor(rows, list(rows[0].keys()) if rows else [])

    def executescript(self, script: str) -> None:
        """Several statements without parameters (a migration), in PostgreSQL's simple protocol."""
        self._loop.run_until_complete(self._conn.execute(script))

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]]) -> PgCursor:
        rows = [tuple(p) for p in seq_of_parameters]
        self._loop.run_until_complete(self._conn.executemany(said(sql, self.dialect), rows))
        return PgCursor([], [])

    def copy_in(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Rows into `table` by PostgreSQL's COPY (binary): a copy's pages, several times faster than INSERTs."""
        self._loop.run_until_complete(self._conn.copy_records_to_table(table, records=rows, columns=list(columns)))

    def cursor(self) -> PgSession:
        """Itself: one session, its statements one after another (what `cursor()` is for sqlite3 here)."""
        return self

    def begin_write(self) -> None:
        """BEGIN, then the ledger's write lock for the transaction: one writing transaction at a time."""
        self.execute("BEGIN")
        self.execute("SELECT pg_advisory_xact_lock($1)", (WRITE_LOCK,))

    def close(self) -> None:
        """Closed (twice is harmless, as sqlite3's close is)."""
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self._conn.close(timeout=5))
        except (TimeoutError, OSError, asyncpg.PostgresError):
            self._conn.terminate()
        finally:
            self._loop.close()


class WriterHold:
    """This process's hold on one PostgreSQL ledger's writer lock: a session of its own holds the advisory
    lock (the server lets go of it when that session ends, however the process ends). As for a file's
    lock, the same process may open its ledger again; the last `release()` ends the session.

    `shared`: the lock in shared mode, which `residents run` processes take (any number of them share a
    ledger under leases, `leases.py`); a writer that is not one of them takes it alone, so each kind is
    refused while the other holds it."""

    _held: dict[tuple[str, bool], list[Any]] = {}  # (url, shared) → [the holding connection, holds]

    def __init__(self, url: str, shared: bool = False) -> None:
        self._url: str | None = url
        self._shared = shared

    @classmethod
    async def acquire(cls, url: str, shared: bool = False) -> WriterHold | str:
        """A hold, or who holds the lock instead ("pid host" as that session named itself, or "")."""
        held = cls._held.get((url, shared))
        if held is not None:
            held[1] += 1
            return cls(url, shared)
        holder = await connect(url)
        try:
            other = await holder.run(_take_writer_lock, shared)
        except BaseException:
            await holder.close()
            raise
        if other is not None:
            await holder.close()
            return other
        cls._held[(url, shared)] = [holder, 1]
        return cls(url, shared)

    async def release(self) -> None:
        if self._url is None:
            return
        held = self._held[(self._url, self._shared)]
        held[1] -= 1
        if held[1] == 0:
            del self._held[(self._url, self._shared)]
            await held[0].close()
        self._url = None


class HeldWriter:
    """A `WriterHold` taken and let go of from code that is not a coroutine (a command before its loop
    starts), as a file's lock is: `release()` once."""

    def __init__(self, hold: WriterHold) -> None:
        self._hold = hold

    def release(self) -> None:
        _off_loop(self._hold.release())


def hold_writer(url: str) -> HeldWriter | str:
    """`WriterHold.acquire`, from outside any coroutine: a hold, or who holds the lock instead."""
    got = _off_loop(WriterHold.acquire(url))
    return HeldWriter(got) if isinstance(got, WriterHold) else got


def _off_loop(work: Coroutine[Any, Any, T]) -> T:
    """A coroutine run to its end on a loop of its own, in a thread of its own (the caller's thread may
    have a loop running)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ledger-hold") as pool:
        return pool.submit(asyncio.run, work).result()


def _take_writer_lock(conn: PgSession, shared: bool = False) -> str | None:
    """None once this session holds the writer lock (in shared mode if `shared`); else who does ("pid
    host", or "" if not known)."""
    take = "SELECT pg_try_advisory_lock_shared($1)" if shared else "SELECT pg_try_advisory_lock($1)"
    [(taken,)] = conn.execute(take, (WRITER_LOCK,)).fetchall()
    if taken:
        return None
    got = conn.execute(WRITER_HOLDER, lock_key_parts(WRITER_LOCK)).fetchone()
    return str(got[0]) if got is not None and got[0] else ""


async def connect(url: str, *, read_only: bool = False) -> Connection:
    """The ledger's connection to the PostgreSQL database at `url`, on a thread of its own."""
    return await Connection.serve(shown(url), "postgresql", lambda: PgSession.connect(url, read_only=read_only))
