"""`Ledger.list_stump_meta`: stumps' metadata newest first, paged, scoped to channels, reading no stump text.

Whether the text is read is asked of SQLite itself: an authorizer refuses every read of `stumps.text`,
so a query that selects it fails instead of passing quietly.
"""

from __future__ import annotations

import sqlite3

import pytest

from residents.ledger import Ledger
from residents.records import Generation, Stump


async def seed(ledger: Ledger) -> list[Stump]:
    """Twelve stumps over two residences, two channels and two causes, created in a known order."""
    made: list[Stump] = []
    for i in range(12):
        g = Generation(
            id=f"g-{i:03}",
            residence="cairn" if i % 3 else "sill",
            channel="100" if i % 2 else "200",
            model="claude-3-opus-20240229",
            created_at=1000.0 + i,
        )
        await ledger.create_generation(g)
        s = Stump(
            id=f"s-{i:03}",
            generation_id=g.id,
            attempt_id=None,
            cause="max_tokens" if i % 4 else "refusal",
            text="x" * (10 + i) + "\ud83d",
            output_tokens=i,
            residence=g.residence,
            created_at=2000.0 + i,
        )
        made.append(s)
    await ledger.add_stumps(made)
    return made


@pytest.fixture
async def ledger(tmp_path):
    ledger = await Ledger.open(tmp_path / "ledger.db")
    try:
        yield ledger
    finally:
        await ledger.close()


async def refuse_text_reads(ledger: Ledger) -> list[str]:
    reads: list[str] = []

    def authorize(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_READ and arg1 == "stumps":
            reads.append(str(arg2))
            if arg2 == "text":
                return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    await ledger.db.set_authorizer(authorize)
    return reads


async def test_metadata_newest_first_with_chars_and_no_text_read(ledger):
    made = await seed(ledger)
    reads = await refuse_text_reads(ledger)
    got = await ledger.list_stump_meta(limit=100)
    assert [s.id for s in got] == [s.id for s in reversed(made)]
    assert all(s.text == "" for s in got)
    assert [s.chars for s in got] == [len(s.text) for s in reversed(made)]  # the stored count, surrogate included
    assert [(s.cause, s.residence, s.output_tokens, s.generation_id) for s in got] == [
        (s.cause, s.residence, s.output_tokens, s.generation_id) for s in reversed(made)
    ]
    assert reads and "text" not in reads
    with pytest.raises(sqlite3.DatabaseError):  # the authorizer is live: the full read is refused
        await ledger.list_stumps()


async def test_paging_filters_and_channel_scope(ledger):
    made = await seed(ledger)
    await refuse_text_reads(ledger)
    newest = [s.id for s in reversed(made)]
    first = await ledger.list_stump_meta(limit=5)
    second = await ledger.list_stump_meta(limit=5, before=first[-1].id)
    third = await ledger.list_stump_meta(limit=5, before=second[-1].id)
    assert [s.id for s in first + second + third] == newest
    assert await ledger.list_stump_meta(limit=5, before=made[0].id) == []
    assert [s.id for s in await ledger.list_stump_meta("cairn", "max_tokens")] == [
        s.id for s in reversed(made) if s.residence == "cairn" and s.cause == "max_tokens"
    ]
    in_100 = await ledger.list_stump_meta(channels=["100"])
    assert [s.id for s in in_100] == [s.id for i, s in reversed(list(enumerate(made))) if i % 2]
    assert await ledger.list_stump_meta(channels=[]) == []
    assert await ledger.list_stump_meta(channels=["' OR '1'='1"]) == []
    assert [s.id for s in await ledger.list_stump_meta("sill", channels=["100", "200"], limit=2)] == ["s-009", "s-006"]
