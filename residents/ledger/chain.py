"""The ledger's hash chain: every settled record appended as an entry whose hash covers the entry before.

Why: the ledger is the only memory of what a resident emitted; a witness who sees a post, and an
auditor given an export, should be able to check that the ledger was not rewritten afterwards.

An entry is a JSON object of hashes and metadata, never text (an export reveals no stump text):

- `generation` — a settlement (again at each /continue): status, stop reason, counts, SHA-256 of the
  canonical text, its segments;
- `attempt` — a settled provider call: outcome, stop or discard reason, error kind, counts, SHA-256 of
  its text and of each content block (reasoning and tool input included, by hash only);
- `stump` — a stump as stored: cause, scope, counts, SHA-256 of its text;
- `post` — a planned post: kind, seq, SHA-256 of its content as stored (`content_sha256`) and, where a
  lone surrogate left as U+FFFD, of the content as sent (`sent_sha256`);
- `delivered` — the message id a post got;
- `refused` — a post set aside because the room refused it try after try: the HTTP status, Discord's
  error code and the SHA-256 of the refusal as the ledger keeps it (`posts.refused`); never delivered after;
- `genesis` — first on a ledger that had records before the chain: the `backfill` entries after it
  were written from those records when the chain began.

Every entry has `kind`, `at` (milliseconds since the epoch when appended) and the record's id.

The algorithm (docs/provenance.md has it in a few lines of Python):

    canonical(x) = json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    hash(n)      = sha256(canonical({"entry": entry(n), "prev": hash(n-1), "seq": n})).hexdigest()
    hash(0)      = "0" * 64

Text is hashed as its exact bytes in the ledger: UTF-8, lone surrogates passed through
(`str.encode("utf-8", "surrogatepass")`). An export is one line per entry,
`canonical({"entry", "hash", "prev", "seq"})` + "\\n", so one changed byte anywhere fails the check.

Appending: `append(kind, record, payload)` returns one `(sql, params)` INSERT to put in the same
transaction as the change it records (`Ledger._tx`), so a crash never leaves a record without its
entry or an entry without its record. The INSERT reads the head itself, under the transaction's
write lock; the hash is computed by `chain_hash`, a function `install` registers on the connection.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import sqlite3
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import Attempt, Block, Generation, Post, Refusal, Segment, Stump
from ..text import outbound
from .connection import Connection

log = logging.getLogger(__name__)

GENESIS_PREV = "0" * 64
Statement = tuple[str, tuple[Any, ...]]
RECORD_KINDS = ("generation", "attempt", "stump", "post", "delivered", "refused", "stump-access", "stump-read")


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def canonical(obj: Any) -> str:
    """The one serialisation that is hashed: sorted keys, no spaces, every non-ASCII character escaped."""
    return _CANONICAL.encode(obj)


def sha256_text(text: str | bytes) -> str:
    """SHA-256 of a text's exact bytes as the ledger stores them (UTF-8, lone surrogates passed through)."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def sent_sha256(content: str) -> str:
    """SHA-256 of a post as it left for the room (valid UTF-8: lone surrogates as U+FFFD): what a witness sees."""
    return hashlib.sha256(outbound(content)[0].encode("utf-8")).hexdigest()


def entry_hash(seq: int, prev: str, body: str) -> str:
    """hash(n): `body` is the entry's canonical JSON; this is canonical({"entry","prev","seq"}), hashed."""
    return hashlib.sha256(f'{{"entry":{body},"prev":"{prev}","seq":{int(seq)}}}'.encode("ascii")).hexdigest()


def export_line(seq: int, prev: str, body: str, digest: str) -> str:
    """One export line: canonical({"entry","hash","prev","seq"}) (keys in that, sorted, order)."""
    return f'{{"entry":{body},"hash":"{digest}","prev":"{prev}","seq":{int(seq)}}}'


_APPEND = (
    "INSERT INTO chain (seq, kind, record, prev, body, hash) SELECT n, ?, ?, p, b, chain_hash(n, p, b) FROM"
    " (SELECT coalesce((SELECT max(seq) FROM chain), 0) + 1 AS n,"
    " coalesce((SELECT hash FROM chain ORDER BY seq DESC LIMIT 1), printf('%064d', 0)) AS p, ? AS b)"
)


_IF_STREAMING = " WHERE EXISTS (SELECT 1 FROM attempts WHERE id=? AND outcome='streaming')"


async def install(db: Connection) -> None:
    """Register `chain_hash(seq, prev, body)` on a connection; every connection that appends needs it."""
    await db.create_function("chain_hash", 3, entry_hash, deterministic=True)


def append(kind: str, record: str | None, payload: dict[str, Any]) -> Statement:
    """The one INSERT that appends an entry; put it in the transaction of the change it records.

    `payload` holds the entry's own fields (ids, counts, hashes: never text); `kind`, `at` and, for a
    record, `id` (the record id the `record` column repeats) are added.
    """
    entry = {**payload, "kind": kind, "at": int(time.time() * 1000)}
    if record is not None and entry.setdefault("id", record) != record:
        raise ValueError(f"a {kind} entry for {record} names another id: {entry['id']!r}")
    return (_APPEND, (kind, record, canonical(entry)))


# ---------------------------------------------------------------------- entries of records
# One builder per kind, used when a record is written, when old records are backfilled and when
# `verify` rebuilds what each record's latest entry must say: the three can never disagree.


def attempt_payload(a: Attempt) -> dict[str, Any]:
    return {
        "id": a.id,
        "generation_id": a.generation_id,
        "segment": a.segment,
        "index": a.index,
        "outcome": a.outcome,
        "stop_reason": a.stop_reason,
        "discard_reason": a.discard_reason,
        "error": a.error,
        "chars": a.chars,
        "output_tokens": a.output_tokens,
        "text_sha256": sha256_text(a.text),
        "blocks": [
            {"index": b.index, "type": b.type, "chars": b.chars, "sha256": sha256_text(b.content)}
            for b in a.content_blocks()
        ],
    }


