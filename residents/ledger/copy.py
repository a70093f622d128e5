"""`residents ledger copy`: a ledger moved whole to another place, on either backend, its chain with it.

Why row by row rather than through the records: the chain hashes bytes, so the copy must hold exactly the
bytes the source holds (texts, REALs, NULLs, BLOBs), tampering included, and end on the same head; any
reading through records would remake rather than move them. The tables come from the source's schema
(every table its migrations made), copied parents first by their foreign keys, in pages (bounded memory at
a million generations) read in one read transaction (one state of a source a running writer holds) and
written in one transaction (a copy that fails leaves the destination as empty as it found it). The
destination's triggers are off while rows go in (a row copied is not a change: `posts_planned` must not
re-plan, `stumps_default_access` must not reset an access chosen since), and a PostgreSQL destination's
identity sequences are set past the highest `rowid` copied, so its next row follows on.

The source must be at this residents' migration step: copying never writes the source, so it does not
migrate it (`residents ledger migrate` does, as its one writer). The destination must be empty: a new
file, or a database or file with no ledger rows; it is made or migrated to the same step first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import chain, migrations, postgres
from .connection import Connection, Session, placeholders
from .store import Ledger, LedgerError, read_only_uri

PAGE = 2000  # rows read and written per trip: memory stays bounded however large a table is
NOT_COPIED = frozenset({"_migrations"})  # each ledger's own record of its schema steps


class CopyRefused(LedgerError):
    """A copy that cannot begin as asked (a destination not empty, a source at another step); nothing written."""


@dataclass
class Table:
    """One table as the copy needs it: the columns both ends share, the key it is paged by, its parents."""

    name: str
    columns: list[str]  # copied, `rowid` among them where both ends keep it as a value
    key: list[str]  # the source's unique key, in order: what the pages walk
    parents: set[str] = field(default_factory=set)


@dataclass
class Copied:
    """What a copy did: rows per table in the order copied, and the chain's head on each end."""

    rows: list[tuple[str, int]]
    source_head: tuple[int, str] | None
    copy_head: tuple[int, str] | None


def quoted(name: str) -> str:
    """An identifier as both dialects read it, whatever it holds."""
    return '"' + name.replace('"', '""') + '"'


def identifiers(names: Sequence[str]) -> str:
    """Column names as a statement lists them, each `quoted`."""
    return ", ".join(quoted(n) for n in names)


# ----------------------------------------------------------------------------- the schema, on each backend


def _tables(conn: Session) -> list[str]:
    """The ledger tables of the database, `_migrations` and SQLite's own left out."""
    if conn.dialect == "postgresql":
        sql = (
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            " AND table_type = 'BASE TABLE' ORDER BY table_name"
        )
    else:
        sql = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
    return [str(r[0]) for r in conn.execute(sql).fetchall() if r[0] not in NOT_COPIED]


@dataclass
class _Shape:
    columns: list[str]  # declared, in order (PostgreSQL's `rowid` among them where declared)
    rowid: bool  # `rowid` is a value of its own (not an alias of another column)
    primary: list[str]  # primary key columns, in order
    parents: set[str]
    serial: list[str]  # PostgreSQL: columns an identity sequence fills


