"""Appending to the hash chain: the one INSERT that puts a record's entry in the transaction of the
change it records, so a crash never parts a record from its entry. The INSERT reads the head itself,
under the transaction's write lock, and hashes with `chain_hash` (`install`). The entries' format and
builders are `chain`'s; `ledger verify` reads them back and appends nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..records import Attempt, Generation, Post, Refusal, Stump
from .chain import (
    GENESIS_PREV,
    attempt_payload,
    canonical,
    delivered_payload,
    entry_hash,
    generation_payload,
    post_payload,
    refused_payload,
    stump_payload,
)
from .connection import Connection

Statement = tuple[str, tuple[Any, ...]]

APPEND = (
    "INSERT INTO chain (seq, kind, record, prev, body, hash) SELECT n, $1, $2, p, b, chain_hash(n, p, b) FROM"
    " (SELECT coalesce((SELECT max(seq) FROM chain), 0) + 1 AS n,"
    " coalesce((SELECT hash FROM chain ORDER BY seq DESC LIMIT 1), '" + GENESIS_PREV + "') AS p, $3 AS b) AS head"
)


_IF_STREAMING = " WHERE EXISTS (SELECT 1 FROM attempts WHERE id=$4 AND outcome='streaming')"


async def install(db: Connection) -> None:
    """Register `chain_hash(seq, prev, body)` on a connection; every connection that appends needs it.
    (PostgreSQL's is a function in the database: `schema_postgres`.)"""
    if db.dialect != "sqlite":
        return
    await db.create_function("chain_hash", 3, entry_hash, deterministic=True)


def append(kind: str, record: str | None, payload: dict[str, Any]) -> Statement:
    """The one INSERT that appends an entry; put it in the transaction of the change it records.

    `payload` holds the entry's own fields (ids, counts, hashes: never text); `kind`, `at` and, for a
    record, `id` (the record id the `record` column repeats) are added.
    """
    entry = {**payload, "kind": kind, "at": int(time.time() * 1000)}
    if record is not None and entry.setdefault("id", record) != record:
        raise ValueError(f"a {kind} entry for {record} names another id: {entry['id']!r}")
    return (APPEND, (kind, record, canonical(entry)))


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