def generation_payload(g: Generation) -> dict[str, Any]:
    return {
        "id": g.id,
        "residence": g.residence,
        "channel": g.channel,
        "model": g.model,
        "status": g.status,
        "stop_reason": g.stop_reason,
        "chars": g.chars,
        "output_tokens": g.output_tokens,
        "text_sha256": sha256_text(g.text),
        "standing": g.standing,
        "continuation_ended": g.continuation_ended,
        "segments": [
            {
                "index": s.index,
                "attempt_id": s.attempt_id,
                "stop_reason": s.stop_reason,
                "chars": s.chars,
                "output_tokens": s.output_tokens,
                "overlap_removed": s.overlap_removed,
            }
            for s in sorted(g.segments, key=lambda s: s.index)
        ],
    }


def stump_payload(s: Stump) -> dict[str, Any]:
    return {
        "id": s.id,
        "generation_id": s.generation_id,
        "attempt_id": s.attempt_id,
        "residence": s.residence,
        "scope": s.scope,
        "cause": s.cause,
        "chars": s.chars,
        "output_tokens": s.output_tokens,
        "text_sha256": sha256_text(s.text),
        "block": s.block,
        "block_type": s.block_type,
    }


def post_payload(p: Post) -> dict[str, Any]:
    out = {
        "id": p.id,
        "generation_id": p.generation_id,
        "channel": p.channel,
        "seq": p.seq,
        "post_kind": p.kind,
        "chars": len(p.content),
        "content_sha256": sha256_text(p.content),
    }
    sent = sent_sha256(p.content)
    if sent != out["content_sha256"]:
        out["sent_sha256"] = sent
    return out


def delivered_payload(post_id: str, message_id: str) -> dict[str, Any]:
    return {"id": post_id, "message_id": message_id}


def refused_payload(post_id: str, status: int | None, code: int | None, refused: str) -> dict[str, Any]:
    """A post set aside: the room's status and error code, and the refusal's text by its hash."""
    return {"id": post_id, "status": status, "code": code, "refused_sha256": sha256_text(refused)}


def stump_access_payload(stump_id: str, access: str, set_by: str, generation_id: str | None) -> dict[str, Any]:
    """The resident's choice of who may read a stump's text (its `stumps` tool, `set_access`)."""
    return {"id": stump_id, "access": access, "set_by": set_by, "generation_id": generation_id}


def stump_read_payload(stump_id: str, reader: str, reader_kind: str, generation_id: str | None) -> dict[str, Any]:
    """One read of a stump's text, by its resident's tool or a moderator: who, never what."""
    return {"id": stump_id, "reader": reader, "reader_kind": reader_kind, "generation_id": generation_id}


def generation(g: Generation) -> Statement:
    return append("generation", g.id, generation_payload(g))


def attempt(a: Attempt, only_if_streaming: bool = False) -> Statement:
    """An attempt's entry; `only_if_streaming` (recovery) appends it only if the attempt's settling UPDATE,
    which follows it in the transaction, will find it still streaming (as the UPDATE's own guard does)."""
    sql, params = append("attempt", a.id, attempt_payload(a))
    if only_if_streaming:
        return (sql + _IF_STREAMING, params + (a.id,))
    return (sql, params)


def stumps(items: Iterable[Stump]) -> list[Statement]:
    return [append("stump", s.id, stump_payload(s)) for s in items]


def posts(items: Iterable[Post]) -> list[Statement]:
    return [append("post", p.id, post_payload(p)) for p in items]


def delivered(post_id: str, message_id: str) -> Statement:
    return append("delivered", post_id, delivered_payload(post_id, message_id))


def refused(post_id: str, refusal: Refusal) -> Statement:
    return append("refused", post_id, refused_payload(post_id, refusal.status, refusal.code, refusal.text))


def closed_by(receipt: Post, all_posts: list[Post]) -> list[Post]:
    """The text posts a receipt closes: its generation's partials and speech since the previous receipt."""
    out: list[Post] = []
    for p in sorted(all_posts, key=lambda p: p.seq):
        if p.generation_id != receipt.generation_id or p.seq >= receipt.seq:
            continue
        if p.kind == "receipt":
            out = []
        elif p.kind in ("partial", "speech"):
            out.append(p)
    return out


# ---------------------------------------------------------------------- reading records back


def _dec(blob: bytes | str | None) -> str:
    if blob is None:
        return ""
    return blob if isinstance(blob, str) else bytes(blob).decode("utf-8", "surrogatepass")


async def backfill(db: Connection) -> int:
    """Start the chain of a ledger that has records from before it: a `genesis` entry, then one entry per
    record as it stands now, in one transaction. Nothing on a fresh ledger or one already chained."""
    if await db.execute_fetchall("SELECT 1 FROM chain LIMIT 1"):
        return 0
    if not list(
        await db.execute_fetchall(
            "SELECT EXISTS (SELECT 1 FROM stumps) OR EXISTS (SELECT 1 FROM posts)"
            " OR EXISTS (SELECT 1 FROM generations WHERE status != 'pending')"
        )
    )[0][0]:
        return 0
    await db.execute("BEGIN IMMEDIATE")
    try:
        if await db.execute_fetchall("SELECT 1 FROM chain LIMIT 1"):  # another process began it meanwhile
            await db.execute("ROLLBACK")
            return 0
        count = await db.run(_backfill)  # on the connection's thread, inside this transaction
        await db.execute("COMMIT")
    except BaseException:
        await db.execute("ROLLBACK")
        raise
    log.info("ledger chain begun: %d record(s) from before it backfilled after a genesis entry", count)
    return count


def _backfill(conn: sqlite3.Connection) -> int:
    """The genesis entry, then each record's entry as it stands now, built by the same reader `check`
    holds records against their entries with (`_payloads`), in the same order."""
    cur = conn.cursor()
    cur.row_factory = None
    items = [(k, r, p) for i in range(len(RECORDS)) for batch in _payloads(cur, i) for k, r, p, _, _ in batch]
    conn.execute(*append("genesis", None, {"backfill": len(items)}))
    conn.executemany(_APPEND, [append(k, r, p)[1] for k, r, p in items])
    return len(items)


# ---------------------------------------------------------------------- checking


@dataclass
class ChainReport:
    """What `check` found: one line per problem, the first broken entry first; the head when whole."""

    violations: list[str] = field(default_factory=list)
    entries: int = 0
    head: str = GENESIS_PREV


