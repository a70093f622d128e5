"""The ledger's PostgreSQL session: `asyncpg` driven from the ledger's own thread (`connection.py`).

Why this shape: the ledger's contract is `run(fn)`, a whole function run on the connection's thread in
one trip, in the order asked (a group commit, a check that reads the whole ledger). On PostgreSQL that
thread owns a private event loop and one `asyncpg` connection; each statement a call says is run on that
loop to its end before the next (`loop.run_until_complete`), so the pipeline's own loop never waits on
the network, and both backends keep one order of calls and one writer per process.

A write transaction takes the ledger's transaction-scoped advisory lock first (`begin_write`): writes,
and with them the chain's appends, are serialised in the database itself, as SQLite's `BEGIN IMMEDIATE`
does for a file, whichever process or connection asks.

The server may go away mid-call (restarted, the session ended, the network dropped): the session then
connects again and the whole call is asked again (`PgSession.call`), with backoff, for up to
`RECONNECT.within` seconds. That is safe because a write transaction cut short was rolled back as a
whole; one cut during its COMMIT is looked up by its transaction id (`txid_status`) before anything is
asked again, so nothing is written twice. Past the bound the call fails with `ConnectionLost`, which the
store reports as a `LedgerWriteError` (the disk-full path: the turn holds its posts and tries again).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import asyncpg

from .connection import Connection, ConnectionLost, Params, said

log = logging.getLogger(__name__)

T = TypeVar("T")
# How a writer's session holds the writer lock: alone (migrate, copy) or shared (`run`'s processes).
WriterMode = Literal["alone", "shared"]

# The advisory lock keys of a ledger (one database): its write transactions, and its one writer process.
WRITE_LOCK = 0x7265736964656E74  # "resident"
WRITER_LOCK = 0x6C65646765727731  # "ledgerw1"
MIGRATE_LOCK = 0x6D69677261746531  # "migrate1": held by a session applying migrations (`migrations.apply`)


# Who holds an advisory lock (its key as pg_locks shows it: classid, objid), as that session named itself.
WRITER_HOLDER = (
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database"
    " WHERE datname = current_database()) AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid"
    " AND l.objsubid = 1 LIMIT 1"
)


@dataclass(frozen=True)
class Reconnect:
    """How long a call waits for its server: tries doubling from `base` s, at most `cap` s apart, for
    `within` s in all; `connect_timeout` for each new connection."""

    within: float = 30.0
    base: float = 0.2
    cap: float = 5.0
    connect_timeout: float = 5.0

    def delay(self, failures: int) -> float:
        return min(self.cap, self.base * 2 ** max(0, failures - 1))


RECONNECT = Reconnect()

# The server's words for "this session is gone" (SQLSTATE): the administrator or a crash ended it, or the
# server is starting or stopping. Class 08 (connection exceptions) is asyncpg's PostgresConnectionError.
GONE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
# ... and for a write the server could not make: its disk is full, or an I/O error (`store`: LedgerWriteError).
WRITE_REFUSED_SQLSTATES = frozenset({"53100", "58030"})


def write_refused(e: BaseException) -> bool:
    """Whether `e` is the server refusing a write for want of disk (what SQLITE_FULL is for a file)."""
    return isinstance(e, asyncpg.PostgresError) and e.sqlstate in WRITE_REFUSED_SQLSTATES


def _gone(e: BaseException, conn: asyncpg.Connection | None) -> bool:
    """Whether `e` says the connection is gone, not that a statement failed on a live one."""
    if isinstance(e, (OSError, asyncio.TimeoutError, asyncpg.PostgresConnectionError)):
        return True
    if isinstance(e, asyncpg.PostgresError):
        return e.sqlstate in GONE_SQLSTATES
    return isinstance(e, asyncpg.InterfaceError) and (conn is None or conn.is_closed())


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
    """One `asyncpg` connection used synchronously from the thread that made it (see the module's doc);
    made again when the server goes away."""

    dialect = "postgresql"

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: asyncpg.Connection,
        url: str = "",
        settings: dict[str, str] | None = None,
    ) -> None:
        self._loop = loop
        self._conn = conn
        self._url = url
        self._settings = settings or {}
        self.description: list[tuple[Any, ...]] | None = None
        self._lost = False  # the connection is gone: the next statement makes a new one
        self._orphaned = False  # a transaction was lost with it, and its owner has not said ROLLBACK yet
        self._xid: int | None = None  # the open write transaction's id (`begin_write`), for a lost COMMIT
        self.reconnect = RECONNECT
        self.writer: WriterMode | None = None  # a writer's: the writer lock taken again on each new connection

    @classmethod
    def connect(
        cls, url: str, *, read_only: bool = False, reconnect: Reconnect | None = None, writer: WriterMode | None = None
    ) -> PgSession:
        """`reconnect`: how long its calls wait for the server (`RECONNECT` by default). `writer`: the session
        of a process holding the writer lock (`WriterHold`) in that mode, which a server restart
        ends with every session: each new connection takes the lock again before its first statement."""
        loop = asyncio.new_event_loop()
        settings = {"application_name": f"{os.getpid()} {socket.gethostname()}"[:63]}
        if read_only:
            settings["default_transaction_read_only"] = "on"
        try:
            conn = loop.run_until_complete(asyncpg.connect(url, server_settings=settings))
        except BaseException:
            loop.close()
            raise
        session = cls(loop, conn, url, settings)
        session.writer = writer
        if reconnect is not None:
            session.reconnect = reconnect
        return session

    @property
    def in_transaction(self) -> bool:
        return self._orphaned or (not self._lost and self._conn.is_in_transaction())

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(self, *args)`, asked again on a new connection while the server cannot be reached, with
        backoff, for up to `reconnect.within` s; then `ConnectionLost`. A call made inside a transaction an
        earlier call began is asked once: that transaction, lost, is its owner's to end."""
        if self.in_transaction:
            return fn(self, *args)
        failures, since = 0, time.monotonic()
        while True:
            try:
                result = fn(self, *args)
            except ConnectionLost as e:
                self._orphaned = False  # the call's own transaction, if any: gone with its connection
                failures += 1
                waited = time.monotonic() - since
                if waited >= self.reconnect.within:
                    log.warning("the ledger's database could not be reached for %.0fs (%s); the call fails", waited, e)
                    raise ConnectionLost(f"its database could not be reached for {waited:.0f}s: {e}") from e
                if failures == 1:
                    log.warning(
                        "the ledger's connection to its database was lost (%s); trying again for up to %.0fs",
                        e,
                        self.reconnect.within,
                    )
                time.sleep(min(self.reconnect.delay(failures), self.reconnect.within - waited))
                continue
            if failures:
                log.warning(
                    "the ledger reached its database again after %d failed tr%s over %.1fs",
                    failures,
                    "y" if failures == 1 else "ies",
                    time.monotonic() - since,
                )
            return result

    def _run(self, sql: str, work: Callable[[asyncpg.Connection], Coroutine[Any, Any, T]]) -> T | None:
        """One statement (`sql`, for what it is) on the connection, made again first if it was lost. None: a
        COMMIT or ROLLBACK of a transaction lost with its connection, settled without it."""
        if self._orphaned:
            if sql == "ROLLBACK":  # its owner ends the lost transaction: nothing is left to roll back
                self._orphaned, self._xid = False, None
                return None
            if sql != "COMMIT":
                raise ConnectionLost("the transaction was lost with its connection")
            self._lost_commit()
            return None
        if self._lost:
            self._connect_again()
        within = self._conn.is_in_transaction()
        try:
            result = self._loop.run_until_complete(work(self._conn))
        except Exception as e:
            if not _gone(e, self._conn):
                raise
            self._lost = True
            if within and sql == "COMMIT":
                self._lost_commit()
                return None
            self._orphaned = within
            raise ConnectionLost(reason(e)) from e
        if sql in ("COMMIT", "ROLLBACK"):
            self._xid = None
        return result

    def _connect_again(self) -> None:
        """A new connection in place of the lost one: ConnectionLost while the server cannot be reached."""
        self._conn.terminate()
        try:
            self._conn = self._loop.run_until_complete(
                asyncpg.connect(self._url, server_settings=self._settings, timeout=self.reconnect.connect_timeout)
            )
        except Exception as e:
            if not _gone(e, None):
                raise
            raise ConnectionLost(reason(e)) from e
        self._lost = False
        if self.writer is not None:
            self._take_writer_lock_again()

    def _take_writer_lock_again(self) -> None:
        """The writer lock on the new connection, unless this process still holds it on another. Refused, the
        call is ConnectionLost: it waits (`call`) while another writer (a `ledger migrate` started while the
        server was away) has the ledger, asking on a new connection each time, and fails past the bound."""
        holder = _take_writer_lock(self, shared=self.writer == "shared")
        if holder is None or holder == self._settings["application_name"]:
            return
        self._lost = True  # the next call connects again, and asks again
        raise ConnectionLost(f"another writer ({holder or 'unknown'}) took the ledger while its server was away")

    def _lost_commit(self) -> None:
        """A COMMIT whose answer was lost: looked up by the transaction's id on a new connection, waiting for
        the server up to `reconnect.within` s. Returns if it was committed; ConnectionLost if it was not
        (nothing of it is written: it may be asked again); RuntimeError if that cannot be known."""
        xid, self._xid, self._orphaned = self._xid, None, False
        if xid is None:  # not a write transaction (`begin_write`): nothing to write twice
            raise ConnectionLost("the connection was lost during a COMMIT")
        failures, since = 0, time.monotonic()
        while True:
            try:
                if self._lost:
                    self._connect_again()
                status = self._loop.run_until_complete(self._conn.fetchval("SELECT txid_status($1)", xid))
            except ConnectionLost:
                status = "unreachable"
            except Exception as e:
                if not _gone(e, self._conn):
                    raise
                self._lost, status = True, "unreachable"
            if status == "committed":
                log.warning("the ledger's connection was lost during a COMMIT; transaction %d was committed", xid)
                return
            if status == "aborted" or status is None:
                raise ConnectionLost(f"the connection was lost during a COMMIT; transaction {xid} was not committed")
            failures += 1  # unreachable, or "in progress" (the old session not yet ended on the server)
            waited = time.monotonic() - since
            if waited >= self.reconnect.within:
                raise RuntimeError(
                    f"the connection was lost during a COMMIT and whether transaction {xid} was committed"
                    f" could not be learnt within {waited:.0f}s"
                )
            time.sleep(min(self.reconnect.delay(failures), self.reconnect.within - waited))

    def execute(self, sql: str, parameters: Params = ()) -> PgCursor:
        cursor = self._run(sql, lambda conn: self._fetch(conn, sql, parameters))
        if cursor is None:  # a COMMIT or ROLLBACK settled after its connection was lost
            cursor = PgCursor([], [])
        self.description = cursor.description  # as a DB-API cursor: the last statement's columns
        return cursor

    async def _fetch(self, conn: asyncpg.Connection, sql: str, parameters: Params) -> PgCursor:
        if isinstance(parameters, dict):
            raise TypeError("the ledger's PostgreSQL statements take positional parameters ($1, $2, …)")
        rows = await conn.fetch(said(sql, self.dialect), *parameters)  # prepared once per connection (asyncpg's cache)
        return PgCursor(rows, list(rows[0].keys()) if rows else [])

    def executescript(self, script: str) -> None:
        """Several statements without parameters (a migration), in PostgreSQL's simple protocol."""
        self._run(script, lambda conn: conn.execute(script))  # (its status line unused)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]]) -> PgCursor:
        rows = [tuple(p) for p in seq_of_parameters]
        self._run(sql, lambda conn: conn.executemany(said(sql, self.dialect), rows))
        return PgCursor([], [])

    def copy_in(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Rows into `table` by PostgreSQL's COPY (binary): a copy's pages, several times faster than INSERTs."""
        self._loop.run_until_complete(self._conn.copy_records_to_table(table, records=rows, columns=list(columns)))

    def cursor(self) -> PgSession:
        """Itself: one session, its statements one after another (what `cursor()` is for sqlite3 here)."""
        return self

    def begin_write(self) -> None:
        """BEGIN, then the ledger's write lock for the transaction (one writing transaction at a time), and
        the transaction's id, by which a COMMIT whose answer is lost is looked up."""
        self.execute("BEGIN")
        got = self.execute("SELECT pg_advisory_xact_lock($1), txid_current()", (WRITE_LOCK,)).fetchone()
        self._xid = int(got[1]) if got is not None else None

    def close(self) -> None:
        """Closed (twice is harmless, as sqlite3's close is)."""
        if self._loop.is_closed():
            return
        try:
            if self._lost:
                self._conn.terminate()
            else:
                self._loop.run_until_complete(self._conn.close(timeout=5))
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
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


async def connect(
    url: str, *, read_only: bool = False, reconnect: Reconnect | None = None, writer: WriterMode | None = None
) -> Connection:
    """The ledger's connection to the PostgreSQL database at `url`, on a thread of its own; `reconnect`: how
    long its calls wait for the server when it goes away (`RECONNECT` by default); `writer`: see
    `PgSession.connect`."""
    return await Connection.serve(
        shown(url),
        "postgresql",
        lambda: PgSession.connect(url, read_only=read_only, reconnect=reconnect, writer=writer),
    )


# A session whose calls fail at once when the server goes away, and whose next call connects again: the
# leases' (`discord.run`), whose renewal is tried again every few seconds and whose failure stops the bots
# as their leases run out, which a call waiting `RECONNECT.within` for the server would hold up.
AT_ONCE = Reconnect(within=0.0)
