"""The outbox: every post a process sends goes out through here, one channel at a time, oldest first.

A room can stop taking posts at any moment (connection refused or reset, a timeout, a 5xx, a 429, a
403). What must hold then: the rest of that reply waits, undelivered in the ledger; nothing planned
later in that channel — by any resident of the process — goes out before it; it is retried with
backoff (1, 2, 4, 8 s, then every `cap` s), so once the room is back everything pending is out within
`cap` s plus the time to send it, in order, exactly once.

A room that refuses one post (HTTP 400, 403 or 404: `RoomRefused`) is not down: that post may never be
taken. After `REFUSED_TRIES` refusals in a row it is set aside in the ledger with the refusal
(`Ledger.mark_refused`, one ERROR line naming it) and the channel goes on with the next post, the
rest of the same reply included. A post set aside is never tried again, after a restart either.

So each channel has one queue and one worker. A new reply is appended; posts a stopped process left
undelivered (start-up) go in front of anything new. A post that was never tried is simply sent; one
whose send failed may have reached the room anyway (a lost response, a timeout), so after a failure
the worker first looks for it among the resident's recent messages (`resume.resume_generation`)
and records it instead of sending it again — Discord's nonce check alone lasts only minutes.

The outbox knows nothing of Discord: each resident registers its room (`ResumeRoom`: send a post,
read its own recent messages), and every room failure arrives as `RoomUnavailable`. Every process
delivers through one: `residents run` shares one among its residents (the demo too); replay and the
tests give theirs a room of their own and no backoff (`Outbox.of_room`).

Several processes on one ledger (`residents.ledger.leases`): a process may post as a bot (or in a shard of
it) only while its lease covers it. Every send of the outbox passes one check, `fence` (residence, channel),
just before the room is asked; a post it refuses is left to the ledger, where the holder's outbox finds it
(`resume`), and this process drops that resident's queue in that channel.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from ..ledger import Ledger, LedgerWriteError
from ..observe import UNOBSERVED, Observer
from ..records import Post
from .live import LiveRoom
from .resume import ResumeRoom, RoomRefused, RoomUnavailable, Seen, resume_generation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Delays between tries of a channel whose room failed: doubling from `base`, at most `cap`.

    Nothing is given up while the process runs (`cap` bounds how late a room that came back is
    noticed); after `alarm` seconds of failing, one ERROR says an operator is needed.
    """

    base: float = 1.0
    cap: float = 10.0
    alarm: float = 600.0

    def delay(self, failures: int) -> float:
        # The doubling stops once past any cap: 2 ** 1024 is more than a float holds (after ~3 hours at 10 s).
        return min(self.cap, self.base * 2 ** min(64, max(0, failures - 1)))


NO_BACKOFF = Backoff(base=0.0, cap=0.0)  # a room of one's own (replay, tests): a failed post is tried again at once

# Refusals in a row (HTTP 400, 403, 404) after which a post is set aside: a refusal can be passing (a
# permission given back a moment later), so it is tried again with the channel's backoff, but not for ever.
REFUSED_TRIES = 3


class LeaseLost(RoomUnavailable):
    """This process's lease no longer covers posting as this resident in this channel: the post waits in the
    ledger for the process that holds it."""


# Whether this process may post now as `residence` in `channel`: None where every post may go (one process).
Fence = Callable[[str, str], Awaitable[bool]]


@dataclass
class _Entry:
    residence: str
    post: Post
    fresh: bool  # never tried in this process: it cannot be in the room already
    done: asyncio.Future[bool]  # True once delivered or set aside; False when the outbox closed first
    since: float = field(default_factory=time.time)  # when this process queued it

    @property
    def reply(self) -> str:
        """What counts as one reply: a generation's posts, or a post of no generation on its own."""
        return self.post.generation_id or f"post:{self.post.id}"


@dataclass
class _Channel:
    queue: list[_Entry] = field(default_factory=list)
    resumed: int = 0  # how many entries at the front came from the ledger at start-up
    worker: asyncio.Task[None] | None = None
    failing_since: float | None = None
    failures: int = 0
    alarmed: bool = False
    refused: tuple[str, int] | None = None  # the front post's id and how many refusals in a row it met
    tried: asyncio.Event = field(default_factory=asyncio.Event)  # set after each pass: delivered all, or failed


