"""After a stop: planning the posts of settled generations that have none, and delivering what waits.

Recovery (`residents.generation.recovery`) settles what a stopped process left open; it plans no posts.
This module does the rest, before any bot takes a new turn:

- `plan_unposted` plans the posts of every settled generation that has none (one settled by
  recovery just now, or one the process stopped between settling and planning), by the same rules
  as a live turn (`residents.delivery.plan`).
- `resume_delivery` delivers every undelivered post of a residence, oldest generation first, each
  in `seq` order. `residents run` does the same through its outbox (`residents.delivery.outbox`) after a
  bot logs in and before its gateway connects: those posts go first in their channel's queue, ahead
  of any new turn, and what the room refuses then is retried with backoff (`resume_generation`).

Posting twice is prevented by reading the room before sending. `deliver` records a message id
before it sends the next post, so at most one post per generation can have reached the room without
its id reaching the ledger: the one in flight at the crash. For the first undelivered post of a
generation, this bot's messages in the channel after the generation's last recorded post (or after
it settled, less `SLACK_SECONDS` of clock difference) that no post in the ledger claims are compared
with it (content, and the nonce where the room reports one — every post is sent with its post id as
nonce); a match is adopted as that post's message id instead of being sent again. Discord's own
`enforce_nonce` check also catches a resend, but only for a few minutes; the history check does not
expire, so a restart hours later still posts nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from ..generation.recovery import Recovery, settle_interrupted
from ..ledger import Ledger
from ..records import Generation, Post, Refusal, numbered
from ..text import outbound
from .plan import plan

log = logging.getLogger(__name__)

SLACK_SECONDS = 120.0  # clock difference tolerated between this host and the room's message ids


@dataclass(frozen=True)
class Seen:
    """One of the bot's own messages as the room reports it."""

    id: str
    content: str
    nonce: str | None = None


class RoomUnavailable(Exception):
    """The room could not be read or written now (any failure: network, timeout, 5xx, 429, 403).

    The posts wait, in order: the outbox retries them with backoff, or the next start does."""


class RoomRefused(RoomUnavailable):
    """The room answered that it will not take this (HTTP 400, 403, 404), not that it is down.

    Retried as any failure, but only a few times for one post: then the outbox sets the post aside."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.text)
        self.refusal = refusal


class ResumeRoom(Protocol):
    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        """This bot's messages in `channel` after message `after_id` (or, when None, after `after_time`),
        oldest first. Raises RoomUnavailable when the channel cannot be read."""
        ...

    async def send(self, post: Post) -> str:
        """Deliver one post (with its id as nonce); returns the message id. Raises RoomUnavailable."""
        ...


async def recover(
    ledger: Ledger, residences: Collection[str] | None = None, channels: Collection[str] | None = None
) -> Recovery:
    """At start-up, before any bot connects: settle what a stopped process left open, then plan its posts
    (`channels`: only in these, as `settle_interrupted` says)."""
    rec = await settle_interrupted(ledger, residences, channels)
    rec.planned = await plan_unposted(ledger, residences, channels)
    return rec


async def open_channels(ledger: Ledger, residence: str) -> set[str]:
    """The channels where `residence` has a generation recovery would touch: open, with a /continue still
    streaming, or settled with no posts planned."""
    ids = (
        await ledger.unsettled_generations()
        + await ledger.streaming_generations()
        + await ledger.generations_without_posts()
    )
    found = set()
    for gid in ids:
        g = await ledger.get_generation(gid)
        if g is not None and g.residence == residence:
            found.add(g.channel)
    return found


async def plan_unposted(
    ledger: Ledger, residences: Collection[str] | None = None, channels: Collection[str] | None = None
) -> list[str]:
    """Plan the posts of every settled generation (of `residences`, or of all when None) that has none.

    Only generations of the residences this process runs are touched: another process (a replay,
    say) may be settling its own generations in the same ledger file right now, and plans their posts itself.
    """
    done = []
    for gid in await ledger.generations_without_posts():
        g = await ledger.get_generation(gid)
        if (
            g is not None
            and (residences is None or g.residence in residences)
            and (channels is None or g.channel in channels)
            and await _plan_missing(ledger, g)
        ):
            done.append(gid)
    return done


async def _plan_missing(ledger: Ledger, g: Generation) -> bool:
    """A settled generation with no posts: settled by recovery, or the process stopped before planning."""
    planned = plan(g.ending(), g.text)
    if not planned:
        await ledger.mark_planned(g.id)
        return False
    posts = numbered(planned, g.id, g.channel, await ledger.next_post_seq(g.id))
    await ledger.add_posts(posts)
    g.posts += posts
    log.warning("generation %s (%s) settled after a stop: %d post(s) planned now", g.id, g.residence, len(posts))
    return True


async def resume_delivery(ledger: Ledger, residence: str, room: ResumeRoom) -> int:
    """Deliver a residence's undelivered posts in order, adopting any that already reached the room.

    Returns how many posts were delivered or adopted. A room error stops delivery in that channel
    (later posts must not overtake earlier ones); those posts wait for the next start.
    """
    posts = await ledger.undelivered_posts_of(residence)
    groups: dict[str, list[Post]] = {}
    for p in posts:
        groups.setdefault(p.generation_id or "", []).append(p)
    blocked: set[str] = set()
    done = 0
    for gid, group in groups.items():
        channel = group[0].channel
        if channel in blocked:
            continue
        g = await ledger.get_generation(gid)
        if g is None:  # pragma: no cover - posts reference their generation
            continue
        try:
            done += await resume_generation(ledger, room, g, group)
        except RoomUnavailable as e:
            blocked.add(channel)
            log.warning(
                "%s: posts of generation %s not delivered yet (channel %s): %s; they wait for the next start",
                residence,
                gid,
                channel,
                e,
            )
    if done:
        log.warning("%s: %d post(s) left undelivered by a stop are now delivered", residence, done)
    return done


async def resume_generation(ledger: Ledger, room: ResumeRoom, g: Generation, group: list[Post]) -> int:
    """Deliver `group` (undelivered posts of `g`, one channel) in order, adopting any already in the room.

    Also how the outbox (`residents.delivery.outbox`) retries a post whose send failed while running.
    """
    group = sorted(group, key=lambda p: p.seq)
    earlier = [p for p in g.posts if p.message_id is not None and p.seq < group[0].seq]
    anchor = earlier[-1].message_id if earlier else None
    since = (g.finished_at or g.created_at) - SLACK_SECONDS
    seen = await room.own_messages(group[0].channel, anchor, since)
    known = await ledger.posts_by_message([m.id for m in seen])
    fresh = [m for m in seen if m.id not in known]
    done, j, adopting = 0, 0, True
    for p in group:
        if adopting:
            k = next((i for i in range(j, len(fresh)) if _is_post_seen(fresh[i], p)), None)
            if k is not None:
                await ledger.mark_delivered(p, fresh[k].id)
                log.warning(
                    "post %s (generation %s) had reached the room as message %s though its send never "
                    "returned (a stop or a lost answer): recorded, not sent again",
                    p.id,
                    g.id,
                    fresh[k].id,
                )
                j, done = k + 1, done + 1
                continue
            adopting = False  # what was never sent before cannot be followed by something that was
        await ledger.mark_delivered(p, await room.send(p))
        done += 1
    return done


def _is_post_seen(m: Seen, p: Post) -> bool:
    if m.nonce is not None:
        return m.nonce == p.id
    return m.content.strip() == outbound(p.content)[0].strip()  # what the room was sent
