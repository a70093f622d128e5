"""A resident's turn, end to end: room → context → generation → ledger → delivery plan → room.

The Discord cog and `residents replay` both call this, and every post goes out the same way: through
the resident's outbox, in per-channel order. What differs is the room the outbox sends to — the
process's bots under `residents run`, a room of their own for replay and the tests (`Outbox.of_room`)
— and the room a caller names, which only a live view writes to.

Work on one resident in one channel is serialised here (a turn, a /continue, a declined /continue) up
to handing its posts to the outbox: two requests never number posts of one generation at once, and
their posts never interleave. Waiting for the room comes after, so a /continue is never held behind
another reply's posts that the room has not taken yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import observe, truth
from .config import Residence
from .context import RoomMessage
from .context.compile import compile_with_files, ledger_message_ids, own_generation_ids
from .context.window import Window
from .delivery import plan, plan_continuation
from .delivery.keys import KeyRejections
from .delivery.live import LiveBoard, LiveView, shared_board, supports_live
from .delivery.outbox import Outbox
from .delivery.plan import notice as notice_post
from .delivery.plan import plan_recovered
from .delivery.send import Room
from .generation import budgets
from .generation.run import Generator, never
from .generation.stumps_tool import StumpsTool
from .ledger import Ledger, Superseded
from .ledger import budgets as ledger_budgets
from .ledger.retry import until_written
from .observe import UNOBSERVED, Observer
from .records import BudgetRefusal, Generation, Planned, Post, PostReason, SharedFile, new_id, numbered

log = logging.getLogger(__name__)

PUBLISH_WAIT = 5.0  # seconds a publication waits to reach the room before the tool answers "not yet delivered"


@dataclass
class Reply:
    generation: Generation | None
    posts: list[Post]
    declined: str | None = None  # the reason a /continue was declined, as `residents.truth` words it
    decline: truth.Declined | None = None  # ... and as facts
    waiting: int = 0  # posts of it not in the room yet when the call returned (an outbox held by the room)
    taken: bool = False  # its trigger had been claimed before: no turn was taken (`Ledger.claim_reply`)


class Resident:
    def __init__(
        self,
        residence: Residence,
        generator: Generator,
        ledger: Ledger,
        outbox: Outbox,
        key_rejections: KeyRejections | None = None,
    ) -> None:
        self.residence = residence
        self.generator = generator
        self.ledger = ledger
        self.outbox = outbox
        self.key_rejections = key_rejections  # `residents run`: refused-key failures logged, room told once
        self._busy: dict[str, asyncio.Lock] = {}
        self.windows: dict[str, Window] = {}  # per channel: where its requests start showing the room
        self.board: LiveBoard = shared_board()  # live messages in progress, across the process
        self.observer: Observer = UNOBSERVED  # told each turn's time (`residents.metrics`)

    def busy(self, channel: str) -> asyncio.Lock:
        """Held while this resident works in `channel`: generating or recording a reply, up to its enqueue."""
        lock = self._busy.get(channel)
        if lock is None:
            lock = self._busy[channel] = asyncio.Lock()
        return lock

    @property
    def name(self) -> str:
        return self.residence.name

    async def compile(self, history: list[RoomMessage], channel: str | None = None) -> dict:
        return (await self.compile_with_files(history, channel))[0]

    async def compile_with_files(
        self, history: list[RoomMessage], channel: str | None = None
    ) -> tuple[dict[str, Any], list[SharedFile]]:
        """The request, and the files it carries or describes (for the ledger: never their bytes).

        `channel`: where the turn is taken; its window (`residents.context.window`) is kept between
        turns, so the older part of its requests stays the same and a provider's cache can read it."""
        posts = await self.ledger.posts_by_message(ledger_message_ids(history))
        gens = await self.ledger.generations_brief(own_generation_ids(history, posts))
        own = {m.id for m in history if m.is_self}
        recovered = {
            p.stump_id: s
            for mid, p in posts.items()
            if mid in own
            and p.kind == "recovered"
            and p.stump_id
            and (s := await self.ledger.get_stump(p.stump_id)) is not None
        }
        window = self.windows.setdefault(channel, Window()) if channel is not None else None
        return compile_with_files(self.residence, history, posts, gens, recovered, window)

    def tools(self, room: Room, channel: str) -> StumpsTool | None:
        """The resident's own `stumps` tool for a turn in `channel`, where its policy gives it."""
        if not self.residence.policy.stumps.patient_tool:
            return None

        async def publish(meta: dict[str, Any], text: str, g: Generation) -> dict[str, Any]:
            return await self._publish(channel, g, meta, text)

        return StumpsTool(self.ledger, self.residence, channel, publish)

    async def _publish(self, channel: str, g: Generation, meta: dict[str, Any], text: str) -> dict[str, Any]:
        """A stump's text into its channel at the resident's request, as posts of the generation asking.

        Recorded before they are sent; a room that fails now leaves them undelivered, in order, for the
        same redelivery every post gets."""
        posts = numbered(
            plan_recovered(text, meta["cause"]),
            g.id,
            channel,
            await self.ledger.next_post_seq(g.id),
            stump_id=meta["id"],
        )
        await until_written(f"stump {meta['id']} published", self.ledger.add_posts, posts)
        g.posts += posts
        # In the channel's order; an outage leaves them queued, not lost.
        await self.outbox.wait(self.outbox.enqueue(self.name, posts), timeout=PUBLISH_WAIT)
        delivered = all(p.message_id is not None for p in posts)
        return {"posts": len(posts), "delivered": delivered}

    async def respond(
        self,
        room: Room,
        channel: str,
        history: list[RoomMessage],
        trigger: str | None = None,
        superseded: Callable[[], bool] = never,
        queued: Callable[[list[Post]], None] | None = None,
        person: str | None = None,
    ) -> Reply:
        """One turn, returned once its posts are in the room (or set aside).

        `queued(posts)` is called as the reply's posts are handed to delivery (floor control). `person`: the
        room user id of whoever asked (the trigger's author), whose daily budget the reply counts against.
        The turn claims `trigger` in the ledger before anything else (`Ledger.claim_reply`): a message taken
        already — re-delivered, caught up, or taken by another process — gets no second turn
        (`Reply.taken`)."""
        began = time.monotonic()
        with observe.working_on(residence=self.name, channel=channel):
            async with self.busy(channel):
                if trigger is not None and not await self._claim(trigger, channel):
                    reply, waiting = Reply(None, [], taken=True), []
                elif (refused := await self._over_budget(channel, trigger, person)) is not None:
                    reply, waiting = refused, self._enqueue(refused.posts, queued)
                else:
                    try:
                        reply, waiting = await self._respond(
                            room, channel, history, trigger, superseded, queued, person
                        )
                    except Superseded as e:
                        # This process was stopped past its lease and another took the bot over, settling this
                        # turn's open generation as interrupted: the rest is that process's (nothing posted here).
                        log.warning(
                            "%s: the turn in %s was given up, its bot now driven elsewhere: %s", self.name, channel, e
                        )
                        reply, waiting = Reply(None, []), []
            reply = await self._delivered(reply, waiting)
        self.observer.turn_ended(self.name, channel, time.monotonic() - began)
        return reply

    async def _claim(self, trigger: str, channel: str) -> bool:
        """Whether this turn took `trigger` (False: taken before, and said so in the log)."""
        taken = await until_written(
            f"{self.name}: the claim of message {trigger}", self.ledger.claim_reply, self.name, trigger, channel
        )
        if not taken:
            log.info("%s: message %s in %s was taken already; no second reply to it", self.name, trigger, channel)
        return taken

    async def _over_budget(self, channel: str, trigger: str | None, person: str | None) -> Reply | None:
        """None when no daily budget is spent; else the refusal, recorded with the channel's one notice of
        the day (none if it had it already): no provider call is made. Asked under the channel's lock, so
        two turns of this resident never both post the day's notice."""
        now = time.time()
        found = await budgets.reached(self.ledger, self.name, self.residence.policy.budgets, person, now)
        if found is None:
            return None
        day = budgets.utc_day(now)[0]
        posts = []
        if not await ledger_budgets.told(self.ledger, self.name, channel, day):
            line = truth.budget_notice(found.tokens, found.scope, found.budget)
            posts = numbered([notice_post(line, PostReason.BUDGET_REACHED)], None, channel, 1)
        refusal = BudgetRefusal(
            id=new_id("b-"),
            residence=self.name,
            channel=channel,
            trigger=trigger,
            person=person,
            scope=found.scope,
            tokens=found.tokens,
            budget=found.budget,
            spent=found.spent,
            day=day,
            post_id=posts[0].id if posts else None,
            created_at=now,
        )
        await until_written(
            f"{self.name}: a reply refused by its budget", ledger_budgets.refuse, self.ledger, refusal, posts
        )
        log.info(
            "%s: daily %s budget (%s) of %d tokens reached (%d counted); no reply in %s%s",
            self.name,
            found.tokens,
            found.scope,
            found.budget,
            found.spent,
            channel,
            "" if posts else " (the channel was told today already)",
        )
        return Reply(None, posts)

    async def _respond(
        self,
        room: Room,
        channel: str,
        history: list[RoomMessage],
        trigger: str | None,
        superseded: Callable[[], bool],
        queued: Callable[[list[Post]], None] | None,
        person: str | None = None,
    ) -> tuple[Reply, list[asyncio.Future[bool]]]:
        request, files = await self.compile_with_files(history, channel)
        view = self._live_view(room, channel)
        try:
            g = await self.generator.generate(
                self.residence,
                channel,
                request,
                trigger,
                superseded,
                seen_upto=history[-1].id if history else None,
                tools=self.tools(room, channel),
                watch=view,
                attachments=files,
                person=person,
            )
        finally:
            if view is not None:
                await view.halt()
        planned = plan(g.ending(), g.text)
        if self.key_rejections is not None:
            planned = self.key_rejections.review(g, channel, planned)
        # A stump shown live was told in a notice of its own as it was set aside (`LiveView.set_aside`).
        set_aside = [
            s for s in g.stumps if s.scope == "attempt" and s.cause == truth.RETRY_ABANDONED and not s.published
        ]
        if set_aside and self.residence.policy.notices.retry_abandoned:
            planned.append(
                notice_post(
                    truth.abandoned_notice(len(set_aside), sum(s.chars for s in set_aside)), PostReason.ABANDONED_NOTICE
                )
            )
        posts = await self._record(g, planned, channel)
        if view is not None:
            final = next((a for a in g.attempts if g.segments and a.id == g.segments[0].attempt_id), None)
            await view.settle(final, posts)
        # A publication its tool made that the room has not taken yet goes first: the outbox keeps that order.
        return Reply(g, posts), self._enqueue(posts, queued)

    def _live_view(self, room: Room, channel: str) -> LiveView | None:
        """A live view of the reply, where the policy asks for one and the room can edit its messages."""
        live_room: object = room  # the same room, seen as a LiveRoom once it is known to be one
        if not self.residence.policy.delivery.live or not supports_live(live_room):
            return None
        outbox = self.outbox
        return LiveView(
            self.name,
            channel,
            self.ledger,
            self.outbox.fenced(self.name, channel, live_room),  # under leases, as every post is
            self.board,
            lambda gid, line: self._notice(gid, line, channel),
            pending=lambda ch: bool(outbox.pending(ch)),
        )

    async def _notice(self, generation_id: str, line: str, channel: str) -> None:
        """One notice post of a generation still being written (an attempt shown live was set aside)."""
        posts = numbered(
            [notice_post(line, PostReason.LIVE_SET_ASIDE)],
            generation_id,
            channel,
            await self.ledger.next_post_seq(generation_id),
        )
        await until_written(f"notice of generation {generation_id}", self.ledger.add_posts, posts)
        await self._delivered(Reply(None, posts), self._enqueue(posts))

    async def continue_generation(
        self,
        room: Room,
        channel: str,
        generation_id: str | None,
        superseded: Callable[[], bool] = never,
        within: float | None = None,
        offered: int | None = None,
    ) -> Reply:
        """A moderator asked for more of a cut output: one segment at most, under the standing.

        Waits for any turn or continuation of this resident in `channel` still being generated (not for
        their posts to reach the room), then reads the generation afresh: a second request on one
        generation runs after the first, and is declined with the reason if it no longer applies. Returns once its posts are in
        the room, or after `within` seconds with `Reply.waiting` saying how many are not yet.

        `offered`: the segments the asker saw (a Continue button's receipt, a /continue when it was asked).
        Once the generation has more (a double-click, two moderators at once, an older receipt) it is
        declined to the asker alone, with no notice in the room: one ask, one continuation at most.
        """
        with observe.working_on(residence=self.name, channel=channel):
            async with self.busy(channel):
                reply, waiting = await self._continue(channel, generation_id, superseded, offered)
            return await self._delivered(reply, waiting, within)

    async def _continue(
        self, channel: str, generation_id: str | None, superseded: Callable[[], bool], offered: int | None = None
    ) -> tuple[Reply, list[asyncio.Future[bool]]]:
        g = (
            await self.ledger.get_generation(generation_id)
            if generation_id
            else await self.ledger.latest_generation(self.name, channel)
        )
        if g is None or g.residence != self.name:
            return await self._decline(
                channel,
                None,
                truth.Declined(
                    "unknown-generation" if generation_id else "no-generation-here", self.name, generation_id
                ),
            )
        if offered is not None and len(g.segments) != offered:
            why = truth.Declined("already-continued", self.name, g.id, str(len(g.segments)))
            return Reply(g, [], declined=truth.declined_reason(why), decline=why), []
        result = await self.generator.continue_on_request(g, self.residence, superseded)
        if result.refused:
            return await self._decline(channel, g, result.refused)
        planned = plan_continuation(g.ending(), result.added)
        if self.key_rejections is not None:
            planned = self.key_rejections.review(g, channel, planned, added=result.added)
        posts = await self._record(g, planned, channel)
        return Reply(g, posts), self._enqueue(posts)

    async def _decline(
        self, channel: str, g: Generation | None, why: truth.Declined
    ) -> tuple[Reply, list[asyncio.Future[bool]]]:
        posts = await self._record(
            g, [notice_post(truth.declined_continue(why), PostReason.DECLINED_CONTINUE)], channel
        )
        return Reply(g, posts, declined=truth.declined_reason(why), decline=why), self._enqueue(posts)

    def _enqueue(
        self, posts: list[Post], queued: Callable[[list[Post]], None] | None = None
    ) -> list[asyncio.Future[bool]]:
        """Hand recorded posts to the outbox, behind anything still waiting in their channel."""
        waiting = self.outbox.enqueue(self.name, posts)
        if queued is not None:
            queued(posts)  # in the same step as the enqueue: floor control never sees the reply in neither place
        return waiting

    async def _delivered(self, reply: Reply, waiting: list[asyncio.Future[bool]], within: float | None = None) -> Reply:
        """`reply` once its posts are in the room or set aside, or after `within` seconds (then `waiting` > 0)."""
        if not await self.outbox.wait(waiting, timeout=within):
            reply.waiting = sum(1 for p in reply.posts if p.message_id is None and p.refused is None)
            if self.outbox.closed:
                log.warning(
                    "%s: %d post(s) not delivered before the outbox closed; delivered at the next start",
                    self.name,
                    reply.waiting,
                )
        return reply

    async def _record(self, g: Generation | None, planned: list[Planned], channel: str) -> list[Post]:
        start = await self.ledger.next_post_seq(g.id) if g is not None else 1
        posts = numbered(planned, g.id if g else None, channel, start)
        # Recorded before anything is sent: a refused write waits for the disk, and nothing unrecorded goes out.
        await until_written(
            f"posts of {g.id if g else 'a notice'} ({self.name}, {channel})", self.ledger.add_posts, posts
        )
        if g is not None:
            g.posts += posts
        return posts