class Outbox:
    """Per-channel FIFO delivery with backoff, shared by every resident of one process."""

    def __init__(self, ledger: Ledger, backoff: Backoff | None = None) -> None:
        self.ledger = ledger
        self.backoff = backoff or Backoff()
        self.rooms: dict[str, ResumeRoom] = {}
        self.channels: dict[str, _Channel] = {}
        self.closed = False
        self.observer: Observer = UNOBSERVED  # told each post that leaves (`residents.metrics`)
        self.fence: Fence | None = None  # several processes: the lease check before every send
        self.left: set[str] = set()  # residents whose posts the fence left in the ledger since their last `resume`

    @classmethod
    def of_room(cls, ledger: Ledger, residence: str, room: ResumeRoom) -> Outbox:
        """An outbox with a room of its own for one resident and no backoff: replay's, a script's, a test's."""
        outbox = cls(ledger, NO_BACKOFF)
        outbox.register(residence, room)
        return outbox

    def register(self, residence: str, room: ResumeRoom) -> None:
        """The room through which `residence` sends (its bot); its posts wait until it is registered."""
        self.rooms[residence] = room
        for channel, ch in self.channels.items():
            if ch.queue:
                self._kick(channel)

    def fenced(self, residence: str, channel: str, room: LiveRoom) -> LiveRoom:
        """`room` for a live reply of `residence` in `channel`, behind the same fence as every send."""
        return room if self.fence is None else _FencedLive(room, residence, channel, self.fence)

    def unregister(self, residence: str) -> None:
        """Its bot stopped here (another process holds it now): what it left queued goes when the fence
        says, and until another `register`, nothing of it is sent from this process."""
        self.rooms.pop(residence, None)
        for channel, ch in self.channels.items():
            if any(e.residence == residence for e in ch.queue):
                self._kick(channel)

    def pending(self, channel: str) -> set[str]:
        """Replies with posts still waiting in `channel` (generation ids, or `post:ID`): not in the room yet."""
        ch = self.channels.get(channel)
        return {e.reply for e in ch.queue} if ch else set()

    def backlog(self) -> dict[str, tuple[int, float | None]]:
        """Per channel ever used: how many posts wait, and since when (time.time()) the oldest was queued here."""
        return {
            channel: (len(ch.queue), min((e.since for e in ch.queue), default=None))
            for channel, ch in self.channels.items()
        }

    def enqueue(self, residence: str, posts: Iterable[Post]) -> list[asyncio.Future[bool]]:
        """Append a reply's recorded posts behind everything already waiting in their channels."""
        futures = []
        for post in posts:
            if post.message_id is not None:
                continue
            entry = _Entry(residence, post, True, asyncio.get_running_loop().create_future())
            queued = self._queued(post)
            if self.closed:  # the process is stopping: the post waits in the ledger for the next start
                entry.done.set_result(False)
            elif queued is not None:  # resumed from the ledger already (`resume` after a lapse): one entry
                entry.done = queued.done
            else:
                self._channel(post.channel).queue.append(entry)
            futures.append(entry.done)
        for channel in {p.channel for p in posts}:
            self._kick(channel)
        return futures

    async def deliver(self, residence: str, posts: list[Post]) -> bool:
        """Enqueue and wait until every one of `posts` is in the room or set aside; False if the outbox closed first."""
        return await self.wait(self.enqueue(residence, posts))

    @staticmethod
    async def wait(futures: list[asyncio.Future[bool]], timeout: float | None = None) -> bool:
        """Whether every post is delivered or set aside: False if the outbox closed first or `timeout` s passed."""
        if not futures:
            return True
        done, waiting = await asyncio.wait(futures, timeout=timeout)
        return not waiting and all(f.result() for f in done)

    async def resume(self, residence: str) -> int:
        """At start-up: put what a stopped process left undelivered in front, and wait for one try.

        Returns how many of those posts are in the room after it; the rest keep being retried.
        """
        posts = [
            p
            for p in await self.ledger.undelivered_posts_of(residence)
            if self._queued(p) is None and (self.fence is None or await self.fence(residence, p.channel))
        ]  # under leases, only what this process's lease covers: the rest is for the holder
        entries: dict[str, list[_Entry]] = {}
        for post in posts:
            entry = _Entry(residence, post, False, asyncio.get_running_loop().create_future())
            entries.setdefault(post.channel, []).append(entry)
        for channel, group in entries.items():
            ch = self._channel(channel)
            ch.queue[ch.resumed : ch.resumed] = group  # before anything new, after what other residents resumed
            ch.resumed += len(group)
            ch.tried.clear()
            self._kick(channel)
        for channel, group in entries.items():
            ch = self.channels[channel]
            while not all(e.done.done() for e in group) and not ch.tried.is_set() and not self.closed:
                await ch.tried.wait()
        done = sum(1 for group in entries.values() for e in group if e.post.message_id is not None)
        if done:
            log.warning("%s: %d post(s) left undelivered by a stop are now delivered", residence, done)
        return done

    async def close(self) -> None:
        """Stop every worker; whoever waits is told the posts did not go out (they stay in the ledger)."""
        self.closed = True
        workers = [ch.worker for ch in self.channels.values() if ch.worker is not None]
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for ch in self.channels.values():
            for e in ch.queue:
                if not e.done.done():
                    e.done.set_result(False)
            ch.tried.set()

    # ------------------------------------------------------------------ the worker

    def _queued(self, post: Post) -> _Entry | None:
        """The entry of this very post (by id) already waiting in its channel, if any."""
        ch = self.channels.get(post.channel)
        return next((e for e in ch.queue if e.post.id == post.id), None) if ch is not None else None

    def _channel(self, channel: str) -> _Channel:
        ch = self.channels.get(channel)
        if ch is None:
            ch = self.channels[channel] = _Channel()
        return ch

    def _kick(self, channel: str) -> None:
        ch = self._channel(channel)
        if self.closed or (ch.worker is not None and not ch.worker.done()):
            return
        ch.worker = asyncio.create_task(self._work(channel), name=f"outbox:{channel}")

    async def _work(self, channel: str) -> None:
        """Drain one channel, front first; on a room failure wait and try the same post again."""
        ch = self.channels[channel]
        try:
            while True:
                self._pop_delivered(ch)
                if not ch.queue:
                    break
                head = ch.queue[0]
                found = self.rooms.get(head.residence)
                if found is None and self.fence is not None and not await self.fence(head.residence, channel):
                    await self._leave(channel, head.residence, LeaseLost(f"{head.residence}'s bot runs elsewhere"))
                    continue
                room = found if found is None or self.fence is None else _Fenced(found, head.residence, self.fence)
                if room is None:  # its bot has not logged in yet: it kicks this channel when it does
                    log.info("outbox %s: waiting for %s to connect", channel, head.residence)
                    return
                failure: RoomUnavailable | LedgerWriteError | None = None
                try:
                    await self._send_front(ch, room)
                except LeaseLost as e:
                    await self._leave(channel, head.residence, e)
                    continue
                except (RoomUnavailable, LedgerWriteError) as e:
                    # A ledger refusing a delivery's record: the post may be in the room unrecorded, so it is
                    # tried again like a room failure, looking for it in the room before sending it again.
                    failure = e
                self._pop_delivered(ch)
                if isinstance(failure, RoomRefused) and ch.queue and await self._refused(channel, ch, failure):
                    continue  # set aside: the next post goes at once
                if failure is not None:
                    await self._failed(channel, ch, failure)
                    continue
                if ch.failing_since is not None:
                    log.warning(
                        "outbox %s: the room is back after %.1fs and %d failed tr%s; delivery resumes in order",
                        channel,
                        time.monotonic() - ch.failing_since,
                        ch.failures,
                        "y" if ch.failures == 1 else "ies",
                    )
                    ch.failing_since, ch.failures, ch.alarmed = None, 0, False
            ch.tried.set()
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug, or the ledger failing: say so once, loudly. The posts stay queued, in order, for the
            # next reply in this channel (or the next start); nobody is left waiting for them meanwhile.
            log.exception("outbox %s: delivery stopped by an unexpected error; %d post(s) wait", channel, len(ch.queue))
            for waiting in ch.queue:
                if not waiting.done.done():
                    waiting.done.set_result(False)
            ch.tried.set()

    async def _send_front(self, ch: _Channel, room: ResumeRoom) -> None:
        """Send the front run of one reply's posts; after a failure, first adopt what already arrived."""
        head = ch.queue[0]
        run = [head]
        for e in ch.queue[1:]:
            if e.residence != head.residence or e.reply != head.reply or e.fresh != head.fresh:
                break
            run.append(e)
        if head.fresh or head.post.generation_id is None:
            for e in run:
                e.fresh = False  # from here on it may have reached the room, whatever the send says
                await self.ledger.mark_delivered(e.post, await room.send(e.post))
                self._resolve(e)
            return
        g = await self.ledger.get_generation(head.post.generation_id)
        if g is None:  # pragma: no cover - posts reference their generation
            raise RoomUnavailable(f"generation {head.post.generation_id} is not in the ledger")
        await resume_generation(self.ledger, room, g, [e.post for e in run])
        for e in run:
            self._resolve(e)

    def _resolve(self, e: _Entry) -> None:
        if (e.post.message_id is not None or e.post.refused is not None) and not e.done.done():
            e.done.set_result(True)
            self.observer.post_delivered(e.residence, e.post)

    async def _leave(self, channel: str, residence: str, e: LeaseLost) -> None:
        """Drop a resident's posts from the queue of every channel the fence refuses it now (this one first):
        they stay undelivered in the ledger, for the process whose lease covers them (or for this one's
        `resume` once its lease is renewed: `left`); whoever waits for them here is told they did not go out."""
        assert self.fence is not None
        left = 0
        for ref, other in list(self.channels.items()):
            if ref != channel and (
                not any(x.residence == residence for x in other.queue) or await self.fence(residence, ref)
            ):
                continue
            busy = other.worker is not None and not other.worker.done()
            kept, front = [], other.resumed
            for i, entry in enumerate(other.queue):
                if entry.residence != residence or (ref != channel and i == 0 and busy):
                    kept.append(entry)  # (another channel's front may be in a send: its own check drops it)
                    continue
                left += 1
                if i < front:
                    other.resumed -= 1
                if not entry.done.done():
                    entry.done.set_result(False)
            other.queue = kept
        self.left.add(residence)
        log.warning("outbox %s: %d post(s) of %s left in the ledger: %s", channel, left, residence, e)

    def _pop_delivered(self, ch: _Channel) -> None:
        while ch.queue and (ch.queue[0].post.message_id is not None or ch.queue[0].post.refused is not None):
            self._resolve(ch.queue.pop(0))
            if ch.resumed:
                ch.resumed -= 1

    async def _refused(self, channel: str, ch: _Channel, e: RoomRefused) -> bool:
        """Count a refusal of the front post; at `REFUSED_TRIES` in a row, set it aside. True when it was."""
        head = ch.queue[0]
        tries = ch.refused[1] + 1 if ch.refused is not None and ch.refused[0] == head.post.id else 1
        ch.refused = (head.post.id, tries)
        if tries < REFUSED_TRIES:
            return False
        await self.ledger.mark_refused(head.post, e.refusal)
        log.error(
            "outbox %s: post %s (%s %d of generation %s) set aside undelivered: the room refused it %d times (%s);"
            " the channel goes on with the next post",
            channel,
            head.post.id,
            head.post.kind,
            head.post.seq,
            head.post.generation_id or "none",
            tries,
            e.refusal.text,
        )
        for entry in ch.queue:
            if entry.reply == head.reply:
                entry.fresh = False  # the rest of its reply: looked for in the room before it is sent again
        ch.refused = None
        ch.failing_since, ch.failures, ch.alarmed = None, 0, False
        self._pop_delivered(ch)
        return True

    async def _failed(self, channel: str, ch: _Channel, e: RoomUnavailable | LedgerWriteError) -> None:
        now = time.monotonic()
        for entry in ch.queue:
            if entry.reply == ch.queue[0].reply:
                entry.fresh = False  # any of them may be in the room now: look before sending again
        if ch.failing_since is None:
            ch.failing_since = now
        ch.failures += 1
        delay = self.backoff.delay(ch.failures)
        waiting = len(ch.queue)
        what = "the ledger refused a delivery's record" if isinstance(e, LedgerWriteError) else "the room failed"
        if ch.failures == 1:
            log.warning(
                "outbox %s: %s (%s); %d post(s) wait, in order, retried with backoff", channel, what, e, waiting
            )
        else:
            log.info("outbox %s: try %d failed (%s); next in %.1fs", channel, ch.failures, e, delay)
        if not ch.alarmed and now - ch.failing_since >= self.backoff.alarm:
            ch.alarmed = True
            log.error(
                "outbox %s: the room has failed for %.0fs (%s); %d post(s) wait and are still retried every %.0fs",
                channel,
                now - ch.failing_since,
                e,
                waiting,
                self.backoff.cap,
            )
        ch.tried.set()
        await asyncio.sleep(delay)
        ch.tried.clear()


