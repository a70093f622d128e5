"""One reply per trigger message (issue 23): a turn claims its trigger in the ledger before any provider
call, once, on SQLite and on a real PostgreSQL server (`pgkit`).

A message taken already gets no second turn, whoever asks again: the gateway re-delivering the same
MESSAGE_CREATE (real discord.py over the local room's socket), a second turn on it at once, a catch-up.
A reply a spent budget refused counts as taken; a ledger from before the claims reads them from what
answered a message then. And two sessions migrating one new ledger at once (issue 23's failure parts)
apply each step once, on both backends.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from conftest import Pipeline, Room, residence
from discordkit import deployed
from ledgerkit import Backend, rows
from roomkit import eventually

from residents import bundled
from residents.discord.catchup import Claims
from residents.ledger import Ledger, migrations, postgres
from residents.ledger.connection import Connection
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.replay.run import replay
from residents.replay.scenario import load_scenario


@pytest.fixture
def location(backend: Backend) -> str:
    """Where a test's ledger is: a SQLite file's path, or a fresh PostgreSQL database's URL (`backend`)."""
    return backend.location


def said(text: str) -> Call:
    return Call(sse=sse.stream(text, "end_turn", 5))


async def test_a_trigger_is_claimed_once_however_many_ask_at_once(location: str) -> None:
    async with Ledger.open(location) as ledger:
        got = await asyncio.gather(*(ledger.claim_reply("cairn", "100", "general") for _ in range(6)))
        assert sorted(got) == [False] * 5 + [True]
        assert await ledger.claim_reply("cairn", "100", "general") is False
        assert await ledger.claim_reply("basalt", "100", "general") is True  # another resident's turn on it
        assert await ledger.answered("cairn", ["99", "100", "101"]) == {"100"}


async def test_two_turns_on_one_trigger_at_once_make_one_reply(location: str) -> None:
    """Two residents of one name on one ledger (as two processes would be), both handed the same message:
    one provider call, one reply; the other turn is told it was taken."""
    server = ProviderServer()
    await server.start()
    ledger = await Ledger.open(location)
    p = Pipeline(server, ledger, [])
    try:
        room = Room()
        first, second = p.resident(residence(), room), p.resident(residence(), room)
        server.reset([said("only once"), said("a second reply")])
        m = room.say("alice", "hello cairn")
        replies = await asyncio.gather(
            first.respond(room, "room", list(room.history), trigger=m.id),
            second.respond(room, "room", list(room.history), trigger=m.id),
        )
        assert sorted(r.taken for r in replies) == [False, True]
        assert len(server.requests) == 1
        assert [x.content for x in room.sent] == ["only once"]
        again = await first.respond(room, "room", list(room.history), trigger=m.id)  # re-delivered later
        assert again.taken and again.generation is None and again.posts == [] and len(server.requests) == 1
        assert len(await ledger.list_generations("cairn")) == 1
    finally:
        await p.client.close()
        await ledger.close()
        await server.stop()


async def test_a_mention_refused_by_a_spent_budget_is_taken(pipeline: Pipeline) -> None:
    """A refused mention counts as answered: no catch-up takes it again, and no second refusal is recorded."""
    room = Room()
    resident = pipeline.resident(residence(policy={"budgets": {"daily_output_tokens": 1}}), room)
    pipeline.server.reset([said("spends the day's budget")])
    first = await resident.respond(room, "room", list(room.history), trigger=room.say("alice", "hello").id)
    assert first.generation is not None
    ask = room.say("alice", "again")
    refused = await resident.respond(room, "room", list(room.history), trigger=ask.id)
    assert refused.generation is None and not refused.taken and len(pipeline.server.requests) == 1
    assert await pipeline.ledger.answered("cairn", [ask.id]) == {ask.id}
    again = await resident.respond(room, "room", list(room.history), trigger=ask.id)
    assert again.taken and again.posts == []