def _shape(conn: Session, table: str) -> _Shape:
    if conn.dialect == "postgresql":
        cols = conn.execute(
            "SELECT column_name, pg_get_serial_sequence(quote_ident(table_name), column_name) IS NOT NULL"
            " FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1"
            " ORDER BY ordinal_position",
            (table,),
        ).fetchall()
        primary = conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = quote_ident($1)::regclass AND i.indisprimary"
            " ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (table,),
        ).fetchall()
        parents = conn.execute(
            "SELECT DISTINCT c2.relname FROM pg_constraint k JOIN pg_class c2 ON c2.oid = k.confrelid"
            " WHERE k.conrelid = quote_ident($1)::regclass AND k.contype = 'f'",
            (table,),
        ).fetchall()
        names = [str(c[0]) for c in cols]
        return _Shape(
            names,
            "rowid" in names,
            [str(p[0]) for p in primary],
            {str(p[0]) for p in parents},
            [str(c[0]) for c in cols if c[1]],
        )
    info = conn.execute("SELECT name, type, pk FROM pragma_table_info($1) ORDER BY cid", (table,)).fetchall()
    primary = sorted((r for r in info if r[2]), key=lambda r: int(r[2]))
    alias = len(primary) == 1 and str(primary[0][1]).upper() == "INTEGER"  # then rowid is that column
    try:
        conn.execute(f"SELECT rowid FROM {quoted(table)} LIMIT 0").fetchall()
        has_rowid = not alias
    except sqlite3.OperationalError:  # WITHOUT ROWID
        has_rowid = False
    parents = conn.execute('SELECT DISTINCT "table" FROM pragma_foreign_key_list($1)', (table,)).fetchall()
    return _Shape([str(r[0]) for r in info], has_rowid, [str(r[0]) for r in primary], {str(p[0]) for p in parents}, [])


def _plan(source: dict[str, _Shape], destination: dict[str, _Shape]) -> list[Table]:
    """The tables to copy, parents before children: the same tables and columns on both ends, else refused."""
    missing = sorted(set(source) - set(destination))
    if missing:
        raise CopyRefused(f"the copy has no table {missing[0]}, though at the same migration step")
    plan: dict[str, Table] = {}
    for name, s in source.items():
        d = destination[name]
        ours = [c for c in s.columns if c != "rowid"]
        if sorted(ours) != sorted(c for c in d.columns if c != "rowid"):
            raise CopyRefused(f"table {name}: its columns differ between the two ledgers")
        both_rowid = s.rowid and d.rowid
        key = ["rowid"] if s.rowid else s.primary
        if not key:
            raise CopyRefused(f"table {name}: no key to read it by in pages (no rowid, no primary key)")
        plan[name] = Table(name, ours + (["rowid"] if both_rowid else []), key, s.parents & set(source))
    ordered: list[Table] = []
    placed: set[str] = set()
    while len(ordered) < len(plan):
        ready = sorted(n for n, t in plan.items() if n not in placed and t.parents - {n} <= placed)
        if not ready:
            raise CopyRefused("the ledger's foreign keys go round in a circle; no order copies it")
        for n in ready:
            ordered.append(plan[n])
            placed.add(n)
    return ordered


def _schema(conn: Session) -> dict[str, _Shape]:
    return {t: _shape(conn, t) for t in _tables(conn)}


# ----------------------------------------------------------------------------- the source: one snapshot


def _begin_snapshot(conn: Session) -> tuple[list[str], tuple[int, str] | None, dict[str, _Shape]]:
    """One read transaction for the whole copy (later commits by a writer unseen); the source's migration
    steps, head and schema as of it."""
    if conn.dialect == "postgresql":
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    else:
        conn.execute("BEGIN")  # a deferred transaction: its snapshot is taken by the first read, next
    steps = [str(r[0]) for r in conn.execute("SELECT name FROM _migrations").fetchall()]
    return steps, chain.head(conn), _schema(conn)  # type: ignore[arg-type]


def _page(conn: Session, sql: str, after: Sequence[Any] | None, first: str) -> list[tuple[Any, ...]]:
    rows = conn.execute(first if after is None else sql, (*(after or ()), PAGE)).fetchall()
    return [tuple(r) for r in rows]


def _end_snapshot(conn: Session) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


# ----------------------------------------------------------------------------- the destination: one transaction


def _rows_in(conn: Session, tables: list[str]) -> str | None:
    """The first of `tables` holding a row (None: all empty)."""
    for t in tables:
        if conn.execute(f"SELECT EXISTS (SELECT 1 FROM {quoted(t)})").fetchall()[0][0]:
            return t
    return None