@dataclass(frozen=True)
class Entry:
    seq: int
    kind: str
    record: str | None
    prev: str
    body: str
    hash: str

    @property
    def line(self) -> str:
        return export_line(self.seq, self.prev, self.body, self.hash)


def _link_problem(e: Entry, last_seq: int, last_hash: str) -> str:
    """Why entry `e` does not follow the entry (last_seq, last_hash); whether it hashes to itself, and
    its body, are `_body_problem`'s."""
    if e.seq != last_seq + 1:
        return f"follows entry {last_seq}" + (
            f"; entries {last_seq + 1}..{e.seq - 1} are missing" if e.seq > last_seq + 1 else ""
        )
    return f"names {e.prev[:16]}… as the previous hash, but entry {last_seq} hashes to {last_hash[:16]}…"


# An entry's columns, in `Entry`'s order.
_ENTRIES = "SELECT seq, kind, record, prev, body, hash FROM chain"
_ENTRY_AT = _ENTRIES + " WHERE seq = ?"


EXPORT_PAGE = 2000  # entries read at a time by an export: its memory stays this page's, whatever the chain's length


async def export_pages(db: Connection, since: int, last: int) -> AsyncIterator[list[Entry]]:
    """Entries `since`..`last` in order, a page at a time: an export writes each page before reading the next.

    Why pages: the whole chain held at once took 1.1 GB at 100,000 generations. Each page starts after
    the last entry of the one before (by `seq`, the primary key), so the pages cost the same however
    far into the chain they are; entries appended meanwhile, past `last`, are left for a later export.
    """
    after, page = since - 1, EXPORT_PAGE
    while after < last:
        rows = await db.execute_fetchall(
            _ENTRIES + " WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?", (after, last, page)
        )
        if not rows:
            return
        batch = [Entry(*r) for r in rows]
        yield batch
        after = batch[-1].seq


async def latest(db: Connection, kind: str, record: str) -> Entry | None:
    """The newest entry of `kind` for a record: the one a Provenance answer names."""
    rows = list(
        await db.execute_fetchall(
            _ENTRIES + " WHERE record=? AND kind=? ORDER BY seq DESC LIMIT 1",
            (record, kind),
        )
    )
    return Entry(*rows[0]) if rows else None


async def head(db: Connection) -> tuple[int, str]:
    """The last entry's sequence number and hash (0 and 64 zeros for an empty chain)."""
    rows = list(await db.execute_fetchall("SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1"))
    return (rows[0][0], rows[0][1]) if rows else (0, GENESIS_PREV)


def _differs(stated: dict[str, Any], now: dict[str, Any]) -> list[str]:
    keys = sorted((set(stated) | set(now)) - {"kind", "at"})
    out = []
    for k in keys:
        if stated.get(k) != now.get(k):
            a, b = stated.get(k), now.get(k)
            if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
                out.append(k)
            else:
                out.append(f"{k} (entry {_short(a)}, ledger {_short(b)})")
    return out


def _short(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=True)
    return s[:16] + "…" if len(s) > 20 else s


# `check` streams: records and entries are read in batches of this many rows, so its memory stays flat
# however long the ledger is (two bitmaps of one bit per entry aside).
BATCH = 2000


def _latest(kind: str) -> str:
    """The newest entry of `kind` for the record `x.id`: a seek on `chain_record_kind`."""
    return f"LEFT JOIN chain c ON c.seq = (SELECT max(seq) FROM chain WHERE record = x.id AND kind = '{kind}')"


# What each record's latest entry must say, read table by table in rowid order, a batch at a time, each
# record with its latest entry's seq and body. Deliveries last, after stumps' access and reads (`_access`).
RECORDS: list[tuple[str, str]] = [
    (
        "attempt",
        "SELECT x.rowid, x.id, x.generation_id, x.segment, x.idx, x.outcome, x.stop_reason, x.discard_reason,"
        " x.error, x.text, x.output_tokens, c.seq, c.body FROM attempts x " + _latest("attempt") + " WHERE x.rowid > ?"
        " AND x.outcome != 'streaming' ORDER BY x.rowid LIMIT ?",
    ),
    (
        "generation",
        "SELECT x.rowid, x.id, x.residence, x.channel, x.model, x.status, x.stop_reason, x.text, x.output_tokens,"
        " x.standing, x.continuation_ended, c.seq, c.body FROM generations x " + _latest("generation") + " WHERE"
        " x.rowid > ? AND x.status != 'pending' ORDER BY x.rowid LIMIT ?",
    ),
    (
        "stump",
        "SELECT x.rowid, x.id, x.generation_id, x.attempt_id, x.residence, x.scope, x.cause, x.text, x.output_tokens,"
        " x.block, x.block_type, c.seq, c.body FROM stumps x " + _latest("stump") + " WHERE x.rowid > ?"
        " ORDER BY x.rowid LIMIT ?",
    ),
    (
        "post",
        "SELECT x.rowid, x.id, x.generation_id, x.seq, x.kind, x.content, x.channel, c.seq, c.body FROM posts x "
        + _latest("post")
        + " WHERE x.rowid > ? ORDER BY x.rowid LIMIT ?",
    ),
    (
        "delivered",
        "SELECT x.rowid, x.id, x.message_id, c.seq, c.body FROM posts x " + _latest("delivered") + " WHERE x.rowid > ?"
        " AND x.message_id IS NOT NULL ORDER BY x.rowid LIMIT ?",
    ),
]
BLOCKS_OF = (
    "SELECT attempt_id, idx, type, content FROM attempt_blocks WHERE attempt_id IN ({marks}) ORDER BY attempt_id, pos"
)

