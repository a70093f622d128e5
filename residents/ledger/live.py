"""The ledger's record of live replies (policy `delivery.live`): each message shown while generating.

Kept apart from the posts: a live message is what the room saw while a reply was written; once the
reply settles it is either one of the reply's posts (`adopted`), the published text of a retried
attempt (`set-aside`, its stump marked published), or — left in progress by a stopped process —
`withdrawn` from the room at the next start, so the room ends as it would without live mode.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from . import appending
from .connection import placeholders
from .store import Ledger, stored_bytes, stored_text


@dataclass
class LiveMessage:
    nonce: str
    message_id: str | None  # None until the room answered the send
    generation_id: str
    attempt_id: str
    idx: int
    channel: str
    residence: str
    content: str  # what it showed last, without the in-progress marker
    state: str = "live"
    created_at: float = 0.0


async def add(ledger: Ledger, m: LiveMessage) -> None:
    """Before the send: a stop between the send and its answer leaves the message findable by nonce or content."""
    m.created_at = time.time()
    await ledger.transact(
        [
            (
                "INSERT INTO live_messages (nonce, message_id, generation_id, attempt_id, idx, channel,"
                " residence, content, state, created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)",
                (
                    m.nonce,
                    m.message_id,
                    m.generation_id,
                    m.attempt_id,
                    m.idx,
                    m.channel,
                    m.residence,
                    stored_bytes(m.content),
                    m.state,
                    m.created_at,
                ),
            )
        ]
    )


async def sent(ledger: Ledger, nonce: str, message_id: str) -> None:
    await ledger.transact([("UPDATE live_messages SET message_id=$1 WHERE nonce=$2", (message_id, nonce))])


async def shown(ledger: Ledger, message_id: str, content: str) -> None:
    await ledger.transact(
        [("UPDATE live_messages SET content=$1 WHERE message_id=$2", (stored_bytes(content), message_id))]
    )


async def adopt(ledger: Ledger, message_id: str, post_id: str, content: str) -> None:
    """The live message is now post `post_id` of the settled reply (its message id recorded on the post)."""
    now = time.time()
    await ledger.transact(
        [
            (
                "UPDATE live_messages SET state='adopted', post_id=$1, content=$2 WHERE message_id=$3",
                (post_id, stored_bytes(content), message_id),
            ),
            ("UPDATE posts SET message_id=$1, delivered_at=$2 WHERE id=$3", (message_id, now, post_id)),
            appending.delivered(post_id, message_id),  # a delivery like any other: in the hash chain with it
        ]
    )


async def set_aside(ledger: Ledger, message_ids: list[str], stump_id: str | None, contents: list[str]) -> None:
    """The messages of a retried attempt stay as shown; their text's stump is marked published."""
    statements: list[appending.Statement] = [
        (
            "UPDATE live_messages SET state='set-aside', stump_id=$1, content=$2 WHERE message_id=$3",
            (stump_id, stored_bytes(c), mid),
        )
        for mid, c in zip(message_ids, contents, strict=False)
    ]
    if stump_id is not None:
        statements.append(("UPDATE stumps SET published=1 WHERE id=$1", (stump_id,)))
    await ledger.transact(statements)


async def withdraw(ledger: Ledger, nonce: str, message_id: str | None = None) -> None:
    """No longer in the room (or never reached it): `message_id` is what a stopped send turned out to be."""
    await ledger.transact(
        [
            (
                "UPDATE live_messages SET state='withdrawn', message_id=coalesce(message_id, $1) WHERE nonce=$2",
                (message_id, nonce),
            )
        ]
    )


# On `live_messages_live` (m031): only the messages still in progress are in it.
IN_PROGRESS = "SELECT * FROM live_messages WHERE residence=$1 AND state='live' ORDER BY created_at, idx"


async def in_progress(ledger: Ledger, residence: str) -> list[LiveMessage]:
    """Live messages a stopped process left in progress, oldest first."""
    rows = await ledger.db.execute_fetchall(IN_PROGRESS, (residence,))
    return [_row(r) for r in rows]


async def of_generation(ledger: Ledger, generation_id: str) -> list[LiveMessage]:
    rows = await ledger.db.execute_fetchall(
        "SELECT * FROM live_messages WHERE generation_id=$1 ORDER BY created_at, idx", (generation_id,)
    )
    return [_row(r) for r in rows]


async def by_message(ledger: Ledger, message_ids: list[str]) -> list[LiveMessage]:
    """Live messages by room message id (those not adopted as posts are known only here)."""
    if not message_ids:
        return []
    marks = placeholders(len(message_ids))
    rows = await ledger.db.execute_fetchall(
        f"SELECT * FROM live_messages WHERE message_id IN ({marks}) AND state IN ('live', 'set-aside')",
        list(message_ids),
    )
    return [_row(r) for r in rows]


def _row(r: sqlite3.Row) -> LiveMessage:
    return LiveMessage(
        r["nonce"],
        r["message_id"],
        r["generation_id"],
        r["attempt_id"],
        r["idx"],
        r["channel"],
        r["residence"],
        stored_text(r["content"]),
        r["state"],
        r["created_at"],
    )
