"""The resident's control of its own stumps, in the ledger: access, reads, publications, tool calls.

A stump's `access` (`moderators` | `private`) is the resident's choice of who may read its text; a
new stump starts with its residence's `stumps.default_access` (kept in `stump_access_defaults`, set
on insert by the schema). Every read of a stump's text (the resident's `stumps` tool, a moderator's
`/stumps show`) is a row in `stump_reads`; every change of access, in `stump_access_changes`. A
generation's tool calls are rows of `tool_calls`. Kept apart from `store.py` so each is small.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..records import Post, ToolCall
from . import appending, chain
from .connection import placeholders
from .rows import post as post_from_row
from .store import Ledger, stored_bytes, stored_text

ACCESS = ("moderators", "private")


async def use_default_access(ledger: Ledger, residence: str, access: str) -> None:
    """The access every new stump of `residence` starts with from now on."""
    if access not in ACCESS:
        raise ValueError(f"access must be one of {ACCESS}, not {access!r}")
    await ledger.transact(
        [
            (
                "INSERT INTO stump_access_defaults (residence, access) VALUES ($1, $2)"
                " ON CONFLICT(residence) DO UPDATE SET access = excluded.access",
                (residence, access),
            )
        ]
    )


async def access_of(ledger: Ledger, stump_id: str) -> str | None:
    rows = list(await ledger.db.execute_fetchall("SELECT access FROM stumps WHERE id=$1", (stump_id,)))
    return rows[0][0] if rows else None


async def set_access(ledger: Ledger, stump_id: str, access: str, residence: str, generation_id: str | None) -> float:
    """The resident's choice, with who made it and when, in one transaction; returns when."""
    if access not in ACCESS:
        raise ValueError(f"access must be one of {ACCESS}, not {access!r}")
    now = time.time()
    await ledger.transact(
        [
            ("UPDATE stumps SET access=$1 WHERE id=$2", (access, stump_id)),
            (
                "INSERT INTO stump_access_changes (stump_id, access, set_by, generation_id, set_at) VALUES ($1,$2,$3,$4,$5)",
                (stump_id, access, residence, generation_id, now),
            ),
            appending.append(
                "stump-access", stump_id, chain.stump_access_payload(stump_id, access, residence, generation_id)
            ),
        ]
    )
    return now


async def record_read(
    ledger: Ledger, stump_id: str, reader: str, reader_kind: str, generation_id: str | None = None
) -> float:
    """One read of a stump's text, recorded before the text is handed over; returns when."""
    if reader_kind not in ("resident", "moderator"):
        raise ValueError(f"reader kind must be resident or moderator, not {reader_kind!r}")
    now = time.time()
    await ledger.transact(
        [
            (
                "INSERT INTO stump_reads (stump_id, reader, reader_kind, generation_id, read_at) VALUES ($1,$2,$3,$4,$5)",
                (stump_id, reader, reader_kind, generation_id, now),
            ),
            appending.append(
                "stump-read", stump_id, chain.stump_read_payload(stump_id, reader, reader_kind, generation_id)
            ),
        ]
    )
    return now


async def reads_of(ledger: Ledger, stump_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Who read each stump's text and when, oldest first."""
    out: dict[str, list[dict[str, Any]]] = {sid: [] for sid in stump_ids}
    for i in range(0, len(stump_ids), 500):
        part = stump_ids[i : i + 500]
        marks = placeholders(len(part))
        for r in await ledger.db.execute_fetchall(
            f"SELECT stump_id, reader, reader_kind, read_at FROM stump_reads WHERE stump_id IN ({marks})"
            " ORDER BY read_at, rowid",
            tuple(part),
        ):
            out[r[0]].append({"reader": r[1], "kind": r[2], "at": r[3]})
    return out


_META = (
    "SELECT s.id, s.generation_id, s.attempt_id, s.scope, s.cause, s.chars, s.output_tokens, s.published,"
    " s.created_at, s.access, s.block_type, g.channel FROM stumps s JOIN generations g ON g.id = s.generation_id"
)


async def own_stumps(ledger: Ledger, residence: str, channel: str, limit: int) -> tuple[list[dict[str, Any]], int]:
    """A residence's stumps made in `channel`, newest first, metadata only (no text read), and how many in all."""
    rows = await ledger.db.execute_fetchall(
        _META + " WHERE s.residence=$1 AND g.channel=$2 ORDER BY s.created_at DESC, s.rowid DESC LIMIT $3",
        (residence, channel, limit),
    )
    total = list(
        await ledger.db.execute_fetchall(
            "SELECT count(*) FROM stumps s JOIN generations g ON g.id = s.generation_id"
            " WHERE s.residence=$1 AND g.channel=$2",
            (residence, channel),
        )
    )
    return [dict(r) for r in rows], total[0][0]


async def own_stump(ledger: Ledger, residence: str, channel: str, stump_id: str) -> dict[str, Any] | None:
    """One stump of `residence` made in `channel`, metadata only; None for any other (as if it did not exist)."""
    rows = list(
        await ledger.db.execute_fetchall(
            _META + " WHERE s.id=$1 AND s.residence=$2 AND g.channel=$3", (stump_id, residence, channel)
        )
    )
    return dict(rows[0]) if rows else None


async def stump_text(ledger: Ledger, stump_id: str) -> str:
    rows = list(await ledger.db.execute_fetchall("SELECT text FROM stumps WHERE id=$1", (stump_id,)))
    return stored_text(rows[0][0]) if rows else ""


async def publication_of(ledger: Ledger, stump_id: str) -> list[Post]:
    """The posts that published a stump at its resident's request (recovered text and its receipt)."""
    return [
        post_from_row(r)
        for r in await ledger.db.execute_fetchall("SELECT * FROM posts WHERE stump_id=$1 ORDER BY seq", (stump_id,))
    ]


async def add_tool_calls(ledger: Ledger, generation_id: str, calls: list[ToolCall]) -> None:
    """One round's calls and their results, in one transaction."""
    if calls:
        await ledger.transact(
            [
                (
                    "INSERT INTO tool_calls (generation_id, round, pos, attempt_id, tool_use_id, name, input,"
                    " result, is_error, created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)",
                    (
                        generation_id,
                        c.round,
                        c.pos,
                        c.attempt_id,
                        c.tool_use_id,
                        c.name,
                        stored_bytes(json.dumps(c.input, ensure_ascii=False)),
                        stored_bytes(json.dumps(c.result, ensure_ascii=False)),
                        int(c.is_error),
                        c.created_at,
                    ),
                )
                for c in calls
            ]
        )


async def tool_calls_of(ledger: Ledger, generation_id: str) -> list[ToolCall]:
    return [
        ToolCall(
            round=r["round"],
            pos=r["pos"],
            attempt_id=r["attempt_id"],
            tool_use_id=r["tool_use_id"],
            name=r["name"],
            input=json.loads(stored_text(r["input"])),
            result=json.loads(stored_text(r["result"])),
            is_error=bool(r["is_error"]),
            created_at=r["created_at"],
        )
        for r in await ledger.db.execute_fetchall(
            "SELECT * FROM tool_calls WHERE generation_id=$1 ORDER BY round, pos", (generation_id,)
        )
    ]
