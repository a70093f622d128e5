"""Checkpoints: the ledger's head posted where witnesses are (`ledger.checkpoints` in residents.yaml).

Nothing else publishes the chain's head; once a line naming it sits in a channel, under the room's own
timestamp, rewriting any entry up to it shows: `residents ledger verify --head N:SHA256` finds that head
no longer in the chain. The process's commands bot (the one that answers /provenance) posts one subtext
line (`truth.checkpoint_line`) once it is ready, then every `every` seconds counted from the first, so
the cadence does not drift. The channel was found, and start-up stopped if it cannot be posted in, by
the bot's on_ready (`app.checkpoint_channel`).

The post itself is not recorded in the ledger: recording it would append an entry, so the head just
published would be stale the moment it appeared, and an idle ledger would get a new head at every
checkpoint, made by checkpoints alone. A post the room refuses is one warning line; the next comes at
its time.
"""

from __future__ import annotations

import asyncio
import logging
import time

import discord
from discord.ext import commands

from ... import truth
from ...config import Checkpoints
from ...ledger.checkpoints import chain_head
from ..app import ResidentBot
from ..room import ROOM_ERRORS, SEND_TIMEOUT

log = logging.getLogger(__name__)


class CheckpointsCog(commands.Cog):
    def __init__(self, bot: ResidentBot, settings: Checkpoints) -> None:
        self.bot, self.settings = bot, settings
        self.task: asyncio.Task[None] | None = None

    async def cog_load(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"checkpoints:{self.bot.residence.name}")

    async def cog_unload(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        await self.bot.settled.wait()  # ready, and its checkpoint channel found
        channel = self.bot.checkpoint_channel
        assert channel is not None
        loop = asyncio.get_running_loop()
        first = loop.time()
        n = 0
        while True:
            try:
                await self.post(channel)
            except Exception:  # the ledger could not be read: said once, with its traceback; the cadence goes on
                log.exception("checkpoint %d not posted: the ledger's head could not be read", n + 1)
            n += 1
            await asyncio.sleep(max(0.0, first + n * self.settings.every - loop.time()))

    async def post(self, channel: discord.TextChannel) -> None:
        """One checkpoint line with the head as it is now; a room that refuses it is one warning line."""
        head = await chain_head(self.bot.resident.ledger.db)
        line = truth.checkpoint_line(head, time.time())
        try:
            message = await asyncio.wait_for(
                channel.send(line, allowed_mentions=discord.AllowedMentions.none()), timeout=SEND_TIMEOUT
            )
        except ROOM_ERRORS as e:
            log.warning(
                "checkpoint not posted in %s/%s (%s: %s); the next in %ds",
                channel.guild.name,
                channel.name,
                type(e).__name__,
                e,
                self.settings.every,
            )
            return
        log.info(
            "checkpoint posted in %s/%s: head %s (message %s)",
            channel.guild.name,
            channel.name,
            truth.head_ref(*head) if head else "none",
            message.id,
        )


async def setup(bot: ResidentBot) -> None:
    assert bot.checkpoints is not None  # loaded only when configured (`app.CHECKPOINTS_COG`)
    await bot.add_cog(CheckpointsCog(bot, bot.checkpoints))
