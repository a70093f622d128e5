"""`residents ledger verify`: check every promise the ledger makes, one line per violation.

It reads the ledger back cold, as a load or crash test does afterwards and an operator does on a
production file: the records' invariants (`invariants`) and the hash chain (`chain`). It needs only
the ledger's path: every read is on a read-only connection of its own, in one read transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import operator
import sqlite3
from collections import deque
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

import asyncpg

from ..records import PostReason
from . import chain, postgres, rows
from .chain import Rows
from .connection import sqlite_session
from .invariants import GenerationRows, check_blocks, check_generation, check_line, check_recovered
from .store import Ledger, LedgerError, read_only_uri
from .verify_attachments import check_attachments
from .verify_tools import check_tool_calls, round_finals


@dataclass
class Report:
    """What `verify` found: violations, plus facts that are not violations by themselves."""

    violations: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)  # generations still `pending`
    generations: int = 0
    undelivered: int = 0  # posts recorded but not (yet) delivered: resumable, so not a violation
    chain_entries: int = 0
    chain_head: str = chain.GENESIS_PREV  # the last entry's hash: what a witness compares an export with
    chain_lines: list[str] = field(default_factory=list)  # the chain's own lines (first in `violations` too)
    saved_head: str | None = None  # with `head`: whether a saved head is in the chain, in one line
    head_holds: bool = False  # ... and it is, with every entry after it consistent

    @property
    def ok(self) -> bool:
        return not self.violations

    def lines(self, unsettled_as_violations: bool = False) -> list[str]:
        """The violations, and with `unsettled_as_violations` (`--strict`) each pending generation."""
        pending = [f"generation {gid}: unsettled (status pending)" for gid in self.unsettled]
        return self.violations + (pending if unsettled_as_violations else [])


async def verify(ledger: Ledger, *, unsettled_as_violations: bool = False) -> list[str]:
    """One human line per violated invariant; empty when the ledger holds every promise."""
    return (await check(ledger)).lines(unsettled_as_violations)


async def check(ledger: Ledger, head: tuple[int, str] | None = None) -> Report:
    """`check_file` on the ledger's file, in a thread (the ledger's own connection is left alone)."""
    return await asyncio.to_thread(check_file, ledger.path, head)


# From this many generations, one worker process shares the check; the generations are taken `CHUNK`
# at a time and read `BATCH` at a time, so memory stays flat however long the ledger is.
PARALLEL_FROM = 50_000
CHUNK = 4_000
BATCH = 1000


def check_file(path: str, head: tuple[int, str] | None = None) -> Report:
    """Read the whole ledger once and check it; linear in its size, in memory bounded by a batch.

    The chain's lines come first (the first broken entry first), then the invariants; the report is the
    same however the work is shared. `head`: a head a witness saved (seq, hash), said in `saved_head`."""
    if path == ":memory:":
        raise LedgerError("verify reads a ledger file; an in-memory ledger has none")
    with contextlib.closing(_read_only(path)) as conn:
        db = conn.cursor()
        top = (chain.head(conn) or (0, ""))[0]
        prelude = _prelude(conn)
        shared = db.execute("SELECT count(*) FROM generations").fetchone()[0] >= PARALLEL_FROM
        spans = _spans(_bounds(conn))
        tasks: list[tuple[Any, ...]] = [(chain.walk, top), (chain.unattested, top)]
        tasks += [(_range, lo, hi, prelude, BATCH) for lo, hi in spans]
        walked, unattested, *parts = _run(path, db, tasks) if shared else [fn(db, *args) for fn, *args in tasks]
        orphans = rows.dicts(db, "SELECT * FROM posts WHERE generation_id IS NULL ORDER BY seq")
        held = chain.hold(db, chain.refusal_records(db) + [chain.post_record(p) for p in orphans])
        held.add(unattested)
        for part in parts:
            held.add(part.held)
        links = chain.report(walked, held)
        rep = Report(chain_entries=walked.entries, chain_head=walked.head, chain_lines=[line for _, line in links])
        # the notices of spent budgets, by the refusals that posted them (one per channel a day: few)
        told = {r[0] for r in db.execute("SELECT post_id FROM budget_refusals WHERE post_id IS NOT NULL")}
        _assemble(rep, prelude, parts, orphans, told)
        if head is not None:
            rep.head_holds, rep.saved_head = _saved_head(db, head, walked.entries, links[0][0] if links else None)
    return rep


def _saved_head(db: sqlite3.Cursor, head: tuple[int, str], entries: int, broken: int | None) -> tuple[bool, str]:
    """Whether entry N of this chain is the one a witness saved as `N:SHA256`, and none after it `broken`."""
    seq, digest = head
    said = f"head {seq}:{digest}"
    got = db.execute("SELECT hash FROM chain WHERE seq = $1", (seq,)).fetchone()
    if got is None:
        return False, f"{said}: not in this chain (it has {entries} entries): the chain was cut or replaced"
    if got[0] != digest:
        return False, f"{said}: entry {seq} of this chain hashes to {got[0]}: the chain was rewritten at or before it"
    if broken is not None:
        return False, f"{said}: in this chain, but entry {broken} is broken (named below)"
    return True, f"{said}: in this chain, and the {entries - seq} entries after it are consistent with it"


def _run(path: str, db: sqlite3.Cursor, tasks: list[tuple[Any, ...]]) -> list[Any]:
    """Each task `(fn, *args)` run as `fn(cursor, *args)`, results in the tasks' order, shared with one
    spawned worker process (nothing of this process inherited): a thread hands it tasks from the first,
    one at a time, while this process takes them from the last. One worker: with this process, two
    cores; each more would cost its memory."""
    todo, results = deque(enumerate(tasks)), [None] * len(tasks)

    def feed(pool: ProcessPoolExecutor) -> None:
        try:
            while got := _take(todo.popleft):
                results[got[0]] = pool.submit(_in_worker, path, *got[1]).result()
        finally:
            todo.clear()  # a worker that failed stops this process's share too

    with _pool() as pool, ThreadPoolExecutor(1) as feeder:
        fed = feeder.submit(feed, pool)
        try:
            while got := _take(todo.pop):
                fn, *args = got[1]
                results[got[0]] = fn(db, *args)
            fed.result()
        except BrokenProcessPool:
            raise LedgerError(
                f"{postgres.shown(path)}: a worker process checking the ledger failed: it ended before it answered"
            ) from None
        except (OSError, sqlite3.Error, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise LedgerError(f"{postgres.shown(path)}: a worker process checking the ledger failed: {e}") from None
        finally:
            todo.clear()  # (this process's task failed: the worker stops after its own)
    return results


def _take(end: Callable[[], tuple[int, tuple[Any, ...]]]) -> tuple[int, tuple[Any, ...]] | None:
    """The next task from one end of the queue, None once it is empty (another thread takes from the other)."""
    try:
        return end()
    except IndexError:
        return None


def _pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))


def _in_worker(path: str, fn: Any, *args: Any) -> Any:
    """A worker's task: `fn` on a read-only connection of its own."""
    with contextlib.closing(_read_only(path)) as conn:
        return fn(conn.cursor(), *args)


