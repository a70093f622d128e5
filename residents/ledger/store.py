"""The SQLite ledger (WAL, its connection on a thread of its own: `connection.py`): writes as the pipeline goes, reads for context and moderators.

Writes go through one writer (group commit): every change asked for while the previous commit was in the
connection's thread goes to disk in the next single commit, each change in a savepoint of its own, so a
crash leaves either the old or the new state of a record, one change that fails leaves the others of
its commit alone, and 100 streams flushing at once wait for one commit, not for 100 queued ones.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Coroutine, Generator, Iterable, Sequence
from pathlib import Path
from typing import Any

from .. import truth
from ..observe import UNOBSERVED, Observer
from ..records import (
    Attempt,
    Block,
    Generation,
    Outcome,
    Post,
    Refusal,
    Stump,
    StumpScope,
    join_text,
    make_stump,
)
from ..text import outbound
from . import appending, attachments, lock, migrations, postgres, requests
from . import rows as read
from .connection import POSTGRESQL, Connection, ConnectionLost, Session, placeholders, said
from .rows import cols as _cols
from .rows import post as _post
from .rows import stored_text
from .rows import stump as _stump

log = logging.getLogger(__name__)


class LedgerError(Exception):
    pass


class LedgerWriteError(LedgerError):
    """A change the ledger could not write: the disk is full, or it failed to write (an I/O error), or
    (PostgreSQL) the server could not be reached again within `postgres.RECONNECT`.

    Nothing of the change is on disk, and the very same change can be asked for again: it succeeds once
    the ledger takes writes (`residents.ledger.retry`). Its cause stays the error it wraps."""


# SQLite's primary result codes for a write the disk refused (an extended code keeps them in its low byte).
WRITE_REFUSED = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})


def _as_write_error(path: str, e: BaseException) -> BaseException:
    """A write the disk refused (SQLite's, or the server's on PostgreSQL), or one whose server stayed out of
    reach, as a `LedgerWriteError` naming the ledger; others as they are."""
    code = getattr(e, "sqlite_errorcode", None)
    if (
        (isinstance(e, sqlite3.Error) and code is not None and code & 0xFF in WRITE_REFUSED)
        or postgres.write_refused(e)
        or isinstance(e, ConnectionLost)
    ):
        refused = LedgerWriteError(f"{path}: the ledger could not write: {e}")
        refused.__cause__ = e
        return refused
    return e


class Superseded(LedgerError):
    """A change to an attempt that is no longer streaming: another process settled it (a takeover's recovery
    of a bot whose lease this process lost while it was stopped). Nothing of the change is written; asking
    again cannot succeed."""


class StillStreaming(str):
    """A check before a change (`_statements`): the attempt its first parameter names, if it exists, is still
    streaming, so the process writing it is still the one that owns it. A missing attempt is not a takeover:
    the change's own statement reports it (a foreign key). The same rule, other way round: recovery's writes
    skip an attempt a live process settled meanwhile rather than refuse (`_attempt_settle(only_if_streaming)`,
    `BLOCK_IF_STREAMING`, `appending.attempt(only_if_streaming)`)."""


STILL_STREAMING = StillStreaming("SELECT outcome FROM attempts WHERE id=$1")


class LedgerInUse(LedgerError):
    """Another process writes this ledger: a second writer is refused before it reads or writes anything."""


def hold_ledger(path: str) -> lock.Hold | postgres.HeldWriter:
    """This process's writer's lock on the ledger at `path` (its folder made if missing): LedgerInUse
    naming the process that has it. `Ledger.open` takes it; so does a command that replaces the file.
    A PostgreSQL URL: the database's writer lock (`postgres.WriterHold`), shared the same way."""
    if postgres.is_url(path):
        try:
            held = postgres.hold_writer(path)
        except Exception as e:
            raise LedgerError(f"{postgres.shown(path)}: cannot open the ledger: {postgres.reason(e)}") from None
        if isinstance(held, str):
            raise _in_use(postgres.shown(path), held)
        return held
    return _hold_file(path)


def _hold_file(path: str) -> lock.Hold:
    """The writer's lock on a SQLite ledger's file (`lock.py`)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        return lock.acquire(path)
    except lock.LedgerHeld as e:
        raise _in_use(path, e.holder) from None
    except OSError as e:
        raise LedgerError(f"{lock.lock_path(path)}: cannot lock the ledger for writing: {e.strerror or e}") from None


def _in_use(where: str, holder: str) -> LedgerInUse:
    """The one line a second writer is refused with; `holder`: "pid host" as the writer left it, if known."""
    pid, _, host = holder.partition(" ")
    who = f"process {pid} on {host}" if pid.isdigit() and host else "another process"
    return LedgerInUse(
        f"{where}: in use by {who}; one process writes a ledger at a time"
        " (the read-only `residents ledger` verbs work beside it)"
    )


async def _read_migrations(uri: str, path: str) -> tuple[Connection, set[str]]:
    """A read-only connection and the migrations its ledger has had; its first read opens the file, so
    the medium's refusal (SQLITE_CANTOPEN) is raised here as sqlite3.OperationalError."""
    try:
        db = await Connection.open(uri, uri=True, name=path)
    except sqlite3.Error as e:
        raise LedgerError(f"{path}: cannot open the ledger: {e}") from None
    try:
        if not await db.execute_fetchall("SELECT 1 FROM sqlite_master WHERE type='table' AND name='_migrations'"):
            raise LedgerError(f"{path}: not a ledger (it has no _migrations table)")
        return db, {r[0] for r in await db.execute_fetchall("SELECT name FROM _migrations")}
    except sqlite3.OperationalError as e:
        await db.close()
        if e.sqlite_errorname == "SQLITE_CANTOPEN":
            raise
        raise LedgerError(f"{path}: not a usable ledger: {e}") from None
    except BaseException as e:
        await db.close()
        if isinstance(e, sqlite3.Error):
            raise LedgerError(f"{path}: not a usable ledger: {e}") from None
        raise


def read_only_uri(path: str) -> str:
    """The URI that reads the ledger at `path` and can write nothing: SQLite's `mode=ro`; on read-only
    media with no write-ahead log beside the file (so the file holds everything, and nothing can change
    it), `immutable=1` too, which needs no -shm file (none can be made there). `verify`'s workers use it."""
    where = "file:" + urllib.parse.quote(os.path.abspath(path))
    if _read_only_medium(path) and not _nonempty(path + "-wal"):
        return where + "?mode=ro&immutable=1"
    return where + "?mode=ro"


