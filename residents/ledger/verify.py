"""`residents ledger verify`: check every invariant the ledger promises, one line per violation.

The pipeline writes the ledger as it goes; this reads it back cold (raw rows, not the pipeline's
records) and checks what the project promises about it: every emitted text kept exactly, every cut
surfaced once, posts covering each text exactly once, nothing uncompleted posted as speech. It is
what a load or crash test runs afterwards, and what an operator runs on a production file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import operator
import os
import pickle
import re
import sqlite3
import sys
import tempfile
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import truth
from ..records import Block, PostReason, join_text
from ..text import FENCE_LINE
from ..truth import LIMIT, RECEIPT_PREFIX
from . import chain
from .store import Ledger, LedgerError, dec
from .verify_attachments import check_attachments
from .verify_tools import check_tool_calls, joined_upto, round_finals

CUT = frozenset({"truncated", "failed", "incomplete"})
SETTLED = frozenset({"completed", "truncated", "refused", "failed", "incomplete"})
TEXT_KINDS = frozenset({"speech", "partial"})
_SECOND_PERSON = re.compile(r"\b(you|your|yours|yourself)\b", re.IGNORECASE)


# Room lines that are not a generation's boundary line: the optional retry notice, a declined
# /continue, a refused provider key's notice (in place of a line, once per window) and a live attempt set aside. A post records why it exists (`posts.reason`); its wording is never parsed here.
_SIDE_NOTICES = frozenset(
    {PostReason.ABANDONED_NOTICE, PostReason.DECLINED_CONTINUE, PostReason.LIVE_SET_ASIDE, PostReason.KEY_REJECTED}
)
# The kinds each reason may be posted as.
_REASON_KINDS: dict[str, frozenset[str]] = {
    PostReason.TEXT: TEXT_KINDS,
    PostReason.RECEIPT: frozenset({"receipt"}),
    PostReason.NO_TEXT: frozenset({"receipt", "notice"}),
    PostReason.REFUSAL: frozenset({"notice"}),
    PostReason.DECLINED_CONTINUE: frozenset({"notice"}),
    PostReason.ABANDONED_NOTICE: frozenset({"notice"}),
    PostReason.KEY_REJECTED: frozenset({"notice"}),
    PostReason.LIVE_SET_ASIDE: frozenset({"notice"}),
    PostReason.RECOVERED: frozenset({"recovered", "receipt"}),
}


@dataclass
class Report:
    """What `verify` found: violations, plus facts that are not violations by themselves."""

    violations: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)  # generations still `pending`
    generations: int = 0
    undelivered: int = 0  # posts recorded but not (yet) delivered: resumable, so not a violation
    chain_entries: int = 0
    chain_head: str = chain.GENESIS_PREV  # the last entry's hash: what a witness compares an export with

    @property
    def ok(self) -> bool:
        return not self.violations


async def verify(ledger: Ledger, *, unsettled_as_violations: bool = False) -> list[str]:
    """One human line per violated invariant; empty when the ledger holds every promise."""
    r = await check(ledger)
    if unsettled_as_violations:
        return r.violations + [f"generation {gid}: unsettled (status pending)" for gid in r.unsettled]
    return r.violations


# `check` reads generations a batch at a time (in id order, on the primary key) with their records
# (range seeks on the indexes by generation id), so its memory stays flat however long the ledger is.
BATCH = 1000
# Only the columns the checks read (a generation's request and trigger, an attempt's request id and
# times, are not checked here and are the widest columns to copy).
_GENS = (
    "SELECT rowid, id, status, stop_reason, text, chars, standing, created_at FROM generations"
    " WHERE id > ?{upto} ORDER BY id LIMIT ?"
)
# Each table's rows of the generations in (lo, hi], with the columns the checks read (each costs as much
# as a row of few); `{upto}`: " AND generation_id <= ?" or "" (the last batch).
_OF: list[tuple[str, str]] = [
    (
        "attempts",
        "SELECT id, generation_id, segment, idx, outcome, stop_reason, discard_reason, error, text, chars,"
        " replaced_by FROM attempts WHERE generation_id > ?{upto} ORDER BY generation_id, segment, idx, started_at",
    ),
    (
        "segments",
        "SELECT generation_id, idx, attempt_id, chars, overlap_removed FROM segments WHERE generation_id > ?{upto}"
        " ORDER BY generation_id, idx",
    ),
    (
        "stumps",
        "SELECT id, generation_id, attempt_id, scope, cause, text, chars, published, replaced_by, block FROM stumps"
        " WHERE generation_id > ?{upto} ORDER BY generation_id, created_at, rowid",
    ),
    (
        "posts",
        "SELECT id, generation_id, seq, kind, content, message_id, reason, stump_id, refused FROM posts"
        " WHERE generation_id > ?{upto} ORDER BY generation_id, seq",
    ),
]
# The blocks of the batch's attempts, by their ids (seeks on the blocks' primary key, in its order).
_BLOCKS = (
    "SELECT attempt_id, idx, type, content, chars, text_offset FROM attempt_blocks WHERE attempt_id IN ({marks})"
    " ORDER BY attempt_id, pos"
)
_ATTACHMENTS = "SELECT * FROM attachments WHERE generation_id > ?{upto} ORDER BY generation_id, rowid"
_CALLS = (
    "SELECT generation_id, round, pos, attempt_id, name, is_error FROM tool_calls"
    " WHERE generation_id > ?{upto} ORDER BY generation_id, round, pos"
)


async def check(ledger: Ledger) -> Report:
    """Read the whole ledger once and check it; linear in its size, in memory bounded by a batch.

    The chain's lines come first (the first broken entry first), then the invariants. On a long ledger
    kept in a file the work is shared among processes, one per core (`PARALLEL_FROM`): this one and
    workers. Each first checks some of the chain's parts, then takes ranges of generations (`CHUNK`
    each) from one queue until none is left, so all finish together on any machine; the report is the
    same as one pass."""
    db, path = ledger.db, ledger.path
    count = list(await db.execute_fetchall("SELECT count(*) FROM generations"))[0][0]
    procs = min(os.cpu_count() or 1, 4)
    pre: _Prelude = await db.run(_prelude)  # on the connection's thread, in one trip
    if path is None or path == ":memory:" or count < max(PARALLEL_FROM, 1) or procs < 2:
        links = await chain.check(db)
        parts = [await db.run(_generations, "", None, pre)]
    else:
        top = (await chain.head(db))[0]
        own = _deal(procs)
        ranges = await _Ranges.of(db)
        workers = [_Worker(path, top, own[k]) for k in range(1, procs)]
        shares = [asyncio.ensure_future(asyncio.to_thread(_share_here, path, top, own[0], ranges, pre))]
        shares += [asyncio.ensure_future(w.run(ranges)) for w in workers]
        # This process's share holds the interpreter while it checks; the loop that hands a worker its
        # next range waits for it up to the switch interval (5 ms by default: a worker idle that long
        # each range). Shorter while the shares run.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, 0.0005))
        try:
            results = await asyncio.gather(*shares)
        except BaseException:
            ranges.close()  # one share failed (or this was cancelled): the others stop with it
            for task in shares:
                task.cancel()
            await asyncio.gather(*shares, return_exceptions=True)
            raise
        finally:
            sys.setswitchinterval(switch)
            await asyncio.gather(*(w.close() for w in workers))
        found: dict[int, Any] = {}
        for mine, (of_parts, _) in zip(own, results, strict=True):
            found.update(zip(mine, of_parts, strict=True))
        # each range's findings in the order of the ranges, whichever process checked it
        parts = [part for _, part in sorted((p for _, done in results for p in done), key=lambda p: p[0])]
        links = await db.run(chain.finish, top, [found[i] for i in range(chain.WALK_PART)], found[chain.WALK_PART])
    rep = await _assemble(db, pre, parts)
    rep.violations[:0] = links.violations  # the first broken entry first, ahead of the invariants
    rep.chain_entries, rep.chain_head = links.entries, links.head
    return rep


# A ledger of this many generations, kept in a file, is checked by one process per core; they take its
# generations this many at a time.
PARALLEL_FROM = 50_000
CHUNK = 4_000
# What the chain's parts (attempt, generation, stump, post, delivered, walk) cost, one against another,
# as measured on a ledger of the field's proportions: only how they are dealt depends on it.
_KIND_COST = {"attempt": 1.1, "generation": 0.9, "stump": 0.12, "post": 0.72, "delivered": 0.3}
_PART_COST = {i: _KIND_COST[kind] for i, (kind, _) in enumerate(chain.RECORDS)} | {chain.WALK_PART: 1.1}


def _deal(procs: int) -> list[list[int]]:
    """The chain's parts among the processes (this one first), dearest first to the least loaded."""
    load = [0.0] * procs
    own: list[list[int]] = [[] for _ in range(procs)]
    for i in sorted(_PART_COST, key=lambda i: -_PART_COST[i]):
        k = load.index(min(load))
        own[k].append(i)
        load[k] += _PART_COST[i]
    return own


