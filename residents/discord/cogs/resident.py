"""The resident's side of the room: when to speak, and one turn through the shared pipeline.

Floor control keeps several residents from talking over each other or looping: one generation at
a time per channel (a message arriving meanwhile queues at most one more turn and marks any
continuation superseded), a cooldown, and a limit on resident replies before a person speaks again,
counted across every resident of the process (`..floor`), replies still being written or waiting
in the outbox included, and checked again when a queued turn starts.

The room may be unreachable when a turn starts: reading the channel waits with the outbox's backoff
(a turn asked for during an outage is taken once Discord is back), and the typing indicator is
skipped. The reply's posts go out through the outbox, behind anything still undelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator

import discord
from discord.ext import commands

from ...delivery.outbox import Backoff
from ..app import ResidentBot
from ..floor import Floor, replies, shared_floor, since_person
from ..room import ROOM_ERRORS, SEND_TIMEOUT, Attachments, DiscordRoom

log = logging.getLogger(__name__)

STABLE_READS = 3  # floor reads retried while replies move between claimed, waiting and posted


@contextlib.asynccontextmanager
async def typing(channel: discord.abc.Messageable) -> AsyncIterator[None]:
    """The typing indicator, when Discord takes it; a turn never fails for want of it."""
    indicator = channel.typing()
    try:
        await asyncio.wait_for(indicator.__aenter__(), timeout=SEND_TIMEOUT)
    except ROOM_ERRORS as e:
        log.info("typing indicator not shown in %s: %s: %s", getattr(channel, "id", "?"), type(e).__name__, e)
        yield
        return
    try:
        yield
    finally:
        await indicator.__aexit__(None, None, None)


class ResidentCog(commands.Cog):
    def __init__(self, bot: ResidentBot) -> None:
        self.bot = bot
        self.locks: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.queued: dict[int, bool] = defaultdict(bool)
        self.moved_on: dict[int, bool] = defaultdict(bool)
        self.last_reply: dict[int, float] = {}
        # Another resident's live reply (`delivery.live`) is taken only once settled: its messages are
        # ignored while in progress, and read afresh when the board says they settled.
        self.board = bot.resident.board
        self.board.listeners.append(self._settled)
        self._tasks: set[asyncio.Task[None]] = set()
        self.attachments = Attachments()  # the bytes of files in the history a turn reads

    async def cog_unload(self) -> None:
        if self._settled in self.board.listeners:
            self.board.listeners.remove(self._settled)

    def _settled(self, channel: str, message_ids: list[str]) -> None:
        me = self.bot.user
        if self.bot.is_closed() or me is None or not channel.isdigit():
            return
        ch = self.bot.get_channel(int(channel))
        if not isinstance(ch, discord.abc.Messageable) or not self.bot.listens_in(ch):
            return  # unknown, or a channel with no messages (a category, a forum) that no live reply is in
        task = asyncio.create_task(self._take_settled(ch, message_ids), name=f"settled:{self.bot.residence.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _take_settled(self, channel: discord.abc.Messageable, message_ids: list[str]) -> None:
        """The settled messages of a live reply, as they now stand, each taken as a new message."""
        for mid in message_ids:
            try:
                message = await asyncio.wait_for(channel.fetch_message(int(mid)), timeout=SEND_TIMEOUT)
            except ROOM_ERRORS as e:
                log.warning(
                    "%s: a settled live message %s could not be read: %s: %s",
                    self.bot.residence.name,
                    mid,
                    type(e).__name__,
                    e,
                )
                continue
            if message.author.id != getattr(self.bot.user, "id", None):
                await self.on_message(message)

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
        if self.board.hidden(message.nonce, message.id):
            return  # a live reply still being written: taken when it settles (`_settled`)
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

    @property
    def backoff(self) -> Backoff:
        return self.bot.resident.outbox.backoff

    async def _history(self, channel: discord.abc.Messageable, limit: int) -> list[discord.Message] | None:
        """The channel's recent messages, oldest first, waiting with backoff while Discord cannot be reached."""

        async def read() -> list[discord.Message]:
            return [m async for m in channel.history(limit=limit)]

        failures, since = 0, time.monotonic()
        while True:
            try:
                history = await asyncio.wait_for(read(), timeout=SEND_TIMEOUT)
            except ROOM_ERRORS as e:
                failures += 1
                waited = time.monotonic() - since
                if waited >= self.backoff.alarm:
                    log.error(
                        "%s: a turn in %s is dropped: the channel could not be read for %.0fs (%s: %s)",
                        self.bot.residence.name,
                        getattr(channel, "id", "?"),
                        waited,
                        type(e).__name__,
                        e,
                    )
                    return None
                if failures == 1:
                    log.warning(
                        "%s: the channel %s cannot be read (%s: %s); the turn waits for Discord",
                        self.bot.residence.name,
                        getattr(channel, "id", "?"),
                        type(e).__name__,
                        e,
                    )
                await asyncio.sleep(self.backoff.delay(failures))
                continue
            if failures:
                log.warning(
                    "%s: the channel %s can be read again after %d failed tr%s",
                    self.bot.residence.name,
                    getattr(channel, "id", "?"),
                    failures,
                    "y" if failures == 1 else "ies",
                )
            history.reverse()
            return history

    async def _floor(
        self, message: discord.Message, shared: Floor, me: int
    ) -> tuple[list[discord.Message], int] | None:
        """The channel's history and the resident replies since a person spoke, claimed and waiting ones included.

        A reply moves from claimed (being generated) to waiting in the outbox to the room's history;
        the read is repeated until no reply moved while it ran, so none is missed or counted twice.
        """
        ch = message.channel.id
        outbox = self.bot.resident.outbox

        def moving() -> tuple[frozenset[int], frozenset[str]]:
            return (
                frozenset(shared.generating[ch] - {me}),
                frozenset(outbox.pending(str(ch))),
            )

        claims: set[int] = set()
        waiting: set[str] = set()
        for _ in range(STABLE_READS):
            before = moving()
            read = await self._history(message.channel, self.bot.residence.policy.floor.history_limit)
            if read is None:
                return None
            # A live reply in progress is counted by its claim, not by its messages.
            history = [m for m in read if not self.board.hidden(m.nonce, m.id)]
            run = since_person(history)
            posts = await self.bot.resident.ledger.posts_by_message([str(m.id) for m in run])
            after = moving()
            claims = set(before[0] | after[0])
            waiting = set(before[1] | after[1])
            if before == after:
                break
        reply_of = {mid: p.generation_id or f"post:{p.id}" for mid, p in posts.items()}
        return history, len(replies(run, reply_of) | waiting) + len(claims)

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
            seen = await self._floor(message, shared, me.id)
            if seen is None:
                return
            history, count = seen
            if count >= floor.max_resident_run:
                log.info(
                    "%s stays quiet in %s: %d resident replies since a person spoke (claimed and waiting included)",
                    self.bot.residence.name,
                    ch,
                    count,
                )
                return
            shared.generating[ch].add(me.id)
        try:
            room = await self.attachments.room_messages(history, me.id)
            async with typing(message.channel):
                # The claim ends as the posts enter the outbox: from there on they count as waiting.
                reply = await self.bot.resident.respond(
                    DiscordRoom(message.channel),
                    str(ch),
                    room,
                    trigger=str(message.id),
                    superseded=lambda: self.moved_on[ch],
                    queued=lambda _posts: shared.generating[ch].discard(me.id),
                )
        finally:
            shared.generating[ch].discard(me.id)
        self.last_reply[ch] = time.monotonic()
        g = reply.generation
        if g is not None:
            log.info(
                "%s replied in %s: generation %s %s, %d post(s)",
                self.bot.residence.name,
                ch,
                g.id,
                g.status,
                len(reply.posts),
            )


async def setup(bot: ResidentBot) -> None:
    await bot.add_cog(ResidentCog(bot))
