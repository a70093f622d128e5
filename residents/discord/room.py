"""The Discord room adapter: the one place that turns a planned post into a Discord message.

Every post goes out with `AllowedMentions.none()` (an output can never ping anyone) and with its
post id as Discord's nonce, so a retried send after a lost response cannot post it twice.

Whatever stops a send — connection refused or reset, a TLS error or timeout, a 5xx or 429 discord.py
gave up on, a 403 — becomes one error, `RoomUnavailable`, for the outbox to retry (`ROOM_ERRORS`); a
400, 403 or 404 is a `RoomRefused`, which the outbox tries only a few times for one post.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import aiohttp
import discord

from ..context import RoomMessage
from ..context.attachments import FETCH_LIMIT, Fetched
from ..delivery.resume import RoomRefused, RoomUnavailable, Seen
from ..records import Post, Refusal
from ..text import outbound

if TYPE_CHECKING:
    from .app import ResidentBot

log = logging.getLogger(__name__)


# Every way a REST call to Discord can fail that is not a bug here: HTTP errors (discord.py has already
# retried 5xx and waited out 429s), a rate limit too long to wait, the network, a timeout.
ROOM_ERRORS: tuple[type[BaseException], ...] = (
    discord.HTTPException,
    discord.RateLimited,
    aiohttp.ClientError,
    OSError,
    asyncio.TimeoutError,
)

# A REST call that has not returned after this long counts as failed (a send may still land: the nonce,
# and the outbox's look at the channel before trying again, keep it from being posted twice).
SEND_TIMEOUT = 15.0


# What Discord answers for a request it will never take as it stands (a malformed post, a permission the bot
# lacks, a channel that is gone): a refusal, not an outage. A 429 and a 5xx are not among them.
REFUSED_STATUSES = frozenset({400, 403, 404})


def unavailable(e: BaseException) -> RoomUnavailable:
    if isinstance(e, discord.HTTPException) and e.status in REFUSED_STATUSES:
        return RoomRefused(Refusal(e.status, e.code or None, str(e)))
    return RoomUnavailable(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


class DiscordRoom:
    def __init__(self, channel: discord.abc.Messageable) -> None:
        self.channel = channel

    async def send(self, post: Post, view: discord.ui.View | None = None) -> str:
        """Post it (valid UTF-8: lone surrogates leave as U+FFFD), with `view`'s buttons if given; any
        failure to do so raises RoomUnavailable."""
        content, quiet = outbound(post.content)[0], discord.AllowedMentions.none()
        try:
            message = await asyncio.wait_for(
                self.channel.send(content, nonce=post.id, allowed_mentions=quiet)
                if view is None
                else self.channel.send(content, nonce=post.id, allowed_mentions=quiet, view=view),
                timeout=SEND_TIMEOUT,
            )
        except ROOM_ERRORS as e:
            raise unavailable(e) from e
        return str(message.id)

    # A live reply (`residents.delivery.live`): its messages are created, edited and, when the settled reply
    # has no text post for one, removed. The same timeout and errors as a send.

    async def send_live(self, content: str, nonce: str) -> str:
        try:
            message = await asyncio.wait_for(
                self.channel.send(outbound(content)[0], nonce=nonce, allowed_mentions=discord.AllowedMentions.none()),
                timeout=SEND_TIMEOUT,
            )
        except ROOM_ERRORS as e:
            raise unavailable(e) from e
        return str(message.id)

    async def edit(self, message_id: str, content: str) -> None:
        try:
            await asyncio.wait_for(
                self._partial(message_id).edit(
                    content=outbound(content)[0], allowed_mentions=discord.AllowedMentions.none()
                ),
                timeout=SEND_TIMEOUT,
            )
        except ROOM_ERRORS as e:
            raise unavailable(e) from e

    async def delete(self, message_id: str) -> None:
        try:
            await asyncio.wait_for(self._partial(message_id).delete(), timeout=SEND_TIMEOUT)
        except discord.NotFound:
            return
        except ROOM_ERRORS as e:
            raise unavailable(e) from e

    def _partial(self, message_id: str) -> discord.PartialMessage:
        return discord.PartialMessage(channel=self.channel, id=int(message_id))  # type: ignore[arg-type]


def as_room_message(m: discord.Message, self_id: int, files: tuple[Fetched, ...] = ()) -> RoomMessage:
    """What the context compiler needs of a Discord message: who, whether it is the resident, what, and its
    attachments (`files`, read by `Attachments`; without them each is named by its file name alone)."""
    # clean_content names users instead of <@id>; its zero-width escape of @everyone/@here only guards
    # against pings, which residents' posts never make (allowed mentions are none), so the text is kept as typed.
    content = m.clean_content.replace("@\u200beveryone", "@everyone").replace("@\u200bhere", "@here")
    extras = [] if files else [f"[attachment: {a.filename}]" for a in m.attachments]
    if m.embeds and not content:
        extras.append("[embed]")
    text = "\n".join(([content] if content else []) + extras) if extras else content
    return RoomMessage(str(m.id), m.author.display_name, m.author.id == self_id, text, is_bot=m.author.bot, files=files)


FETCH_ERRORS: tuple[type[BaseException], ...] = (*ROOM_ERRORS, ValueError)  # ValueError: no URL to read
CACHE_BYTES = 64 * 1024 * 1024  # attachment bytes kept between turns, per bot


class Attachments:
    """The bytes of the attachments in a channel's recent messages, read through discord.py.

    A file over every limit (by the size Discord states) is not read; one read is checked again by its
    real length. A failed read becomes a file described as not fetched, never an error of the turn. An
    attachment's bytes never change under its id, so what the last turn read is kept for the next,
    up to `CACHE_BYTES`, and dropped once its message leaves the history."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        self.budget = budget
        self._kept: dict[int, Fetched] = {}

    async def room_messages(self, history: list[discord.Message], self_id: int) -> list[RoomMessage]:
        out = []
        wanted: set[int] = set()
        for m in history:
            files: tuple[Fetched, ...] = ()
            if m.attachments and m.author.id != self_id:
                files = tuple([await self.read(a) for a in m.attachments])
                wanted |= {a.id for a in m.attachments}
            out.append(as_room_message(m, self_id, files))
        self._kept = {k: v for k, v in self._kept.items() if k in wanted}
        return out

    async def read(self, a: discord.Attachment) -> Fetched:
        kept = self._kept.get(a.id)
        if kept is not None:
            return kept
        if a.size > FETCH_LIMIT:
            return Fetched(a.filename, a.size, a.content_type)
        try:
            data = await asyncio.wait_for(a.read(), timeout=SEND_TIMEOUT)
        except FETCH_ERRORS as e:
            log.warning("attachment %s (%s) could not be read: %s", a.id, a.filename, unavailable(e))
            return Fetched(a.filename, a.size, a.content_type, failed=True)
        if len(data) > FETCH_LIMIT:  # larger than Discord said: over every limit all the same
            return Fetched(a.filename, len(data), a.content_type)
        got = Fetched(a.filename, len(data), a.content_type, data)
        if sum(len(f.data or b"") for f in self._kept.values()) + len(data) <= self.budget:
            self._kept[a.id] = got
        return got