# The same records, each with whether its latest entry is, byte for byte, the entry its builder above
# gives now: the payload rendered by SQLite's `json_object` with its keys in sorted order, the texts
# hashed by `verify_sha256`. That rendering is the canonical one only where every string is printable
# ASCII and no number is REAL (SQLite writes other characters raw, and a REAL with 15 digits): a REAL
# value in any column makes the query fail (`_v`), and an entry whose body holds a character outside
# ASCII or a DEL is never left confirmed: the walk counts it as not hashing to itself, so `finish`
# reads it whole (a raw control character cannot match: SQLite escapes those as canonical JSON does).
# Only a row answered 1 is taken as confirmed; any other answer (0: it differs; NULL: no entry, or a
# post with lone surrogates) and any error is checked again by the builders (`_built`), which alone
# name what differs. `test_chain` holds these renderings against the builders for every kind of record
# a replay writes, so the two cannot drift apart unseen. An attempt's blocks and a generation's
# segments are gathered in the builders' order by an ORDER BY (the order a plan reads them in is not
# theirs to trust: an index or the planner's statistics may change it).
_CHARS = "length(CAST({col} AS TEXT))"  # code points, as `len` counts them (up to a NUL: then it differs)


def _v(col: str) -> str:
    """A column as `json_object` may render it: a REAL stops the query (`json('!')` is malformed JSON)."""
    return f"CASE typeof({col}) WHEN 'real' THEN json('!') ELSE {col} END"


# The entry's `at`, its first key in sorted order, parsed from the body up to its first comma: the whole
# body is not parsed for it. Where that prefix is not `{"at":VALUE}` (a body not written by the
# builders), the value is NULL or the query fails, and the entry is not confirmed; where it is, the
# value is the one the whole body states.
_AT_SQL = "json_extract(substr(c.body, 1, instr(c.body, ',') - 1) || '}', '$.at')"


def _same(table: str, kind: str, fields: str, where: str, *, paged: bool = False) -> str:
    """The query for one kind (from this module's constants only): rowid, the latest entry's seq, and
    whether that entry is `fields` rendered. `paged`: `table` is a subquery that pages itself (`rowid_`)."""
    return (
        "SELECT x."
        + ("rowid_" if paged else "rowid")
        + ", c.seq, c.body = json_object('at', "
        + _AT_SQL
        + ", "
        + fields
        + ") FROM "
        + table
        + " x "
        + _latest(kind)
        + (" ORDER BY x.rowid_" if paged else " WHERE x.rowid > ?" + where + " ORDER BY x.rowid LIMIT ?")
    )


# A block whose content is, byte for byte and in type, the attempt's text (not equal by a collation or
# an affinity the columns might be given).
_SAME_BYTES = "typeof(b.content) = typeof(x.text) AND CAST(b.content AS BLOB) = CAST(x.text AS BLOB)"
# The attempts of a batch with their text hashed and counted once (`h`, `n`): SQLite works an expression
# out each time it is named, and an attempt of one text block names its text twice (the block, the whole).
_ATTEMPTS = (
    "(SELECT rowid AS rowid_, id, generation_id, segment, idx, outcome, stop_reason, discard_reason, error, text,"
    " output_tokens, verify_sha256(text) AS h, "
    + _CHARS.format(col="text")
    + " AS n FROM attempts WHERE rowid > ? AND outcome != 'streaming' ORDER BY rowid LIMIT ?)"
)


CONFIRMED: dict[str, str] = {
    "attempt": _same(
        _ATTEMPTS,
        "attempt",
        # its blocks (one whose content is the attempt's text takes its hash and count); none kept (a
        # ledger from before blocks were), its text as one text block
        "'blocks', coalesce(nullif((SELECT json_group_array(json_object('chars', CASE WHEN "
        + _SAME_BYTES
        + " THEN x.n ELSE "
        + _CHARS.format(col="b.content")
        + " END, 'index', "
        + _v("b.idx")
        + ", 'sha256', CASE WHEN "
        + _SAME_BYTES
        + " THEN x.h ELSE verify_sha256(b.content) END, 'type', "
        + _v("b.type")
        + ")) FROM (SELECT idx, type, content FROM attempt_blocks WHERE attempt_id = x.id ORDER BY pos) b), '[]'),"
        " CASE WHEN length(x.text) > 0 THEN json_array(json_object('chars', x.n, 'index', 0, 'sha256', x.h,"
        " 'type', 'text')) ELSE json_array() END),"
        " 'chars', x.n, 'discard_reason', "
        + _v("x.discard_reason")
        + ", 'error', "
        + _v("x.error")
        + ", 'generation_id', "
        + _v("x.generation_id")
        + ", 'id', "
        + _v("x.id")
        + ", 'index', "
        + _v("x.idx")
        + ", 'kind', 'attempt', 'outcome', "
        + _v("x.outcome")
        + ", 'output_tokens', "
        + _v("x.output_tokens")
        + ", 'segment', "
        + _v("x.segment")
        + ", 'stop_reason', "
        + _v("x.stop_reason")
        + ", 'text_sha256', x.h",
        "",
        paged=True,
    ),
    "generation": _same(
        "generations",
        "generation",
        "'channel', "
        + _v("x.channel")
        + ", 'chars', "
        + _CHARS.format(col="x.text")
        + ", 'continuation_ended', "
        + _v("x.continuation_ended")
        + ", 'id', "
        + _v("x.id")
        + ", 'kind', 'generation', 'model', "
        + _v("x.model")
        + ", 'output_tokens', "
        + _v("x.output_tokens")
        + ", 'residence', "
        + _v("x.residence")
        + ", 'segments', (SELECT json_group_array(json_object('attempt_id', "
        + _v("s.attempt_id")
        + ", 'chars', "
        + _v("s.chars")
        + ", 'index', "
        + _v("s.idx")
        + ", 'output_tokens', "
        + _v("s.output_tokens")
        + ", 'overlap_removed', "
        + _v("s.overlap_removed")
        + ", 'stop_reason', "
        + _v("s.stop_reason")
        + ")) FROM (SELECT * FROM segments WHERE generation_id = x.id ORDER BY idx) s), 'standing', "
        + _v("x.standing")
        + ", 'status', "
        + _v("x.status")
        + ", 'stop_reason', "
        + _v("x.stop_reason")
        + ", 'text_sha256', verify_sha256(x.text)",
        " AND x.status != 'pending'",
    ),
    "stump": _same(
        "stumps",
        "stump",
        "'attempt_id', "
        + _v("x.attempt_id")
        + ", 'block', "
        + _v("x.block")
        + ", 'block_type', "
        + _v("x.block_type")
        + ", 'cause', "
        + _v("x.cause")
        + ", 'chars', "
        + _CHARS.format(col="x.text")
        + ", 'generation_id', "
        + _v("x.generation_id")
        + ", 'id', "
        + _v("x.id")
        + ", 'kind', 'stump', 'output_tokens', "
        + _v("x.output_tokens")
        + ", 'residence', "
        + _v("x.residence")
        + ", 'scope', "
        + _v("x.scope")
        + ", 'text_sha256', verify_sha256(x.text)",
        "",
    ),
    # `sent_sha256` is written only for content with lone surrogates: `verify_sent_same` answers NULL
    # for such content, so those posts are always held against their builder
    "post": _same(
        "posts",
        "post",
        "'channel', "
        + _v("x.channel")
        + ", 'chars', "
        + _CHARS.format(col="x.content")
        + ", 'content_sha256', verify_sent_same(x.content), 'generation_id', "
        + _v("x.generation_id")
        + ", 'id', "
        + _v("x.id")
        + ", 'kind', 'post', 'post_kind', "
        + _v("x.kind")
        + ", 'seq', "
        + _v("x.seq"),
        "",
    ),
    "delivered": _same(
        "posts",
        "delivered",
        "'id', " + _v("x.id") + ", 'kind', 'delivered', 'message_id', " + _v("x.message_id"),
        " AND x.message_id IS NOT NULL",
    ),
}


