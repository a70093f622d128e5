"""Discord faults, injected by the local room: every post arrives exactly once and in order.

A reply cut at max_tokens is long enough to need several posts; the room fails one of them (500,
a 500 after it stored the message, a 429 with retry-after, a 403) in the middle of the delivery, or
stops accepting connections altogether for a few seconds. And the gateway drops during a generation
and resumes, with a person's message arriving while it is down. The residents run as in production
(`run_bots`: ResidentBot, its cogs, the real SDK and ledger), with a short redelivery backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from residents.delivery.outbox import Backoff
from residents.discord.run import Deployment, run_bots
from residents.ledger import Ledger
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.localservers.room import RoomServer
from residents.records import Generation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import residence  # noqa: E402
from roomkit import error_guard, eventually, running_room  # noqa: E402

MODEL = "claude-3-opus-20240229"
FAST = Backoff(base=0.2, cap=0.5)  # production: 1 s doubling to 10 s


def words(n_chars: int, tag: str) -> str:
    out, i = [], 0
    while sum(map(len, out)) + len(out) < n_chars:
        out.append(f"{tag}{i:05d}")
        i += 1
    return " ".join(out)[:n_chars]


@dataclass
class Rig:
    room: RoomServer
    provider: ProviderServer
    db: Path

    def bot_messages(self, author: str = "cairn") -> list[dict[str, Any]]:
        return [m for m in self.room.messages("general") if m["author"] == author]

    async def generations(self) -> list[Generation]:
        led = await Ledger.open(self.db)
        try:
            rows = await led.db.execute_fetchall("SELECT id FROM generations ORDER BY created_at, rowid")
            return [g for (gid,) in rows if (g := await led.get_generation(gid)) is not None]
        finally:
            await led.close()

    async def delivered(self, timeout: float = 10.0) -> list[Generation]:
        """The generations once every post has its message id (a post is in the room a moment before)."""
        deadline = time.monotonic() + timeout
        while True:
            gens = await self.generations()
            if all(p.message_id for g in gens for p in g.posts) or time.monotonic() > deadline:
                return gens
            await asyncio.sleep(0.05)

    async def verified(self) -> None:
        led = await Ledger.open(self.db)
        try:
            assert await verify(led, unsettled_as_violations=True) == []  # `ledger verify --strict`
            assert await led.undelivered_posts_of("cairn") == []
        finally:
            await led.close()


@contextlib.asynccontextmanager
async def rig(
    tmp_path: Path, names: tuple[str, ...] = ("cairn",), provider: ProviderServer | None = None
) -> AsyncIterator[Rig]:
    """Residents (cairn, and any other `names`) in #general, run by `run_bots`, ready for mentions."""
    residents = [
        residence(
            name=n,
            max_tokens=1024,
            system=f"You are {n.capitalize()}, a resident of this room.",
            discord={"token_env": f"{n.upper()}_TOKEN", "channels": ["general"]},
            policy={
                "floor": {"cooldown_seconds": 0, "reply_to": "mentions"},
                "retries": {"max_attempts": 2, "backoff_seconds": 0},
            },
        )
        for n in names
    ]
    provider = provider or ProviderServer()
    await provider.start()
    stop = asyncio.Event()
    async with error_guard(), running_room(["general"]) as room:
        db = tmp_path / "ledger.db"
        task = asyncio.create_task(
            run_bots(
                Deployment(residents, {n: f"local-{n}" for n in names}),
                str(db),
                {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "test-key"},
                guild_ready_timeout=0.05,
                stop=stop,
                backoff=FAST,
            )
        )
        try:
            # on_ready syncs the slash commands: once they are in the room, the bots take turns.
            await eventually(
                lambda: task.done() or sum(bool(b["synced"]) for b in room.snapshot()["bots"]) == len(names), timeout=15
            )
            if task.done():
                task.result()
            yield Rig(room, provider, db)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=15)
            await provider.stop()


def assert_delivered_once_in_order(r: Rig, gens: list[Generation]) -> None:
    """Each post of each generation is one room message, mapped in the ledger, in order; no extras."""
    msgs = r.bot_messages()
    by_id = {m["id"]: m for m in msgs}
    ids = [p.message_id for g in gens for p in g.posts]
    assert None not in ids, "a post was never delivered"
    assert len(set(ids)) == len(ids), "two posts mapped to one message"
    assert [by_id[i]["content"] for i in ids] == [p.content for g in gens for p in g.posts]  # type: ignore[index]
    assert [m["id"] for m in msgs] == ids, "the room holds other bot messages, or they are out of order"
    assert ids == sorted(ids, key=int)  # type: ignore[arg-type]