async def _check(fence: Fence, residence: str, channel: str) -> None:
    """The one check before anything leaves as `residence` (a post, a live message's create, edit or removal):
    LeaseLost unless this process's lease covers it now."""
    if not await fence(residence, channel):
        raise LeaseLost(f"this process no longer holds the lease of {residence} there")


class _Fenced:
    """A resident's room as the outbox uses it under leases: each send first passes `_check`."""

    def __init__(self, room: ResumeRoom, residence: str, fence: Fence) -> None:
        self.room, self.residence, self.fence = room, residence, fence

    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        return await self.room.own_messages(channel, after_id, after_time)

    async def send(self, post: Post) -> str:
        await _check(self.fence, self.residence, post.channel)
        return await self.room.send(post)


class _FencedLive:
    """A live reply's room under leases: each create, edit and removal first passes `_check` (LeaseLost is a
    RoomUnavailable: the live view stops showing, and the settled reply waits in the ledger)."""

    def __init__(self, room: LiveRoom, residence: str, channel: str, fence: Fence) -> None:
        self.room, self.residence, self.channel, self.fence = room, residence, channel, fence

    async def send_live(self, content: str, nonce: str) -> str:
        await _check(self.fence, self.residence, self.channel)
        return await self.room.send_live(content, nonce)

    async def edit(self, message_id: str, content: str) -> None:
        await _check(self.fence, self.residence, self.channel)
        await self.room.edit(message_id, content)

    async def delete(self, message_id: str) -> None:
        await _check(self.fence, self.residence, self.channel)
        await self.room.delete(message_id)
