"""The chain's head as checkpoints and /provenance publish it, read in one place.

Why its own reader: a checkpoint names the latest entry exactly as `residents ledger verify --head`
will look it up — its `seq` and `hash` — and an empty chain has no head to name (None), rather than
a made-up entry 0.
"""

from __future__ import annotations

from .connection import Connection


async def chain_head(db: Connection) -> tuple[int, str] | None:
    """The latest chain entry's sequence number and hash (lowercase hex), or None while the chain is empty."""
    rows = list(await db.execute_fetchall("SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1"))
    return (int(rows[0][0]), str(rows[0][1])) if rows else None