class _Ranges:
    """The generations in ranges of ids of `CHUNK` each, handed out in order: ("", id1], (id1, id2], ...,
    (idN, None) (open-ended), so together they are every id (and every record's generation id). The
    bounds are read once, first (one walk of the ids' index), so handing one out waits for nothing; the
    threads and tasks of `check` take them under a lock."""

    def __init__(self, bounds: list[str]) -> None:
        self._spans = list(zip(["", *bounds], [*bounds, None], strict=True))
        self._spans.reverse()
        self._lock = threading.Lock()

    @classmethod
    async def of(cls, db: Any) -> _Ranges:
        return cls(await db.run(_bounds))  # on the connection's thread, in one trip

    def next(self) -> tuple[str, str | None] | None:
        with self._lock:
            return self._spans.pop() if self._spans else None

    def close(self) -> None:
        """No more ranges for anyone (a share failed: the others stop at their next range)."""
        with self._lock:
            self._spans.clear()


def _bounds(conn: sqlite3.Connection) -> list[str]:
    """Every `CHUNK`th generation id: each a step of the ids' index inside SQLite (`OFFSET` skips without
    making a row), so the bounds of a million generations take milliseconds, before any share begins."""
    out: list[str] = []
    while got := conn.execute(_NEXT_BOUND, (out[-1] if out else "", CHUNK - 1)).fetchall():
        out.append(got[0][0])
    return out