def _stored_bytes(value: bytes | str | None) -> bytes:
    """A text column's bytes as `_dec` then `sha256_text` read them (a TEXT value encoded back)."""
    if value is None:
        return b""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)


def _sql_sha256(value: bytes | str | None) -> str:
    """`verify_sha256`: `sha256_text` of a text column's value as stored (NULL read as empty)."""
    return sha256_text(b"" if value is None else value)


def _sql_sent_same(value: bytes | str | None) -> str | None:
    """The content's SHA-256 where what was sent is the content itself (valid UTF-8), else NULL."""
    data = _stored_bytes(value)
    if not data.isascii():  # (ASCII is UTF-8: no text made to find out)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return hashlib.sha256(data).hexdigest()


def _install_sql(conn: sqlite3.Connection) -> None:
    """The functions `check`'s queries call, on the connection that runs them."""
    conn.create_function("verify_sha256", 1, _sql_sha256, deterministic=True)
    conn.create_function("verify_sent_same", 1, _sql_sent_same, deterministic=True)


# The table each kind of `CONFIRMED` reads as `x`, and those its subqueries read as `b` and `s`.
_TABLE_OF = {
    "attempt": "attempts",
    "generation": "generations",
    "stump": "stumps",
    "post": "posts",
    "delivered": "posts",
}
_SUBQUERY_TABLES = {"b": "attempt_blocks", "s": "segments"}
_GUARD = re.compile(r"CASE typeof\((\w+)\.(\w+)\) WHEN 'real' THEN json\('!'\) ELSE \1\.\2 END")


def confirmed(conn: sqlite3.Connection) -> dict[str, str]:
    """`CONFIRMED` for this ledger's schema, with no guard (`_v`) on a column whose declared type gives it
    TEXT affinity: SQLite stores a number given to such a column as text, so it never holds a REAL.

    (One who rewrites the schema's text itself may redeclare a column after storing a REAL in it; for
    SQLite's 15 digits to match an entry, the entry must then be rewritten too, and every later hash
    worked out again: one who can do that can write an entry matching the record anyway. The chain's
    head, published, is what shows such a rewrite.)"""
    text = frozenset(
        (table, name)
        for table in {*_TABLE_OF.values(), *_SUBQUERY_TABLES.values()}
        for name, declared in conn.execute("SELECT name, type FROM pragma_table_info(?)", (table,))
        if _text_affinity(declared)
    )
    return _confirmed_for(text)


def _text_affinity(declared: str) -> bool:
    """SQLite's rule: a declared type holding INT is INTEGER; else one holding CHAR, CLOB or TEXT is TEXT
    (its case folded in ASCII only, as SQLite folds it)."""
    upper = declared.encode("utf-8", "surrogatepass").upper()
    return b"INT" not in upper and any(word in upper for word in (b"CHAR", b"CLOB", b"TEXT"))


@functools.cache
def _confirmed_for(text: frozenset[tuple[str, str]]) -> dict[str, str]:
    return {kind: _unguarded(query, _TABLE_OF[kind], text) for kind, query in CONFIRMED.items()}


def _unguarded(query: str, table: str, text: frozenset[tuple[str, str]]) -> str:
    tables = {"x": table, **_SUBQUERY_TABLES}
    return _GUARD.sub(lambda m: m[1] + "." + m[2] if (tables[m[1]], m[2]) in text else m[0], query)


def _held(db: sqlite3.Cursor, i: int) -> Iterator[_Held]:
    """`_payloads`, a batch at a time, as (the seqs of the latest entries SQLite confirmed, by `CONFIRMED`,
    the records built in Python): only a batch holding some record SQLite does not confirm is read
    again and built (`_built`)."""
    kind, sql = RECORDS[i]
    if kind == "delivered":
        yield [], _access(db)
    confirming = confirmed(db.connection)[kind]
    last = -(2**63)
    while True:
        try:
            rows: list[Any] | None = db.execute(confirming, (last, BATCH)).fetchall()
        except sqlite3.Error:
            rows = None  # a value SQLite's JSON cannot hold (a BLOB id, a body that is not JSON)
        if rows is not None and all(r[2] == 1 for r in rows):
            if not rows:
                return
            yield [r[1] for r in rows], []
            last = rows[-1][0]
            continue
        batch = db.execute(sql, (last, BATCH)).fetchall()
        if rows:  # the same span as the confirming read, however the ledger moved since
            batch = [r for r in batch if r[0] <= rows[-1][0]]
        elif not batch:
            return
        if batch:
            yield [], _built(db, kind, batch)
        last = rows[-1][0] if rows else batch[-1][0]


