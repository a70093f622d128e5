"""Where SQLite rows become records: the one text decoder and one reader per kind of record.

Why one place: the ledger (`store`) and `ledger verify` read the same rows; if each turned them into
records its own way, `verify` could confirm an entry against a record the ledger never reads back.
A row is anything indexable by column name (`sqlite3.Row`, aiosqlite's rows, a dict); columns a
query left out take the record's default. A stored value outside its enum (a hand-edited status)
is kept as it is stored, for `verify` to name rather than to fail on.
"""

from __future__ import annotations

import functools
import itertools
import json
import sqlite3
import sys
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, TypeVar

from ..records import (
    Attempt,
    Block,
    ContinuationEnd,
    Generation,
    Outcome,
    Post,
    PostKind,
    PostReason,
    Segment,
    Status,
    Stump,
    StumpScope,
)
from ..text import outbound

E = TypeVar("E", bound=StrEnum)


def stored_text(blob: bytes | str | None) -> str:
    """A text column as stored (UTF-8 bytes, lone surrogates passed through) read back exactly."""
    if type(blob) is bytes:  # the usual case first: `verify` reads every text of the ledger through here
        return blob.decode("utf-8", "surrogatepass")
    if blob is None:
        return ""
    if isinstance(blob, str):
        return blob
    return bytes(blob).decode("utf-8", "surrogatepass")


def cols(r: Any) -> dict[str, Any]:
    return dict(r) if not isinstance(r, dict) else r


TEXTS = frozenset({"text", "content", "refused"})  # the text columns (UTF-8 BLOBs) of the ledger's records


def dicts(db: sqlite3.Cursor, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
    """A query's rows as dicts made straight from tuples (cheaper than `sqlite3.Row` looked up by name),
    their text columns decoded here, once, for every check and builder that reads them after."""
    got = db.execute(sql, tuple(params)).fetchall()
    names = [sys.intern(d[0]) for d in db.description or ()]  # (so each look-up by name is one compare)
    out = list(map(dict, map(zip, itertools.repeat(names), got)))
    for name in TEXTS.intersection(names):
        for r in out:
            if r[name] is not None:  # (a post's `refused` is NULL unless the room refused it)
                r[name] = stored_text(r[name])
    return out


def _member(kind: type[E], value: Any) -> E:
    """`value` as a member of `kind`, or as stored where it is none (verify names it; reading never fails)."""
    return _members(kind).get(value, value)


@functools.cache
def _members(kind: type[E]) -> dict[Any, E]:
    return {m.value: m for m in kind}


def generation(r: Any, request: dict[str, Any] | None = None) -> Generation:
    g = cols(r)
    return Generation(
        id=g["id"],
        residence=g["residence"],
        channel=g["channel"],
        model=g["model"],
        status=_member(Status, g["status"]),
        stop_reason=g["stop_reason"],
        text=stored_text(g["text"]),
        output_tokens=g["output_tokens"],
        standing=g["standing"],
        continuation_ended=_member(ContinuationEnd, g["continuation_ended"]),
        trigger=g.get("trigger"),
        person=g.get("person"),
        seen_upto=g.get("seen_upto"),
        request=request,
        created_at=g.get("created_at") or 0.0,
        finished_at=g.get("finished_at"),
    )


def segment(r: Any) -> Segment:
    s = cols(r)
    return Segment(
        index=s["idx"],
        attempt_id=s["attempt_id"],
        stop_reason=s["stop_reason"],
        chars=s["chars"],
        output_tokens=s["output_tokens"],
        overlap_removed=s["overlap_removed"],
    )


def block(r: Any) -> Block:
    b = cols(r)
    start, extras = b.get("start"), b.get("extras")
    return Block(
        b["idx"],
        b["type"],
        stored_text(b["content"]),
        json.loads(start) if start else None,
        json.loads(extras) if extras else [],
        b.get("text_offset"),
    )


def attempt(r: Any, blocks: list[Block]) -> Attempt:
    a = cols(r)
    details = a.get("stop_details")
    return Attempt(
        id=a["id"],
        generation_id=a["generation_id"],
        segment=a["segment"],
        index=a["idx"],
        text=stored_text(a["text"]),
        outcome=_member(Outcome, a["outcome"]),
        stop_reason=a["stop_reason"],
        discard_reason=a["discard_reason"],
        error=a["error"],
        output_tokens=a["output_tokens"],
        input_tokens=a.get("input_tokens"),
        cache_write_tokens=a.get("cache_write_tokens"),
        cache_read_tokens=a.get("cache_read_tokens"),
        request_id=a.get("request_id"),
        replaced_by=a.get("replaced_by"),
        started_at=a.get("started_at") or 0.0,
        ended_at=a.get("ended_at"),
        stop_details=json.loads(details) if details else None,
        blocks=blocks,
        request_replacements=a["request_replacements"] if "request_replacements" in a else 0,
    )


def stump(r: Any) -> Stump:
    """A stump from its row; a row without `text` (a metadata listing) keeps its stored chars."""
    s = cols(r)
    return Stump(
        id=s["id"],
        generation_id=s["generation_id"],
        attempt_id=s["attempt_id"],
        cause=s["cause"],
        text=stored_text(s.get("text")),
        output_tokens=s["output_tokens"],
        scope=_member(StumpScope, s["scope"]),
        published=bool(s.get("published")),
        replaced_by=s.get("replaced_by"),
        created_at=s.get("created_at") or 0.0,
        residence=s["residence"],
        stored=True,
        known_chars=None if "text" in s else s["chars"],
        block=s.get("block"),
        block_type=s.get("block_type"),
    )


def post(r: Any) -> Post:
    p = cols(r)
    content = stored_text(p["content"])
    replacements = p.get("replacements")
    return Post(
        id=p["id"],
        generation_id=p["generation_id"],
        seq=p["seq"],
        kind=_member(PostKind, p["kind"]),
        content=content,
        channel=p["channel"],
        message_id=p.get("message_id"),
        delivered_at=p.get("delivered_at"),
        replacements=outbound(content)[1] if replacements is None else replacements,
        stump_id=p.get("stump_id"),
        reason=None if p.get("reason") is None else _member(PostReason, p["reason"]),
        refused=p.get("refused"),
        refused_at=p.get("refused_at"),
    )
