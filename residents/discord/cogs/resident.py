"""The resident's side of the room: when to speak, and one turn through the shared pipeline.

Floor control keeps several residents from talking over each other or looping: one generation at
a time per channel (a message arriving meanwhile queues at most one more turn and marks any
continuation superseded), a cooldown, and a limit on resident replies before a person speaks again,
counted across every resident of the process (`..floor`), replies still being written or waiting
in the outbox included, and checked again when a queued turn starts.

A new gateway session (after INVALID_SESSION, a reconnect that could not resume, or a restart) is
followed by a catch-up (`..catchup`): each mention missed in between and younger than the policy's
`catch_up.window` is answered, oldest first, as a turn of its own read up to that mention; older ones
are logged. A message is answered once: each turn claims its trigger in the ledger before any provider
call (`Resident.respond`), the one rule a catch-up reads too (`Ledger.answered`), so a gateway replay, a
catch-up and another process never take it twice; a claim in process only keeps one process from
queueing the same message twice.

The room may be unreachable when a turn starts: reading the channel waits with the outbox's backoff
(a turn asked for during an outage is taken once Discord is back), and the typing indicator is
skipped. The reply's posts go out through the outbox, behind anything still undelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

import discord
from discord.ext import commands

from ...delivery.outbox import Backoff
from ..app import ResidentBot
from ..buttons import ContinueButton
from ..catchup import CATCH_UP_READ, Claims, Sightings, age_words, ledger_bound, oldest_first, window_start
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
        self.sightings = Sightings()
        self.claims = Claims()

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
                await self.take(message)

    def addressed(self, message: discord.Message, missed: bool = False) -> bool:
        """Whether the message asks for this resident. A `missed` one (a catch-up's) must mention it or,
        unless the policy says `mentions`, reply to it: under `all`, missed chatter is not owed a reply each."""
        me = self.bot.user
        assert me is not None
        mode = self.bot.residence.policy.floor.reply_to
        if (mode == "all" and not missed) or any(u.id == me.id for u in message.mentions):
            return True
        if mode != "mentions" and message.reference is not None:
            ref = message.reference.resolved
            return isinstance(ref, discord.Message) and ref.author.id == me.id
        return False

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        """A message the gateway delivered: seen (where a catch-up would begin), then taken."""
        if message.guild is not None:
            self.sightings.saw(message.channel.id, message.id)
        await self.take(message)

    async def take(self, message: discord.Message) -> None:
        """A turn on `message` if it asks for this resident and no turn has been taken on it yet."""
        me = self.bot.user
        if me is None or message.author.id == me.id or message.guild is None:
            return
        if self.board.hidden(message.nonce, message.id):
            return  # a live reply still being written: taken when it settles (`_settled`)
        if not self.bot.listens_in(message.channel) or not self.addressed(message):
            return
        if message.id in self.claims:
            return  # a catch-up read it before the gateway delivered it, and answers it
        ch = message.channel.id
        lock = self.locks[ch]
        if lock.locked():
            self.moved_on[ch] = True  # a running bounded continuation stops: the room moved on
            if self.queued[ch]:
                return  # one queued turn will read this message too
            self.queued[ch] = True
        self.claims.claim(message.id)
        async with lock:
            self.queued[ch] = False
            self.moved_on[ch] = False
            await self._take_turn(message)

    @property
    def backoff(self) -> Backoff:
        return self.bot.resident.outbox.backoff

    @commands.Cog.listener()
    async def on_disconnect(self) -> None:
        if not self.bot.sharded:  # a sharded bot's shards each say which dropped (on_shard_disconnect)
            self.sightings.dropped()

    @commands.Cog.listener()
    async def on_shard_disconnect(self, shard_id: int) -> None:
        """One shard's connection closed: only the channels of its guilds have a gap to come."""
        self.sightings.dropped(c.id for g in self.bot.guilds if g.shard_id == shard_id for c in g.text_channels)

    @commands.Cog.listener()
    async def on_new_session(self, shard_id: int | None = None) -> None:
        """Every channel the resident listens in (on shard `shard_id` only, when one shard has a new session),
        at once; within each, one turn at a time, oldest first."""
        me = self.bot.user
        if me is None or self.bot.is_closed():
            return
        gap = self.sightings.at_drop  # replaced, never changed, at each drop: this session's gap stays as it is
        channels = [
            c
            for g in self.bot.guilds
            if shard_id is None or g.shard_id == shard_id
            for c in g.text_channels
            if self.bot.listens_in(c)
        ]
        await asyncio.gather(*(self._catch_up(c, gap) for c in channels))

    async def _catch_up(self, channel: discord.TextChannel, gap: dict[int, int] | None) -> None:
        """The mentions of this resident missed in `channel`: answered if younger than the window, else logged."""
        me = self.bot.user
        assert me is not None
        name, ch = self.bot.residence.name, channel.id
        policy = self.bot.residence.policy.catch_up
        seen = gap.get(ch) if gap is not None else None
        if seen is None:
            seen = ledger_bound(await self.bot.resident.ledger.latest_generation(name, str(ch)))
        if seen is None and self.bot.driven_elsewhere_since is not None:
            # Never answered here, but another process drove the bot: a mention since it did (one that came
            # as the bot changed hands) was for this resident, and is owed unless answered already.
            since = dt.datetime.fromtimestamp(self.bot.driven_elsewhere_since, dt.UTC)
            seen = discord.utils.time_snowflake(since)
        if seen is None:  # never seen here, by this process or in the ledger: nothing it was there to miss
            log.info("%s caught up in #%s (%s): nothing seen there before, nothing missed", name, channel.name, ch)
            return
        async with self.locks[ch]:
            self.moved_on[ch] = False
            now = discord.utils.utcnow()
            start = window_start(now, policy.window_seconds)
            read = await self._read_missed(channel, seen, start)
            if read is None:
                return
            if read:
                self.sightings.examined(ch, read[-1].id)
            live_from = self.sightings.live_from.get(ch)  # from there on, the gateway delivered them
            owed = [
                m
                for m in read
                if (live_from is None or m.id < live_from)
                and m.author.id != me.id
                and not self.board.hidden(m.nonce, m.id)
                and self.addressed(m, missed=True)
                and m.id not in self.claims
            ]
            answered = await self.bot.resident.ledger.answered(name, [str(m.id) for m in owed])
            owed = [m for m in owed if str(m.id) not in answered]
            older = [m for m in owed if m.id <= start]
            for m in older:
                log.info(
                    "%s: a mention missed in #%s (message %s) is %s old, older than catch_up.window %s: not answered",
                    name,
                    channel.name,
                    m.id,
                    age_words((now - m.created_at).total_seconds()),
                    policy.window,
                )
            due = [m for m in owed if m.id > start and self.claims.claim(m.id)]
            replied = 0
            for m in due:
                replied += await self._take_turn(m, missed=True)
        log.info(
            "%s caught up in #%s (%s): answered %d, older than the window %d",
            name,
            channel.name,
            ch,
            replied,
            len(older),
        )

    async def _read_missed(self, channel: discord.TextChannel, seen: int, start: int) -> list[discord.Message] | None:
        """The channel's messages after `seen`, oldest first: those within the window (snowflakes above
        `start`) and those older, at most CATCH_UP_READ of each (a warning says when that cut the read)."""

        def after(bound: int, before: int | None = None) -> Callable[[], Awaitable[list[discord.Message]]]:
            async def read() -> list[discord.Message]:
                return [
                    m
                    async for m in channel.history(
                        limit=CATCH_UP_READ,
                        after=discord.Object(bound),
                        before=discord.Object(before) if before is not None else None,
                        oldest_first=True,
                    )
                ]

            return read

        recent = await self._patiently(channel, after(max(seen, start)), "a catch-up")
        if recent is None:
            return None
        earlier: list[discord.Message] = []
        if seen < start:
            found = await self._patiently(channel, after(seen, start + 1), "a catch-up")
            if found is None:
                return None
            earlier = found
        for part, read in (("within", recent), ("older than", earlier)):
            if len(read) >= CATCH_UP_READ:
                log.warning(
                    "%s: catching up in #%s read the first %d messages %s the window; later ones were not examined",
                    self.bot.residence.name,
                    channel.name,
                    CATCH_UP_READ,
                    part,
                )
        return oldest_first(earlier + recent)

    async def _history(
        self, channel: discord.abc.Messageable, limit: int, upto: int | None = None
    ) -> list[discord.Message] | None:
        """The channel's recent messages (up to message `upto`, included), oldest first, waiting with
        backoff while Discord cannot be reached."""

        async def read() -> list[discord.Message]:
            before = discord.Object(upto + 1) if upto is not None else None
            return [m async for m in channel.history(limit=limit, before=before)]

        history = await self._patiently(channel, read, "a turn")
        if history is not None:
            history.reverse()
        return history

    async def _patiently(
        self,
        channel: discord.abc.Messageable,
        read: Callable[[], Awaitable[list[discord.Message]]],
        what: str,
    ) -> list[discord.Message] | None:
        """`read()`, retried with backoff while Discord cannot be reached; None (logged) once that is an alarm."""
        failures, since = 0, time.monotonic()
        while True:
            try:
                history = await asyncio.wait_for(read(), timeout=SEND_TIMEOUT)
            except ROOM_ERRORS as e:
                failures += 1
                waited = time.monotonic() - since
                if waited >= self.backoff.alarm:
                    log.error(
                        "%s: %s in %s is dropped: the channel could not be read for %.0fs (%s: %s)",
                        self.bot.residence.name,
                        what,
                        getattr(channel, "id", "?"),
                        waited,
                        type(e).__name__,
                        e,
                    )
                    return None
                if failures == 1:
                    log.warning(
                        "%s: the channel %s cannot be read (%s: %s); %s waits for Discord",
                        self.bot.residence.name,
                        getattr(channel, "id", "?"),
                        type(e).__name__,
                        e,
                        what,
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

    async def _take_turn(self, message: discord.Message, missed: bool = False) -> bool:
        """One turn on `message`; True if a reply was generated. A `missed` message's turn reads the channel
        up to it (the floor is still judged on the channel as it stands)."""
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
                return False
            history, count = seen
            if count >= floor.max_resident_run:
                log.info(
                    "%s stays quiet in %s: %d resident replies since a person spoke (claimed and waiting included)",
                    self.bot.residence.name,
                    ch,
                    count,
                )
                return False
            shared.generating[ch].add(me.id)
        try:
            if missed:
                upto = await self._history(message.channel, floor.history_limit, upto=message.id)
                if upto is None:
                    return False
                history = [m for m in upto if not self.board.hidden(m.nonce, m.id)]
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
                    person=str(message.author.id),
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
        return g is not None


async def setup(bot: ResidentBot) -> None:
    await bot.add_cog(ResidentCog(bot))
    # The Continue button on this bot's receipts, pressed now or after any number of restarts.
    bot.add_dynamic_items(ContinueButton)
