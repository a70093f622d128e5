"""What the processes sharing a ledger share out, recovery kept to a taken-over shard's channels, and the
outbox's one fence before anything leaves as a bot: the parts of issue 23's leases that need no server
(the rest runs on one, with real processes, in `test_leases.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Room
from conftest import residence as conftest_residence

from residents.config import Residence
from residents.delivery.outbox import LeaseLost, Outbox
from residents.delivery.resume import open_channels, recover
from residents.discord.run import lease_units
from residents.ledger import Ledger
from residents.ledger.leases import Terms, Unit, unit_of
from residents.localservers import sse
from residents.localservers.provider import Call

try:
    from test_crash import pending, streaming
except ImportError:  # tests/ collected as a package
    from tests.test_crash import pending, streaming


def residence(name: str, shards: Any = None) -> Residence:
    discord: dict[str, Any] = {"token_env": "T", "channels": []}
    if shards is not None:
        discord["shards"] = shards
    return Residence.model_validate(
        {"name": name, "model": "claude-3-opus-20240229", "max_tokens": 1024, "discord": discord}
    )


def test_a_bot_is_one_unit_and_a_fixed_count_of_shards_one_unit_each() -> None:
    units = lease_units(
        [
            residence("cairn"),
            residence("sill", {"count": 3}),
            residence("moss", {"count": 4, "ids": [1, 3]}),
            residence("reed", "auto"),  # Discord's count, unknown in advance: the bot is one unit
        ]
    )
    assert [u.key for u in units] == ["cairn", "sill#0", "sill#1", "sill#2", "moss#1", "moss#3", "reed"]
    assert [unit_of(u.key) for u in units] == units
    assert unit_of("cairn") == Unit("cairn") and unit_of("sill#2") == Unit("sill", 2)


def test_the_default_terms_replace_a_dead_process_within_thirty_seconds() -> None:
    terms = Terms()
    assert terms.length + terms.renew < 30 and 0 < terms.margin < terms.renew <= terms.length / 3


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    async with Ledger.open(tmp_path / "ledger.db") as led:
        yield led


async def test_recovery_kept_to_some_channels_leaves_the_bots_other_channels_streaming(ledger: Ledger) -> None:
    taken = await pending(ledger, channel="100")  # on a shard this process has just taken over
    await streaming(ledger, taken, ["cut here"])
    running = await pending(ledger, channel="200")  # on a shard another process runs on
    await streaming(ledger, running, ["still streaming elsewhere"])
    assert await open_channels(ledger, "cairn") == {"100", "200"}
    rec = await recover(ledger, {"cairn"}, ["100"])
    assert rec.interrupted == [taken.id]
    settled, other = await ledger.get_generation(taken.id), await ledger.get_generation(running.id)
    assert settled is not None and settled.status != "pending" and settled.posts
    assert other is not None and other.status == "pending" and other.attempts[0].outcome == "streaming"
    assert await open_channels(ledger, "cairn") == {"200"}


class Fence:
    """A lease that covers posting, or not, as the test says."""

    def __init__(self) -> None:
        self.covers = False
        self.asked: list[tuple[str, str]] = []

    async def __call__(self, residence: str, channel: str) -> bool:
        self.asked.append((residence, channel))
        return self.covers


async def test_a_post_the_fence_refuses_stays_in_the_ledger_until_the_lease_covers_it_again(pipeline: Any) -> None:
    room = Room()
    res = pipeline.resident(conftest_residence(), room)
    fence = Fence()
    res.outbox.fence = fence
    reply, sent = await asyncio.wait_for(
        pipeline.turn(res, room, "Hello?", [Call(sse=sse.stream("Calm water.", "end_turn", 4))]), 10
    )
    assert sent == [] and fence.asked == [("cairn", "room")]
    [waiting] = await pipeline.ledger.undelivered_posts_of("cairn")
    assert waiting.generation_id == reply.generation.id and res.outbox.left == {"cairn"}
    fence.covers = True  # renewed: what the fence left goes out, once
    assert await res.outbox.resume("cairn") == 1
    assert [p.content for p in room.sent] == ["Calm water."]
    assert await pipeline.ledger.undelivered_posts_of("cairn") == []


class LiveRoom:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def send_live(self, content: str, nonce: str) -> str:
        self.calls.append("send")
        return "1"

    async def edit(self, message_id: str, content: str) -> None:
        self.calls.append("edit")

    async def delete(self, message_id: str) -> None:
        self.calls.append("delete")


async def test_a_live_reply_passes_the_same_fence_before_each_create_edit_and_removal(ledger: Ledger) -> None:
    outbox = Outbox(ledger)
    live = LiveRoom()
    assert outbox.fenced("cairn", "100", live) is live  # one process: no fence at all
    fence = Fence()
    outbox.fence = fence
    fenced = outbox.fenced("cairn", "100", live)
    for call in (fenced.send_live("text", "n"), fenced.edit("1", "text"), fenced.delete("1")):
        with pytest.raises(LeaseLost):
            await call
    assert live.calls == [] and fence.asked == [("cairn", "100")] * 3
    fence.covers = True
    assert await fenced.send_live("text", "n") == "1"
    await fenced.edit("1", "more")
    await fenced.delete("1")
    assert live.calls == ["send", "edit", "delete"]