def _read_only_medium(path: str) -> bool:
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def stored_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class Ledger:
    def __init__(self, db: Connection, path: str) -> None:
        self.db = db
        self.path = path
        self._queue: list[tuple[list[tuple[str, tuple[Any, ...]]], asyncio.Future[None]]] = []
        self._idle = asyncio.Event()  # no commit in the connection's thread
        self._idle.set()
        # When the last commit returned, by time.perf_counter() read in the connection's thread: the moment
        # its changes were on disk, before the loop got round to telling their callers (bench/concurrency.py).
        self.committed_at = 0.0
        self._hold: lock.Hold | None = None  # a writer's lock on its file (`lock.py`)
        self._writer: postgres.WriterHold | None = None  # ... on a PostgreSQL ledger
        self.observer: Observer = UNOBSERVED  # told each commit's time (`residents.metrics`)

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False, shared: bool = False) -> _Opening:
        """The ledger at `path`, created and migrated as needed: `ledger = await Ledger.open(p)`, or
        `async with Ledger.open(p) as ledger:`, which closes it however the block ends.

        A writer holds the ledger's lock while open (`lock.py`): LedgerInUse while another process has
        it, before anything is read or written. `read_only`: an existing ledger for reading, beside a
        running process or on read-only media: no lock, no migration, nothing written. `shared`: on
        PostgreSQL, the writer lock in shared mode: one of several `residents run` processes, each driving
        only the bots it holds a lease on (`leases.py`); a writer of another kind is refused meanwhile."""
        return _Opening(cls, path, read_only, shared)

    @classmethod
    async def _connect_postgresql(cls, url: str, shared: bool = False) -> Ledger:
        """The ledger in the PostgreSQL database at `url`: the writer lock first (LedgerInUse before
        anything is read or written; in shared mode when `shared`), then its schema made or migrated, as a
        file's."""
        name = postgres.shown(url)
        try:
            hold = await postgres.WriterHold.acquire(url, shared)
        except Exception as e:
            raise LedgerError(f"{name}: cannot open the ledger: {postgres.reason(e)}") from None
        if not isinstance(hold, postgres.WriterHold):
            raise _in_use(name, hold)
        try:
            db = await postgres.connect(url, writer="shared" if shared else "alone")
        except Exception as e:
            await hold.release()
            raise LedgerError(f"{name}: cannot open the ledger: {postgres.reason(e)}") from None
        try:
            await migrations.apply(db)
            await migrations.backfill(db)
        except Exception as e:
            await db.close()
            await hold.release()
            raise LedgerError(f"{name}: not a usable ledger: {postgres.reason(e)}") from None
        ledger = cls(db, url)
        ledger._writer = hold
        return ledger

    @classmethod
    async def _connect_read_only_postgresql(cls, url: str) -> Ledger:
        """A session whose transactions are read-only (the server refuses any write), no lock taken."""
        name = postgres.shown(url)
        try:
            db = await postgres.connect(url, read_only=True)
        except Exception as e:
            raise LedgerError(f"{name}: cannot open the ledger: {postgres.reason(e)}") from None
        try:
            if not (await db.execute_fetchall("SELECT to_regclass('_migrations') IS NOT NULL"))[0][0]:
                raise LedgerError(f"{name}: not a ledger (it has no _migrations table)")
            done = {r[0] for r in await db.execute_fetchall("SELECT name FROM _migrations")}
        except LedgerError:
            await db.close()
            raise
        except Exception as e:
            await db.close()
            raise LedgerError(f"{name}: not a usable ledger: {postgres.reason(e)}") from None
        pending = [n for n, _ in migrations.MIGRATIONS if n not in done]
        if pending:
            await db.close()
            raise LedgerError(
                f"{name}: written by an older residents, {len(pending)} migration(s) to apply (from {pending[0]});"
                f" `residents ledger migrate --db URL` applies them"
            )
        return cls(db, url)

    @classmethod
    async def _connect(cls, path: str | Path, shared: bool = False) -> Ledger:
        path = str(path)
        if postgres.is_url(path):
            return await cls._connect_postgresql(path, shared)
        hold: lock.Hold | None = None
        if path != ":memory:":
            p = Path(path)
            hold = _hold_file(path)
            if not p.exists():
                # Created readable by its owner only: stumps may hold text a room never saw.
                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            db = await Connection.open(path)
        except Exception as e:
            if hold is not None:
                hold.release()
            raise LedgerError(f"{path}: cannot open the ledger: {e}") from None
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.execute("PRAGMA foreign_keys=ON")
            await migrations.apply(db)
            await appending.install(db)
            await migrations.backfill(db)
        except Exception as e:
            await db.close()
            if hold is not None:
                hold.release()
            raise LedgerError(f"{path}: not a usable ledger: {e}") from None
        ledger = cls(db, path)
        ledger._hold = hold
        return ledger

    @classmethod
    async def _connect_read_only(cls, path: str | Path) -> Ledger:
        """SQLite's `mode=ro`; on read-only media with no write-ahead log beside the file (so the file
        holds everything, and nothing can change it), `immutable=1`, which needs no -shm file."""
        path = str(path)
        if postgres.is_url(path):
            return await cls._connect_read_only_postgresql(path)
        if path == ":memory:":  # a new empty one: nothing another process could hold
            return await cls._connect(path)
        if not Path(path).is_file():
            raise LedgerError(f"{path}: no ledger there")
        try:
            db, done = await _read_migrations(read_only_uri(path), path)
        except sqlite3.OperationalError as e:
            raise LedgerError(f"{path}: cannot read the ledger: {e}") from None
        pending = [name for name, _ in migrations.MIGRATIONS if name not in done]
        if pending:
            await db.close()
            raise LedgerError(
                f"{path}: written by an older residents, {len(pending)} migration(s) to apply (from {pending[0]});"
                f" `residents ledger migrate --db {path}` applies them"
            )
        await appending.install(db)
        return cls(db, path)

    async def close(self) -> None:
        while self._queue or not self._idle.is_set():  # what was asked for before closing still reaches disk
            if self._idle.is_set():
                self._commit_waiting()
            await self._idle.wait()
        try:
            await self.db.close()
        finally:
            if self._hold is not None:
                self._hold.release()
                self._hold = None
            if self._writer is not None:
                await self._writer.release()
                self._writer = None

    async def __aenter__(self) -> Ledger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def transact(self, statements: Iterable[tuple[str, tuple[Any, ...]]]) -> None:
        """One logical change, in one transaction (a savepoint of the writer's next commit); returns once
        committed. Shielded: a caller cancelled mid-write still gets CancelledError, but the change runs to
        its commit or rollback instead of being torn between them (a write either happened or not)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._queue and self._idle.is_set():  # the first change since the last commit began
            asyncio.get_running_loop().call_soon(self._commit_waiting)
        self._queue.append((list(statements), done))
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            done.add_done_callback(self._orphaned)  # its caller is gone: a failure is told to the log
            raise

    async def write(self, statements: Iterable[appending.Statement], posts: Iterable[Post] = ()) -> None:
        """One change of a record kind kept in a module of its own (as `budgets`): its rows' statements with
        their chain entries (`appending.append`), then the posts it plans with theirs, in one transaction."""
        planned = list(posts)
        await self.transact([*statements, *map(self._post_insert, planned), *appending.posts(planned)])

    def _orphaned(self, done: asyncio.Future[None]) -> None:
        if not done.cancelled() and (e := done.exception()) is not None:
            log.error("%s: a change whose caller was cancelled failed (it is not on disk): %s", self.db.name, e)

    def _commit_waiting(self) -> None:
        """The one writer: every change waiting goes to the connection's thread in one trip and one commit.

        No timer and no task: a change that finds no commit in flight goes at the end of the loop's
        current turn (with every other change asked for in that turn); changes arriving during a commit
        wait only for it, however many streams asked. The thread hands the outcome back with one
        callback, which starts the next commit.
        """
        batch, self._queue = self._queue, []
        if not batch:
            return
        loop = asyncio.get_running_loop()
        if self.db.closed:
            for _, done in batch:
                done.set_exception(LedgerError(f"{self.db.name}: the ledger is closed"))
            return
        changes = [st for st, _ in batch]

        def work(conn: Session) -> None:  # in the connection's thread
            began = time.perf_counter()
            try:
                errors = conn.call(_commit, changes)  # asked again whole if the server went away (PostgreSQL)
            except BaseException as e:  # the commit itself failed: nothing of the batch is on disk
                errors = [e] * len(changes)
            loop.call_soon_threadsafe(self._committed, batch, errors, time.perf_counter(), began)

        self._idle.clear()
        self.db.post(work)  # in order with every read; its outcome comes back through `_committed`

    def _committed(
        self,
        batch: list[tuple[Any, asyncio.Future[None]]],
        errors: list[BaseException | None],
        at: float,
        began: float,
    ) -> None:
        self.committed_at = at  # read by a caller as it resumes: no other commit is reported before it runs
        refused = False
        for (_, done), err in zip(batch, errors, strict=True):
            failure = _as_write_error(self.db.name, err) if err is not None else None
            refused = refused or isinstance(failure, LedgerWriteError)
            if done.done():
                continue
            if failure is None:
                done.set_result(None)
            else:
                done.set_exception(failure)
        self.observer.committed(at - began, refused)
        self._idle.set()
        if self._queue:
            self._commit_waiting()

    # ------------------------------------------------------------------ writes

    async def create_generation(self, g: Generation) -> None:
        await self.transact(self._generation_insert(g))

    PART_INSERT = "INSERT OR IGNORE INTO request_parts (id, sha256, body) VALUES ($1,$2,$3)"
    POSTGRESQL[PART_INSERT] = "INSERT INTO request_parts (id, sha256, body) VALUES ($1,$2,$3) ON CONFLICT DO NOTHING"

    @classmethod
    def _generation_insert(
        cls, g: Generation, memo: dict[str, requests.Part] | None = None
    ) -> list[tuple[str, tuple[Any, ...]]]:
        """The generation's row, its request stored by content (`residents.ledger.requests`, images as their
        SHA-256, never their bytes): parts, then the row, then the request's attachments."""
        packed = requests.pack(attachments.stored_request(g.request), memo) if g.request is not None else None
        parts = [(cls.PART_INSERT, (p.id, p.sha256, p.body)) for p in packed.parts] if packed else []
        return parts + [
            (
                "INSERT INTO generations (id, residence, channel, model, status, stop_reason, text, chars,"
                " output_tokens, standing, continuation_ended, trigger, request_ref, created_at, seen_upto, person)"
                " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16)",
                (
                    g.id,
                    g.residence,
                    g.channel,
                    g.model,
                    g.status,
                    g.stop_reason,
                    stored_bytes(g.text),
                    g.chars,
                    g.output_tokens,
                    g.standing,
                    g.continuation_ended,
                    g.trigger,
                    packed.ref if packed is not None else None,
                    g.created_at,
                    g.seen_upto,
                    g.person,
                ),
            ),
            *attachments.insert(g.id, g.attachments),
        ]

    async def start_attempt(
        self, a: Attempt, new_generation: Generation | None = None, replaces: Attempt | None = None
    ) -> None:
        """Record an attempt before its stream starts, with its generation when that is new too, and
        the link from the attempt it replaces: one transaction, one trip."""
        stmts = self._generation_insert(new_generation) if new_generation is not None else []
        stmts.append(
            (
                "INSERT INTO attempts (id, generation_id, segment, idx, outcome, started_at) VALUES ($1,$2,$3,$4,$5,$6)",
                (a.id, a.generation_id, a.segment, a.index, a.outcome, a.started_at),
            )
        )
        if replaces is not None:
            stmts += self._replaced(replaces.id, a.id)
        await self.transact(stmts)

    async def add_chunk(
        self,
        attempt_id: str,
        seq: int,
        text: str,
        block: int | None = None,
        block_type: str | None = None,
        block_start: str | None = None,
    ) -> None:
        """Streaming content, flushed in pieces so a crash loses at most the unflushed tail.

        `block`: the content block the piece belongs to (None: the attempt's text, as before blocks)."""
        await self.add_chunks(attempt_id, [(seq, block, block_type, text, block_start)])

    _CHUNK = (
        "INSERT INTO attempt_chunks (attempt_id, seq, block, block_type, text, block_start) VALUES ($1,$2,$3,$4,$5,$6)"
    )

    async def add_chunks(
        self, attempt_id: str, rows: Sequence[tuple[int, int | None, str | None, str, str | None]]
    ) -> None:
        """Pieces of several blocks in one write: rows of (seq, block, block type, text, block start)."""
        await self.transact(
            [
                (STILL_STREAMING, (attempt_id,)),
                *(
                    (self._CHUNK, (attempt_id, seq, block, btype, stored_bytes(text), start))
                    for seq, block, btype, text, start in rows
                ),
            ]
        )

    async def finish_attempt(self, a: Attempt, stumps: list[Stump] = ()) -> None:  # type: ignore[assignment]
        stmts = (
            [(STILL_STREAMING, (a.id,))]
            + self._attempt_settle(a)
            + [self._stump_insert(s) for s in stumps]
            + appending.stumps(stumps)
        )
        await self._superseded_kept(a, stmts)
        _stored(stumps)

    @staticmethod
    def _attempt_settle(a: Attempt, only_if_streaming: bool = False) -> list[tuple[str, tuple[Any, ...]]]:
        """An attempt's settlement with its blocks; `only_if_streaming` leaves one a live process settled
        meanwhile alone (its blocks are written only while it is still streaming, before the update)."""
        guard = " AND outcome='streaming'" if only_if_streaming else ""
        block_sql = BLOCK_IF_STREAMING if only_if_streaming else BLOCK
        stmts = [
            (
                block_sql,
                (
                    a.id,
                    pos,
                    b.index,
                    b.type,
                    stored_bytes(b.content),
                    b.chars,
                    b.offset,
                    json.dumps(b.start, ensure_ascii=False) if b.start else None,
                    json.dumps(b.extras, ensure_ascii=False) if b.extras else None,
                )
                + ((a.id,) if only_if_streaming else ()),
            )
            for pos, b in enumerate(a.content_blocks())
        ]
        return stmts + [
            appending.attempt(a, only_if_streaming=only_if_streaming),
            (
                "UPDATE attempts SET outcome=$1, stop_reason=$2, discard_reason=$3, error=$4, text=$5, chars=$6,"
                " output_tokens=$7, request_id=$8, replaced_by=$9, ended_at=$10, stop_details=$11, request_replacements=$12,"
                " input_tokens=$13, cache_write_tokens=$14, cache_read_tokens=$15"
                " WHERE id=$16" + guard,
                (
                    a.outcome,
                    a.stop_reason,
                    a.discard_reason,
                    a.error,
                    stored_bytes(a.text),
                    a.chars,
                    a.output_tokens,
                    a.request_id,
                    a.replaced_by,
                    a.ended_at,
                    json.dumps(a.stop_details) if a.stop_details is not None else None,
                    a.request_replacements,
                    a.input_tokens,
                    a.cache_write_tokens,
                    a.cache_read_tokens,
                    a.id,
                ),
            ),
            ("DELETE FROM attempt_chunks WHERE attempt_id=$1", (a.id,)),
        ]

    @staticmethod
    def _replaced(attempt_id: str, replaced_by: str) -> list[tuple[str, tuple[Any, ...]]]:
        return [
            ("UPDATE attempts SET replaced_by=$1 WHERE id=$2", (replaced_by, attempt_id)),
            ("UPDATE stumps SET replaced_by=$1 WHERE attempt_id=$2 AND scope='attempt'", (replaced_by, attempt_id)),
        ]

    async def add_stumps(self, stumps: list[Stump]) -> None:
        if stumps:
            await self.transact([self._stump_insert(s) for s in stumps] + appending.stumps(stumps))
            _stored(stumps)

    @staticmethod
    def _stump_insert(s: Stump) -> tuple[str, tuple[Any, ...]]:
        return (
            "INSERT INTO stumps (id, generation_id, attempt_id, residence, scope, cause, text, chars,"
            " output_tokens, published, replaced_by, created_at, block, block_type)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)",
            (
                s.id,
                s.generation_id,
                s.attempt_id,
                s.residence,
                s.scope,
                s.cause,
                stored_bytes(s.text),
                s.chars,
                s.output_tokens,
                int(s.published),
                s.replaced_by,
                s.created_at,
                s.block,
                s.block_type,
            ),
        )

    async def finish_generation(
        self,
        g: Generation,
        new_stumps: list[Stump],
        replaced_output: tuple[str, str] | None = None,
        last_attempt: Attempt | None = None,
    ) -> None:
        """Settle a generation: its status, canonical text, segments and the stumps it leaves.

        `last_attempt`, when given, is settled in the same transaction: the attempt and the outcome it
        decides reach disk together.
        """
        stmts: list[tuple[str, tuple[Any, ...]]] = (
            [(STILL_STREAMING, (last_attempt.id,)), *self._attempt_settle(last_attempt)] if last_attempt else []
        )
        stmts += self._generation_settle(g)
        if replaced_output is not None:
            stump_id, by = replaced_output
            stmts.append(("UPDATE stumps SET replaced_by=$1 WHERE id=$2", (by, stump_id)))
        stmts += [self._stump_insert(s) for s in new_stumps]
        stmts += [appending.generation(g)] + appending.stumps(new_stumps)
        await (self._superseded_kept(last_attempt, stmts) if last_attempt else self.transact(stmts))
        _stored(new_stumps)

    async def _superseded_kept(self, a: Attempt, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """The attempt's settlement; refused as Superseded (another process settled it from what reached
        the ledger while this one was stopped), the text this process streamed is kept all the same, as a
        stump of its own (cause `taken-over`) beside that settlement, unless the ledger holds it already."""
        try:
            await self.transact(statements)
        except Superseded:
            found = await self.db.execute_fetchall(
                "SELECT a.text, g.residence, g.channel, g.model, EXISTS (SELECT 1 FROM stumps s"
                " WHERE s.attempt_id = a.id AND s.cause = $2) FROM attempts a"
                " JOIN generations g ON g.id = a.generation_id WHERE a.id = $1",
                (a.id, truth.TAKEN_OVER.value),
            )
            if found and a.text and stored_text(found[0][0]) != a.text and not found[0][4]:
                _, residence, channel, model, _ = found[0]
                g = Generation(id=a.generation_id, residence=residence, channel=channel, model=model)
                await self.add_stumps([make_stump(g, a, truth.TAKEN_OVER, StumpScope.ATTEMPT)])
            raise

    async def add_posts(self, posts: list[Post]) -> None:
        await self.transact([self._post_insert(p) for p in posts] + appending.posts(posts))

    async def next_post_seq(self, generation_id: str) -> int:
        """The seq the next post of a generation takes: from what is recorded, never an in-memory copy."""
        rows = list(
            await self.db.execute_fetchall(
                "SELECT coalesce(max(seq), 0) + 1 FROM posts WHERE generation_id=$1", (generation_id,)
            )
        )
        return int(rows[0][0])

    async def mark_delivered(self, post: Post, message_id: str) -> None:
        """The post is in the room as `message_id`; `post` says so once the ledger does (not if it refused)."""
        at = time.time()
        # The output stump of a delivered text post is marked published by the trigger of m008.
        await self.transact(
            [
                ("UPDATE posts SET message_id=$1, delivered_at=$2 WHERE id=$3", (message_id, at, post.id)),
                appending.delivered(post.id, message_id),
            ]
        )
        post.message_id, post.delivered_at = message_id, at

    async def mark_refused(self, post: Post, refusal: Refusal) -> None:
        """Set a post aside: the room refused it try after try. It is never delivered afterwards."""
        post.refused, post.refused_at = refusal.text, time.time()
        await self.transact(
            [
                (
                    "UPDATE posts SET refused=$1, refused_at=$2, refused_status=$3, refused_code=$4 WHERE id=$5",
                    (post.refused, post.refused_at, refusal.status, refusal.code, post.id),
                ),
                appending.refused(post.id, refusal),
            ]
        )

    # ------------------------------------------------------------------ reads

    async def get_generation(self, gid: str) -> Generation | None:
        return (await self._generations([gid])).get(gid)

    async def _generations(self, ids: list[str], brief: bool = False) -> dict[str, Generation]:
        """Generations whole, read in one trip to the connection's thread, a few batched queries on
        indexes however many; `brief` (the context compiler's) leaves out requests and posts."""
        rows = await self.db.run(_generation_rows, ids, brief)
        out: dict[str, Generation] = {}
        for r in rows["generations"]:
            g = _cols(r)
            out[g["id"]] = read.generation(g, None if brief else await self._request(g))
        blocks: dict[str, list[Block]] = {}
        for r in rows["blocks"]:
            blocks.setdefault(r["attempt_id"], []).append(read.block(r))
        for r in rows["attempts"]:
            a = read.attempt(r, blocks.get(r["id"], []))
            if a.outcome == "streaming":  # not yet settled: what reached disk so far
                a.blocks = await self.streamed_blocks(a.id)
                a.text = join_text(a.blocks)
            out[a.generation_id].attempts.append(a)
        for r in rows["segments"]:
            out[r["generation_id"]].segments.append(read.segment(r))
        for r in rows["stumps"]:
            out[r["generation_id"]].stumps.append(_stump(r))
        for r in rows["posts"]:
            out[r["generation_id"]].posts.append(_post(r))
        for r in rows["attachments"]:
            out[r["generation_id"]].attachments.append(attachments.from_row(_cols(r)))
        return out

    async def _request(self, cols: dict[str, Any]) -> dict[str, Any] | None:
        """A generation's request: from its parts (`request_ref`), or whole as stored before m033."""
        if cols.get("request_ref") is not None:
            return requests.unpack(cols["request_ref"], await self._parts(cols["request_ref"]))
        return json.loads(stored_text(cols["request"])) if cols["request"] is not None else None

    async def request_json(self, gid: str) -> bytes | None:
        """A generation's request as the JSON bytes it was stored from (None: no such generation or none)."""
        rows = list(await self.db.execute_fetchall("SELECT request, request_ref FROM generations WHERE id=$1", (gid,)))
        if not rows:
            return None
        request, ref = rows[0]
        if ref is not None:
            return requests.unpack_bytes(ref, await self._parts(ref))
        return bytes(request) if request is not None else None

    async def _parts(self, ref: bytes) -> dict[int, bytes]:
        """The stored parts a request's ref names: its runs, then their lines (two seeks per key)."""
        out: dict[int, bytes] = {}
        while ids := requests.needed(ref, out):
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                sql = REQUEST_PARTS.format(marks=placeholders(len(part)))
                got = [(r[0], bytes(r[1])) for r in await self.db.execute_fetchall(sql, tuple(part))]
                if len(got) < len(part):
                    raise LedgerError(f"a request names {len(part) - len(got)} part(s) not in request_parts")
                out.update(got)
        return out

    async def streamed_blocks(self, attempt_id: str) -> list[Block]:
        """An unsettled attempt's blocks as far as they reached disk, in the order they began.

        Chunks written before blocks were kept (no block named) are the attempt's one text block."""
        rows = await self.db.execute_fetchall(
            "SELECT block, block_type, block_start, text FROM attempt_chunks WHERE attempt_id=$1 ORDER BY seq",
            (attempt_id,),
        )
        parts: dict[int, list[str]] = {}
        out: dict[int, Block] = {}
        for block, btype, start, text in rows:
            key = 0 if block is None else block
            if key not in out:
                out[key] = Block(key, btype or "text", start=json.loads(start) if start else None)
                parts[key] = []
            parts[key].append(stored_text(text))
        for key, b in out.items():
            b.content = "".join(parts[key])
        blocks = list(out.values())
        join_text(blocks)
        return blocks

    async def streamed_text(self, attempt_id: str) -> str:
        """An unsettled attempt's text (its text blocks) as far as it reached disk."""
        return join_text(await self.streamed_blocks(attempt_id))

    async def list_generations(self, residence: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        params: tuple[Any, ...] = (residence,) if residence else ()
        return [
            _cols(r) for r in await self.db.execute_fetchall(list_generations_sql(bool(residence)), params + (limit,))
        ]

    async def list_stumps(self, residence: str | None = None, cause: str | None = None, limit: int = 50) -> list[Stump]:
        sql = "SELECT * FROM stumps WHERE 1=1"
        params: list[str | int] = []
        if residence:
            params.append(residence)
            sql += f" AND residence=${len(params)}"
        if cause:
            params.append(cause)
            sql += f" AND cause=${len(params)}"
        params.append(limit)
        sql += f" ORDER BY created_at, rowid LIMIT ${len(params)}"
        return [_stump(r) for r in await self.db.execute_fetchall(sql, tuple(params))]

    async def list_stump_meta(
        self,
        residence: str | None = None,
        cause: str | None = None,
        *,
        limit: int = 50,
        before: str | None = None,
        channels: Iterable[str] | None = None,
    ) -> list[Stump]:
        """Stumps newest first, without reading their text (each with text "" and its stored chars).

        `before` pages on: only stumps older than that stump (none if it does not exist); `channels`
        keeps only stumps of generations in those channels (an empty collection: none).
        """
        params: list[Any] = []
        chans = None if channels is None else list(channels)
        if chans is not None:
            if not chans:
                return []
            params += chans
        params += [x for x in (residence, cause, before) if x]
        sql = stump_meta_sql(
            residence=bool(residence),
            cause=bool(cause),
            before=before is not None,
            channels=None if chans is None else len(chans),
            dialect=self.db.dialect,
        )
        return [_stump(r) for r in await self.db.execute_fetchall(sql, tuple(params) + (limit,))]

    async def get_stump(self, sid: str) -> Stump | None:
        rows = list(await self.db.execute_fetchall("SELECT * FROM stumps WHERE id=$1", (sid,)))
        return _stump(rows[0]) if rows else None

    async def posts_by_message(self, message_ids: list[str]) -> dict[str, Post]:
        """Which delivered messages were which kind of post: how context tells partials from speech."""
        out: dict[str, Post] = {}
        ids = [m for m in message_ids if m]
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            for r in await self.db.execute_fetchall(
                POSTS_BY_MESSAGE.format(marks=placeholders(len(part))), tuple(part)
            ):
                p = _post(r)
                out[p.message_id or ""] = p
        return out

    async def claim_reply(self, residence: str, trigger: str, channel: str) -> bool:
        """Take the turn on room message `trigger` for `residence`: True if this call took it, False if it
        was taken before (by this process or another, live or caught up). The one rule for "this message
        was answered": claimed once, before any provider call; `answered` reads the same claims."""
        try:
            return await self.db.run(_claim, (residence, trigger, channel, time.time()))
        except Exception as e:
            raise _as_write_error(self.db.name, e) from e

    async def answered(self, residence: str, message_ids: Iterable[str]) -> set[str]:
        """The messages among `message_ids` whose turn `residence` has claimed (`claim_reply`): each was
        taken once, whatever came of it (a reply, a refusal by a spent daily budget)."""
        ids, out = list(message_ids), set[str]()
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            sql = CLAIMED.format(marks=placeholders(len(part)), residence=len(part) + 1)
            out.update(r[0] for r in await self.db.execute_fetchall(sql, (*part, residence)))
        return out

    async def generations_brief(self, ids: Iterable[str]) -> dict[str, Generation]:
        """Generations with attempts and stumps, for the context compiler (no posts or requests needed)."""
        return await self._generations(list(dict.fromkeys(ids)), brief=True)

    async def latest_generation(self, residence: str, channel: str | None = None) -> Generation | None:
        params = [residence] if channel is None else [residence, channel]
        sql = LATEST_GENERATION.format(channel="" if channel is None else " AND channel=$2")
        rows = list(await self.db.execute_fetchall(sql, tuple(params)))
        return await self.get_generation(rows[0][0]) if rows else None

    async def unsettled_generations(self) -> list[str]:
        return [r[0] for r in await self.db.execute_fetchall(UNSETTLED)]

    # ------------------------------------------------------------------ crash recovery (bot.generation.recovery, bot.delivery.resume)

    async def streaming_generations(self) -> list[str]:
        """Settled generations that still have an attempt streaming: a /continue cut by a crash."""
        return [r[0] for r in await self.db.execute_fetchall(STREAMING)]

    async def generations_without_posts(self) -> list[str]:
        """Settled generations with no post planned: the process stopped between settling and planning."""
        return [r[0] for r in await self.db.execute_fetchall(WITHOUT_POSTS)]

    async def mark_planned(self, generation_id: str) -> None:
        """A settled generation whose plan is empty (nothing to post, no line): planned all the same, so
        start-up's `generations_without_posts` does not read it again at every start."""
        await self.transact(
            [("UPDATE generations SET planned = 1 WHERE id=$1 AND status != 'pending'", (generation_id,))]
        )

    async def undelivered_posts_of(self, residence: str) -> list[Post]:
        """One residence's posts with no message id yet, oldest generation first, each in seq order."""
        return [_post(r) for r in await self.db.execute_fetchall(UNDELIVERED, (residence,))]

    async def refused_posts(self) -> list[Post]:
        """Posts set aside because the room refused them, in the order they were recorded (few: a partial index)."""
        return [_post(r) for r in await self.db.execute_fetchall(REFUSED)]

    async def recover_generation(
        self, g: Generation, settled: list[Attempt], new_stumps: list[Stump], posts: list[Post]
    ) -> None:
        """Settle what a stopped process left open, in one transaction: attempts, generation, stumps, posts.

        One transaction so a crash during recovery leaves the record as it was, to be recovered again.
        """
        stmts: list[tuple[str, tuple[Any, ...]]] = []
        for a in settled:
            stmts += self._attempt_settle(a, only_if_streaming=True)
        stmts += self._generation_settle(g)
        stmts += [self._stump_insert(s) for s in new_stumps]
        stmts += [self._post_insert(p) for p in posts]
        stmts += [appending.generation(g)] + appending.stumps(new_stumps) + appending.posts(posts)
        await self.transact(stmts)
        _stored(new_stumps)

    @staticmethod
    def _generation_settle(g: Generation) -> list[tuple[str, tuple[Any, ...]]]:
        return [
            (
                "UPDATE generations SET status=$1, stop_reason=$2, text=$3, chars=$4, output_tokens=$5,"
                " continuation_ended=$6, finished_at=$7 WHERE id=$8",
                (
                    g.status,
                    g.stop_reason,
                    stored_bytes(g.text),
                    g.chars,
                    g.output_tokens,
                    g.continuation_ended,
                    g.finished_at,
                    g.id,
                ),
            ),
            ("DELETE FROM segments WHERE generation_id=$1", (g.id,)),
        ] + [
            (
                "INSERT INTO segments VALUES ($1,$2,$3,$4,$5,$6,$7)",
                (g.id, s.index, s.attempt_id, s.stop_reason, s.chars, s.output_tokens, s.overlap_removed),
            )
            for s in g.segments
        ]

    @staticmethod
    def _post_insert(p: Post) -> tuple[str, tuple[Any, ...]]:
        if p.replacements is None:
            p.replacements = outbound(p.content)[1]
        return (
            "INSERT INTO posts (id, generation_id, seq, kind, content, channel, replacements, stump_id, reason)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)",
            (
                p.id,
                p.generation_id,
                p.seq,
                p.kind,
                stored_bytes(p.content),
                p.channel,
                p.replacements,
                p.stump_id,
                p.reason,
            ),
        )


# ---------------------------------------------------------------------- the reads people and start-up make
# Each is an index seek or an ORDER BY ... LIMIT walked on an index (migrations m031, m032), so it stays
# fast however long the ledger grows; tests/test_ledger_scale.py checks their plans with EXPLAIN QUERY PLAN.
# `CROSS JOIN` keeps SQLite's join order: the small, indexed side (undelivered posts, streaming attempts) first.

# PostgreSQL has no `CROSS JOIN … ON` (nor a way to fix a join's order): its forms say `JOIN`.

UNSETTLED = "SELECT id FROM generations WHERE status='pending' ORDER BY created_at"
STREAMING = (
    "SELECT DISTINCT g.id FROM attempts a CROSS JOIN generations g ON g.id = a.generation_id"
    " WHERE a.outcome = 'streaming' AND g.status != 'pending' ORDER BY g.created_at, g.rowid"
)
POSTGRESQL[STREAMING] = (
    "SELECT g.id FROM (SELECT DISTINCT g.id, g.created_at, g.rowid FROM attempts a JOIN generations g"
    " ON g.id = a.generation_id WHERE a.outcome = 'streaming' AND g.status != 'pending') g"
    " ORDER BY g.created_at, g.rowid"
)
WITHOUT_POSTS = (
    "SELECT id FROM generations g WHERE planned = 0 AND status != 'pending'"
    " AND NOT EXISTS (SELECT 1 FROM posts p WHERE p.generation_id = g.id AND p.stump_id IS NULL)"
    " ORDER BY created_at, rowid"
)
UNDELIVERED = (
    "SELECT p.* FROM posts p CROSS JOIN generations g ON g.id = p.generation_id"
    " WHERE p.message_id IS NULL AND p.refused IS NULL AND g.residence = $1 ORDER BY g.created_at, g.rowid, p.seq"
)
POSTGRESQL[UNDELIVERED] = (
    "SELECT p.* FROM posts p JOIN generations g ON g.id = p.generation_id"
    " WHERE p.message_id IS NULL AND p.refused IS NULL AND g.residence = $1 ORDER BY g.created_at, g.rowid, p.seq"
)
REFUSED = "SELECT * FROM posts WHERE refused IS NOT NULL ORDER BY rowid"
# Generations read whole (`get_generation`: provenance, `ledger show`, recovery; `generations_brief`: the
# context compiler), by id: each query a seek per id ({marks}: one parameter each).
GENERATIONS = "SELECT * FROM generations WHERE id IN ({marks})"
GENERATION_BLOCKS = (
    "SELECT b.* FROM attempts a CROSS JOIN attempt_blocks b ON b.attempt_id = a.id WHERE a.generation_id IN ({marks})"
    " ORDER BY b.attempt_id, b.pos"
)
POSTGRESQL[GENERATION_BLOCKS] = (
    "SELECT b.* FROM attempts a JOIN attempt_blocks b ON b.attempt_id = a.id WHERE a.generation_id IN ({marks})"
    " ORDER BY b.attempt_id, b.pos"
)
# An attempt's blocks as it settles: written again whole (a settlement recovery repeats replaces them).
BLOCK = (
    "INSERT OR REPLACE INTO attempt_blocks (attempt_id, pos, idx, type, content, chars, text_offset,"
    " start, extras) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)"
)
POSTGRESQL[BLOCK] = (
    "INSERT INTO attempt_blocks (attempt_id, pos, idx, type, content, chars, text_offset, start, extras)"
    " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT (attempt_id, pos) DO UPDATE SET idx = excluded.idx,"
    " type = excluded.type, content = excluded.content, chars = excluded.chars, text_offset = excluded.text_offset,"
    " start = excluded.start, extras = excluded.extras"
)
# ... only while the attempt is still streaming (recovery's, beside a live process that may settle it).
BLOCK_IF_STREAMING = (
    "INSERT OR REPLACE INTO attempt_blocks (attempt_id, pos, idx, type, content, chars, text_offset,"
    " start, extras) SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9 WHERE EXISTS"
    " (SELECT 1 FROM attempts WHERE id=$10 AND outcome='streaming')"
)
POSTGRESQL[BLOCK_IF_STREAMING] = (
    "INSERT INTO attempt_blocks (attempt_id, pos, idx, type, content, chars, text_offset, start, extras)"
    " SELECT $1::text, $2::bigint, $3::bigint, $4::text, $5::bytea, $6::bigint, $7::bigint, $8::text, $9::text"
    " WHERE EXISTS (SELECT 1 FROM attempts WHERE id=$10 AND outcome='streaming')"
    " ON CONFLICT (attempt_id, pos) DO UPDATE SET idx = excluded.idx, type = excluded.type,"
    " content = excluded.content, chars = excluded.chars, text_offset = excluded.text_offset,"
    " start = excluded.start, extras = excluded.extras"
)
GENERATION_ATTEMPTS = (
    "SELECT * FROM attempts WHERE generation_id IN ({marks}) ORDER BY generation_id, started_at, rowid"
)
GENERATION_SEGMENTS = "SELECT * FROM segments WHERE generation_id IN ({marks}) ORDER BY generation_id, idx"
GENERATION_STUMPS = "SELECT * FROM stumps WHERE generation_id IN ({marks}) ORDER BY generation_id, created_at, rowid"
GENERATION_POSTS = "SELECT * FROM posts WHERE generation_id IN ({marks}) ORDER BY generation_id, seq"
GENERATION_ATTACHMENTS = "SELECT * FROM attachments WHERE generation_id IN ({marks}) ORDER BY rowid"


def _generation_rows(conn: Session, ids: list[str], brief: bool) -> dict[str, list[Any]]:
    """The rows of generations `ids` and of their records, table by table (`Ledger._generations`)."""
    out: dict[str, list[Any]] = {
        k: [] for k in ("generations", "blocks", "attempts", "segments", "stumps", "posts", "attachments")
    }
    queries = [
        ("generations", GENERATIONS),
        ("blocks", GENERATION_BLOCKS),
        ("attempts", GENERATION_ATTEMPTS),
        ("segments", GENERATION_SEGMENTS),
        ("stumps", GENERATION_STUMPS),
    ] + ([] if brief else [("posts", GENERATION_POSTS), ("attachments", GENERATION_ATTACHMENTS)])
    for i in range(0, len(ids), 500):
        part = ids[i : i + 500]
        for key, sql in queries:
            out[key] += conn.execute(said(sql, conn.dialect).format(marks=placeholders(len(part))), part).fetchall()
    return out


POSTS_BY_MESSAGE = "SELECT * FROM posts WHERE message_id IN ({marks})"
CLAIMED = "SELECT trigger FROM reply_claims WHERE trigger IN ({marks}) AND residence=${residence}"
# Portable as written (SQLite 3.35+, PostgreSQL 9.5+): a row back only when this statement inserted it.
CLAIM = (
    "INSERT INTO reply_claims (residence, trigger, channel, claimed_at) VALUES ($1,$2,$3,$4)"
    " ON CONFLICT DO NOTHING RETURNING trigger"
)
REQUEST_PARTS = "SELECT id, body FROM request_parts WHERE id IN ({marks})"
LATEST_GENERATION = (
    "SELECT id FROM generations WHERE residence=$1{channel} ORDER BY created_at DESC, rowid DESC LIMIT 1"
)


def list_generations_sql(residence: bool) -> str:
    """`ledger list`: newest first, walked on `generations_created` (or `generations_residence`)."""
    return (
        "SELECT id, residence, channel, model, status, stop_reason, chars, output_tokens, continuation_ended, standing,"
        " created_at, (SELECT count(*) FROM attempts a WHERE a.generation_id=g.id) AS attempts,"
        " (SELECT count(*) FROM stumps s WHERE s.generation_id=g.id) AS stumps FROM generations g"
        + (" WHERE residence=$1 ORDER BY created_at DESC, rowid DESC LIMIT $2" if residence else "")
        + ("" if residence else " ORDER BY created_at DESC, rowid DESC LIMIT $1")
    )


def stump_meta_sql(*, residence: bool, cause: bool, before: bool, channels: int | None, dialect: str = "sqlite") -> str:
    """`ledger stumps` and `/stumps list`: newest first on a stumps index; parameters in the order
    channels…, residence, cause, before, limit. `channels`: how many (the moderator's scope), or None.
    `dialect`: SQLite's join is `CROSS JOIN` (its order kept: stumps first); PostgreSQL's `JOIN`."""
    sql = (
        "SELECT s.id, s.generation_id, s.attempt_id, s.residence, s.scope, s.cause, s.chars, s.output_tokens,"
        " s.published, s.replaced_by, s.created_at, s.block, s.block_type FROM stumps s"
    )
    where: list[str] = []
    n = 0  # parameters so far
    if channels is not None:
        sql += (
            " CROSS JOIN generations g ON g.id = s.generation_id"
            if dialect == "sqlite"
            else " JOIN generations g ON g.id = s.generation_id"
        )
        where.append(f"g.channel IN ({placeholders(channels)})")
        n += channels
    if residence:
        n += 1
        where.append(f"s.residence=${n}")
    if cause:
        n += 1
        where.append(f"s.cause=${n}")
    if before:
        n += 1
        where.append(f"(s.created_at, s.rowid) < (SELECT created_at, rowid FROM stumps WHERE id=${n})")
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql + f" ORDER BY s.created_at DESC, s.rowid DESC LIMIT ${n + 1}"


def _commit(conn: Session, changes: list[list[tuple[str, tuple[Any, ...]]]]) -> list[BaseException | None]:
    """Several logical changes in one commit, run in the connection's own thread; each one's error, or None.

    Alone, a change is its own transaction (on SQLite, one statement: none around it). Together, each is a
    savepoint of one BEGIN IMMEDIATE … COMMIT: one that fails is rolled back to its savepoint and
    reported to its caller only. One whose error made SQLite roll back the whole transaction (a full
    disk, an I/O error) is reported to its caller, and the others are written again without it. A
    failed COMMIT is reported to all (nothing of the batch is on disk).
    """
    if len(changes) == 1:
        try:
            # PostgreSQL: always a transaction, whose id answers for a COMMIT lost with its connection.
            alone = len(changes[0]) == 1 and conn.dialect == "sqlite"
            _statements(conn, changes[0]) if alone else _transaction(conn, changes[0])
        except ConnectionLost:
            raise  # nothing of it written: the whole commit is asked again (`Session.call`)
        except Exception as e:
            return [e]
        return [None]
    errors: dict[int, BaseException] = {}
    while len(errors) < len(changes):
        conn.begin_write()
        try:
            for i, statements in enumerate(changes):
                if i in errors:
                    continue
                conn.execute("SAVEPOINT change")
                try:
                    _statements(conn, statements)
                except ConnectionLost:
                    raise
                except Exception as e:  # SQLite's, or a parameter it could not take (a lone surrogate, a huge int)
                    errors[i] = e
                    if not conn.in_transaction:  # SQLite rolled back the whole transaction: again, without it
                        break
                    conn.execute("ROLLBACK TO change")
                conn.execute("RELEASE change")
            else:
                conn.execute("COMMIT")
                break
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return [errors.get(i) for i in range(len(changes))]


def _claim(conn: Session, params: tuple[Any, ...]) -> bool:
    """The claim in a write transaction of its own (on PostgreSQL: under the write lock, and with a
    transaction id whose outcome a lost connection can look up), run in the connection's own thread."""
    conn.begin_write()
    try:
        taken = conn.execute(CLAIM, params).fetchone() is not None
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return taken


def _statements(conn: Session, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    # A run of one statement (a reply's posts) is one executemany.
    for sql, run in itertools.groupby(statements, key=lambda st: st[0]):
        rows = [params for _, params in run]
        if isinstance(sql, StillStreaming):
            for params in rows:
                found = conn.execute(str(sql), params).fetchone()
                if found is not None and found[0] != Outcome.STREAMING:
                    raise Superseded(f"attempt {params[0]} is no longer streaming: another process settled it")
            continue
        if len(rows) == 1:
            conn.execute(sql, rows[0])
        else:
            conn.executemany(sql, rows)


def _transaction(conn: Session, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    """BEGIN IMMEDIATE, the statements, COMMIT (or ROLLBACK), run in the connection's own thread."""
    conn.begin_write()
    try:
        _statements(conn, statements)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # not when SQLite rolled it back itself (a full disk): its error is the one to report
            conn.execute("ROLLBACK")
        raise


class _Opening:
    """What `Ledger.open` returns: awaited, the open ledger; entered (`async with`), the ledger, closed on exit."""

    def __init__(self, cls: type[Ledger], path: str | Path, read_only: bool, shared: bool = False) -> None:
        self.cls, self.path, self.read_only, self.shared = cls, path, read_only, shared
        self.ledger: Ledger | None = None

    def _connect(self) -> Coroutine[Any, Any, Ledger]:
        return self.cls._connect_read_only(self.path) if self.read_only else self.cls._connect(self.path, self.shared)

    def __await__(self) -> Generator[Any, None, Ledger]:
        return self._connect().__await__()

    async def __aenter__(self) -> Ledger:
        self.ledger = await self._connect()
        return self.ledger

    async def __aexit__(self, *exc: object) -> None:
        if self.ledger is not None:
            await self.ledger.close()


def _stored(stumps: Iterable[Stump]) -> None:
    for s in stumps:
        s.stored = True