SEGMENTS_OF = (
    "SELECT generation_id, idx, attempt_id, stop_reason, chars, output_tokens, overlap_removed FROM segments"
    " WHERE generation_id IN ({marks})"
)
# The same, as the bytes stored (`_walk` hashes them as they are).
WALK = "SELECT seq, CAST(prev AS BLOB), CAST(body AS BLOB), CAST(hash AS BLOB) FROM chain WHERE seq > ? ORDER BY seq LIMIT ?"
LATER = "SELECT 1 FROM chain WHERE record = ? AND kind = ? AND seq > ? LIMIT 1"


def _rows(db: sqlite3.Cursor, sql: str) -> Iterator[list[Any]]:
    """Every row of a keyset-paged query (`rowid > ? ... LIMIT ?`, rowid first), a batch at a time."""
    last = -(2**63)
    while True:
        batch = db.execute(sql, (last, BATCH)).fetchall()
        if not batch:
            return
        yield batch
        last = batch[-1][0]


_Built = list[tuple[str, str, dict[str, Any], int | None, str | None]]
_Held = tuple[list[int], _Built]


def _payloads(db: sqlite3.Cursor, i: int) -> Iterator[_Built]:
    """(kind, record id, payload, latest entry's seq or None, its body) of every record of kind `i` of
    `RECORDS`, a batch at a time: what `check` holds against the chain without
    loading the ledger."""
    kind, sql = RECORDS[i]
    if kind == "delivered":
        yield _access(db)
    for batch in _rows(db, sql):
        yield _built(db, kind, batch)


def _built(db: sqlite3.Cursor, kind: str, batch: list[Any]) -> _Built:
    """One batch of `RECORDS[kind]` rows, each with the payload its builder gives now."""
    out: _Built = []
    if kind == "attempt":
        blocks: dict[str, list[Block]] = defaultdict(list)
        ids = [r[1] for r in batch]
        for b in db.execute(BLOCKS_OF.format(marks=",".join("?" * len(ids))), ids).fetchall():
            blocks[b[0]].append(Block(b[1], b[2], _dec(b[3])))
        for a in batch:
            att = Attempt(
                id=a[1],
                generation_id=a[2],
                segment=a[3],
                index=a[4],
                outcome=a[5],
                stop_reason=a[6],
                discard_reason=a[7],
                error=a[8],
                text=_dec(a[9]),
                output_tokens=a[10],
                blocks=blocks.get(a[1], []),
            )
            out.append((kind, att.id, attempt_payload(att), a[11], a[12]))
    elif kind == "generation":
        segments: dict[str, list[Segment]] = defaultdict(list)
        ids = [r[1] for r in batch]
        for sg in db.execute(SEGMENTS_OF.format(marks=",".join("?" * len(ids))), ids).fetchall():
            segments[sg[0]].append(Segment(sg[1], sg[2], sg[3], sg[4], sg[5], sg[6]))
        for g in batch:
            gen = Generation(
                id=g[1],
                residence=g[2],
                channel=g[3],
                model=g[4],
                status=g[5],
                stop_reason=g[6],
                text=_dec(g[7]),
                output_tokens=g[8],
                standing=g[9],
                continuation_ended=g[10],
                segments=segments.get(g[1], []),
            )
            out.append((kind, gen.id, generation_payload(gen), g[11], g[12]))
    elif kind == "stump":
        for x in batch:
            st = Stump(
                id=x[1],
                generation_id=x[2],
                attempt_id=x[3],
                residence=x[4],
                scope=x[5],
                cause=x[6],
                text=_dec(x[7]),
                output_tokens=x[8],
                block=x[9],
                block_type=x[10],
            )
            out.append((kind, st.id, stump_payload(st), x[11], x[12]))
    elif kind == "post":
        for x in batch:
            post = Post(
                id=x[1],
                generation_id=x[2],
                seq=x[3],
                kind=x[4],
                content=_dec(x[5]),
                channel=x[6],
                replacements=0,
            )
            out.append((kind, post.id, post_payload(post), x[7], x[8]))
    else:
        out = [(kind, x[1], delivered_payload(x[1], x[2]), x[3], x[4]) for x in batch]
    return out


def _access(db: sqlite3.Cursor) -> _Built:
    """Each stump's latest access choice and latest read (few: one per stump a resident or moderator touched)."""
    out = []
    for kind, sql, build in (
        (
            "stump-access",
            "SELECT stump_id, access, set_by, generation_id FROM stump_access_changes ORDER BY rowid",
            stump_access_payload,
        ),
        (
            "stump-read",
            "SELECT stump_id, reader, reader_kind, generation_id FROM stump_reads ORDER BY rowid",
            stump_read_payload,
        ),
    ):
        latest = {r[0]: r for r in db.execute(sql).fetchall()}
        for sid, r in latest.items():
            got = db.execute(
                "SELECT seq, body FROM chain WHERE record = ? AND kind = ? ORDER BY seq DESC LIMIT 1", (sid, kind)
            ).fetchall()
            out.append((kind, sid, build(*r), got[0][0] if got else None, got[0][1] if got else None))
    # Posts set aside as refused (few: read on their partial index). The status and code are the room's,
    # kept by the entry alone; the refusal's text is held against the ledger's by its hash.
    for pid, text in db.execute("SELECT id, refused FROM posts WHERE refused IS NOT NULL ORDER BY rowid").fetchall():
        got = db.execute(LATEST_OF, (pid, "refused")).fetchall()
        stated = _json_object(got[0][1]) if got else {}
        payload = refused_payload(pid, stated.get("status"), stated.get("code"), _dec(text))
        out.append(("refused", pid, payload, got[0][0] if got else None, got[0][1] if got else None))
    return out


LATEST_OF = "SELECT seq, body FROM chain WHERE record = ? AND kind = ? ORDER BY seq DESC LIMIT 1"


def _json_object(body: str) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


_AT = re.compile(r'[{,]"at":(-?[0-9]+)[,}]')


def _stated_at(body: str) -> int | None:
    """The `at` of an entry's canonical body, read without parsing it (None where it is not so written)."""
    m = _AT.search(body)
    return int(m.group(1)) if m else None


def _mark(bits: bytearray, seq: int) -> None:
    if 0 < seq < len(bits) * 8:
        bits[seq >> 3] |= 1 << (seq & 7)