def _spans(bounds: list[str]) -> list[tuple[str, str | None]]:
    """The generations in ranges of ids: ("", id1], (id1, id2], ..., (idN, None), so together they are
    every id (and every record's generation id)."""
    return list(zip(["", *bounds], [*bounds, None], strict=True))


def _bounds(conn: sqlite3.Connection) -> list[str]:
    """Every `CHUNK`th generation id: each a step of the ids' index inside SQLite (`OFFSET` skips without
    making a row), so the bounds of a million generations take milliseconds."""
    out: list[str] = []
    sql = "SELECT id FROM generations WHERE id > $1 ORDER BY id LIMIT 1 OFFSET $2"
    while got := conn.execute(sql, (out[-1] if out else "", CHUNK - 1)).fetchall():
        out.append(got[0][0])
    return out


def _read_only(path: str) -> sqlite3.Connection:
    """A read-only connection in one read transaction (PostgreSQL: REPEATABLE READ, one snapshot), so
    the check sees one state of the ledger, each record with its entries, however it moves meanwhile."""
    if postgres.is_url(path):
        try:
            session = postgres.PgSession.connect(path, read_only=True)
            session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        except Exception as e:
            raise LedgerError(f"{postgres.shown(path)}: cannot read the ledger: {postgres.reason(e)}") from None
        return session  # type: ignore[return-value]  # the few calls of a sqlite3.Connection verify makes
    try:
        conn = sqlite_session(read_only_uri(path), uri=True)
        conn.execute("BEGIN")
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # the read transaction begins here
    except sqlite3.Error as e:
        raise LedgerError(f"{path}: cannot read the ledger: {e}") from None
    return conn


