"""Crash recovery: what a stopped process left open is settled, truthfully, at the next start-up.

A SIGKILL, an out-of-memory kill or a power cut can stop `residents run` mid-stream or mid-delivery.
The ledger then holds generations still `pending`, attempts still `streaming` (their text, up to the
last flush, in `attempt_chunks`) and posts with no message id. Nothing of that may be dropped, and
nothing may be posted twice:

- `settle_interrupted` (before any bot connects) settles each open generation from what reached
  disk: a streaming attempt becomes `incomplete` with error and discard reason `interrupted` and
  its streamed text; the generation becomes `incomplete` with stop reason `interrupted` (so
  `bot.truth` gives the `interrupted` stump cause and the wording of its receipt), its text kept
  as an output stump, and its posts (partial + receipt) are planned in the same transaction.
- `resume_delivery` (after a bot logs in, before its gateway connects, so no new turn can
  interleave) delivers every undelivered post of its residence, oldest generation first, each in
  `seq` order.

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
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from .. import truth
from ..delivery import plan
from ..delivery.plan import RECEIPT_PREFIX
from ..ledger import Ledger
from ..text import outbound
from .attempts import block_stumps
from .records import Attempt, Generation, Post, Segment, Stump, new_id

log = logging.getLogger(__name__)

SLACK_SECONDS = 120.0  # clock difference tolerated between this host and the room's message ids


@dataclass(frozen=True)
class Seen:
    """One of the bot's own messages as the room reports it."""
    id: str
    content: str
    nonce: str | None = None


class RoomUnavailable(Exception):
    """The room could not be read or written now; the posts wait, in order, for the next start."""


class ResumeRoom(Protocol):
    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        """This bot's messages in `channel` after message `after_id` (or, when None, after `after_time`),
        oldest first. Raises RoomUnavailable when the channel cannot be read."""
        ...

    async def send(self, post: Post) -> str:
        """Deliver one post (with its id as nonce); returns the message id. Raises RoomUnavailable."""
        ...


@dataclass
class Recovery:
    """What start-up recovery did, for the log and for tests."""
    interrupted: list[str]  # generations settled as interrupted
    settled: list[str]  # generations whose last attempt had ended: settled by its outcome
    stray: list[str]  # settled generations with a streaming /continue attempt, now closed
    planned: list[str]  # settled generations that had no posts planned; planned now


async def settle_interrupted(ledger: Ledger, residences: Collection[str] | None = None) -> Recovery:
    """Settle every generation a stopped process left open (of `residences`, or of all when None).

    Only generations of the residences this process runs are touched: another process (a replay,
    say) may be writing its own generations to the same ledger file right now.
    """
    rec = Recovery([], [], [], [])

    def ours(g: Generation | None) -> bool:
        return g is not None and (residences is None or g.residence in residences)

    for gid in await ledger.unsettled_generations():
        g = await ledger.get_generation(gid)
        if g is not None and ours(g):
            interrupted = await _settle_pending(ledger, g)
            (rec.interrupted if interrupted else rec.settled).append(gid)
    for gid in await ledger.streaming_generations():
        g = await ledger.get_generation(gid)
        if g is not None and ours(g):
            await _close_stray_attempts(ledger, g)
            rec.stray.append(gid)
    for gid in await ledger.generations_without_posts():
        g = await ledger.get_generation(gid)
        if g is not None and ours(g) and await _plan_missing(ledger, g):
            rec.planned.append(gid)
    if rec.interrupted or rec.settled or rec.stray or rec.planned:
        log.warning("recovered after a stop: %d generation(s) interrupted, %d settled by their last attempt, "
                    "%d /continue attempt(s) closed, %d generation(s) had no posts planned",
                    len(rec.interrupted), len(rec.settled), len(rec.stray), len(rec.planned))
    return rec


def _interrupt(attempts: list[Attempt], now: float) -> list[Attempt]:
    """Close every still-streaming attempt with the text that reached disk (already in `a.text`)."""
    cut = []
    for a in attempts:
        if a.outcome == "streaming":
            a.outcome, a.stop_reason = "incomplete", None
            a.error = a.discard_reason = truth.INTERRUPTED
            a.output_tokens, a.ended_at = None, now
            cut.append(a)
    return cut