SCAN_LIMIT = 200  # room messages read after a generation's last recorded post when resuming its delivery


class DiscordResumeRoom:
    """A bot's room for the outbox: send a post to the channel it names, read the bot's own recent messages.

    REST only, so it works after login and before the gateway connects (crash recovery), and for every
    post while the bot runs; a post whose send failed is looked for here before it is sent again.
    """

    def __init__(
        self, bot: ResidentBot, views: Callable[[Post], Awaitable[discord.ui.View | None]] | None = None
    ) -> None:
        self.bot = bot
        self.views = views  # the buttons a post goes out with (`buttons.receipt_view`), if any

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
            discord.Object(id=int(after_id)) if after_id else dt.datetime.fromtimestamp(after_time, tz=dt.UTC)
        )

        async def read() -> list[Seen]:
            ch = await self._channel(channel)
            return [
                Seen(str(m.id), m.content, str(m.nonce) if m.nonce is not None else None)
                async for m in ch.history(limit=SCAN_LIMIT, after=after, oldest_first=True)
                if m.author.id == me.id
            ]

        try:
            return await asyncio.wait_for(read(), timeout=SEND_TIMEOUT)
        except ROOM_ERRORS as e:
            raise unavailable(e) from e

    async def send(self, post: Post) -> str:
        """Post it; a cut output's latest receipt carries the Continue button where its policy offers one."""
        try:
            channel = await asyncio.wait_for(self._channel(post.channel), timeout=SEND_TIMEOUT)
        except ROOM_ERRORS as e:
            raise unavailable(e) from e
        return await DiscordRoom(channel).send(post, await self.views(post) if self.views is not None else None)

    async def delete(self, channel_ref: str, message_id: str) -> None:
        """Remove one of the bot's messages (a live reply a stopped process left in progress)."""
        try:
            channel = await asyncio.wait_for(self._channel(channel_ref), timeout=SEND_TIMEOUT)
        except ROOM_ERRORS as e:
            raise unavailable(e) from e
        await DiscordRoom(channel).delete(message_id)
