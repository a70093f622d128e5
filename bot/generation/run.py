"""One generation: its first segment, any continuation its standing grants, and its settlement.

The status and stumps of a generation are decided by `bot.truth`; this module only sequences the
calls and writes each step to the ledger as it happens.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import truth
from ..config import Residence
from ..context import continuation_request
from ..continuation import judge_segment
from .attempts import AttemptRunner, block_stumps
from .records import Attempt, Generation, Segment, Stump, new_id

log = logging.getLogger(__name__)


def never() -> bool:
    return False


@dataclass
class ContinueResult:
    generation: Generation
    added: str  # the text this request added to the canonical output (after overlap removal)
    refused: str | None = None  # why no provider call was made, when none was


class Generator:
    def __init__(self, runner: AttemptRunner) -> None:
        self.runner = runner
        self.ledger = runner.ledger

    async def generate(self, res: Residence, channel: str, request: dict[str, Any], trigger: str | None = None,
                       superseded: Callable[[], bool] = never, seen_upto: str | None = None) -> Generation:
        g = Generation(id=new_id("g-"), residence=res.name, channel=channel, model=res.model,
                       standing=res.policy.continuation.standing, trigger=trigger, request=request,
                       seen_upto=seen_upto)
        final = await self.runner.run_segment(g, 1, request, res.policy.retries, new_generation=True,
                                              settle_last=False)
        g.text, g.stop_reason = final.text, final.stop_reason
        g.status = truth.status_of_outcome(final.outcome)
        g.segments = [Segment(1, final.id, final.stop_reason, final.chars, final.output_tokens)]
        unsettled: Attempt | None = final
        if g.stop_reason == "max_tokens":
            g.continuation_ended = truth.cut_left_standing(g.standing)
            if res.policy.continuation.standing == "bounded":
                await self.ledger.finish_attempt(final)  # on disk before any continuation call
                unsettled = None
                await self._continue(g, res, superseded, max_new=res.policy.continuation.max_segments or 0)
        await self._settle(g, res, previous_output=None, last_attempt=unsettled)
        return g

    async def continue_on_request(self, g: Generation, res: Residence,
                                  superseded: Callable[[], bool] = never) -> ContinueResult:
        """A moderator's request: at most one more segment for a cut output, where the standing allows."""
        cont = res.policy.continuation
        if cont.standing != "on-request":
            return ContinueResult(g, "", f"the continuation standing of {res.name} is {cont.standing}")
        if g.status != "truncated" or g.stop_reason != "max_tokens":
            return ContinueResult(g, "", f"generation {g.id} is {g.status}, not cut at the output ceiling")
        if g.request is None:
            return ContinueResult(g, "", f"generation {g.id} has no recorded request to continue")
        before = len(g.text)
        previous = next((s for s in reversed(g.stumps) if s.scope == "output" and s.replaced_by is None), None)
        await self._continue(g, res, superseded, max_new=1)
        added = g.text[before:]
        await self._settle(g, res, previous_output=previous if added else None)
        if not added and g.continuation_ended in ("segment-limit", "token-limit", "superseded"):
            return ContinueResult(g, "", f"continuation of {g.id} stopped: {g.continuation_ended}")
        return ContinueResult(g, added)

    async def _continue(self, g: Generation, res: Residence, superseded: Callable[[], bool], max_new: int) -> None:
        cont = res.policy.continuation
        assert g.request is not None
        calls = 0
        ended = g.continuation_ended
        while g.stop_reason == "max_tokens":
            spent = sum(s.output_tokens if s.output_tokens is not None else g.request["max_tokens"] for s in g.segments)
            if len(g.segments) - 1 >= (cont.max_segments or 0):
                ended = "segment-limit"
                break
            if spent >= (cont.max_output_tokens or 0):
                ended = "token-limit"
                break
            if calls >= max_new:
                break
            if superseded():
                ended = "superseded"
                break
            request, stripped = continuation_request(g.request, g.text, (cont.max_output_tokens or 0) - spent)
            final = await self.runner.run_segment(g, len(g.segments) + 1, request, res.policy.retries)
            calls += 1
            if final.outcome not in ("completed", "truncated"):
                ended = "error"
                self._set_aside(g, final, truth.stump_cause(truth.status_of_outcome(final.outcome), final.stop_reason))
                break
            d = judge_segment(g.text, final.text, min_overlap=cont.min_overlap_chars,
                              min_progress=cont.min_progress_chars or 1,
                              similarity_abort=cont.similarity_abort if cont.similarity_abort is not None else 1.0,
                              stripped_tail=stripped)
            if d.verdict != "append":
                ended = d.verdict
                self._set_aside(g, final, d.verdict)
                log.info("continuation of %s ended: %s (overlap %d, %d new chars)", g.id, d.verdict, d.overlap,
                         len(d.added))
                break
            g.segments.append(Segment(len(g.segments) + 1, final.id, final.stop_reason, len(d.added),
                                      final.output_tokens, d.overlap))
            g.text += d.added
            g.stop_reason = final.stop_reason
            g.status = truth.status_of_outcome(final.outcome)
            if g.status == "completed":
                ended = "completed"
        else:
            if g.status == "truncated":
                ended = "error"  # cut for a reason continuation cannot address (a full context window)
        g.continuation_ended = ended

    @staticmethod
    def _set_aside(g: Generation, a: Attempt, cause: str | None) -> None:
        """A continuation segment that is not appended is kept, unpublished, as a stump."""
        if a.text and cause:
            g.stumps.append(Stump(id=new_id("s-"), generation_id=g.id, attempt_id=a.id, cause=cause, text=a.text,
                                  output_tokens=a.output_tokens, scope="attempt", residence=g.residence))
        g.stumps += block_stumps(g, a, cause)

    async def _settle(self, g: Generation, res: Residence, previous_output: Stump | None,
                      last_attempt: Attempt | None = None) -> None:
        tokens = [s.output_tokens for s in g.segments]
        g.output_tokens = sum(t for t in tokens if t is not None) if tokens and None not in tokens else None
        g.finished_at = time.time()
        new = [s for s in g.stumps if not s.stored]
        cause = truth.stump_cause(g.status, g.stop_reason)
        replaced = None
        if previous_output is not None:
            last = g.segments[-1].attempt_id
            previous_output.replaced_by = last
            replaced = (previous_output.id, last)
        if cause and g.text and (previous_output is not None or not any(s.scope == "output" for s in g.stumps)):
            out = Stump(id=new_id("s-"), generation_id=g.id, attempt_id=g.segments[-1].attempt_id, cause=cause,
                        text=g.text, output_tokens=g.output_tokens, scope="output", residence=g.residence)
            g.stumps.append(out)
            new.append(out)
        final = next((a for a in g.attempts if g.segments and a.id == g.segments[-1].attempt_id), None)
        if final is not None:  # a reasoning or tool-input block the output stopped in
            cut = block_stumps(g, final, cause)
            g.stumps += cut
            new += cut
        await self.ledger.finish_generation(g, new, replaced, last_attempt)