def _assemble(rep: Report, prelude: _Prelude, parts: list[_Part], orphans: Rows, told: AbstractSet[str]) -> None:
    """The ranges' findings after the chain's lines: records of missing generations, posts of none,
    published stumps, each generation's lines oldest first, then attachments. `told`: the posts recorded
    refusals of a spent budget name, the only posts that may say a budget was reached."""
    lines: list[str] = []
    for p in orphans:
        check_line(lines, p)  # notices about no generation (a declined /continue, a spent budget)
        if p["kind"] != "notice":
            lines.append(f"post {p['id']}: a {p['kind']} post with no generation")
        budget = p["reason"] == PostReason.BUDGET_REACHED
        if budget and p["id"] not in told:
            lines.append(f"post {p['id']}: a notice of a spent budget that no refusal records")
        elif not budget and p["id"] in told:
            lines.append(f"post {p['id']}: a refusal of a spent budget names it, but it is a {p['reason']} post")
    lines += [
        f"post {pid}: named by a refusal of a spent budget, but no notice of no generation has that id"
        for pid in sorted(told - {p["id"] for p in orphans})
    ]
    rep.violations = rep.chain_lines + [line for part in parts for line in part.missing] + lines + prelude.lines
    for *_, found in sorted((f for part in parts for f in part.by_order), key=lambda f: (f[0], f[1])):
        rep.violations += found
    rep.violations += [line for part in parts for line in part.attached]
    rep.unsettled = [gid for *_, gid in sorted(u for part in parts for u in part.unsettled)]
    rep.generations, rep.undelivered = sum(p.generations for p in parts), sum(p.undelivered for p in parts)


@dataclass
class _Prelude:
    """What checking any generation needs to know of the ledger as a whole (small: a few rows)."""

    shown_live: set[str]  # stumps whose text a live message showed and then set aside
    chunks: dict[str, int]  # streamed chunks left per attempt
    lines: list[str]  # what the posts publishing a stump at its resident's request violate
    recovered: set[str]  # stumps whose recovered posts were delivered


def _prelude(conn: sqlite3.Connection) -> _Prelude:
    db = conn.cursor()
    # A retried attempt's text shown live (`delivery.live`) is published: its stump says so, and only it may.
    shown_live = {r[0] for r in db.execute("SELECT DISTINCT stump_id FROM live_messages WHERE state='set-aside'")}
    chunks = dict(db.execute("SELECT attempt_id, count(*) FROM attempt_chunks GROUP BY attempt_id").fetchall())
    # posts publishing a stump at its resident's request are checked with that stump, not as their
    # generation's own (read by the partial index on stump_id, then put in the order they were written)
    got = rows.dicts(db, "SELECT rowid AS written, * FROM posts WHERE stump_id IS NOT NULL")
    published = sorted(got, key=lambda r: r["written"])
    sql = "SELECT * FROM stumps WHERE id IN (SELECT stump_id FROM posts WHERE stump_id IS NOT NULL) ORDER BY id"
    stumps = {r["id"]: r for r in rows.dicts(db, sql)}
    lines: list[str] = []
    recovered = check_recovered(lines, stumps, published)
    return _Prelude(shown_live, chunks, lines, recovered)


@dataclass
class _Part:
    """What checking one range of generations found, to be put in order with the other ranges'."""

    missing: list[str] = field(default_factory=list)  # records of generations not in the ledger
    by_order: list[tuple[float, int, list[str]]] = field(default_factory=list)  # by (created_at, rowid)
    unsettled: list[tuple[float, int, str]] = field(default_factory=list)
    attached: list[str] = field(default_factory=list)  # attachment rows' violations
    generations: int = 0
    undelivered: int = 0
    held: chain.Found = field(default_factory=chain.Found)  # the range's records against the chain


# Generations and attempts: only the columns the checks and the builders read (a generation's request
# and trigger, an attempt's request id, times and stop details, are not checked and are the widest).
_GENS = (
    "SELECT rowid, id, residence, channel, model, status, stop_reason, text, chars, output_tokens, standing,"
    " continuation_ended, created_at FROM generations WHERE id > $1{upto} ORDER BY id LIMIT {limit}"
)
# Each table's rows of the generations in (lo, hi]; `{upto}`: " AND generation_id <= $2" or "" (the last batch).
_OF = {
    "attempts": "SELECT id, generation_id, segment, idx, outcome, stop_reason, discard_reason, error, text, chars,"
    " output_tokens, input_tokens, cache_write_tokens, cache_read_tokens, replaced_by FROM attempts"
    " WHERE generation_id > $1{upto} ORDER BY generation_id, segment, idx, started_at",
    "segments": "SELECT * FROM segments WHERE generation_id > $1{upto} ORDER BY generation_id, idx",
    "stumps": "SELECT * FROM stumps WHERE generation_id > $1{upto} ORDER BY generation_id, created_at, rowid",
    "posts": "SELECT * FROM posts WHERE generation_id > $1{upto} ORDER BY generation_id, seq",
}
# The blocks of the batch's attempts (seeks on the blocks' primary key, in its order).
_BLOCKS = (
    "SELECT attempt_id, idx, type, content, chars, text_offset FROM attempt_blocks WHERE attempt_id IN"
    " (SELECT id FROM attempts WHERE generation_id > $1{upto}) ORDER BY attempt_id, pos"
)
_ATTACHMENTS = "SELECT * FROM attachments WHERE generation_id > $1{upto} ORDER BY generation_id, rowid"
_CALLS = (
    "SELECT generation_id, round, pos, attempt_id, name, is_error FROM tool_calls"
    " WHERE generation_id > $1{upto} ORDER BY generation_id, round, pos"
)