_NEXT_BOUND = "SELECT id FROM generations WHERE id > ? ORDER BY id LIMIT 1 OFFSET ?"
_Share = tuple[list[Any], list[tuple[str, "_Part"]]]  # the chain parts' results, each range's (lo, findings)


def _read_only(path: str) -> sqlite3.Connection:
    """A read-only connection to the ledger in one read transaction: its share sees one state of the
    ledger, however the ledger moves while it is checked."""
    conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)
    conn.execute("BEGIN")
    return conn


def _share_here(path: str, top: int, own: list[int], ranges: _Ranges, pre: _Prelude) -> _Share:
    """This process's share, in a thread of its own on a connection of its own: its chain parts, then
    ranges until none is left."""
    conn = _read_only(path)
    try:
        of_parts = [chain.part(conn.cursor(), top, i) for i in own]
        done = []
        while (span := ranges.next()) is not None:
            done.append((span[0], _generations(conn, *span, pre)))
        return of_parts, done
    finally:
        conn.close()


class _Worker:
    """A worker process of `check`: a fresh interpreter (nothing of this process, its threads or its main
    module is inherited) on a read-only connection of its own. It checks its chain parts, then each range
    it is sent; every answer comes back as one frame: its length (8 bytes), then its pickle. What it
    says on stderr goes to a file (a pipe nobody reads would stop it once full)."""

    def __init__(self, path: str, top: int, own: list[int]) -> None:
        self.args = (path, str(top), ",".join(map(str, own)))
        self.proc: asyncio.subprocess.Process | None = None
        self.err = tempfile.TemporaryFile()

    async def run(self, ranges: _Ranges) -> _Share:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",  # the working folder is not on the path: a `bot.py` or `residents.py` there shadows nothing
            "-c",
            "from residents.ledger.verify import _worker; _worker()",
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.err,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            of_parts: list[Any] = await self._answer()
            done: list[tuple[str, _Part]] = []
            while (span := ranges.next()) is not None:
                self.proc.stdin.write(_frame(span))
                await self.proc.stdin.drain()
                done.append((span[0], await self._answer()))
            self.proc.stdin.close()
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise await self._failed() from e
        if await self.proc.wait() != 0:
            raise await self._failed()
        return of_parts, done

    async def _answer(self) -> Any:
        assert self.proc is not None and self.proc.stdout is not None
        size = int.from_bytes(await self.proc.stdout.readexactly(8), "big")
        return pickle.loads(await self.proc.stdout.readexactly(size))

    async def _failed(self) -> LedgerError:
        assert self.proc is not None
        status: int | None
        try:
            status = await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            await self.close()
            status = self.proc.returncode
        self.err.seek(0)
        said = self.err.read()[-4000:].decode(errors="replace").strip().splitlines()
        why = said[-1] if said else f"it ended with status {status} and said nothing"
        return LedgerError(f"{self.args[0]}: a worker process checking the ledger failed: {why[-300:]}")

    async def close(self) -> None:
        """The process ended (killed if it still runs) and waited for; its stderr file closed."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.err.close()


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """While a process only checks: what it reads makes no reference cycles, so the cyclic garbage
    collector runs rarely (every 20,000 new objects, not 700) and never looks at what existed before;
    as it was afterwards."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def _frame(value: Any) -> bytes:
    data = pickle.dumps(value)
    return len(data).to_bytes(8, "big") + data


def _worker() -> None:
    """A worker process of `check`: argv PATH TOP PARTS; ranges (lo, hi) as frames on stdin until it closes."""
    path, top, own = sys.argv[1:4]
    conn = _read_only(path)
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    with few_collections(), contextlib.closing(conn):
        pre = _prelude(conn)
        out.write(_frame([chain.part(conn.cursor(), int(top), int(i)) for i in own.split(",") if i]))
        out.flush()
        while head := inp.read(8):
            lo, hi = pickle.loads(inp.read(int.from_bytes(head, "big")))
            out.write(_frame(_generations(conn, lo, hi, pre)))
            out.flush()


async def _assemble(db: Any, pre: _Prelude, parts: list[_Part]) -> Report:
    """The ranges' findings in one report: records of missing generations, posts of none, published
    stumps, each generation's lines oldest first, then attachments."""
    rep = Report()
    orphans: list[str] = []
    for p in await db.execute_fetchall("SELECT * FROM posts WHERE generation_id IS NULL ORDER BY seq"):
        _check_line(orphans, dict(p))  # notices about no generation (a declined /continue)
        if p["kind"] != "notice":
            orphans.append(f"post {p['id']}: a {p['kind']} post with no generation")
    by_order: list[tuple[float, int, list[str]]] = []
    unsettled: list[tuple[float, int, str]] = []
    missing: list[str] = []
    attached: list[str] = []
    for part in parts:
        missing += part.missing
        by_order += part.by_order
        unsettled += part.unsettled
        attached += part.attached
        rep.generations += part.generations
        rep.undelivered += part.undelivered
    rep.violations += missing + orphans + pre.lines
    for _, _, lines in sorted(by_order, key=lambda f: (f[0], f[1])):
        rep.violations += lines
    rep.unsettled = [gid for _, _, gid in sorted(unsettled)]
    rep.violations += attached
    return rep


