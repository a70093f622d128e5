"""Discord faults, injected by the local room: every post arrives exactly once and in order.

A reply cut at max_tokens is long enough to need several posts; the room fails one of them (500,
a 500 after it stored the message, a 429 with retry-after) in the middle of the delivery. And the
gateway drops during a generation and resumes, with a person's message arriving while it is down.
The residents run as in production (`run_bots`: ResidentBot, its cogs, the real SDK and ledger).
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

from bot.discord.run import Deployment, run_bots
from bot.generation.records import Generation
from bot.ledger import Ledger
from bot.ledger.verify import verify
from bot.localservers import sse
from bot.localservers.provider import Call, ProviderServer
from bot.localservers.room import RoomServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import residence  # noqa: E402
from roomkit import error_guard, eventually, running_room  # noqa: E402

MODEL = "claude-3-opus-20240229"


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

    def bot_messages(self) -> list[dict[str, Any]]:
        return [m for m in self.room.messages("general") if m["author"] == "cairn"]

    async def generations(self) -> list[Generation]:
        led = await Ledger.open(self.db)
        try:
            rows = await led.db.execute_fetchall("SELECT id FROM generations ORDER BY created_at, rowid")
            return [g for (gid,) in rows if (g := await led.get_generation(gid)) is not None]
        finally:
            await led.close()

    async def verified(self) -> None:
        led = await Ledger.open(self.db)
        try:
            assert await verify(led, unsettled_as_violations=True) == []
        finally:
            await led.close()


@contextlib.asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """One resident (cairn) in #general, run by `run_bots`, ready for mentions."""
    res = residence(max_tokens=1024, discord={"token_env": "CAIRN_TOKEN", "channels": ["general"]},
                    policy={"floor": {"cooldown_seconds": 0, "reply_to": "mentions"},
                            "retries": {"max_attempts": 2, "backoff_seconds": 0}})
    provider = ProviderServer()
    await provider.start()
    stop = asyncio.Event()
    async with error_guard(), running_room(["general"]) as room:
        db = tmp_path / "ledger.db"
        task = asyncio.create_task(run_bots(Deployment([res], {"cairn": "local-cairn"}), str(db), provider.url,
                                            "test-key", guild_ready_timeout=0.05, stop=stop))
        try:
            # on_ready syncs the slash commands: once they are in the room, the bot takes turns.
            await eventually(lambda: task.done() or any(b["commands"] for b in room.snapshot()["bots"]), timeout=15)
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
    await r.room.wait_for_message(lambda m: m["author"] == "cairn" and "Output ceiling" in m["content"],
                                  timeout=20)
    gens = await r.generations()
    assert [p.kind for p in gens[-1].posts] == ["partial", "partial", "partial", "receipt"]
    return gens


async def test_a_500_on_a_post_mid_delivery_is_retried_and_posted_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.room.fail_message_posts(500, nth=2)
        gens = await cut_reply(r, words(5200, "a"))
        assert r.room.faults.hits == 1
        assert_delivered_once_in_order(r, gens)
        assert " ".join(p.content for p in gens[0].posts[:-1]).split() == \
            gens[0].text.split()
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
        r.provider.enqueue([Call(sse=sse.stream(first, "max_tokens", 1024, model=MODEL, size=40), chunk_bytes=400,
                                 chunk_delay=0.05),
                            Call(sse=sse.stream("The second answer, whole.", "end_turn", model=MODEL))])
        r.room.post("general", "alice", "A long one, @cairn", mentions=["cairn"])
        await eventually(lambda: len(r.provider.requests) == 1, timeout=10)
        await r.room.drop_gateway(hold=True)
        # Posted while the bot is disconnected: delivered to it on RESUME, answered after the first.
        r.room.post("general", "bob", "And then, @cairn?", mentions=["cairn"])
        await asyncio.sleep(0.3)
        r.room.release_gateway()
        await r.room.wait_for_message(lambda m: m["author"] == "cairn" and m["content"] == "The second answer, whole.",
                                      timeout=20)
        assert r.room.resumes >= 1
        gens = await r.generations()
        assert [g.status for g in gens] == ["truncated", "completed"]
        assert gens[0].text == first
        assert_delivered_once_in_order(r, gens)
        assert len(r.provider.requests) == 2
        await r.verified()


async def test_a_post_discord_refuses_mid_delivery_is_delivered_later_in_order(tmp_path: Path, monkeypatch) -> None:
    """discord.py gives up (a 403 is not retried): the rest wait in the ledger and go out later, once each."""
    from bot.discord import room as discord_room
    monkeypatch.setattr(discord_room, "REDELIVER_SECONDS", 0.2)
    async with rig(tmp_path) as r:
        r.room.fail_message_posts(403, nth=2)
        r.provider.enqueue([Call(sse=sse.stream(words(5200, "c"), "max_tokens", 1024, model=MODEL))])
        r.room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
        await r.room.wait_for_message(lambda m: m["author"] == "cairn" and "Output ceiling" in m["content"],
                                      timeout=20)
        gens = await r.generations()
        assert r.room.faults.hits == 1
        assert_delivered_once_in_order(r, gens)
        await r.verified()
