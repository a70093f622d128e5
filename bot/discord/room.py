"""The Discord room adapter: the one place that turns a planned post into a Discord message.

Every post goes out with `AllowedMentions.none()` (an output can never ping anyone) and with its
post id as Discord's nonce, so a retried send after a lost response cannot post it twice.
"""
from __future__ import annotations

import logging

import discord

from ..context import RoomMessage
from ..generation.records import Post

log = logging.getLogger(__name__)


class DiscordRoom:
    def __init__(self, channel: discord.abc.Messageable) -> None:
        self.channel = channel

    async def send(self, post: Post) -> str:
        message = await self.channel.send(post.content, nonce=post.id, allowed_mentions=discord.AllowedMentions.none())
        return str(message.id)


def as_room_message(m: discord.Message, self_id: int) -> RoomMessage:
    """What the context compiler needs of a Discord message: who, whether it is the resident, what."""
    content = m.clean_content
    extras = [f"[attachment: {a.filename}]" for a in m.attachments]
    if m.embeds and not content:
        extras.append("[embed]")
    text = "\n".join([content] + extras) if extras else content
    return RoomMessage(str(m.id), m.author.display_name, m.author.id == self_id, text)
