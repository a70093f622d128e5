"""Crash recovery: what a stopped process left open is settled, truthfully, at the next start-up.

A SIGKILL, an out-of-memory kill or a power cut can stop `residents run` mid-stream or mid-delivery.
The ledger then holds generations still `pending`, attempts still `streaming` (their text, up to the
last flush, in `attempt_chunks`) and posts with no message id. Nothing of that may be dropped, and
nothing may be posted twice:

- `settle_interrupted` (before any bot connects) settles each open generation from what reached
  disk: a streaming attempt becomes `incomplete` with error and discard reason `interrupted` and
  its streamed text; the generation becomes `incomplete` with stop reason `interrupted` (so
  `residents.truth` gives the `interrupted` stump cause and the wording of its receipt), its text kept
  as an output stump. A `/continue` call cut on a settled generation is closed with the one
  receipt every call gets, in the same transaction.
- Recovery settles; it plans no posts and delivers nothing. Delivery (`residents.delivery.resume`) then
  plans the posts of settled generations that have none and delivers what waits, adopting any post
  that reached the room without its id reaching the ledger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from .. import truth
from ..ledger import Ledger
from ..records import (
    Attempt,
    ContinuationEnd,
    Generation,
    Outcome,
    Planned,
    PostKind,
    PostReason,
    Segment,
    Status,
    StumpScope,
    make_stump,
    numbered,
)
from .attempts import block_stumps

log = logging.getLogger(__name__)


@dataclass
class Recovery:
    """What start-up recovery did, for the log and for tests."""

    interrupted: list[str]  # generations settled as interrupted
    settled: list[str]  # generations whose last attempt had ended: settled by its outcome
    stray: list[str]  # settled generations with a streaming /continue attempt, now closed
    planned: list[str] = field(default_factory=list)  # filled by `residents.delivery.resume.recover`: posts planned


async def settle_interrupted(
    ledger: Ledger, residences: Collection[str] | None = None, channels: Collection[str] | None = None
) -> Recovery:
    """Settle every generation a stopped process left open (of `residences`, or of all when None).

    Only generations of the residences this process runs are touched: another process (a replay,
    say) may be writing its own generations to the same ledger file right now. `channels`: only those in
    these channels (a sharded bot's shards taken over, whose other shards run on in another process).
    """
    rec = Recovery([], [], [])

    def ours(g: Generation | None) -> bool:
        return (
            g is not None
            and (residences is None or g.residence in residences)
            and (channels is None or g.channel in channels)
        )

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
    if rec.interrupted or rec.settled or rec.stray:
        log.warning(
            "recovered after a stop: %d generation(s) interrupted, %d settled by their last attempt, "
            "%d /continue attempt(s) closed",
            len(rec.interrupted),
            len(rec.settled),
            len(rec.stray),
        )
    return rec


def _interrupt(attempts: list[Attempt], now: float) -> list[Attempt]:
    """Close every still-streaming attempt with the text that reached disk (already in `a.text`)."""
    cut = []
    for a in attempts:
        if a.outcome == "streaming":
            a.outcome, a.stop_reason = Outcome.INCOMPLETE, None
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
    g.segments = (
        [Segment(1, final.id, final.stop_reason, final.chars, final.output_tokens)]
        if has_text and final is not None
        else []
    )
    ended = (
        has_text
        and final is not None
        and final not in cut
        and not later
        and not (truth.is_ceiling(final.stop_reason) and g.standing == "bounded")
        and final.stop_reason != truth.TOOL_USE
    )  # a round whose tool calls never ran or were answered
    if ended and final is not None:
        g.status, g.stop_reason = truth.status_of_outcome(final.outcome), final.stop_reason
        g.continuation_ended = (
            ContinuationEnd.DISABLED if truth.is_ceiling(final.stop_reason) else ContinuationEnd.NOT_NEEDED
        )
    else:
        g.status, g.stop_reason = Status.INCOMPLETE, truth.INTERRUPTED
    g.output_tokens = g.segments_tokens()
    g.finished_at = now
    stumps = [
        make_stump(g, a, truth.INTERRUPTED, StumpScope.ATTEMPT)
        for a in later
        if a.text and a.outcome != "abandoned" and not any(s.attempt_id == a.id for s in g.stumps)
    ]
    cause = truth.stump_cause(g.status, g.stop_reason)
    if cause and g.text and final is not None:
        stumps.append(make_stump(g, final, cause, StumpScope.OUTPUT))
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
    await ledger.recover_generation(g, cut, stumps, [])
    log.warning(
        "generation %s (%s) settled after a stop: %s, %d characters kept",
        g.id,
        g.residence,
        g.status if ended else "interrupted",
        g.chars,
    )
    return not ended


async def _close_stray_attempts(ledger: Ledger, g: Generation) -> None:
    """A /continue on a settled generation was cut: its text becomes a stump, and one receipt says so.

    The generation keeps its status and text (the segment was never judged or appended); each
    continuation call that produced nothing settled gets the one boundary line every call gets.
    """
    now = time.time()
    cut = _interrupt(g.attempts, now)
    stumps = [make_stump(g, a, truth.INTERRUPTED, StumpScope.ATTEMPT) for a in cut if a.text]
    for a in cut:
        stumps += block_stumps(g, a, truth.INTERRUPTED)
    line = truth.receipt(
        truth.Ending(status=Status.INCOMPLETE, stop_reason=truth.INTERRUPTED, output_tokens=None, chars=g.chars)
    )
    calls = sorted({a.segment for a in cut})
    receipt = Planned(PostKind.RECEIPT, truth.RECEIPT_PREFIX + line, PostReason.RECEIPT) if line else None
    posts = numbered([receipt] * len(calls) if receipt else [], g.id, g.channel, await ledger.next_post_seq(g.id))
    g.posts += posts
    g.stumps += stumps
    await ledger.recover_generation(g, cut, stumps, posts)
    log.warning(
        "generation %s (%s): %d continuation attempt(s) cut by a stop closed as interrupted",
        g.id,
        g.residence,
        len(cut),
    )