def _marked(bits: bytearray, seq: int) -> bool:
    return 0 < seq < len(bits) * 8 and bool(bits[seq >> 3] & (1 << (seq & 7)))


async def check(db: Connection) -> ChainReport:
    """The chain hashes link up, and each record's latest entry still says what the record says.

    Streams: each record is read once beside its latest entry (a seek), then the chain once in order;
    what is remembered between the two is a few bits per entry (whether it was some record's latest,
    whether it was exactly the entry the record gives, so canonical with the right kind and id, and
    whether its link held). The parts (`part`: each kind of record, and the walk) are independent
    reads: `ledger verify` runs them side by side in worker processes on a long ledger and puts them
    together with `finish`; here they run in the connection's own thread, in one trip.
    """
    return await db.run(_check)  # on the connection's thread, in one trip


# The parts of `check`: each kind of `RECORDS` (0..4), then the walk (`WALK_PART`).
WALK_PART = len(RECORDS)


def part(db: sqlite3.Cursor, top: int, i: int) -> Any:
    """Part `i` of `check` (a kind of `RECORDS`, or the walk) read on `db` up to entry `top`; `finish`
    puts the parts together."""
    db.row_factory = None
    _install_sql(db.connection)
    return _walk(db) if i == len(RECORDS) else _records(db, top, i)


_Found = list[tuple[int, int, str]]
_Records = tuple[_Found, list[str], bytearray, bytearray]


