"""The ledger: migrations, byte-exact text, and the flush bound while a stream runs, on both backends
(`backend`: a SQLite file, a PostgreSQL database); a file's own matters (WAL, permissions, a file that is
not a ledger) on SQLite alone."""

from __future__ import annotations

import os
import stat

import pytest
from conftest import Room, residence
from ledgerkit import Backend

from residents.generation.attempts import FLUSH_CHARS, LedgerSink
from residents.ledger import Ledger, LedgerError
from residents.ledger.migrations import MIGRATIONS
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.records import Attempt, Generation, Stump

TRICKY = "Ünïcødé — 漢字 and emoji 👩‍👩‍👧 with trailing spaces   \n\t and a mid-wo"


async def test_migrations_are_recorded_once(backend: Backend) -> None:
    ledger = await Ledger.open(backend.location)
    await ledger.close()
    ledger = await Ledger.open(backend.location)  # second start applies nothing new
    rows = await ledger.db.execute_fetchall("SELECT name FROM _migrations ORDER BY rowid")
    assert [r[0] for r in rows] == [m[0] for m in MIGRATIONS]
    await ledger.close()


async def test_a_new_ledger_file_is_in_wal_mode_and_its_owners_alone(tmp_path):
    """SQLite only by nature: a file's journal mode and permissions."""
    path = tmp_path / "l.db"
    async with Ledger.open(path) as ledger:
        mode = await ledger.db.execute_fetchall("PRAGMA journal_mode")
    assert mode[0][0] == "wal"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


async def test_a_file_that_is_not_a_ledger_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.db"
    bad.write_text("not sqlite at all" * 100)
    with pytest.raises(LedgerError, match="x.db"):
        await Ledger.open(bad)


async def test_text_round_trips_byte_exact_through_the_real_pipeline(backend: Backend, pipeline):
    text = TRICKY + "\ud83d"  # a lone surrogate a provider's JSON escapes can carry
    raw = sse.stream(text, "max_tokens", 4096, size=5)
    res = pipeline.resident(residence())
    reply, posts = await pipeline.turn(res, Room(), "go", [Call(sse=raw)])
    g = reply.generation
    assert g.text == text and g.status == "truncated"
    fresh = await Ledger.open(backend.location)
    try:
        stored = await fresh.get_generation(g.id)
        assert stored.text == text
        assert stored.attempts[0].text == text and stored.attempts[0].chars == len(text)
        assert [s.text for s in stored.stumps] == [text]
        raw_bytes = (await fresh.db.execute_fetchall("SELECT text FROM generations WHERE id=$1", (g.id,)))[0][0]
        assert bytes(raw_bytes) == text.encode("utf-8", "surrogatepass")
    finally:
        await fresh.close()


async def test_streaming_text_is_on_disk_within_the_flush_bound(backend: Backend):
    ledger = await Ledger.open(backend.location)
    try:
        g = Generation(id="g-x", residence="r", channel="c", model="m")
        await ledger.create_generation(g)
        a = Attempt(id="a-x", generation_id="g-x", segment=1, index=1)
        await ledger.start_attempt(a)
        sink = LedgerSink(ledger, a.id)
        sink.start(0, "text", "", None)
        sent = ""
        for i in range(3000):
            piece = f"{i}é👍 "
            due = sink.add(piece)
            sent += piece
            if due:
                await sink.flush()
            if i % 97 == 0:
                # What a crash would leave: the rows another connection reads.
                rows = backend.rows("SELECT text FROM attempt_chunks WHERE attempt_id='a-x' ORDER BY seq")
                on_disk = "".join(bytes(r[0]).decode("utf-8", "surrogatepass") for r in rows)
                assert sent.startswith(on_disk)
                assert len(sent) - len(on_disk) < FLUSH_CHARS + len(piece)
        await sink.flush()  # what settlement writes last: then every character is on disk, in order
        await sink.close()
        assert await ledger.streamed_text("a-x") == sent
    finally:
        await ledger.close()


async def test_stump_queries_are_parameterised(backend: Backend):
    ledger = await Ledger.open(backend.location)
    try:
        g = Generation(id="g-'; DROP TABLE stumps; --", residence="o'brien", channel="c", model="m")
        await ledger.create_generation(g)
        await ledger.add_stumps([Stump("s-1", g.id, None, "max_tokens", "x'y", 3, residence="o'brien")])
        assert [s.text for s in await ledger.list_stumps("o'brien", "max_tokens")] == ["x'y"]
        assert await ledger.get_generation(g.id) is not None
    finally:
        await ledger.close()