@dataclass
class _Prelude:
    """What checking any generation needs to know of the ledger as a whole (small: a few rows)."""

    shown_live: set[str]  # stumps whose text a live message showed and then set aside
    chunks: dict[str, int]  # streamed chunks left per attempt
    lines: list[str]  # what the posts publishing a stump at its resident's request violate
    recovered: set[str]  # stumps whose recovered posts were delivered


def _prelude(conn: sqlite3.Connection) -> _Prelude:
    db = conn.cursor()
    db.row_factory = sqlite3.Row

    def rows(sql: str, *a: Any) -> list[Any]:
        return db.execute(sql, a).fetchall()

    # A retried attempt's text shown live (`delivery.live`) is published: its stump says so, and only it may.
    shown_live = {r[0] for r in rows("SELECT DISTINCT stump_id FROM live_messages WHERE state='set-aside'")}
    chunks = {r[0]: r[1] for r in rows("SELECT attempt_id, count(*) FROM attempt_chunks GROUP BY attempt_id")}
    # posts publishing a stump at its resident's request are checked with that stump, not as the
    # publishing generation's own text and boundary lines
    # (read by the partial index on stump_id, then put in the order they were written)
    got = rows("SELECT rowid AS written, * FROM posts WHERE stump_id IS NOT NULL")
    published = [dict(r) for r in sorted(got, key=lambda r: r["written"])]
    named = sorted({p["stump_id"] for p in published})
    stumps: dict[str, dict[str, Any]] = {}
    for i in range(0, len(named), 500):
        part = named[i : i + 500]
        marks = ",".join("?" * len(part))
        for r in rows(f"SELECT * FROM stumps WHERE id IN ({marks})", *part):
            stumps[r["id"]] = dict(r)
    lines: list[str] = []
    _check_recovered(lines, stumps, published)
    recovered = {sid for sid, st in stumps.items() if st.get("recovered")}
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


def _generations(conn: sqlite3.Connection, lo: str, hi: str | None, pre: _Prelude) -> _Part:
    """Every generation with an id in (lo, hi] (hi None: no end) and its records, a batch at a time."""
    out = _Part()
    recovered = pre.recovered
    while True:
        gens, of, blocks, calls, attachment_rows = _batch(conn, lo, hi)
        known = {g["id"] for g in gens}
        for gid in sorted(set().union(*of.values()) - known):
            for table, rows in of.items():
                out.missing += [
                    f"{table[:-1]} {i.get('id') or i.get('idx')}: belongs to missing generation {gid}"
                    for i in rows.get(gid, ())
                ]
        attempts_of, segments_of, stumps_of, posts_of = of["attempts"], of["segments"], of["stumps"], of["posts"]
        for g in gens:
            gid = g["id"]
            attempts, segments = attempts_of.get(gid) or [], segments_of.get(gid) or []
            stumps, posts = stumps_of.get(gid) or [], posts_of.get(gid) or []
            for st in stumps:
                st["shown_live"] = st["id"] in pre.shown_live
                st["recovered"] = st["id"] in recovered
            own = []
            for p in posts:
                if p["message_id"] is None and p["refused"] is None:  # a refused post is set aside, not waiting
                    out.undelivered += 1
                if p["stump_id"] is None:
                    own.append(p)
            its_calls = calls.get(gid) or []
            rounds = round_finals(attempts, its_calls)
            found: list[str] = []
            pending: list[str] = []
            _check_generation(found, pending, g, attempts, segments, stumps, own, pre.chunks, rounds)
            _check_blocks(found, g, attempts, segments, stumps, blocks)
            check_tool_calls(found, g, attempts, its_calls)
            if found:
                out.by_order.append((g["created_at"], g["rowid"], found))
            out.unsettled += [(g["created_at"], g["rowid"], p) for p in pending]
        check_attachments(out.attached, attachment_rows, known)
        out.generations += len(gens)
        if len(gens) < BATCH:
            return out
        lo = gens[-1]["id"]


_Rows = list[dict[str, Any]]


def _batch(
    conn: sqlite3.Connection, lo: str, hi: str | None = None
) -> tuple[_Rows, dict[str, dict[str, _Rows]], dict[str, _Rows], dict[str, _Rows], _Rows]:
    """The next `BATCH` generations after id `lo` (up to `hi`) and their records: each table's rows by
    generation id (blocks by attempt id), as dicts made straight from tuples (sqlite3.Row looks each
    column up by name). The records are read up to the batch's last id, or, for the range's last
    batch, up to `hi` (or all that follow), so a record whose generation is missing is found by the
    range it falls in."""
    db = conn.cursor()
    db.row_factory = None

    def fetch(sql: str, *params: Any) -> _Rows:
        got = db.execute(sql, params).fetchall()
        cols = [sys.intern(d[0]) for d in db.description or ()]  # (so each look-up by name is one compare)
        return list(map(dict, map(zip, itertools.repeat(cols), got)))  # (the cursor's own columns)

    bounded = hi is not None
    gens = fetch(_GENS.format(upto=" AND id <= ?" if bounded else ""), *((lo, hi, BATCH) if bounded else (lo, BATCH)))
    last = len(gens) < BATCH
    end = hi if last else gens[-1]["id"]
    upto = "" if end is None else " AND generation_id <= ?"
    span: tuple[str, ...] = (lo,) if end is None else (lo, end)
    of = {table: _grouped(fetch(sql.format(upto=upto), *span), _BY_GENERATION) for table, sql in _OF}
    attempt_ids = list(map(_ID, itertools.chain.from_iterable(of["attempts"].values())))
    blocks: dict[str, _Rows] = {}
    for i in range(0, len(attempt_ids), 500):
        ids = attempt_ids[i : i + 500]
        blocks |= _grouped(fetch(_BLOCKS.format(marks=",".join("?" * len(ids))), *ids), _BY_ATTEMPT)
    calls = _grouped(fetch(_CALLS.format(upto=upto), *span), _BY_GENERATION)
    return gens, of, blocks, calls, fetch(_ATTACHMENTS.format(upto=upto), *span)