def _records(db: sqlite3.Cursor, top: int, i: int) -> _Records:
    """Kind `i` of `RECORDS` (and, before deliveries, stumps' access) held against each record's latest
    entry: the lines found, the records with no entry, and which entries were attested, which exactly."""
    found: _Found = []
    unattested: list[str] = []
    attests = bytearray(top // 8 + 1)  # the entry is some record's latest
    exact = bytearray(top // 8 + 1)  # ... and is byte for byte the entry that record gives now
    bound = len(exact) * 8
    for confirmed, built in _held(db, i):
        for n in confirmed:  # the entry is exactly the one its record's builder gives
            if 0 < n < bound:
                bit = 1 << (n & 7)
                attests[n >> 3] |= bit
                exact[n >> 3] |= bit
        for kind, record, payload, seq, body in built:
            what = f"{kind} {record}" if kind != "delivered" else f"delivery of post {record}"
            if seq is None or body is None:
                unattested.append(what)
                continue
            _mark(attests, seq)
            at = _stated_at(body)
            if at is not None and canonical({**payload, "kind": kind, "at": at}) == body:
                _mark(exact, seq)
                continue
            try:
                stated = json.loads(body)
            except ValueError:
                continue  # reported as a broken link
            diff = _differs(stated, payload) if isinstance(stated, dict) else ["its body"]
            if diff:
                found.append(
                    (
                        seq,
                        1,
                        f"chain entry {seq} ({kind} {record}): the ledger no longer matches it: " + ", ".join(diff),
                    )
                )
    return found, unattested, attests, exact


_Walk = tuple[_Found, bytearray, bytearray, int, int, str]


def _walk(db: sqlite3.Cursor) -> _Walk:
    """The chain once in order: each entry follows the one before (seq and prev) and hashes to itself.

    Whether a body is canonical, with its own kind and record, is left to `finish` for the entries no
    record gives exactly (few); so is whether an entry's record is gone. Returns the link lines, the
    entries whose link (seq, prev) broke, those whose hash did not match, the count, last seq and head.
    The entries are read as their stored bytes (`WALK`), hashed as they are: no text is decoded."""
    found: _Found = []
    n = 1 << 16
    linked = bytearray(n)  # grown as the chain goes: one bit per entry whose seq and prev follow
    hashed = bytearray(n)  # ... and whose hash matches its content
    last_seq, last_hash, count = 0, GENESIS_PREV.encode(), 0
    sha = hashlib.sha256
    while True:
        rows = db.execute(WALK, (last_seq, BATCH * 10)).fetchall()
        if not rows:
            break
        if (rows[-1][0] >> 3) >= len(linked):
            grow = bytearray((rows[-1][0] >> 3) + 1 - len(linked) + n)
            linked += grow
            hashed += grow
        count += len(rows)
        for seq, prev, body, digest in rows:
            if seq == last_seq + 1 and prev == last_hash:  # (seq > 0: the first read is of seq > 0)
                byte, bit = seq >> 3, 1 << (seq & 7)
                linked[byte] |= bit
                # canonical JSON is ASCII with no DEL (nor any raw control character, which SQLite
                # never writes either): any other body is not, and `finish` says so
                if (
                    body.isascii()
                    and b"\x7f" not in body
                    and sha(b'{"entry":' + body + b',"prev":"' + prev + b'","seq":%d}' % seq).hexdigest().encode()
                    == digest
                ):
                    hashed[byte] |= bit
            else:
                e = Entry(*db.execute(_ENTRY_AT, (seq,)).fetchone())
                problem = _link_problem(e, last_seq, last_hash.decode("utf-8", "replace"))
                where = f" ({e.kind} {e.record})" if e.record else f" ({e.kind})"
                found.append((seq, 0, f"chain entry {seq}{where}: {problem}"))
            last_seq, last_hash = seq, digest
    return found, linked, hashed, count, last_seq, last_hash.decode("utf-8", "replace")


def _check(conn: sqlite3.Connection) -> ChainReport:
    db = conn.cursor()
    db.row_factory = None
    got = db.execute("SELECT seq FROM chain ORDER BY seq DESC LIMIT 1").fetchall()
    top = got[0][0] if got else 0
    _install_sql(conn)
    return finish(conn, top, [_records(db, top, i) for i in range(len(RECORDS))], _walk(db))


def finish(conn: sqlite3.Connection, top: int, records: list[_Records], walked: _Walk) -> ChainReport:
    """The parts put together: the entries no record gives exactly are read again and checked whole (is
    the body canonical JSON of its own kind and record; is its record still there), and every line is
    ordered by entry, link problems first, as one pass over the chain would find them."""
    db = conn.cursor()
    db.row_factory = None
    found, linked, hashed, count, last_seq, head_ = walked
    found = list(found)
    attests = bytearray(top // 8 + 1)
    exact = bytearray(top // 8 + 1)
    unattested: list[str] = []
    for lines, missing, att, ex in records:
        found += lines
        unattested += missing
        attests = bytearray(
            (int.from_bytes(attests, "little") | int.from_bytes(att, "little")).to_bytes(len(attests), "little")
        )
        exact = bytearray(
            (int.from_bytes(exact, "little") | int.from_bytes(ex, "little")).to_bytes(len(exact), "little")
        )
    # entries past `top` (appended while checking) are never a record's latest here: read them whole
    exact += bytearray(max(0, (last_seq >> 3) + 1 - len(exact)))
    attests += bytearray(max(0, len(exact) - len(attests)))
    # so is an entry a record gives exactly whose link held but whose hash does not match (its body and
    # its record rewritten together): what is left is every entry that needs no second look
    n = len(exact)
    unhashed = int.from_bytes(linked[:n], "little") & ~int.from_bytes(hashed[:n], "little")
    settled = (int.from_bytes(exact, "little") & ~unhashed).to_bytes(n, "little")
    for m in re.finditer(b"[^\\xff]", settled):
        byte = m.start()
        for bit in range(8):
            seq = (byte << 3) | bit
            if seq == 0 or seq > last_seq or settled[byte] & (1 << bit):
                continue
            got = db.execute(_ENTRY_AT, (seq,)).fetchall()
            if not got:
                continue  # a missing entry: the next one's link says so
            e = Entry(*got[0])
            if _marked(linked, seq):
                problem = _body_problem(e, _marked(hashed, seq))
                if problem:
                    found.append(
                        (
                            seq,
                            0,
                            f"chain entry {seq}"
                            + (f" ({e.kind} {e.record})" if e.record else f" ({e.kind})")
                            + f": {problem}",
                        )
                    )
            if (
                e.kind in RECORD_KINDS
                and e.record is not None
                and seq <= top  # one appended while checking attests a record read before it, or after
                and not _marked(attests, seq)
                and not db.execute(LATER, (e.record, e.kind, e.seq)).fetchall()
            ):
                found.append(
                    (
                        seq,
                        2,
                        f"chain entry {seq} ({e.kind} {e.record}): the record it attests is "
                        + ("no longer delivered" if e.kind == "delivered" else "not in the ledger")
                        + (" (or no longer settled)" if e.kind == "generation" else ""),
                    )
                )
    rep = ChainReport(entries=count, head=head_)
    found += [(last_seq + 1, 1, f"{what}: not in the chain") for what in unattested]
    rep.violations = [line for _, _, line in sorted(found, key=lambda f: (f[0], f[1]))]
    return rep


def _body_problem(e: Entry, hash_ok: bool) -> str | None:
    """What is wrong with an entry whose link held and which no record gives exactly, or which does not
    hash to itself: its body, its hash, its kind and record columns."""
    try:
        obj = json.loads(e.body)
    except ValueError:
        return "its body is not JSON"
    if not isinstance(obj, dict) or canonical(obj) != e.body:
        return "its body is not canonical JSON"
    if not hash_ok:
        return "its hash does not match its content"
    if obj.get("kind") != e.kind or (obj.get("id") if e.kind != "genesis" else None) != e.record:
        return f"its kind/record columns ({e.kind}, {e.record}) differ from the entry's own"
    return None


@dataclass
class ExportReport:
    problem: str | None = None
    first: int = 0
    last: int = 0
    anchor: str = GENESIS_PREV
    head: str = GENESIS_PREV

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify_export(path: Path) -> ExportReport:
    """Check an export with no database: each line canonical, linked to the one before, hashing to itself.

    Stops at the first broken line and names it. An export made `--since` an entry starts from that
    entry's `prev` (its anchor, to compare with the ledger's); a whole one starts from 64 zeros.
    """
    return check_export(path.read_bytes(), str(path))


def check_export(data: bytes, name: str) -> ExportReport:
    """`verify_export` on an export's bytes; `name` is how its lines are named."""
    rep = ExportReport()
    if not data:
        rep.problem = f"{name}: no entries"
        return rep
    if not data.endswith(b"\n"):
        rep.problem = f"{name}: the last line is not terminated by a newline (the file was cut or changed)"
        return rep
    last_seq, last_hash = None, None
    for n, raw in enumerate(data[:-1].split(b"\n"), 1):
        where = f"{name}:{n}"
        try:
            text = raw.decode("ascii")
            obj = json.loads(text)
        except (UnicodeDecodeError, ValueError) as e:
            rep.problem = f"{where}: not a JSON line of the export ({type(e).__name__})"
            return rep
        if (
            not isinstance(obj, dict)
            or set(obj) != {"entry", "hash", "prev", "seq"}
            or not isinstance(obj["seq"], int)
            or isinstance(obj["seq"], bool)
            or obj["seq"] < 1
            or not isinstance(obj["entry"], dict)
            or not _hex64(obj["prev"])
            or not _hex64(obj["hash"])
        ):
            rep.problem = f"{where}: not an entry (keys entry, hash, prev, seq with their types)"
            return rep
        seq = obj["seq"]
        label = f"{where}: entry {seq}"
        if canonical(obj) != text:
            rep.problem = f"{label}: not in canonical form (the line was changed)"
            return rep
        if last_seq is None:
            rep.first, rep.anchor = seq, obj["prev"]
            if seq == 1 and obj["prev"] != GENESIS_PREV:
                rep.problem = f"{label}: the first entry must name {GENESIS_PREV[:8]}… (64 zeros) as its previous hash"
                return rep
        elif seq != last_seq + 1:
            rep.problem = f"{label}: follows entry {last_seq}"
            return rep
        elif obj["prev"] != last_hash:
            rep.problem = f"{label}: its previous hash is not entry {last_seq}'s hash"
            return rep
        if entry_hash(seq, obj["prev"], canonical(obj["entry"])) != obj["hash"]:
            rep.problem = f"{label}: its hash does not match its content"
            return rep
        last_seq, last_hash = seq, obj["hash"]
    rep.last, rep.head = last_seq or 0, last_hash or GENESIS_PREV
    return rep


def _hex64(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)
