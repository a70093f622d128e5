"""The ledger's hash chain: every settled record appended as an entry whose hash covers the entry before.

Why: the ledger is the only memory of what a resident emitted; a witness who sees a post, and an
auditor given an export, can check that it was not rewritten afterwards (docs/provenance.md).
Here: the entries' format and builders (which `appending` appends), and `ledger verify`'s reading:
`walk` links and hashes every entry; `hold` reads each record with its entries, whose history must
be one the ledger writes (`HISTORY`) and whose latest entry of each kind must be, byte for byte, the
entry its builder gives now (`confirms`, the one way an entry is confirmed); `unattested` names the
entries whose record is gone.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import truth
from ..records import Attempt, BudgetRefusal, Generation, Post, Stump
from ..text import outbound
from . import rows
from .connection import placeholders

GENESIS_PREV = "0" * 64
Rows = list[dict[str, Any]]


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
    claim = f'{{"entry":{body},"prev":"{prev}","seq":{int(seq)}}}'
    return hashlib.sha256(claim.encode("utf-8", "surrogatepass")).hexdigest()


# ---------------------------------------------------------------------- entries of records
# One builder per kind, used when a record is written, when old records are backfilled and when
# `verify` rebuilds what each record's latest entry must say (`records`, `refusal_records`): the three can
# never disagree.


def _fields(record: Any, names: str) -> dict[str, Any]:
    return {name: getattr(record, name) for name in names.split()}


def attempt_payload(a: Attempt) -> dict[str, Any]:
    """An attempt's entry. The input counts (m045) are stated only where the provider gave one, so an entry
    written before them is still the entry its attempt gives now, and a count added later is named."""
    out = _fields(a, "id generation_id segment index outcome stop_reason discard_reason error chars output_tokens")
    out["text_sha256"] = sha256_text(a.text)
    out["blocks"] = [
        {"index": b.index, "type": b.type, "chars": b.chars, "sha256": sha256_text(b.content)}
        for b in a.content_blocks()
    ]
    counts = _fields(a, "input_tokens cache_write_tokens cache_read_tokens")
    return out | {name: value for name, value in counts.items() if value is not None}


def generation_payload(g: Generation) -> dict[str, Any]:
    out = _fields(g, "id residence channel model status stop_reason chars output_tokens standing continuation_ended")
    out["text_sha256"] = sha256_text(g.text)
    segment = "index attempt_id stop_reason chars output_tokens overlap_removed"
    out["segments"] = [_fields(s, segment) for s in sorted(g.segments, key=lambda s: s.index)]
    return out


def stump_payload(s: Stump) -> dict[str, Any]:
    out = _fields(s, "id generation_id attempt_id residence scope cause chars output_tokens block block_type")
    return out | {"text_sha256": sha256_text(s.text)}


def post_payload(p: Post) -> dict[str, Any]:
    """A post's entry: its content's hash as stored and, where they differ (a lone surrogate sent as
    U+FFFD), as sent; ASCII is sent as it is."""
    out = _fields(p, "id generation_id channel seq") | {"post_kind": p.kind, "chars": len(p.content)}
    out["content_sha256"] = sha256_text(p.content)
    sent = out["content_sha256"] if p.content.isascii() else sent_sha256(p.content)
    return out | ({"sent_sha256": sent} if sent != out["content_sha256"] else {})


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


_REFUSAL_FIELDS = "id residence channel trigger person scope tokens budget spent day post_id"
_REFUSALS = (
    "SELECT id, residence, channel, trigger, person, scope, tokens, budget, spent, day, post_id FROM budget_refusals"
)


def budget_refusal_payload(r: BudgetRefusal) -> dict[str, Any]:
    """A reply a spent daily budget refused (`residents.ledger.budgets`): its fields but when."""
    return _fields(r, _REFUSAL_FIELDS)


def records(
    gens: Rows, of: dict[str, dict[str, Rows]], blocks: dict[str, Rows], touched: dict[str, dict[str, Any]]
) -> list[Record]:
    """Generations' rows and their records' (`of`: each table's rows by generation id, blocks by attempt
    id, `touched`: each `STUMP_FOLLOWS` kind's latest row by stump id) as their entries must state them:
    what `verify` holds against the chain and `backfill` writes. A stump's latest access change and read
    are its latest entries of those kinds (None where it has none: it must have no such entry)."""
    out = []
    for g in gens:
        gen = rows.generation(g)
        gen.segments = [rows.segment(s) for s in of["segments"].get(g["id"], ())]
        payload = generation_payload(gen) if gen.status != "pending" else None
        out.append(Record("generations", gen.id, {"generation": payload}, gen.text))
    for a in itertools.chain.from_iterable(of["attempts"].values()):
        att = rows.attempt(a, [rows.block(b) for b in blocks.get(a["id"], ())])
        payload = attempt_payload(att) if att.outcome != "streaming" else None
        out.append(Record("attempts", att.id, {"attempt": payload}))
    for s in itertools.chain.from_iterable(of["stumps"].values()):
        expected: dict[str, dict[str, Any] | None] = {"stump": stump_payload(rows.stump(s))}
        for kind, (_, build) in STUMP_FOLLOWS.items():
            last = touched[kind].get(s["id"])
            expected[kind] = None if last is None else build(*last)
        out.append(Record("stumps", s["id"], expected))
    return out + [post_record(p) for p in itertools.chain.from_iterable(of["posts"].values())]


def post_record(p: dict[str, Any]) -> Record:
    delivered = delivered_payload(p["id"], p["message_id"]) if p["message_id"] is not None else None
    refusal = p.get("refused")
    refused = None if refusal is None else refused_payload(p["id"], p["refused_status"], p["refused_code"], refusal)
    return Record("posts", p["id"], {"post": post_payload(rows.post(p)), "delivered": delivered, "refused": refused})


# The kinds that follow a stump's entry: their rows, oldest first, for the stumps of the generations with
# ids > $1 (`{upto}`: and <= $2), the columns its builder takes, the stump's id first.
_OF_STUMPS = " WHERE stump_id IN (SELECT id FROM stumps WHERE generation_id > $1{upto}) ORDER BY rowid"
STUMP_FOLLOWS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "stump-access": (
        "SELECT stump_id, access, set_by, generation_id FROM stump_access_changes" + _OF_STUMPS,
        stump_access_payload,
    ),
    "stump-read": (
        "SELECT stump_id, reader, reader_kind, generation_id FROM stump_reads" + _OF_STUMPS,
        stump_read_payload,
    ),
}


def touched(db: sqlite3.Cursor, span: tuple[str, ...], upto: str = "") -> dict[str, dict[str, Any]]:
    """Each `STUMP_FOLLOWS` kind's latest row by stump id, for the stumps of the generations in `span`."""
    return {
        kind: {row[0]: row for row in db.execute(sql.format(upto=upto), span).fetchall()}
        for kind, (sql, _) in STUMP_FOLLOWS.items()
    }


def refusal_records(db: sqlite3.Cursor) -> list[Record]:
    """Each reply a spent budget refused: a record of its own, with a history of one entry."""
    made = [BudgetRefusal(*row) for row in db.execute(_REFUSALS + " ORDER BY rowid").fetchall()]
    return [Record("budget_refusals", r.id, {"budget-refusal": budget_refusal_payload(r)}) for r in made]


# ---------------------------------------------------------------------- checking


class Entry(NamedTuple):
    """A chain entry as stored: `ENTRIES`' columns, in this order."""

    seq: int
    kind: str
    record: str | None
    prev: str
    body: str
    hash: str

    @property
    def where(self) -> str:
        return f"chain entry {self.seq} ({self.kind}{' ' + self.record if self.record else ''})"


def _link_problem(seq: int, prev: str, last_seq: int, last_hash: str) -> str:
    """Why entry (seq, prev) does not follow the entry (last_seq, last_hash)."""
    if seq != last_seq + 1:
        gap = f"; entries {last_seq + 1}..{seq - 1} are missing" if seq > last_seq + 1 else ""
        return f"follows entry {last_seq}{gap}"
    return f"names {prev[:16]}… as the previous hash, but entry {last_seq} hashes to {last_hash[:16]}…"


ENTRIES = "SELECT seq, kind, record, prev, body, hash FROM chain"


def head(conn: sqlite3.Connection) -> tuple[int, str] | None:
    """The latest entry as a witness saves it, `(seq, hash)` (written `N:SHA256`); None for an empty chain."""
    got = conn.execute("SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    return (int(got[0]), str(got[1])) if got else None


def _differs(stated: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The fields an entry states otherwise than its record now: a list or object by name, a value as both."""
    out = []
    for k in sorted((set(stated) | set(now)) - {"kind", "at"}):
        a, b = stated.get(k), now.get(k)
        if a != b:
            whole = isinstance(a, dict | list) or isinstance(b, dict | list)
            out.append(k if whole else f"{k} (entry {_short(a)}, ledger {_short(b)})")
    return out


def _short(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=True)
    return s[:16] + "…" if len(s) > 20 else s


def _parsed(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def confirms(kind: str, payload: dict[str, Any], body: str) -> bool:
    """The one way an entry is confirmed: its body is, byte for byte, the entry its record's builder gives
    now (`append`'s canonical JSON, with the `at` the body states: the first key, as keys sort)."""
    at, _, _ = body[6:].partition(",")
    stated = int(at) if body.startswith('{"at":') and at.isdigit() else (_parsed(body) or {}).get("at")
    return canonical({**payload, "kind": kind, "at": stated}) == body


# ---------------------------------------------------------------------- a record's history
# A record's entries, oldest first: its first entry, then only the transitions the ledger makes (what
# store.py, access.py and live.py append). Anything else is named as the first broken entry. A rule
# gets the entries before, the entry, and the record's text as stored now (a generation's).


Rule = Callable[[list[Entry], Entry, str], str | None]


def _continued(before: list[Entry], now: Entry, text: str) -> str | None:
    """A generation is settled again only by a /continue: from an output cut at its ceiling, the same
    generation, its segments kept and new ones added (or none: a /continue that added nothing), and the
    text it settled before still the start of its text."""
    last = next(s for s in reversed(before) if s.kind == "generation")
    was, now_ = _parsed(last.body), _parsed(now.body)
    if was is None or now_ is None:
        return None  # the body itself is named
    why = f"settled again, but not by a /continue of entry {last.seq}"
    if was.get("status") != "truncated" or not truth.is_ceiling(was.get("stop_reason")):
        return (
            f"{why}: that settled it {was.get('status')} ({was.get('stop_reason')}), and only a cut output is continued"
        )
    for k in ("id", "residence", "channel", "model", "standing"):
        if was.get(k) != now_.get(k):
            return f"{why}: its {k} differs"
    old, new = was.get("segments") or [], now_.get("segments") or []
    if new[: len(old)] != old:
        return f"{why}: its segments do not extend that entry's"
    added = new[len(old) :]
    for k in () if added else ("text_sha256", "chars", "status", "stop_reason"):
        if was.get(k) != now_.get(k):
            return f"{why}: no segment added, but its {k} differs"
    if added and now_.get("chars") != (was.get("chars") or 0) + sum(s.get("chars") or 0 for s in added):
        return f"{why}: its characters are not that entry's and its new segments'"
    if isinstance(was.get("chars"), int) and sha256_text(text[: was["chars"]]) != was.get("text_sha256"):
        return f"{why}: the text that entry settled is no longer the start of the generation's text"
    return None


def _by_its_resident(before: list[Entry], now: Entry, text: str) -> str | None:
    """A stump's access is the resident's choice (its `stumps` tool): set by the stump's residence."""
    stump, change = _parsed(before[0].body), _parsed(now.body)
    if stump is None or change is None or change.get("set_by") == stump.get("residence"):
        return None
    return f"access set by {change.get('set_by')!r}, not by the stump's resident {stump.get('residence')!r}"


def _delivered_or_refused_once(before: list[Entry], now: Entry, text: str) -> str | None:
    ended = next((s for s in before if s.kind in ("delivered", "refused")), None)
    if ended is None:
        return None
    return f"the post was already {ended.kind} at entry {ended.seq}: a post is delivered or refused once"


# table -> (the kind a record's history begins with, {a kind that may follow: its rule, or None: any});
# a kind not listed may not follow (the first kind again, where it is not listed: a record written twice).
HISTORY: dict[str, tuple[str, dict[str, Rule | None]]] = {
    "attempts": ("attempt", {}),  # settled once
    "generations": ("generation", {"generation": _continued}),  # again at each /continue
    "stumps": ("stump", {"stump-access": _by_its_resident, "stump-read": None}),
    "posts": ("post", {"delivered": _delivered_or_refused_once, "refused": _delivered_or_refused_once}),
    "budget_refusals": ("budget-refusal", {}),  # written once
}
TABLE_OF = {kind: table for table, (first, then) in HISTORY.items() for kind in (first, *then)}


def history_problem(table: str, record: str, steps: list[Entry], text: str) -> tuple[Entry, str] | None:
    """The first entry of a record's history (`steps`, oldest first) that the ledger never writes."""
    first, then = HISTORY[table]
    if steps[0].kind != first:
        return steps[0], f"the first entry of {table[:-1]} {record}, whose history begins with a {first} entry"
    for i in range(1, len(steps)):
        if steps[i].kind not in then:
            return steps[i], f"{table[:-1]} {record} recorded again (first at entry {steps[0].seq})"
        rule = then[steps[i].kind]
        problem = rule(steps[:i], steps[i], text) if rule else None
        if problem:
            return steps[i], problem
    return None


# ---------------------------------------------------------------------- holding records, and the walk


@dataclass
class Record:
    """A record as its entries must state it: the payload its builder gives now for each kind of entry it
    must have (None: it must have none, as a pending generation or an undelivered post)."""

    table: str
    id: str
    expected: dict[str, dict[str, Any] | None]
    text: str = ""  # a generation's text, for its history


@dataclass
class Found:
    """What reading the chain found: lines (seq, order, line); holding records: what has no entry; the
    walk: its entries, last seq and head. (`unattested`: lines only.)"""

    lines: list[tuple[int, int, str]] = field(default_factory=list)
    unchained: list[str] = field(default_factory=list)
    confirmed: int = 0  # latest entries their builders give byte for byte
    entries: int = 0
    last: int = 0
    head: str = GENESIS_PREV

    def add(self, other: Found) -> None:
        for name in ("lines", "unchained", "confirmed"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def _attests_nothing(kind: str) -> str:
    gone = "no longer delivered" if kind == "delivered" else "not in the ledger"
    return f"the record it attests is {gone}" + (" (or no longer settled)" if kind == "generation" else "")


def hold(db: sqlite3.Cursor, records: list[Record]) -> Found:
    """Each record's entries, read by its id: its history; its latest entry of each kind it must have
    confirmed against what its builder gives now (else named with what differs, where its body parses);
    every other entry's body read whole."""
    out = Found()
    history: dict[tuple[str, str | None], list[Entry]] = {(r.table, r.id): [] for r in records}
    ids = list({r.id for r in records})
    for i in range(0, len(ids), 500):
        sql = f"{ENTRIES} WHERE record IN ({placeholders(len(ids[i : i + 500]))}) ORDER BY seq"
        for e in map(Entry._make, db.execute(sql, ids[i : i + 500])):
            if (key := (TABLE_OF.get(e.kind, ""), e.record)) in history:
                history[key].append(e)
    for r in records:
        steps = history[r.table, r.id]
        broken = history_problem(r.table, r.id, steps, r.text) if steps else None
        if broken:
            out.lines.append((broken[0].seq, 1, f"{broken[0].where}: {broken[1]}"))
        confirmed = set()
        for kind, payload in r.expected.items():
            last = next((s for s in reversed(steps) if s.kind == kind), None)
            if last is None:
                if payload is not None:
                    out.unchained.append(f"delivery of post {r.id}" if kind == "delivered" else f"{kind} {r.id}")
            elif payload is None:
                out.lines.append((last.seq, 2, f"{last.where}: {_attests_nothing(kind)}"))
            elif confirms(kind, payload, last.body):
                confirmed.add(last.seq)
                out.confirmed += 1
            elif (stated := _parsed(last.body)) is not None and (diff := _differs(stated, payload)):
                out.lines.append((last.seq, 1, f"{last.where}: the ledger no longer matches it: {', '.join(diff)}"))
        for s in steps:
            problem = None if s.seq in confirmed else _body_problem(s.kind, r.id, s.body)
            if problem:
                out.lines.append((s.seq, 0, f"{s.where}: {problem}"))
    return out


def walk(db: sqlite3.Cursor, top: int) -> Found:
    """Each entry follows the one before (seq and prev) and hashes to itself, `BATCH` entries read at a
    time (memory stays flat however long the chain is). One that does not, or that names no record (so
    no record's `hold` reads it), is named by its body (`_body_problem`), else its link or its hash."""
    out = Found()
    while got := db.execute(WALK, (out.last, top, BATCH)).fetchall():
        out.entries += len(got)
        for seq, kind, record, prev, body, digest in got:
            named = kind in TABLE_OF and record is not None
            linked = seq == out.last + 1 and prev == out.head
            if not (linked and named and entry_hash(seq, prev, body) == digest):
                problem = (
                    _link_problem(seq, prev, out.last, out.head) if not linked else _body_problem(kind, record, body)
                )
                if problem is None and entry_hash(seq, prev, body) != digest:
                    problem = "its hash does not match its content"
                if problem:
                    out.lines.append((seq, 0, f"{Entry(seq, kind, record, prev, body, digest).where}: {problem}"))
            out.last, out.head = seq, digest
    return out


BATCH = 5_000  # entries the walk reads at a time: its memory is this many rows, however long the chain
WALK = ENTRIES + " WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3"


def report(walked: Found, held: Found) -> list[tuple[int, str]]:
    """The walk's and the records' lines with the entry each names, ordered by entry, link problems
    first, as one pass over the chain would find them."""
    found = walked.lines + held.lines + [(walked.last + 1, 1, f"{what}: not in the chain") for what in held.unchained]
    found = sorted(dict.fromkeys(found), key=lambda f: (f[0], f[1]))  # (an entry read twice is named once)
    return [(seq, line) for seq, _, line in found]


# The entries up to $1 naming a record that is not in its kind's table: one anti-join per table.
_KINDS = {
    table: ", ".join(f"'{kind}'" for kind in dict.fromkeys((first, *then))) for table, (first, then) in HISTORY.items()
}
UNATTESTED = (
    " UNION ALL ".join(
        f"{ENTRIES} WHERE seq <= $1 AND kind IN ({kinds}) AND record IS NOT NULL"
        f" AND NOT EXISTS (SELECT 1 FROM {table} WHERE id = chain.record)"
        for table, kinds in _KINDS.items()
    )
    + " ORDER BY seq"
)


def unattested(db: sqlite3.Cursor, top: int) -> Found:
    """The entries up to `top` naming a record that is not in its table: each such record's latest
    entry of a kind attests nothing."""
    out = Found()
    latest: dict[tuple[str, str | None], Entry] = {}
    for e in map(Entry._make, db.execute(UNATTESTED, (top,))):
        problem = _body_problem(e.kind, e.record, e.body)
        if problem:
            out.lines.append((e.seq, 0, f"{e.where}: {problem}"))
        latest[e.kind, e.record] = e
    out.lines += [(e.seq, 2, f"{e.where}: {_attests_nothing(e.kind)}") for e in latest.values()]
    return out


def _body_problem(kind: str, record: str | None, body: str) -> str | None:
    """What is wrong with an entry's body that no record's builder gives exactly: not canonical JSON, or
    its kind and record columns not its own."""
    try:
        obj = json.loads(body)
    except ValueError:
        return "its body is not JSON"
    if not isinstance(obj, dict) or canonical(obj) != body:
        return "its body is not canonical JSON"
    if obj.get("kind") != kind or (obj.get("id") if kind != "genesis" else None) != record:
        return f"its kind/record columns ({kind}, {record}) differ from the entry's own"
    return None