_ID = operator.itemgetter("id")
_BY_GENERATION = operator.itemgetter("generation_id")
_BY_ATTEMPT = operator.itemgetter("attempt_id")


def _grouped(rows: _Rows, key: Any) -> dict[str, _Rows]:
    """Rows read in order of `key` (each query's ORDER BY), as lists by key."""
    return {k: list(g) for k, g in itertools.groupby(rows, key)}


@functools.cache
def _status_by_rule(stop_reason: str | None) -> str:
    """residents.truth's rule from a stop reason to a status (the same few answers for every generation)."""
    return truth.status_of_outcome(truth.outcome_of_stop(stop_reason))


def _check_generation(
    v: list[str],
    unsettled: list[str],
    g: dict[str, Any],
    attempts: list[dict[str, Any]],
    segments: list[dict[str, Any]],
    stumps: list[dict[str, Any]],
    posts: list[dict[str, Any]],
    chunks: dict[str, int],
    rounds: list[str] | None = None,
) -> None:
    """`rounds`: a generation with tool calls, the last attempt of each round (its text is theirs joined)."""
    gid, status = g["id"], g["status"]
    text = dec(g["text"])
    where = f"generation {gid}"
    for a in attempts:
        a["text"] = dec(a["text"])
        if a["outcome"] != "streaming":
            if chunks.get(a["id"]):
                v.append(
                    f"attempt {a['id']} ({where}): settled ({a['outcome']}) but {chunks[a['id']]} streamed "
                    "chunk(s) left in attempt_chunks"
                )
            if a["chars"] != len(a["text"]):
                v.append(f"attempt {a['id']} ({where}): chars {a['chars']} != {len(a['text'])} characters of text")
    for s in stumps:
        s["text"] = dec(s["text"])
        if s["chars"] != len(s["text"]):
            v.append(f"stump {s['id']} ({where}): chars {s['chars']} != {len(s['text'])} characters of text")
    for p in posts:
        p["content"] = dec(p["content"])
    if status == "pending":
        unsettled.append(gid)
        return
    if status not in SETTLED:
        v.append(f"{where}: unknown status {status!r}")
        return
    if g["chars"] != len(text):
        v.append(f"{where}: chars {g['chars']} != {len(text)} characters of text")
    # The status follows from the stop reason by bot.truth's rule (a tool stop the loop did not go on
    # from, or the tool round limit, is incomplete); a failed generation stopped for no reason of the model's.
    expected = "failed" if status == "failed" and g["stop_reason"] is None else _status_by_rule(g["stop_reason"])
    if status != expected:
        v.append(f"{where}: status {status} with stop reason {g['stop_reason']!r} (the rule gives {expected})")
    for a in attempts:
        if a["outcome"] == "streaming":
            v.append(f"attempt {a['id']} ({where}): still streaming in a settled generation")
    _check_texts_kept(v, where, text, g["stop_reason"], attempts, segments, stumps, rounds)
    _check_output_stump(v, where, g, text, stumps, posts)
    _check_posts(v, where, g, text, attempts, segments, stumps, posts, rounds)


def _check_blocks(
    v: list[str],
    g: dict[str, Any],
    attempts: list[dict[str, Any]],
    segments: list[dict[str, Any]],
    stumps: list[dict[str, Any]],
    blocks: dict[str, list[dict[str, Any]]],
) -> None:
    """An attempt's text is its text blocks joined; a block stump is its block's content; the non-text
    block a cut attempt stopped in is kept as a stump."""
    where = f"generation {g['id']}"
    final = segments[-1]["attempt_id"] if segments else None
    for a in attempts:
        own = blocks.get(a["id"], [])
        if a["outcome"] == "streaming" or not own:
            continue  # a ledger from before blocks were kept has none
        recs = [Block(b["idx"], b["type"], dec(b["content"])) for b in own]
        for b, rec in zip(own, recs, strict=False):
            if b["chars"] != rec.chars:
                v.append(f"attempt {a['id']} ({where}): block {b['idx']} chars {b['chars']} != {rec.chars}")
        if join_text(recs) != a["text"]:
            v.append(f"attempt {a['id']} ({where}): text is not its text blocks joined")
        for b, rec in zip(own, recs, strict=False):
            if rec.is_text and b["text_offset"] != rec.offset:
                v.append(
                    f"attempt {a['id']} ({where}): text block {b['idx']} span starts at {b['text_offset']}, "
                    f"not {rec.offset}"
                )
        cut = recs[-1] if not recs[-1].is_text and recs[-1].content else None
        due = a["outcome"] == "abandoned" or (a["id"] == final and g["status"] not in ("completed", "pending"))
        held = [s for s in stumps if s["scope"] == "block" and s["attempt_id"] == a["id"]]
        for s in held:
            match = [r for r in recs if r.index == s["block"]]
            if not match or match[0].content != s["text"]:
                v.append(f"stump {s['id']} ({where}): not the content of block {s['block']} of attempt {a['id']}")
        if cut is not None and due and not any(s["block"] == cut.index for s in held):
            v.append(
                f"attempt {a['id']} ({where}): stopped inside {cut.type} block {cut.index} "
                f"({cut.chars} characters), which is kept as no stump"
            )


