"""A post the room refuses (HTTP 400, 403, 404) is set aside after a few tries; the channel goes on.

The real pipeline (local provider, SDK, SQLite ledger) through the outbox, with a room of the test's
own that refuses chosen posts: the refused post is recorded as such, in the chain too, the rest of
its reply and the next reply are delivered, one ERROR names it, `verify` holds, and a restart does
not try it again. A room that is down (any other failure) is still retried for as long as it takes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from conftest import Room, residence

from residents.delivery.outbox import NO_BACKOFF, REFUSED_TRIES, Backoff, Outbox
from residents.delivery.resume import RoomRefused, RoomUnavailable
from residents.ledger import chain, views
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.records import Post, Refusal

TURN_TIMEOUT = 10.0  # a turn whose posts never settle fails the test instead of holding it
FORBIDDEN = Refusal(403, 50013, "403 Forbidden (error code: 50013): Missing Permissions")


def long_text(n: int) -> str:
    return " ".join(f"w{i:05d}" for i in range(n // 7))[:n]


class RefusingRoom(Room):
    """The test's room: a post's sends fail with the errors queued for its seq, one per try, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: dict[int, list[Exception]] = {}
        self.tries: list[int] = []

    async def send(self, post: Post) -> str:
        self.tries.append(post.seq)
        queued = self.failures.get(post.seq)
        if queued:
            raise queued.pop(0)
        return await super().send(post)


@pytest.fixture
def expected_errors() -> list[str]:
    return ["set aside undelivered"]


async def cut_reply(pipeline: Any, room: RefusingRoom) -> Any:
    """A reply cut at the ceiling: three partials and a receipt, through the outbox to `room`."""
    res = pipeline.resident(residence(max_tokens=1024), room)
    reply, _ = await asyncio.wait_for(
        pipeline.turn(res, room, "Describe the harbour.", [Call(sse=sse.stream(long_text(5200), "max_tokens", 1024))]),
        TURN_TIMEOUT,
    )
    assert [p.kind for p in reply.generation.posts] == ["partial", "partial", "partial", "receipt"]
    return res, reply


async def test_a_post_refused_three_times_is_set_aside_and_the_rest_goes_on(pipeline, caplog) -> None:
    room = RefusingRoom()
    room.failures[2] = [RoomRefused(FORBIDDEN) for _ in range(REFUSED_TRIES)]
    res, reply = await cut_reply(pipeline, room)
    g = await pipeline.ledger.get_generation(reply.generation.id)
    second = g.posts[1]
    # tried three times, then set aside with the refusal as the room gave it; the rest of the reply went out
    assert room.tries.count(2) == REFUSED_TRIES
    assert (second.message_id, second.refused) == (None, FORBIDDEN.text) and second.refused_at is not None
    assert [p.seq for p in room.sent] == [1, 3, 4] and all(p.message_id for p in g.posts if p.seq != 2)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and second.id in errors[0].getMessage() and FORBIDDEN.text in errors[0].getMessage()
    # the next reply in the channel is delivered as usual
    nxt, sent = await asyncio.wait_for(
        pipeline.turn(res, room, "And then?", [Call(sse=sse.stream("Calm water.", "end_turn", 4))]), TURN_TIMEOUT
    )
    assert [p.content for p in sent] == ["Calm water."] and nxt.waiting == 0
    # the ledger says which part was refused and why; the chain records it; verify holds
    entry = await views.latest(pipeline.ledger.db, "refused", second.id)
    assert entry is not None
    body = json.loads(entry.body)
    assert (body["status"], body["code"], body["refused_sha256"]) == (403, 50013, chain.sha256_text(FORBIDDEN.text))
    shown = "\n".join(views.provenance(g))
    assert "2. partial" in shown and "refused by the room" in shown and FORBIDDEN.text in shown
    assert views.refused_line(second).startswith(f"partial post 2 of generation {g.id}: not delivered: refused")
    assert await pipeline.ledger.refused_posts() == [second]
    assert await verify(pipeline.ledger) == []
    # a restart: nothing of it is left to deliver, and the room is not tried again
    assert await pipeline.ledger.undelivered_posts_of("cairn") == []
    before = len(room.tries)
    restarted = Outbox(pipeline.ledger, NO_BACKOFF)
    restarted.register("cairn", room)
    assert await restarted.resume("cairn") == 0 and len(room.tries) == before


async def test_refusals_short_of_the_limit_then_success_deliver_the_post(pipeline) -> None:
    room = RefusingRoom()
    room.failures[2] = [RoomRefused(FORBIDDEN) for _ in range(REFUSED_TRIES - 1)]
    _, reply = await cut_reply(pipeline, room)
    g = await pipeline.ledger.get_generation(reply.generation.id)
    assert all(p.message_id and p.refused is None for p in g.posts) and [p.seq for p in room.sent] == [1, 2, 3, 4]
    assert await pipeline.ledger.refused_posts() == []


async def test_a_room_that_is_down_is_retried_however_often_it_fails(pipeline) -> None:
    """429s, 5xx and network errors are not refusals: the post waits for the room, never set aside."""
    room = RefusingRoom()
    room.failures[2] = [RoomUnavailable("DiscordServerError: 503 Service Unavailable") for _ in range(10)]
    _, reply = await cut_reply(pipeline, room)
    g = await pipeline.ledger.get_generation(reply.generation.id)
    assert room.tries.count(2) == 11 and all(p.message_id and p.refused is None for p in g.posts)
    assert [p.seq for p in room.sent] == [1, 2, 3, 4]


async def test_verify_holds_a_refused_post_against_its_chain_entry(pipeline) -> None:
    room = RefusingRoom()
    room.failures[1] = [RoomRefused(FORBIDDEN) for _ in range(REFUSED_TRIES)]
    _, reply = await cut_reply(pipeline, room)
    first = (await pipeline.ledger.get_generation(reply.generation.id)).posts[0]
    assert await verify(pipeline.ledger) == []
    await pipeline.ledger.db.execute("UPDATE posts SET refused = $1 WHERE id = $2", ("400 Bad Request", first.id))
    problems = await verify(pipeline.ledger)
    assert len(problems) == 1 and f"(refused {first.id})" in problems[0] and "refused_sha256" in problems[0]
    # a post marked refused behind the chain's back (its entries are append-only): no entry attests it
    second = (await pipeline.ledger.get_generation(reply.generation.id)).posts[1]
    await pipeline.ledger.db.execute("UPDATE posts SET refused = $1 WHERE id = $2", ("404 Not Found", second.id))
    assert any(f"refused {second.id}: not in the chain" in p for p in await verify(pipeline.ledger))


def test_the_backoff_stays_at_its_cap_however_long_the_room_fails() -> None:
    """After 1,025 failures in a row (about three hours at the 10 s cap) the doubling overflowed a float."""
    assert Backoff().delay(1) == 1.0 and Backoff().delay(5) == 10.0
    assert Backoff().delay(1_100) == 10.0 and NO_BACKOFF.delay(10**6) == 0.0