async def test_a_ledger_from_before_claims_reads_them_from_its_generations(tmp_path: Path, pipeline: Pipeline) -> None:
    path = tmp_path / "old.db"
    async with Ledger.open(path) as ledger:
        p = Pipeline(pipeline.server, ledger, [])
        try:
            room = Room()
            await p.turn(p.resident(residence(), room), room, "hello", [said("answered before claims")])
            asked = room.history[0].id
        finally:
            await p.client.close()
    with closing(sqlite3.connect(path)) as con:  # as m046 left a ledger: no claims table
        con.execute("DROP TABLE reply_claims")
        con.execute("DELETE FROM _migrations WHERE name = 'm047_reply_claims'")
        con.commit()
    async with Ledger.open(path) as ledger:
        assert await ledger.answered("cairn", [asked, "never-said"]) == {asked}
        assert await ledger.claim_reply("cairn", asked, "room") is False


async def test_the_same_message_create_delivered_again_gets_no_second_reply(tmp_path: Path, location: str) -> None:
    """The gateway sends the very MESSAGE_CREATE frame again (as a RESUME replays it) to a process that has
    no memory of it (a new cog's claims): discord.py hands it to the cog, the ledger's claim refuses it."""
    cairn = residence(
        discord={"token_env": "CAIRN_DISCORD_TOKEN", "channels": ["general"]},
        policy={"retries": {"max_attempts": 2, "backoff_seconds": 0}, "floor": {"cooldown_seconds": 0}},
    )
    db = location if location.startswith("postgresql://") else None
    async with deployed(tmp_path, [cairn], calls=[said("one reply"), said("a second reply")], db=db) as d:
        sent = d.room.post("general", "alice", "hello @cairn", mentions=["cairn"])
        await d.wait_bot_messages(1)
        await d.quiet()
        cog = d.bot("cairn").get_cog("ResidentCog")
        cog.claims = Claims()  # what a process that never saw it knows
        app = d.room.state.bot_by_name("cairn")
        [session] = d.room.gateway.live_sessions(app)
        frames = [f for _, f in session.history if '"MESSAGE_CREATE"' in f and f'"id": "{sent["id"]}"' in f]
        assert len(frames) == 1
        before = d.seen["cairn"].count(int(sent["id"]))
        session.conn.send(frames[0])
        await eventually(lambda: d.seen["cairn"].count(int(sent["id"])) == before + 1)
        await d.quiet()
        assert [m["content"] for m in d.bot_messages()] == ["one reply"]
        assert d.provider.arrived == 1
        assert await d.ledger.answered("cairn", [str(sent["id"])]) == {str(sent["id"])}


async def test_two_connections_migrating_one_new_ledger_at_once_apply_each_step_once(location: str) -> None:
    """Two sessions (each on a thread of its own, as two processes would be) migrate one fresh ledger at
    once: both succeed, and each step is applied and recorded once, by one or the other (on SQLite each step
    is a transaction of its own, so the two may take turns)."""

    async def session() -> Connection:
        if location.startswith("postgresql://"):
            return await postgres.connect(location)
        return await Connection.open(location)

    first, second = await session(), await session()
    try:
        applied = await asyncio.gather(migrations.apply(first), migrations.apply(second))
    finally:
        await first.close()
        await second.close()
    names = [name for name, _ in migrations.MIGRATIONS]
    one, two = applied
    assert not set(one) & set(two) and sorted(one + two, key=names.index) == names
    assert one == sorted(one, key=names.index) and two == sorted(two, key=names.index)  # each in order
    recorded = [r[0] for r in rows(location, "SELECT name FROM _migrations ORDER BY name")]
    assert recorded == sorted(names)
    async with Ledger.open(location) as ledger:  # and the ledger opens on it
        assert await ledger.claim_reply("cairn", "1", "general")


def test_a_replay_run_twice_into_one_ledger_answers_every_turn_both_times(tmp_path: Path) -> None:
    """A replay's room names its messages afresh for each run, as a room's ids are never reused: the
    claims a first run left in a kept ledger (`replay --db`) hold no turn of the second back."""
    path = bundled.scenario("continuation")
    assert path is not None
    db = str(tmp_path / "kept.db")
    runs = [asyncio.run(replay(load_scenario(path), db)) for _ in range(2)]
    said_turns = [t for t in load_scenario(path).turns if t.say is not None]
    for result in runs:
        answered = [t for t in result["turns"] if t.get("generation") is not None]
        assert len(answered) == len(result["turns"]) >= len(said_turns) > 0