def _check_texts_kept(
    v: list[str],
    where: str,
    text: str,
    g_stop: str | None,
    attempts: list[dict[str, Any]],
    segments: list[dict[str, Any]],
    stumps: list[dict[str, Any]],
    rounds: list[str] | None = None,
) -> None:
    """Every attempt's text is either part of the canonical text (as a segment) or a stump, exactly.

    With tool `rounds`, the one segment is the rounds' text joined, up to its attempt's round."""
    by_id = {a["id"]: a for a in attempts}
    in_segment: set[str] = set()
    offset = 0
    for s in segments:
        a = by_id.get(s["attempt_id"])
        if a is None:
            v.append(f"{where}: segment {s['idx']} names unknown attempt {s['attempt_id']}")
            continue
        in_segment.add(a["id"])
        added = a["text"][s["overlap_removed"] :]
        if rounds and s["idx"] == 1:
            added, used = joined_upto(attempts, rounds, a["id"])
            in_segment |= used
        if s["chars"] != len(added) or text[offset : offset + s["chars"]] != added:
            v.append(f"{where}: segment {s['idx']} (attempt {a['id']}) is not the canonical text at char {offset}")
        offset += s["chars"]
    if segments and offset != len(text):
        v.append(f"{where}: segments add up to {offset} characters, text has {len(text)}")
    if not segments and text:
        v.append(f"{where}: {len(text)} characters of text but no segment")
    for a in attempts:
        if a["outcome"] == "abandoned":
            if a["discard_reason"] != truth.RETRY_ABANDONED:
                v.append(f"attempt {a['id']} ({where}): abandoned with discard reason {a['discard_reason']!r}")
            if a["replaced_by"] is None and g_stop != truth.INTERRUPTED:  # a stop may come before the retry
                v.append(f"attempt {a['id']} ({where}): abandoned but replaced by no attempt")
            if a["id"] in in_segment:
                v.append(f"attempt {a['id']} ({where}): abandoned text spliced into the canonical text")
        if not a["text"] or a["outcome"] == "streaming":
            continue
        own = [s for s in stumps if s["attempt_id"] == a["id"] and s["scope"] == "attempt"]
        if a["outcome"] == "abandoned":
            match = [s for s in own if s["cause"] == truth.RETRY_ABANDONED]
            if len(match) != 1:
                v.append(
                    f"attempt {a['id']} ({where}): abandoned with {len(a['text'])} characters but "
                    f"{len(match)} retry-abandoned stumps"
                )
            for s in match:
                if s["text"] != a["text"]:
                    v.append(f"stump {s['id']} ({where}): text differs from abandoned attempt {a['id']}")
                if (
                    s["published"] and not s.get("recovered") and not s.get("shown_live")
                ):  # published only at its resident's request, or shown live
                    v.append(f"stump {s['id']} ({where}): retry-abandoned text marked published")
                if s.get("shown_live") and not s["published"]:
                    v.append(f"stump {s['id']} ({where}): retry-abandoned text shown live but not marked published")
        elif a["id"] not in in_segment and not any(s["text"] == a["text"] for s in own):
            v.append(
                f"attempt {a['id']} ({where}): {len(a['text'])} characters neither in the canonical text "
                "nor kept as a stump"
            )


def _check_output_stump(
    v: list[str], where: str, g: dict[str, Any], text: str, stumps: list[dict[str, Any]], posts: list[dict[str, Any]]
) -> None:
    """A non-completed text stands as exactly one output stump, with the right cause and published flag."""
    standing = [s for s in stumps if s["scope"] == "output" and s["replaced_by"] is None]
    cause = truth.stump_cause(g["status"], g["stop_reason"])
    if cause is None or not text:
        if standing:
            v.append(
                f"{where}: {g['status']} with {'no text' if not text else 'no stump cause'} but "
                f"{len(standing)} standing output stump(s)"
            )
        return
    if len(standing) != 1:
        v.append(f"{where}: {g['status']} text of {len(text)} characters has {len(standing)} standing output stumps")
        return
    s = standing[0]
    if s["text"] != text:
        v.append(f"stump {s['id']} ({where}): output stump text differs from the canonical text")
    if s["cause"] != cause:
        v.append(f"stump {s['id']} ({where}): cause {s['cause']!r}, expected '{cause}'")
    text_posts = [p for p in posts if p["kind"] in TEXT_KINDS]
    some = any(p["message_id"] is not None for p in text_posts)
    every = bool(text_posts) and all(p["message_id"] is not None for p in text_posts)
    if s["published"] and not some:
        v.append(f"stump {s['id']} ({where}): marked published but no text post of it was delivered")
    if every and not s["published"]:
        v.append(f"stump {s['id']} ({where}): its text posts were delivered but it is not marked published")