def _range(db: sqlite3.Cursor, lo: str, hi: str | None, prelude: _Prelude, batch: int) -> _Part:
    """Every generation with an id in (lo, hi] (hi None: no end) and its records, `batch` at a time:
    their invariants, and each record against its entries."""
    out = _Part()
    while True:
        gens, of, blocks, calls, attachment_rows, touched = _batch(db, lo, hi, batch)
        known = {g["id"] for g in gens}
        out.held.add(chain.hold(db, chain.records(gens, of, blocks, touched)))
        for gid in sorted(set().union(*of.values()) - known):
            for table, found in of.items():
                out.missing += [
                    f"{table[:-1]} {i.get('id') or i.get('idx')}: belongs to missing generation {gid}"
                    for i in found.get(gid, ())
                ]
        for g in gens:
            gid, order = g["id"], (g["created_at"], g["rowid"])
            attempts, segments, stumps, posts = (found.get(gid, []) for found in of.values())  # (`_OF`'s order)
            for st in stumps:
                st["shown_live"], st["recovered"] = st["id"] in prelude.shown_live, st["id"] in prelude.recovered
                st["access_set"] = (touched["stump-access"].get(st["id"]) or (None, None))[1]
            # a post neither delivered nor refused (a refused post is set aside) waits for its delivery
            out.undelivered += sum(p["message_id"] is None and p["refused"] is None for p in posts)
            its_calls, own_posts = calls.get(gid, []), [p for p in posts if p["stump_id"] is None]
            r = GenerationRows(g, attempts, segments, stumps, own_posts, blocks, round_finals(attempts, its_calls))
            lines: list[str] = []
            check_generation(lines, r, prelude.chunks)
            check_blocks(lines, r)
            check_tool_calls(lines, g, attempts, its_calls)
            if lines:
                out.by_order.append((*order, lines))
            if g["status"] == "pending":
                out.unsettled.append((*order, gid))
        check_attachments(out.attached, attachment_rows, known)
        out.generations += len(gens)
        if len(gens) < batch:
            return out
        lo = gens[-1]["id"]


def _batch(
    db: sqlite3.Cursor, lo: str, hi: str | None, batch: int
) -> tuple[Rows, dict[str, dict[str, Rows]], dict[str, Rows], dict[str, Rows], Rows, dict[str, dict[str, Any]]]:
    """The next `batch` generations after id `lo` (up to `hi`) and their records: each table's rows by
    generation id (blocks by attempt id). The records are read up to the batch's last id, or, for the
    range's last batch, up to `hi` (or all that follow), so a record whose generation is missing is
    found by the range it falls in."""
    upto, span = ("", (lo,)) if hi is None else (" AND {} <= $2", (lo, hi))
    gens = rows.dicts(db, _GENS.format(upto=upto.format("id"), limit=f"${len(span) + 1}"), (*span, batch))
    if len(gens) == batch:
        upto, span = " AND {} <= $2", (lo, gens[-1]["id"])
    upto = upto.format("generation_id")

    def grouped(sql: str, column: str = "generation_id") -> dict[str, Rows]:
        """A query's rows, read in order of `column` (its ORDER BY), as lists by it."""
        found = rows.dicts(db, sql.format(upto=upto), span)
        return {k: list(g) for k, g in itertools.groupby(found, operator.itemgetter(column))}

    of = {table: grouped(sql) for table, sql in _OF.items()}
    return (
        gens,
        of,
        grouped(_BLOCKS, "attempt_id"),
        grouped(_CALLS),
        rows.dicts(db, _ATTACHMENTS.format(upto=upto), span),
        chain.touched(db, span, upto),
    )