def _begin_copy(conn: Session, tables: list[str], name: str) -> list[str]:
    """The write transaction, the destination found empty in it, its triggers off: SQLite's dropped (the
    statements that make them again returned), PostgreSQL's disabled (enabled again by `_end_copy`)."""
    conn.begin_write()
    occupied = _rows_in(conn, tables)
    if occupied is not None:
        conn.execute("ROLLBACK")
        raise CopyRefused(f"{name}: not empty (table {occupied} has rows, written since the copy began)")
    if conn.dialect == "postgresql":
        for t in tables:
            conn.execute(f"ALTER TABLE {quoted(t)} DISABLE TRIGGER USER")
        return []
    triggers = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name").fetchall()
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER {quoted(name)}")
    return [str(sql) for _, sql in triggers]


def _insert(conn: Session, t: Table, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """One page written: by COPY on PostgreSQL (`PgSession.copy_in`), else by the INSERT `sql`."""
    if isinstance(conn, postgres.PgSession):
        conn.copy_in(t.name, t.columns, rows)
    else:
        conn.executemany(sql, rows)


def _end_copy(conn: Session, tables: list[Table], serial: dict[str, list[str]], triggers: list[str]) -> None:
    """Identity sequences past the highest value copied, the triggers back, and the commit."""
    if conn.dialect == "postgresql":
        for t in tables:
            for column in serial.get(t.name, []):
                conn.execute(
                    f"SELECT setval(pg_get_serial_sequence($1, $2), max({quoted(column)})) FROM {quoted(t.name)}"
                    f" HAVING max({quoted(column)}) IS NOT NULL",
                    (quoted(t.name), column),
                )
            conn.execute(f"ALTER TABLE {quoted(t.name)} ENABLE TRIGGER USER")
    for sql in triggers:
        conn.execute(sql)
    conn.execute("COMMIT")


def _abandon(conn: Session) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


# ----------------------------------------------------------------------------- the copy


async def _probe(location: str) -> tuple[Connection, str] | None:
    """A read-only look at a destination that exists (None: a new file, nothing to look at)."""
    if postgres.is_url(location):
        try:
            return await postgres.connect(location, read_only=True), postgres.shown(location)
        except Exception as e:
            raise CopyRefused(f"{postgres.shown(location)}: cannot open the ledger: {postgres.reason(e)}") from None
    path = Path(location)
    if path.is_dir():
        raise CopyRefused(f"{location}: a folder, not a ledger file")
    if not path.exists():
        return None
    try:
        db = await Connection.open(read_only_uri(location), uri=True, name=location)
        await db.execute_fetchall("SELECT 1 FROM sqlite_master LIMIT 1")
    except sqlite3.Error as e:
        raise CopyRefused(f"{location}: not a ledger file to copy into: {e}") from None
    return db, location


async def ensure_empty(location: str, tables: set[str]) -> bool:
    """Refuse a destination holding a row in any of `tables` (the source's), before anything is written;
    True: no file there yet."""
    probed = await _probe(location)
    if probed is None:
        return True
    db, name = probed
    try:
        present = [t for t in await db.run(_tables) if t in tables]
        occupied = await db.run(_rows_in, present)
    except Exception as e:
        raise CopyRefused(f"{name}: not a ledger to copy into: {postgres.reason(e)}") from None
    finally:
        await db.close()
    if occupied is not None:
        raise CopyRefused(f"{name}: not empty (table {occupied} has rows); copy into a new file or an empty database")
    return False


def same_place(source: str, destination: str) -> bool:
    """Whether two locations name one ledger: the same URL, or paths to the same file."""
    if postgres.is_url(source) or postgres.is_url(destination):
        return source == destination
    return os.path.abspath(source) == os.path.abspath(destination)


async def copy_ledger(
    source: str, destination: str, progress: Callable[[str, int, bool], None] = lambda *_: None
) -> Copied:
    """Every row of the ledger at `source` into the empty ledger at `destination` (a path or a URL);
    `progress(table, rows so far, whether the table is done)` as it goes."""
    src_name = postgres.shown(source) if postgres.is_url(source) else source
    if same_place(source, destination):
        raise CopyRefused(f"{src_name}: the source and the destination are the same ledger")
    src = await Ledger.open(source, read_only=True)  # refuses a ledger that needs migrating, naming the verb
    try:
        steps, source_head, source_schema = await src.db.run(_begin_snapshot)
        known = {n for n, _ in migrations.MIGRATIONS}
        newer = [s for s in steps if s not in known]
        if newer:
            raise CopyRefused(
                f"{src_name}: written by a newer residents (its step {newer[0]} is unknown here); copy it with that one"
            )
        fresh = await ensure_empty(destination, set(source_schema))
        try:
            dst = await Ledger.open(destination)
        except OSError as e:  # a path whose folder cannot be made (a file stands in its way, no permission)
            raise CopyRefused(f"{destination}: cannot make a ledger there: {e.strerror or e}") from None
        try:
            result = await _copy(src.db, dst.db, source_schema, progress)
            copy_head = await dst.db.run(chain.head)
        except BaseException:
            await dst.close()
            if fresh:
                _remove_new_file(destination)
            raise
        await dst.close()
    finally:
        with contextlib.suppress(Exception):
            await src.db.run(_end_snapshot)
        await src.close()
    return Copied(result, source_head, copy_head)


async def _copy(
    src: Connection, dst: Connection, source_schema: dict[str, _Shape], progress: Callable[[str, int, bool], None]
) -> list[tuple[str, int]]:
    destination_schema = await dst.run(_schema)
    tables = _plan(source_schema, destination_schema)
    triggers = await dst.run(_begin_copy, [t.name for t in tables], dst.name)
    counts: list[tuple[str, int]] = []
    try:
        for t in tables:
            counts.append((t.name, await _copy_table(src, dst, t, progress)))
        serial = {name: shape.serial for name, shape in destination_schema.items()}
        await dst.run(_end_copy, tables, serial, triggers)
    except BaseException:
        await dst.run(_abandon)
        raise
    return counts


async def _copy_table(src: Connection, dst: Connection, t: Table, progress: Callable[[str, int, bool], None]) -> int:
    """One table, page by page in key order; the next page read while the last is written."""
    first = (
        f"SELECT {identifiers(t.columns)}, {identifiers(t.key)} FROM {quoted(t.name)}"
        f" ORDER BY {identifiers(t.key)} LIMIT $1"
    )
    after = (
        f"SELECT {identifiers(t.columns)}, {identifiers(t.key)} FROM {quoted(t.name)}"
        f" WHERE ({identifiers(t.key)}) > ({placeholders(len(t.key))})"
        f" ORDER BY {identifiers(t.key)} LIMIT {placeholders(1, len(t.key) + 1)}"
    )
    insert = f"INSERT INTO {quoted(t.name)} ({identifiers(t.columns)}) VALUES ({placeholders(len(t.columns))})"
    width = len(t.columns)
    copied = 0
    page = await src.run(_page, after, None, first)
    while page:
        last = page[-1][width:]
        writing = dst.run(_insert, t, insert, [r[:width] for r in page])
        reading = src.run(_page, after, last, first) if len(page) == PAGE else _nothing()
        try:
            await writing
        except Exception as e:
            await asyncio.gather(reading, return_exceptions=True)
            raise CopyRefused(f"{dst.name}: table {t.name}: a row could not be written: {postgres.reason(e)}") from None
        copied += len(page)
        progress(t.name, copied, False)
        page = await reading
    progress(t.name, copied, True)
    return copied


async def _nothing() -> list[tuple[Any, ...]]:
    return []


def _remove_new_file(path: str) -> None:
    """A file this copy made, removed after a copy that failed (the lock file stays, as a writer's does)."""
    for name in (path, path + "-wal", path + "-shm", path + "-journal"):
        with contextlib.suppress(OSError):
            os.unlink(name)