def _check_posts(
    v: list[str],
    where: str,
    g: dict[str, Any],
    text: str,
    attempts: list[dict[str, Any]],
    segments: list[dict[str, Any]],
    stumps: list[dict[str, Any]],
    posts: list[dict[str, Any]],
    rounds: list[str] | None = None,
) -> None:
    status = g["status"]
    # Each /continue that reached the provider is one more settlement with its own posts and receipt;
    # bounded continuation happens inside the first settlement. Tool rounds are never continued.
    calls = (
        sum(1 for a in attempts if a["segment"] > 1 and a["idx"] == 1)
        if g["standing"] == "on-request" and not rounds
        else 0
    )
    if len({p["seq"] for p in posts}) != len(posts):
        v.append(f"{where}: duplicate post seq numbers")
    text_posts, receipts, boundary_notices, kinds = [], [], [], set()
    for p in posts:
        _check_line(v, p, where)
        kind = p["kind"]
        kinds.add(kind)
        if kind in TEXT_KINDS:
            text_posts.append(p)
        elif kind == "receipt":
            receipts.append(p)
        elif kind == "notice" and p["reason"] not in _SIDE_NOTICES:
            boundary_notices.append(p)
    if status != "completed" and "speech" in kinds:
        v.append(f"{where}: speech post for a {status} generation")
    if status == "completed" and calls == 0 and "partial" in kinds:
        v.append(f"{where}: partial post for a generation completed in one settlement")
    if status == "refused":
        if text_posts:
            v.append(f"{where}: refused text posted ({len(text_posts)} {text_posts[0]['kind']} post(s))")
        if receipts:
            v.append(f"{where}: refused generation has {len(receipts)} receipt(s)")
        if len(boundary_notices) != 1:
            v.append(f"{where}: refused generation has {len(boundary_notices)} notices of the refusal, expected 1")
        return
    problem = _cover(text, [p["content"] for p in text_posts])
    if problem:
        v.append(f"{where}: text posts do not cover the text exactly once: {problem}")
    # The first settlement's boundary line: a receipt after posted text; where no text could be posted
    # (none, or only whitespace) the line still stands, alone. Each /continue adds one receipt.
    first_text = text[: segments[0]["chars"]] if calls and segments else text
    first_status = "truncated" if calls else status
    due = first_status in CUT or (first_status == "completed" and len(segments) > 1)
    visible = bool(first_text.strip())
    want = (1 if due else 0) + calls
    found = len(receipts) + len(boundary_notices)
    # A refused provider key: the room hears of it at most once per channel per window (delivery.keys),
    # so such a failure with nothing to post may stand with no line at all.
    withheld = (
        status == "failed"
        and not visible
        and not calls
        and not receipts
        and not boundary_notices
        and bool(attempts)
        and truth.key_rejected(attempts[-1]["error"])
    )
    # So may each /continue whose segment was refused for the key (the notice, if any, is a side line).
    keyless = (
        sum(1 for a in attempts if a["segment"] > 1 and a["outcome"] == "failed" and truth.key_rejected(a["error"]))
        if calls
        else 0
    )
    if not want - keyless <= found <= want and not withheld:
        what = f"{status} generation" + (f" with {calls} continuation(s) on request" if calls else "")
        v.append(
            f"{where}: {len(receipts)} receipt(s) and {len(boundary_notices)} boundary notice(s) for a {what}"
            f" with {'posted' if visible else 'no visible'} text, expected {want} boundary line(s)"
        )
    elif visible and boundary_notices:
        v.append(f"{where}: {len(boundary_notices)} boundary notice(s) after posted text, where a receipt is due")


def _check_line(v: list[str], p: dict[str, Any], about: str | None = None) -> None:
    """Posts fit a Discord message; receipts and notices are compact and never in the second person.
    Lines name the post (and `about`: its generation or stump), named only when one is found."""
    content = p["content"] if isinstance(p["content"], str) else dec(p["content"])
    kind = p["kind"]
    found = []
    if len(content) > LIMIT:
        found.append(f"{len(content)} characters, over the {LIMIT:,} limit")
    if kind in ("receipt", "notice"):
        line = content[len(RECEIPT_PREFIX) :] if content.startswith(RECEIPT_PREFIX) else content
        if len(line) > truth.MAX_LINE:
            found.append(f"{kind} of {len(line)} characters, over {truth.MAX_LINE}")
        if _SECOND_PERSON.search(line):
            found.append(f"{kind} addresses someone in the second person")
    elif kind not in TEXT_KINDS and kind != "recovered":
        found.append(f"unknown post kind {kind!r}")
    reason = p.get("reason")
    if reason is not None and kind not in _REASON_KINDS.get(reason, ()):
        found.append(f"a {kind} post with reason {reason!r}")
    if found:
        who = f"post {p['id']}" + (f" ({about})" if about else "")
        v += [f"{who}: {what}" for what in found]


