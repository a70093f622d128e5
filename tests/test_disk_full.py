"""A ledger whose disk fills mid-turn: nothing unrecorded is posted, and the turn is answered once space is back.

SQLite's `PRAGMA max_page_count` caps the ledger's file, so "database or disk is full" is the real SQLite
error (SQLITE_FULL) without a mount; raising the cap is the operator freeing space. The real pipeline
runs against the local provider behind the real SDK. (`tests/test_disk_full_process.py` fills a real
filesystem under `residents run`.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
from conftest import Pipeline, Room, residence
from roomkit import eventually

from residents.ledger import Ledger, LedgerWriteError
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.records import Attempt, Generation


class Refusals(logging.Handler):
    """Set when the pipeline logs that the ledger refused a write (`residents.ledger.retry`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.refused = asyncio.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        if "not recorded yet" in line:
            self.refused.set()


@contextmanager
def refusals() -> Iterator[Refusals]:
    handler = Refusals()
    logger = logging.getLogger("residents")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def page_count(ledger: Ledger) -> int:
    return int(list(await ledger.db.execute_fetchall("PRAGMA page_count"))[0][0])


@asynccontextmanager
async def full_disk(ledger: Ledger) -> AsyncIterator[None]:
    """The ledger's file may not grow by a page (a full disk) inside the block; after it, it may again."""
    await ledger.db.execute(f"PRAGMA max_page_count = {await page_count(ledger)}")
    try:
        yield
    finally:
        await ledger.db.execute("PRAGMA max_page_count = 1073741823")


async def test_a_write_the_full_disk_refuses_is_a_ledger_write_error_and_nothing_of_it_is_on_disk(tmp_path) -> None:
    async with Ledger.open(tmp_path / "l.db") as ledger:
        g = Generation(id="g-full", residence="cairn", channel="general", model="m")
        async with full_disk(ledger):
            g.text = "x" * 20_000  # needs pages the disk has no room for
            with pytest.raises(LedgerWriteError, match="the ledger could not write: database or disk is full"):
                await ledger.start_attempt(Attempt(id="a-full", generation_id=g.id, segment=1, index=1), g)
        assert await ledger.get_generation(g.id) is None
        await ledger.start_attempt(Attempt(id="a-full", generation_id=g.id, segment=1, index=1), g)  # the same change
        assert await ledger.get_generation(g.id) is not None


async def test_a_turn_whose_ledger_fills_posts_nothing_then_is_answered_once_space_is_back(pipeline: Pipeline) -> None:
    """The disk fills as a 30,000-character reply streams: the provider's text is kept in memory, nothing is
    posted while the ledger refuses it, the generation is not abandoned; once space is back the turn settles
    with its true outcome (completed, every character), its posts recorded then delivered, `verify` clean."""
    res = pipeline.resident(residence(name="cairn"))
    room = Room()
    await pipeline.turn(res, room, "Hello, @cairn", [Call(sse=sse.stream("A first reply."))])  # the file exists
    text = " ".join(f"word{i:05d}" for i in range(3000))
    pipeline.server.reset([Call(sse=sse.stream(text))])
    m = room.say("alice", "Describe the harbour at length, @cairn")
    sent_before = len(room.sent)
    with refusals() as log:
        async with full_disk(pipeline.ledger):
            turn = asyncio.create_task(res.respond(room, "room", list(room.history), trigger=m.id))
            await asyncio.wait_for(log.refused.wait(), 20)
            await asyncio.sleep(1.5)  # refused tries go on, with backoff, while the disk stays full
            assert not turn.done()
            assert room.sent[sent_before:] == []  # nothing is posted that the ledger does not hold
            assert pipeline.server.requests  # the provider was called: its text waits in memory
        reply = await asyncio.wait_for(turn, 30)
    g = reply.generation
    assert g is not None and (g.status, g.stop_reason, g.text) == ("completed", "end_turn", text)
    assert [p.kind for p in room.sent[sent_before:]] == ["speech"] * len(reply.posts)
    assert " ".join(p.content for p in room.sent[sent_before:]).split() == text.split()
    stored = await pipeline.ledger.get_generation(g.id)
    assert stored is not None and stored.status == "completed" and stored.text == text
    assert all(p.message_id is not None for p in stored.posts)
    assert await pipeline.ledger.unsettled_generations() == []
    assert await verify(pipeline.ledger, unsettled_as_violations=True) == []
    assert any("recorded after" in line for line in log.lines)


async def test_a_delivery_the_full_ledger_cannot_record_is_adopted_from_the_room_never_sent_twice(tmp_path) -> None:
    """The room took a post but the ledger refused its message id (a full disk, a real tmpfs here): the outbox
    tries again like after a room failure, finds the post in the room and records it there, so once space is
    back every post is recorded delivered and none went out twice."""
    from test_crash import FakeRoom, planned_generation
    from test_disk_full_process import fill, small_disk

    from residents.delivery.outbox import Backoff, Outbox

    with small_disk(tmp_path / "disk", "4m") as disk, refusals() as log:
        async with Ledger.open(disk / "ledger.db") as ledger:
            posts = await planned_generation(ledger, ["The harbour at dawn."], delivered=0)
            room = FakeRoom([])
            outbox = Outbox(ledger, Backoff(base=0.1, cap=0.2))
            outbox.register("cairn", room)
            filler = fill(disk)
            waiting = outbox.enqueue("cairn", posts)
            await eventually(lambda: any("the ledger refused a delivery's record" in line for line in log.lines))
            await asyncio.sleep(0.5)  # tried again and again while the disk stays full
            assert [p.id for p in room.sent] == [posts[0].id]
            filler.unlink()
            assert await asyncio.wait_for(outbox.wait(waiting), 10)
            await outbox.close()
            assert [p.id for p in room.sent] == [p.id for p in posts]  # each sent once
            stored = await ledger.get_generation(posts[0].generation_id or "")
            assert stored is not None and [p.message_id for p in stored.posts] == [m.id for m in room.held]
            assert await verify(ledger) == []
