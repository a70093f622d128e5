"""End to end: a person's message to the first post of the reply, against the least that path can cost.

Both sides run in this process, against the same local room (REST and gateway over real sockets) and the
same local provider, which answers every request at once with the same 4,096-character reply
(`end_turn`): the first post is its first 2,000 characters.

- **residents**: a real `run_bots` deployment of one residence (settled delivery, no cooldown), the
  ledger on disk: the message arrives by the gateway, the floor decides, the context is compiled, the
  generation streams through the ledger, the reply is planned and recorded, the outbox posts it.
- **minimum**: a bare discord.py client in the same room, which on a message that mentions it streams
  the same reply with the bare SDK (`messages.create(stream=True)`, text deltas joined) and sends the
  first 2,000 characters with one POST (`channel.send`).

The clock starts just before the room stores the person's message and stops when the room stores the
bot's first message (the room's own event, taken as it happens). Start-up (connect, first request,
imports) is done before the first timed round; the channel is cleared after each round, so every round
starts from the same history. Sides alternate, the order reversed every round, after one untimed
warm-up round each. Reported: medians, ranges, and the ratio of medians; CPU time of the whole process
per round (room and provider included, the same for both sides) beside wall time.

`python -m bench.e2e [ROUNDS]` prints JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import discord

from residents.config import build_residence
from residents.discord.localapi import point_at_local
from residents.discord.run import Deployment, run_bots
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.localservers.room import RoomServer
from residents.provider.anthropic_messages import make_client

from . import streams
from .common import ROOT, median, scratch

log = logging.getLogger(__name__)

MODEL = "claude-sonnet-4-6"
REPLY_CHARS = 4096
FIRST_POST = 2000


class BareBot(discord.Client):
    """The minimum: on a mention, one bare SDK stream and one POST of its first 2,000 characters."""

    def __init__(self, provider_url: str) -> None:
        intents = discord.Intents.default()
        intents.message_content = True
        super().__init__(intents=intents, max_messages=None)
        self.sdk = make_client(provider_url, "k")

    async def on_message(self, message: discord.Message) -> None:
        if self.user is None or self.user not in message.mentions:
            return
        stream = await self.sdk.messages.create(
            model=MODEL,
            max_tokens=4096,
            messages=[{"role": "user", "content": message.content}],
            stream=True,
        )
        parts = []
        async for ev in stream:
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                parts.append(ev.delta.text)
        await message.channel.send("".join(parts)[:FIRST_POST])


async def measure(rounds: int, folder: Path) -> dict[str, Any]:
    text = streams.text(REPLY_CHARS)
    body = sse.stream(text, "end_turn", REPLY_CHARS // 4, model=MODEL)
    provider = ProviderServer(lambda _req: Call(sse=body))
    await provider.start()
    room = RoomServer(["general"])
    await room.start()
    point_at_local(room.url)
    first_posted: dict[str, float] = {}

    def on_event(event: Any) -> None:  # the moment the room stores a bot's message
        msg = getattr(event, "message", None)
        if event.kind == "message_create" and msg is not None and msg.author.bot:
            first_posted.setdefault(msg.author.name, time.perf_counter())

    room.state.subscribe(on_event)
    res = build_residence(
        {
            "name": "cairn",
            "model": MODEL,
            "max_tokens": 4096,
            "system": "You are Cairn.",
            "policy": {"floor": {"cooldown_seconds": 0}},
            "discord": {"token_env": "CAIRN_DISCORD_TOKEN", "channels": ["general"]},
        },
        "<bench>",
        None,
        Path(ROOT),
    )
    stop = asyncio.Event()
    product = asyncio.create_task(
        run_bots(
            Deployment([res], {"cairn": "local-cairn"}),
            str(folder / "e2e.db"),
            {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "k"},
            guild_ready_timeout=0.05,
            stop=stop,
        )
    )
    bare = BareBot(provider.url)
    bare_task = asyncio.create_task(bare.start("local-bare"))
    samples: dict[str, list[tuple[float, float]]] = {"residents": [], "minimum": []}
    try:
        await room.wait_until(
            lambda: (
                True
                if len(room.snapshot()["bots"]) == 2 and all(b["connected"] for b in room.snapshot()["bots"])
                else None
            ),
            timeout=60,
        )
        await bare.wait_until_ready()
        assert bare.user is not None
        names = {"residents": "cairn", "minimum": bare.user.name}

        async def one(side: str) -> tuple[float, float]:
            who = names[side]
            first_posted.pop(who, None)
            w, c = time.perf_counter(), time.process_time()
            room.post("general", "alice", f"Describe the harbour, @{who}", mentions=[who])
            await room.wait_until(lambda: first_posted.get(who), timeout=30)
            cpu = time.process_time() - c
            wall = first_posted[who] - w
            # The rest of the reply (its second and third posts) lands before the next round starts.
            await room.wait_until(
                lambda: (
                    True
                    if sum(1 for m in room.messages("general") if m["bot"]) >= (3 if side == "residents" else 1)
                    else None
                ),
                timeout=30,
            )
            await asyncio.sleep(0.3)
            room.clear_channel("general")
            await asyncio.sleep(0.2)
            return wall, cpu

        for side in ("residents", "minimum"):  # warm-up, untimed
            await one(side)
        for r in range(rounds):
            order = ("residents", "minimum") if r % 2 == 0 else ("minimum", "residents")
            for side in order:
                samples[side].append(await one(side))
    finally:
        stop.set()
        await asyncio.wait_for(product, timeout=20)
        await bare.close()
        await bare.sdk.close()
        bare_task.cancel()
        await asyncio.gather(bare_task, return_exceptions=True)
        await provider.stop()
        await room.stop()
    out: dict[str, Any] = {"rounds": rounds, "reply_chars": REPLY_CHARS}
    for side, xs in samples.items():
        walls = [w for w, _ in xs]
        cpus = [c for _, c in xs]
        out[side] = {
            "wall_ms": median(walls) * 1e3,
            "wall_range_ms": [min(walls) * 1e3, max(walls) * 1e3],
            "cpu_ms": median(cpus) * 1e3,
            "cpu_range_ms": [min(cpus) * 1e3, max(cpus) * 1e3],
            "samples_wall_ms": [w * 1e3 for w in walls],
        }
    out["wall_ratio"] = out["residents"]["wall_ms"] / out["minimum"]["wall_ms"]
    out["cpu_ratio"] = out["residents"]["cpu_ms"] / out["minimum"]["cpu_ms"]
    return out


async def run(rounds: int = 7) -> dict[str, Any]:
    folder = Path(scratch("e2e"))
    try:
        return await measure(rounds, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # python -m bench.e2e [ROUNDS]
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(asyncio.run(run(int(sys.argv[1]) if len(sys.argv) > 1 else 7)), indent=1))
