"""The resident's side of the room: when to speak, and one turn through the shared pipeline.

Floor control keeps several residents from talking over each other or looping: one generation at
a time per channel (a message arriving meanwhile queues at most one more turn and marks any
continuation superseded), a cooldown, and a limit on resident turns before a person speaks again,
counted across every resident of the process (`..floor`), turns still being written included.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

import discord
from discord.ext import commands

from ..app import ResidentBot
from ..floor import shared_floor
from ...generation.recovery import RoomUnavailable, resume_delivery
from .. import room as discord_room
from ..room import DiscordResumeRoom, DiscordRoom, as_room_message

log = logging.getLogger(__name__)


def resident_run(history: list[discord.Message]) -> int:
    """Resident turns (runs of one bot author) since the last message from a person; newest last."""
    turns, last_author = 0, None
    for m in reversed(history):
        if not m.author.bot:
            break
        if m.author.id != last_author:
            turns += 1
            last_author = m.author.id
    return turns


class ResidentCog(commands.Cog):
    def __init__(self, bot: ResidentBot) -> None:
        self.bot = bot
        self.locks: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.queued: dict[int, bool] = defaultdict(bool)
        self.moved_on: dict[int, bool] = defaultdict(bool)
        self.last_reply: dict[int, float] = {}
        self.redelivery: asyncio.Task[None] | None = None

    def addressed(self, message: discord.Message) -> bool:
        me = self.bot.user
        assert me is not None
        mode = self.bot.residence.policy.floor.reply_to
        if mode == "all" or any(u.id == me.id for u in message.mentions):
            return True
        if mode == "mentions-and-replies" and message.reference is not None:
            ref = message.reference.resolved
            return isinstance(ref, discord.Message) and ref.author.id == me.id
        return False

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        me = self.bot.user
        if me is None or message.author.id == me.id or message.guild is None:
            return
        if not self.bot.listens_in(message.channel) or not self.addressed(message):
            return
        ch = message.channel.id
        lock = self.locks[ch]
        if lock.locked():
            self.moved_on[ch] = True  # a running bounded continuation stops: the room moved on
            if self.queued[ch]:
                return  # one queued turn will read this message too
            self.queued[ch] = True
        async with lock:
            self.queued[ch] = False
            self.moved_on[ch] = False
            await self._take_turn(message)

    async def _take_turn(self, message: discord.Message) -> None:
        floor = self.bot.residence.policy.floor
        ch = message.channel.id
        wait = floor.cooldown_seconds - (time.monotonic() - self.last_reply.get(ch, -1e9))
        if wait > 0:
            await asyncio.sleep(wait)
        me = self.bot.user
        assert me is not None
        shared = shared_floor()
        async with shared.deciding[ch]:
            history = [m async for m in message.channel.history(limit=floor.history_limit)]
            history.reverse()
            others = shared.generating[ch] - {me.id}  # turns claimed that the history does not show yet
            turns = resident_run(history) + len(others)
            if turns >= floor.max_resident_run:
                log.info("%s stays quiet in %s: %d resident turns since a person spoke (%d in progress)",
                         self.bot.residence.name, ch, turns, len(others))
                return
            shared.generating[ch].add(me.id)
        room = [as_room_message(m, me.id) for m in history]
        try:
            async with message.channel.typing():
                reply = await self.bot.resident.respond(DiscordRoom(message.channel), str(ch), room,
                                                        trigger=str(message.id), superseded=lambda: self.moved_on[ch])
        except discord.HTTPException as e:
            # discord.py gave up on a post: the rest stay undelivered in the ledger, in order, and are
            # delivered later by the same path crash recovery uses (never twice, never out of order).
            log.warning("%s: delivery in %s failed (%s); retrying in %.0fs", self.bot.residence.name, ch, e,
                        discord_room.REDELIVER_SECONDS)
            self._redeliver_later()
            return
        finally:
            shared.generating[ch].discard(me.id)
        self.last_reply[ch] = time.monotonic()
        g = reply.generation
        if g is not None:
            log.info("%s replied in %s: generation %s %s, %d post(s)", self.bot.residence.name, ch, g.id, g.status,
                     len(reply.posts))


    def _redeliver_later(self) -> None:
        if self.redelivery is None or self.redelivery.done():
            self.redelivery = asyncio.create_task(self._redeliver(), name=f"redeliver:{self.bot.residence.name}")

    async def _redeliver(self) -> None:
        for _ in range(discord_room.REDELIVER_TRIES):
            await asyncio.sleep(discord_room.REDELIVER_SECONDS)
            try:
                await resume_delivery(self.bot.resident.ledger, self.bot.residence.name, DiscordResumeRoom(self.bot))
            except RoomUnavailable as e:
                log.warning("%s: redelivery waits: %s", self.bot.residence.name, e)
                continue
            if not await self.bot.resident.ledger.undelivered_posts_of(self.bot.residence.name):
                return
        log.error("%s: posts still undelivered after %d tries; they are delivered at the next start",
                  self.bot.residence.name, discord_room.REDELIVER_TRIES)

    async def cog_unload(self) -> None:
        if self.redelivery is not None:
            self.redelivery.cancel()


async def setup(bot: ResidentBot) -> None:
    await bot.add_cog(ResidentCog(bot))