async def _settle_pending(ledger: Ledger, g: Generation) -> bool:
    """Settle a pending generation; True when it was interrupted, False when its last attempt had ended.

    The canonical text is what segment 1's last attempt produced. A generation whose single segment
    had already ended (the process stopped between the attempt's record and the generation's) is
    settled by that attempt's outcome, exactly as the generator would have; any other — a stream cut,
    a retry or a bounded continuation not finished — is `incomplete` with stop reason `interrupted`.
    Text of continuation segments not yet judged and appended is kept as `interrupted` stumps.
    """
    now = time.time()
    cut = _interrupt(g.attempts, now)
    first = [a for a in g.attempts if a.segment == 1]
    later = [a for a in g.attempts if a.segment > 1]
    final = first[-1] if first else None
    has_text = final is not None and final.outcome != "abandoned"
    g.text = final.text if has_text and final is not None else ""
    g.segments = [Segment(1, final.id, final.stop_reason, final.chars, final.output_tokens)] \
        if has_text and final is not None else []
    ended = (has_text and final is not None and final not in cut and not later
             and not (final.stop_reason == "max_tokens" and g.standing == "bounded"))
    if ended and final is not None:
        g.status, g.stop_reason = truth.status_of_outcome(final.outcome), final.stop_reason
        g.continuation_ended = truth.cut_left_standing(g.standing) if final.stop_reason == "max_tokens" else "not-needed"
    else:
        g.status, g.stop_reason = "incomplete", truth.INTERRUPTED
    tokens = [s.output_tokens for s in g.segments]
    g.output_tokens = sum(t for t in tokens if t is not None) if tokens and None not in tokens else None
    g.finished_at = now
    stumps = [_stump(g, a, truth.INTERRUPTED, "attempt") for a in later
              if a.text and a.outcome != "abandoned" and not any(s.attempt_id == a.id for s in g.stumps)]
    cause = truth.stump_cause(g.status, g.stop_reason)
    if cause and g.text and final is not None:
        out = _stump(g, final, cause, "output")
        out.text, out.output_tokens = g.text, g.output_tokens
        stumps.append(out)
    g.stumps += stumps
    # the reasoning or tool-input block each cut attempt stopped in, kept like its text
    for a in later:
        if a.outcome != "abandoned":
            cut_blocks = block_stumps(g, a, truth.INTERRUPTED)
            g.stumps += cut_blocks
            stumps += cut_blocks
    if final is not None and final.outcome != "abandoned":
        cut_blocks = block_stumps(g, final, cause)
        g.stumps += cut_blocks
        stumps += cut_blocks
    posts = _posts(g, [(p.kind, p.content) for p in plan(g.ending(), g.text)])
    await ledger.recover_generation(g, cut, stumps, posts)
    log.warning("generation %s (%s) settled after a stop: %s, %d characters kept, %d post(s) planned",
                g.id, g.residence, g.status if ended else "interrupted", g.chars, len(posts))
    return not ended


async def _close_stray_attempts(ledger: Ledger, g: Generation) -> None:
    """A /continue on a settled generation was cut: its text becomes a stump, and one receipt says so.

    The generation keeps its status and text (the segment was never judged or appended); each
    continuation call that produced nothing settled gets the one boundary line every call gets.
    """
    now = time.time()
    cut = _interrupt(g.attempts, now)
    stumps = [_stump(g, a, truth.INTERRUPTED, "attempt") for a in cut if a.text]
    for a in cut:
        stumps += block_stumps(g, a, truth.INTERRUPTED)
    line = truth.receipt(truth.Ending(status="incomplete", stop_reason=truth.INTERRUPTED, output_tokens=None,
                                      chars=g.chars))
    calls = sorted({a.segment for a in cut})
    posts = _posts(g, [("receipt", RECEIPT_PREFIX + line)] * len(calls) if line else [])
    g.stumps += stumps
    await ledger.recover_generation(g, cut, stumps, posts)
    log.warning("generation %s (%s): %d continuation attempt(s) cut by a stop closed as interrupted",
                g.id, g.residence, len(cut))


async def _plan_missing(ledger: Ledger, g: Generation) -> bool:
    """A settled generation with no posts: the process stopped between settling and planning."""
    planned = plan(g.ending(), g.text)
    if not planned:
        return False
    posts = _posts(g, [(p.kind, p.content) for p in planned])
    await ledger.add_posts(posts)
    log.warning("generation %s (%s) was settled but never planned: %d post(s) planned now",
                g.id, g.residence, len(posts))
    return True


def _stump(g: Generation, a: Attempt, cause: str, scope: str) -> Stump:
    return Stump(id=new_id("s-"), generation_id=g.id, attempt_id=a.id, cause=cause, text=a.text,
                 output_tokens=a.output_tokens, scope=scope, residence=g.residence)


def _posts(g: Generation, planned: list[tuple[truth.PostKind, str]]) -> list[Post]:
    start = max((p.seq for p in g.posts), default=0) + 1
    posts = [Post(id=new_id("p-"), generation_id=g.id, seq=start + i, kind=kind, content=content, channel=g.channel)
             for i, (kind, content) in enumerate(planned)]
    g.posts += posts
    return posts


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
            done += await _resume_generation(ledger, room, g, group)
        except RoomUnavailable as e:
            blocked.add(channel)
            log.warning("%s: posts of generation %s not delivered yet (channel %s): %s; they wait for the next "
                        "start", residence, gid, channel, e)
    if done:
        log.warning("%s: %d post(s) left undelivered by a stop are now delivered", residence, done)
    return done


async def _resume_generation(ledger: Ledger, room: ResumeRoom, g: Generation, group: list[Post]) -> int:
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
            k = next((i for i in range(j, len(fresh)) if _same(fresh[i], p)), None)
            if k is not None:
                await ledger.mark_delivered(p, fresh[k].id)
                log.warning("post %s (generation %s) had reached the room as message %s before the stop: "
                            "recorded, not sent again", p.id, g.id, fresh[k].id)
                j, done = k + 1, done + 1
                continue
            adopting = False  # what was never sent before cannot be followed by something that was
        await ledger.mark_delivered(p, await room.send(p))
        done += 1
    return done


def _same(m: Seen, p: Post) -> bool:
    if m.nonce is not None:
        return m.nonce == p.id
    return m.content.strip() == outbound(p.content)[0].strip()  # what the room was sent
