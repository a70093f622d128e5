"""Live replies (policy `delivery.live`): a reply shown in the room while it is generated.

The first message goes out as soon as the first reply text arrives; it is edited as text arrives, at
most once a second per message, and ends with an in-progress marker (`truth.LIVE_MARKER`) until the
reply settles. The text is cut exactly where the final plan cuts it (`plan.split_text` on the text so
far: every chunk but the last is already final), so at 2,000 characters a message is closed at the
plan's split point and a new one starts. Everything shown has reached the ledger first (the sink is
flushed before each create or edit), and each live message is recorded (`ledger.live`).

When the generation settles, `Resident` makes the room hold exactly what it would without live mode:
the plan's text posts adopt the live messages in order (edited to their final content, marker gone,
message id recorded on the post), the rest go through the outbox as usual, and a live message the
plan has no text post for (a refusal's text, say) is removed. An attempt set aside for a retry after
its text was shown keeps its messages as shown (closed at the same split points), its stump is marked
published, and the room gets one notice; the replacement is shown in new messages, never spliced.

Other residents react only to settled posts: a live message's nonce and id are on the process's
`LiveBoard` while it is in progress; the resident cog ignores those messages (and leaves them out of
the history it compiles), and is told when they settle so it can take them as new messages then.

Live creates never overtake the channel's outbox: while posts wait there, nothing new is shown. A room
failure while showing stops the showing; the reply is then settled through the outbox as without live.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard

from .. import truth
from ..generation.attempts import LiveLedgerSink
from ..ledger import Ledger, LedgerWriteError
from ..ledger import live as live_ledger
from ..ledger.retry import until_written
from ..records import Attempt, Post, Stump, join_text, new_id
from ..text import outbound
from .plan import LIMIT, split_text
from .resume import RoomUnavailable, Seen

log = logging.getLogger(__name__)

EDIT_INTERVAL = 1.0  # seconds between two edits of one message (Discord's limits allow more; people need less)
TEXT_KINDS = frozenset({"speech", "partial"})


class LiveRoom(Protocol):
    """A room that can show a reply while it is written: create, edit and remove its own messages."""

    async def send_live(self, content: str, nonce: str) -> str: ...

    async def edit(self, message_id: str, content: str) -> None: ...

    async def delete(self, message_id: str) -> None: ...


def supports_live(room: object) -> TypeGuard[LiveRoom]:
    return all(callable(getattr(room, m, None)) for m in ("send_live", "edit", "delete"))


class StaleRoom(Protocol):
    async def delete(self, channel: str, message_id: str) -> None: ...

    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]: ...


def shown_as(content: str) -> tuple[str, str]:
    """How a live message with this content may stand in the room: closed, or open with the marker."""
    return content, content[: LIMIT - len(truth.LIVE_MARKER)] + truth.LIVE_MARKER


async def withdraw_left_in_progress(ledger: Ledger, room: StaleRoom, residence: str) -> int:
    """At start-up, before undelivered posts go out: live messages a stopped process left in progress are
    removed from the room (recorded `withdrawn`), so the recovered reply is posted as without live mode.

    A message whose send was not answered before the stop is looked for among the bot's own messages
    (by nonce where the room reports one, else by content). One that cannot be removed now stays `live`
    in the ledger and is tried again at the next start.
    """
    done = 0
    for m in await live_ledger.in_progress(ledger, residence):
        try:
            mid = m.message_id
            if mid is None:
                seen = await room.own_messages(m.channel, None, m.created_at - 60)
                mid = next(
                    (
                        x.id
                        for x in seen
                        if x.nonce == m.nonce
                        or (
                            x.nonce is None
                            and outbound(x.content)[0] in map(lambda c: outbound(c)[0], shown_as(m.content))
                        )
                    ),
                    None,
                )
            if mid is not None:
                await room.delete(m.channel, mid)
        except RoomUnavailable as e:
            log.warning(
                "%s: live message %s left in progress by a stop could not be removed: %s",
                residence,
                m.message_id or m.nonce,
                e,
            )
            continue
        await live_ledger.withdraw(ledger, m.nonce, mid)
        done += 1
    if done:
        log.warning(
            "%s: %d live message(s) left in progress by a stop were removed; the reply is posted as recovered",
            residence,
            done,
        )
    return done


class LiveBoard:
    """The process's live messages still in progress (by nonce and by id), and who wants to hear of them
    settling. Shared by every resident of a process, as the outbox is."""

    def __init__(self) -> None:
        self.in_progress: set[str] = set()
        self.listeners: list[Callable[[str, list[str]], None]] = []

    def hide(self, key: str) -> None:
        self.in_progress.add(key)

    def hidden(self, nonce: object, message_id: object) -> bool:
        return (nonce is not None and str(nonce) in self.in_progress) or str(message_id) in self.in_progress

    def settled(self, channel: str, keys: list[str], message_ids: list[str]) -> None:
        """The messages are final: visible to other residents from now on; listeners are told once."""
        for k in keys:
            self.in_progress.discard(k)
        if not message_ids:
            return
        for listener in list(self.listeners):
            try:
                listener(channel, list(message_ids))
            except Exception:  # a listener's bug must not stop a reply settling
                log.exception("a live-message listener failed")


_BOARD = LiveBoard()


def shared_board() -> LiveBoard:
    return _BOARD


@dataclass
class LiveMessage:
    message_id: str
    nonce: str
    display: str  # what the room shows now (marker included while open)
    content: str  # the same without the marker
    next_at: float  # monotonic time of the earliest next edit
    edits: list[float] = field(default_factory=list)


class LiveView:
    """One reply's live messages, attempt by attempt (the generation's `AttemptWatch`)."""

    def __init__(
        self,
        residence: str,
        channel: str,
        ledger: Ledger,
        room: LiveRoom,
        board: LiveBoard,
        post_notice: Callable[[str, str], Awaitable[None]],
        pending: Callable[[str], bool] = lambda _c: False,
        interval: float = EDIT_INTERVAL,
    ) -> None:
        self.residence, self.channel, self.ledger, self.room, self.board = residence, channel, ledger, room, board
        self.post_notice = post_notice  # (generation id, line): one notice post of the generation, delivered
        self.pending = pending  # the channel's outbox has posts waiting: nothing new is shown meanwhile
        self.interval = interval
        self.attempt: Attempt | None = None
        self.sink: LiveLedgerSink | None = None
        self.messages: list[LiveMessage] = []  # the current attempt's
        self.keys: list[str] = []  # nonces and ids on the board, for every message this view showed
        self.broken = False  # a room failure stopped the showing
        self._dirty = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ AttemptWatch

    def started(self, a: Attempt, sink: LiveLedgerSink) -> None:
        self.attempt, self.sink, self.messages = a, sink, []

    def grew(self) -> None:
        if self.broken:
            return
        self._dirty.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"live:{self.residence}:{self.channel}")

    async def set_aside(self, a: Attempt, stumps: list[Stump]) -> None:
        """A retried attempt: its messages are closed as shown (all its text), its stump published, one notice."""
        await self.halt()
        shown = self.messages
        self.messages = []
        if not shown:
            return
        contents = split_text(a.text, escape=True)
        try:
            for i, c in enumerate(contents):
                if i < len(shown):
                    await self._edit(shown[i], c, c, wait=True)
                else:
                    shown.append(await self._create(a, i, c, c))
        except RoomUnavailable as e:
            self._broke(e)
        stump = next((s for s in stumps if s.scope == "attempt" and s.cause == truth.RETRY_ABANDONED), None)
        await until_written(
            f"live messages of attempt {a.id} set aside",
            live_ledger.set_aside,
            self.ledger,
            [m.message_id for m in shown],
            stump.id if stump else None,
            [m.content for m in shown],
        )
        if stump is not None:
            stump.published = True
        await self.post_notice(a.generation_id, truth.live_set_aside_notice(a.chars))
        self._release(shown)

    # ------------------------------------------------------------------ settling

    async def settle(self, final: Attempt | None, posts: list[Post]) -> None:
        """Make the room hold `posts` (recorded, none delivered yet): the text posts adopt the final
        attempt's live messages in order; a live message no text post takes is removed."""
        await self.halt()
        shown = self.messages if final is not None and self.attempt is final else []
        self.messages = []
        texts = [p for p in posts if p.kind in TEXT_KINDS and p.message_id is None]
        settled: list[LiveMessage] = []
        for i, m in enumerate(shown):
            post = texts[i] if i < len(texts) else None
            try:
                if post is None:
                    await self.room.delete(m.message_id)
                    await until_written(
                        f"live message {m.message_id} withdrawn", live_ledger.withdraw, self.ledger, m.nonce
                    )
                    continue
                await self._edit(m, post.content, post.content, wait=True)
            except RoomUnavailable as e:
                # Not adopted: the post goes out through the outbox; the stale message is withdrawn if it can be.
                log.warning(
                    "%s: live message %s could not be settled (%s); its post is delivered anew",
                    self.residence,
                    m.message_id,
                    e,
                )
                await self._withdraw(m)
                continue
            await until_written(
                f"live message {m.message_id} adopted by post {post.id}",
                live_ledger.adopt,
                self.ledger,
                m.message_id,
                post.id,
                post.content,
            )
            post.message_id, post.delivered_at = m.message_id, time.time()
            settled.append(m)
        self._release(settled, removed=[m for m in shown if m not in settled])

    async def halt(self) -> None:
        """Stop showing: wait for the step in flight (a create or edit is never cut halfway)."""
        task, self._task = self._task, None
        if task is not None:
            self._stop.set()
            self._dirty.set()
            await task
        self._stop.clear()
        self._dirty.clear()

    # ------------------------------------------------------------------ the showing loop

    async def _run(self) -> None:
        try:
            while not self._stop.is_set():
                await self._dirty.wait()
                if self._stop.is_set():
                    return
                if self.messages:  # the open message is edited at most once per interval
                    await self._nap(self.messages[-1].next_at - time.monotonic())
                    if self._stop.is_set():
                        return
                self._dirty.clear()
                await self._show()
        except (RoomUnavailable, LedgerWriteError) as e:  # a room failure, or a ledger refusing what is shown
            self._broke(e)

    async def _show(self) -> None:
        a, sink = self.attempt, self.sink
        assert a is not None and sink is not None
        if self.pending(self.channel):  # posts wait in the outbox: show nothing new before them
            asyncio.get_running_loop().call_later(self.interval / 4, self._dirty.set)
            return
        # What the room is shown is on disk first: the text as it stands now, before the flush that writes
        # it (deltas arriving while the flush awaits the ledger are shown next time, once they are written).
        text = join_text(sink.blocks())
        if not await sink.on_disk():  # the ledger refused it (a full disk): shown once it is written
            asyncio.get_running_loop().call_later(self.interval, self._dirty.set)
            return
        chunks = split_text(text, escape=True)
        for i, c in enumerate(chunks):
            if self._stop.is_set():
                return
            last = i == len(chunks) - 1
            display = c[: LIMIT - len(truth.LIVE_MARKER)] + truth.LIVE_MARKER if last else c
            if i < len(self.messages):
                await self._edit(self.messages[i], display, c, wait=not last)
            else:
                self.messages.append(await self._create(a, i, display, c))

    async def _create(self, a: Attempt, idx: int, display: str, content: str) -> LiveMessage:
        nonce = new_id("l-")
        self.board.hide(nonce)  # before the send: the room tells other bots before it answers this one
        self.keys.append(nonce)
        await live_ledger.add(
            self.ledger,
            live_ledger.LiveMessage(nonce, None, a.generation_id, a.id, idx, self.channel, self.residence, content),
        )
        mid = await self.room.send_live(display, nonce)
        self.board.hide(mid)
        self.keys.append(mid)
        # In the room now: its id is recorded whatever the disk says meanwhile (a message the ledger does
        # not know would stay in the room in progress, never adopted nor withdrawn when the reply settles).
        await until_written(f"live message {mid} sent", live_ledger.sent, self.ledger, nonce, mid)
        return LiveMessage(mid, nonce, display, content, time.monotonic() + self.interval, [time.monotonic()])

    async def _edit(self, m: LiveMessage, display: str, content: str, *, wait: bool) -> None:
        if m.display == display:
            return
        if wait:
            await asyncio.sleep(max(0.0, m.next_at - time.monotonic()))
        elif m.next_at > time.monotonic():
            self._dirty.set()  # not yet: the loop comes back when it may
            return
        await self.room.edit(m.message_id, display)
        now = time.monotonic()
        m.display, m.next_at = display, now + self.interval
        m.edits.append(now)
        if m.content != content:
            m.content = content
            await live_ledger.shown(self.ledger, m.message_id, content)

    async def _nap(self, seconds: float) -> None:
        if seconds > 0:
            try:
                await asyncio.wait_for(self._stop.wait(), seconds)
            except TimeoutError:
                pass

    async def _withdraw(self, m: LiveMessage) -> None:
        try:
            await self.room.delete(m.message_id)
        except RoomUnavailable as e:
            log.warning("%s: live message %s stays in the room in progress (%s)", self.residence, m.message_id, e)
        await until_written(f"live message {m.message_id} withdrawn", live_ledger.withdraw, self.ledger, m.nonce)

    def _broke(self, e: RoomUnavailable | LedgerWriteError) -> None:
        if not self.broken:
            log.warning(
                "%s: the live reply in %s stopped showing (%s); it is delivered when it settles",
                self.residence,
                self.channel,
                e,
            )
        self.broken = True

    def _release(self, settled: list[LiveMessage], removed: list[LiveMessage] = ()) -> None:  # type: ignore[assignment]
        keys = [k for m in list(settled) + list(removed) for k in (m.nonce, m.message_id)]
        self.board.settled(self.channel, keys, [m.message_id for m in settled])
