"""The chain's head as checkpoints, `/provenance` and `ledger export` publish it.

A head names the latest entry exactly as `residents ledger verify --head` looks it up, its `seq` and
`hash` (`chain.head`, the one reader); an empty chain has no head to name (None), rather than a
made-up entry 0.
"""

from __future__ import annotations

from . import chain
from .connection import Connection


async def chain_head(db: Connection) -> tuple[int, str] | None:
    """The latest chain entry's sequence number and hash (lowercase hex), or None while the chain is empty."""
    return await db.run(chain.head)
