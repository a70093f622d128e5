"""The Discord room adapter: the one place that turns a planned post into a Discord message.

Every post goes out with `AllowedMentions.none()` (an output can never ping anyone) and with its
post id as Discord's nonce, so a retried send after a lost response cannot post it twice.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING

import aiohttp
import discord

from ..context import RoomMessage
from ..generation.recovery import RoomUnavailable, Seen
from ..generation.records import Post
from ..text import outbound

if TYPE_CHECKING:
    from .app import ResidentBot

log = logging.getLogger(__name__)

# When discord.py gives up on a post at run time, the rest are delivered again this often, this many
# times (here, not in the cog: discord.py loads each bot's extensions as separate module objects).
REDELIVER_SECONDS = 30.0
REDELIVER_TRIES = 10


class DiscordRoom:
    def __init__(self, channel: discord.abc.Messageable) -> None:
        self.channel = channel

    async def send(self, post: Post) -> str:
        message = await self.channel.send(outbound(post.content)[0], nonce=post.id,  # valid UTF-8 leaves
                                          allowed_mentions=discord.AllowedMentions.none())
        return str(message.id)


def as_room_message(m: discord.Message, self_id: int) -> RoomMessage:
    """What the context compiler needs of a Discord message: who, whether it is the resident, what."""
    # clean_content names users instead of <@id>; its zero-width escape of @everyone/@here only guards
    # against pings, which residents' posts never make (allowed mentions are none), so the text is kept as typed.
    content = m.clean_content.replace("@\u200beveryone", "@everyone").replace("@\u200bhere", "@here")
    extras = [f"[attachment: {a.filename}]" for a in m.attachments]
    if m.embeds and not content:
        extras.append("[embed]")
    text = "\n".join(([content] if content else []) + extras) if extras else content
    return RoomMessage(str(m.id), m.author.display_name, m.author.id == self_id, text, is_bot=m.author.bot)


SCAN_LIMIT = 200  # room messages read after a generation's last recorded post when resuming its delivery


class DiscordResumeRoom:
    """Discord's side of crash recovery: read the bot's own recent messages, send a post (REST only).

    Used after login and before the gateway connects, so resumed posts precede any new turn, and
    again later when a delivery failed while the bot was running.
    """

    def __init__(self, bot: "ResidentBot") -> None:
        self.bot = bot

    async def _channel(self, ref: str) -> discord.abc.Messageable:
        if not ref.isdigit():
            raise RoomUnavailable(f"{ref!r} is not a Discord channel id")
        channel = self.bot.get_channel(int(ref)) or await self.bot.fetch_channel(int(ref))
        if not isinstance(channel, discord.abc.Messageable):
            raise RoomUnavailable(f"channel {ref} cannot hold messages")
        return channel

    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        me = self.bot.user
        assert me is not None  # set by login()
        after: discord.abc.Snowflake | dt.datetime = (
            discord.Object(id=int(after_id)) if after_id else dt.datetime.fromtimestamp(after_time, tz=dt.timezone.utc))
        try:
            ch = await self._channel(channel)
            return [Seen(str(m.id), m.content, str(m.nonce) if m.nonce is not None else None)
                    async for m in ch.history(limit=SCAN_LIMIT, after=after, oldest_first=True)
                    if m.author.id == me.id]
        except (discord.HTTPException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise RoomUnavailable(f"{type(e).__name__}: {e}") from e

    async def send(self, post: Post) -> str:
        try:
            return await DiscordRoom(await self._channel(post.channel)).send(post)
        except (discord.HTTPException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise RoomUnavailable(f"{type(e).__name__}: {e}") from e