async def cut_reply(r: Rig, text: str, ask: str = "Describe the harbour, @cairn") -> list[Generation]:
    """A reply cut at the output ceiling: three partial posts and a receipt."""
    r.provider.enqueue([Call(sse=sse.stream(text, "max_tokens", 1024, model=MODEL))])
    r.room.post("general", "alice", ask, mentions=["cairn"])
    await r.room.wait_for_message(lambda m: m["author"] == "cairn" and "Output ceiling" in m["content"], timeout=20)
    gens = await r.delivered()
    assert [p.kind for p in gens[-1].posts] == ["partial", "partial", "partial", "receipt"]
    return gens


async def test_a_500_on_a_post_mid_delivery_is_retried_and_posted_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.room.fail_message_posts(500, nth=2)
        gens = await cut_reply(r, words(5200, "a"))
        assert r.room.faults.hits == 1
        assert_delivered_once_in_order(r, gens)
        assert " ".join(p.content for p in gens[0].posts[:-1]).split() == gens[0].text.split()
        await r.verified()


async def test_a_500_after_the_room_stored_the_post_does_not_duplicate_it(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        # The message is created, then the response is lost: only the nonce keeps the retry from
        # creating a second one (every post is sent with its post id as nonce and enforce_nonce).
        r.room.fail_message_posts(500, nth=3, after_create=True)
        gens = await cut_reply(r, words(5200, "b"))
        assert r.room.faults.hits == 1
        assert_delivered_once_in_order(r, gens)
        assert [m["nonce"] for m in r.bot_messages()] == [p.id for p in gens[0].posts]
        await r.verified()


async def test_a_429_with_retry_after_mid_delivery_waits_and_posts_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.room.fail_message_posts(429, nth=2, retry_after=0.6, times=2)
        started = time.monotonic()
        gens = await cut_reply(r, words(5200, "c"))
        assert time.monotonic() - started >= 1.2  # the room's retry-after was honoured, twice
        assert r.room.faults.hits == 2
        assert_delivered_once_in_order(r, gens)
        await r.verified()


async def test_a_gateway_drop_during_a_generation_resumes_and_every_post_lands_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        first = words(3000, "g")
        # About 1.5 s of streaming, so the drop lands mid-generation.
        r.provider.enqueue(
            [
                Call(
                    sse=sse.stream(first, "max_tokens", 1024, model=MODEL, size=40), chunk_bytes=400, chunk_delay=0.05
                ),
                Call(sse=sse.stream("The second answer, whole.", "end_turn", model=MODEL)),
            ]
        )
        r.room.post("general", "alice", "A long one, @cairn", mentions=["cairn"])
        await eventually(lambda: len(r.provider.requests) == 1, timeout=10)
        await r.room.drop_gateway(hold=True)
        # Posted while the bot is disconnected: delivered to it on RESUME, answered after the first.
        r.room.post("general", "bob", "And then, @cairn?", mentions=["cairn"])
        await asyncio.sleep(0.3)
        r.room.release_gateway()
        await r.room.wait_for_message(
            lambda m: m["author"] == "cairn" and m["content"] == "The second answer, whole.", timeout=20
        )
        assert r.room.resumes >= 1
        gens = await r.delivered()
        assert [g.status for g in gens] == ["truncated", "completed"]
        assert gens[0].text == first
        assert_delivered_once_in_order(r, gens)
        assert len(r.provider.requests) == 2
        await r.verified()


async def test_a_post_discord_refuses_mid_delivery_is_delivered_later_in_order(tmp_path: Path) -> None:
    """discord.py gives up (a 403 is not retried): the rest wait in the ledger and go out later, once each."""
    async with rig(tmp_path) as r:
        r.room.fail_message_posts(403, nth=2)
        r.provider.enqueue([Call(sse=sse.stream(words(5200, "c"), "max_tokens", 1024, model=MODEL))])
        r.room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
        await r.room.wait_for_message(lambda m: m["author"] == "cairn" and "Output ceiling" in m["content"], timeout=20)
        gens = await r.delivered()
        assert r.room.faults.hits == 1
        assert_delivered_once_in_order(r, gens)
        await r.verified()


class HeldProvider(ProviderServer):
    """Answers each resident by its system prompt; a resident named in `held` waits until released."""

    def __init__(self, answers: dict[str, list[Call]]) -> None:
        super().__init__(lambda body: answers[body["system"].split()[2].rstrip(",").lower()].pop(0))
        self.held: dict[str, asyncio.Event] = {}
        self.arrived: list[str] = []

    def hold(self, name: str) -> None:
        self.held[name] = asyncio.Event()

    def release(self, name: str) -> None:
        self.held.pop(name).set()

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = body["system"].split()[2].rstrip(",").lower()
        self.arrived.append(name)
        gate = self.held.get(name)
        if gate is not None:
            await asyncio.wait_for(gate.wait(), timeout=20)
        return await super()._messages(request)


async def test_an_outage_mid_delivery_completes_the_reply_first_in_order_exactly_once(tmp_path: Path) -> None:
    """Discord stops accepting connections while a cut reply is being posted (not an HTTP status).

    The rest of that reply waits and is retried with backoff; a reply planned during the outage by
    another resident, and a turn asked of the same resident during it, go out only after it; once
    the room listens again, everything is delivered, in order, exactly once, with no error logged.
    """
    cut = words(5200, "o")
    provider = HeldProvider(
        {
            "cairn": [
                Call(sse=sse.stream(cut, "max_tokens", 1024, model=MODEL)),
                Call(sse=sse.stream("Cairn's second answer.", "end_turn", 6, model=MODEL)),
            ],
            "sill": [Call(sse=sse.stream("Sill answers, late.", "end_turn", 6, model=MODEL))],
        }
    )
    async with rig(tmp_path, ("cairn", "sill"), provider) as r:
        # Sill is asked first and is still generating when the outage starts; cairn's third post meets it:
        # that POST's connection is reset and the room refuses every connection for 2.5 s.
        provider.hold("sill")
        r.room.post("general", "bob", "Your view, @sill?", mentions=["sill"])
        await eventually(lambda: provider.arrived == ["sill"], timeout=10)
        r.room.fail_message_posts(refuse_seconds=2.5, nth=3)
        r.room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
        await eventually(lambda: r.room.outage.refusing, timeout=10)
        assert len(r.bot_messages()) == 2  # two partials are in; the third was cut with the connection
        provider.release("sill")  # sill's reply is planned during the outage, behind cairn's undelivered posts
        r.room.post("general", "alice", "And then, @cairn?", mentions=["cairn"])  # a second turn, asked meanwhile
        await eventually(lambda: not r.room.outage.refusing, timeout=10)
        back = time.monotonic()
        await r.room.wait_for_message(lambda m: m["content"] == "Cairn's second answer.", timeout=20)
        gens = await r.delivered()
        first = next(g for g in gens if g.residence == "cairn" and g.status == "truncated")
        done = [m for m in r.room.messages("general") if m["bot"]]
        # Strict FIFO in the channel: the cut reply whole, then what was planned during the outage, in order.
        assert [m["author"] for m in done] == ["cairn"] * 4 + ["sill", "cairn"]
        assert [m["content"] for m in done[:4]] == [p.content for p in first.posts]
        assert [m["id"] for m in done[:4]] == [p.message_id for p in first.posts]
        assert " ".join(m["content"] for m in done[:3]).split() == cut.split()
        assert done[4]["content"] == "Sill answers, late." and len(provider.requests) == 3
        assert time.monotonic() - back < 10  # all of it within seconds of the room listening again
        assert r.room.outage.outages == 1
        for g in gens:
            assert all(p.message_id for p in g.posts)
        assert len({p.message_id for g in gens for p in g.posts}) == len(done)  # exactly once each
        await r.verified()


async def test_a_post_that_landed_before_the_outage_cut_its_response_is_not_posted_again(tmp_path: Path) -> None:
    """The room stores the third post, then the connection is cut and refused: the answer never arrives.

    After the outage the outbox looks for the post among the bot's messages before sending again.
    """
    async with rig(tmp_path) as r:
        r.room.fail_message_posts(refuse_seconds=2.0, nth=3, after_create=True)
        gens = await cut_reply(r, words(5200, "l"))
        assert r.room.outage.outages == 1 and r.room.faults.hits == 1
        assert_delivered_once_in_order(r, gens)
        await r.verified()


async def test_the_room_refuses_connections_for_n_seconds_then_listens_again(tmp_path: Path) -> None:
    """The fault itself, asked through `/_room/faults`: no TCP connection is accepted and REST ones are cut
    for that long, while the gateway stays up; then the same port listens again and the bot works."""
    async with rig(tmp_path) as r, aiohttp.ClientSession() as http:
        port = int(r.room.url.rsplit(":", 1)[1])
        gateway = r.room.snapshot()["gateway"]
        async with http.post(f"{r.room.url}/_room/faults", json={"refuse_connections": "soon"}) as resp:
            assert resp.status == 400 and "refuse_connections" in (await resp.json())["message"]
        async with http.post(f"{r.room.url}/_room/faults", json={"refuse_connections": 1.5}) as resp:
            assert (await resp.json())["connections"]["refusing"] is True
        started = time.monotonic()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        await eventually(lambda: not r.room.outage.refusing, timeout=5)
        assert time.monotonic() - started >= 1.4
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()
        async with http.get(f"{r.room.url}/_room/faults") as resp:
            assert (await resp.json())["connections"] == {
                "refusing": False,
                "seconds_left": None,
                "outages": 1,
                "refused_requests": 0,
            }
        assert r.room.snapshot()["gateway"] == gateway  # the bot's gateway never dropped: no identify, no resume
        r.provider.enqueue([Call(sse=sse.stream("Still here.", "end_turn", 4, model=MODEL))])
        r.room.post("general", "alice", "There, @cairn?", mentions=["cairn"])
        await r.room.wait_for_message(lambda m: m["content"] == "Still here.", timeout=10)
        await r.verified()