def _cover(text: str, contents: list[str]) -> str | None:
    """None when the contents, in order, are the text's pieces with only whitespace between and around.

    A piece may carry one added fence line at its start (reopening a block a split cut) and/or one at
    its end (closing it), and a `\\` before a line's leading `-# `, as the delivery planner writes
    them. Where a fence line could be either the text's own or an added one, both readings are
    followed (a set of reachable positions), so the check never rejects a split by guessing wrong.
    """
    if "".join(contents) == text:
        for c in contents:
            if not c or "\\-# " in c or len(_bodies(c)) > 1:
                break
        else:  # the pieces end to end, none of them empty or readable another way (the usual case):
            return None  # every position the reading reaches is at or past the exact one, which it ends at
    return _cover_by_reading(text, contents)


def _cover_by_reading(text: str, contents: list[str]) -> str | None:
    """`_cover` by following every reading of every piece."""
    reach = {0}
    for i, c in enumerate(contents, 1):
        nxt: set[int] = set()
        for pos in reach:
            start = pos
            while start < len(text) and text[start].isspace():
                start += 1
            nxt |= _matches(text, pos, start, c)
        if not nxt:
            return f"text post {i} is not the next piece of the text (at character {min(reach)})"
        reach = set(sorted(nxt)[:64])
    if not any(not text[pos:].strip() for pos in reach):
        pos = max(reach)
        return f"characters {pos}..{len(text)} were never posted"
    return None


def _matches(text: str, pos: int, start: int, content: str) -> set[int]:
    """Where the text may continue after `content`, placed anywhere in the whitespace run pos..start."""
    out = set()
    for body, added in _bodies(content):
        if not (body or added):
            continue
        for j in range(pos, start + 1):  # a piece inside a code block may begin with its own indentation
            if text.startswith(body, j):
                out.add(j + len(body))
            elif "\\-# " in body:
                end = _escaped_at(text, j, body)
                if end is not None:
                    out.add(end)
    return out


def _escaped_at(text: str, j: int, body: str) -> int | None:
    """Where `body` ends in the text at `j`, reading a `\\` before a line's leading `-# ` as added.

    The planner escapes such lines so only receipts and notices render as subtext
    (`residents.text.escape_subtext`); the text keeps its exact form. Deterministic: where the text itself
    has the `\\`, it matches as text, and an added one can only stand before a `-#` of the text.
    """
    i, n = j, len(text)
    for k, ch in enumerate(body):
        if i < n and text[i] == ch:
            i += 1
        elif (
            ch == "\\"
            and (k == 0 or body[k - 1] == "\n")
            and body.startswith("-# ", k + 1)
            and text.startswith("-# ", i)
        ):
            continue
        else:
            return None
    return i


def _bodies(content: str) -> list[tuple[str, bool]]:
    """The content as posted, then with an added reopening and/or closing fence line taken off (each
    line looked at is sliced off alone: the usual post, with neither, is not copied)."""
    out = [(content, False)]
    head = None
    if "\n" in content and FENCE_LINE.match(content[: content.index("\n")]):
        head = content[content.index("\n") + 1 :]
        out.append((head, True))
    for c in (content, head):
        if c is not None and "\n" in c and FENCE_LINE.match(c[c.rindex("\n") + 1 :]):
            out.append((c[: c.rindex("\n")], True))
    if head is not None and FENCE_LINE.match(head):  # a chunk that is only a reopened and closed fence
        out.append(("", True))
    return out


def _check_recovered(v: list[str], stumps: dict[str, dict[str, Any]], posts: list[dict[str, Any]]) -> None:
    """Posts that publish a stump: its text exactly once as `recovered` posts, then one receipt, nothing else."""
    by_stump: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in posts:
        by_stump[p["stump_id"]].append(p)
    published = set()
    for sid, ps in by_stump.items():
        ps.sort(key=lambda p: (p["generation_id"] or "", p["seq"]))
        who = f"stump {sid}"
        for p in ps:
            p["content"] = dec(p["content"])
            _check_line(v, p, who)
        s = stumps.get(sid)
        if s is None:
            v.append(f"{who}: published by {len(ps)} post(s) but no such stump")
            continue
        if s["scope"] != "attempt":
            v.append(f"{who}: a {s['scope']} stump published as recovered text; only set-aside text is")
        kinds = [p["kind"] for p in ps]
        if kinds.count("receipt") != 1 or kinds[-1] != "receipt" or set(kinds[:-1]) != {"recovered"}:
            v.append(f"{who}: published as {kinds}, not recovered posts followed by one receipt")
        if len({p["generation_id"] for p in ps}) != 1:
            v.append(f"{who}: published by posts of more than one generation")
        problem = _cover(dec(s["text"]), [p["content"] for p in ps if p["kind"] == "recovered"])
        if problem:
            v.append(f"{who}: recovered posts are not its text exactly once: {problem}")
        delivered = [p for p in ps if p["kind"] == "recovered" and p["message_id"] is not None]
        if delivered:
            published.add(sid)
        if delivered and not s["published"]:
            v.append(f"{who}: its recovered posts were delivered but it is not marked published")
    for sid, s in stumps.items():
        s["recovered"] = sid in published
