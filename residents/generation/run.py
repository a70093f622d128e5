"""One generation: its first segment, any continuation its standing grants, and its settlement.

The status and stumps of a generation are decided by `residents.truth`; this module only sequences the
calls and writes each step to the ledger as it happens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import observe, truth
from ..config import Residence
from ..continuation import continuation_request, judge_segment
from ..ledger.access import tool_calls_of, use_default_access
from ..ledger.attachments import without_image_refs
from ..ledger.retry import until_written
from ..provider import REGISTRY
from ..records import (
    Attempt,
    ContinuationEnd,
    Generation,
    Segment,
    SharedFile,
    Status,
    Stump,
    StumpScope,
    make_stump,
    new_id,
    provider_tokens,
)
from .attempts import AttemptRunner, AttemptWatch, block_stumps
from .tools import Toolbox, ToolLoop, with_tools, without_tools

log = logging.getLogger(__name__)


def never() -> bool:
    return False


@dataclass
class ContinueResult:
    generation: Generation
    added: str  # the text this request added to the canonical output (after overlap removal)
    refused: truth.Declined | None = None  # why no provider call was made, when none was


def continuations_left(g: Generation, res: Residence) -> int:
    """How many more /continue requests `g` may still be granted: 0 unless its residence's standing is
    `on-request` and it is cut at the output ceiling; else what `max_segments` and `max_output_tokens`
    leave, by the same counts `continue_on_request` stops at (the Continue button's "n left").

    Tool calls, which also rule continuation out, are the caller's to check (they are in the ledger)."""
    cont = res.policy.continuation
    if cont.standing != "on-request" or g.status != "truncated" or not truth.is_ceiling(g.stop_reason):
        return 0
    if g.request is None:
        return 0
    spent = sum(s.output_tokens if s.output_tokens is not None else g.request["max_tokens"] for s in g.segments)
    if spent >= (cont.max_output_tokens or 0):
        return 0
    return max(0, (cont.max_segments or 0) - (len(g.segments) - 1))


class Generator:
    def __init__(self, runner: AttemptRunner) -> None:
        self.runner = runner
        self.ledger = runner.ledger
        self._default_access: dict[str, str] = {}  # per residence, as last written to the ledger

    async def _use_default_access(self, res: Residence) -> None:
        """New stumps of this residence start with its policy's `stumps.default_access` (written once per change)."""
        access = res.policy.stumps.default_access
        if self._default_access.get(res.name) != access:
            await until_written(f"{res.name}: default stump access", use_default_access, self.ledger, res.name, access)
            self._default_access[res.name] = access

    async def generate(
        self,
        res: Residence,
        channel: str,
        request: dict[str, Any],
        trigger: str | None = None,
        superseded: Callable[[], bool] = never,
        seen_upto: str | None = None,
        tools: Toolbox | None = None,
        watch: AttemptWatch | None = None,
        attachments: list[SharedFile] | None = None,
        person: str | None = None,
    ) -> Generation:
        """One reply; with `tools`, a tool loop of rounds (`residents.generation.tools`) whose text is joined.

        `watch` sees the first segment's (or round's) attempts stream (a live reply); continuation
        segments and later tool rounds are not shown live, they arrive when the generation settles."""
        await self._use_default_access(res)
        if tools is not None:
            request = with_tools(request, tools)
        g = Generation(
            id=new_id("g-"),
            residence=res.name,
            channel=channel,
            model=res.model,
            standing=res.policy.continuation.standing,
            trigger=trigger,
            person=person,
            request=request,
            seen_upto=seen_upto,
            attachments=list(attachments or []),
        )
        observe.set_ids(generation=g.id)  # the turn's scope (`observe.working_on`) restores it
        loop = ToolLoop(self.runner, tools, res.policy.tools.max_rounds) if tools is not None else None
        if loop is not None:
            final = await loop.run(g, request, res.policy.retries, watch=watch)
            g.text = loop.text
        else:
            final = await self.runner.run_segment(
                g, 1, request, res.policy.retries, new_generation=True, settle_last=False, watch=watch
            )
            g.text = final.text
        g.stop_reason = final.stop_reason
        g.status = truth.status_of_outcome(final.outcome)
        if loop is not None and loop.limit_reached:
            g.status, g.stop_reason = Status.INCOMPLETE, truth.TOOL_ROUND_LIMIT
        # one segment: a tool loop's rounds are its attempts' segments, their text joined in g.text
        g.segments = [Segment(1, final.id, final.stop_reason, g.chars, final.output_tokens)]
        unsettled: Attempt | None = final
        rounds = loop.finals if loop is not None and len(loop.finals) > 1 else None
        if truth.is_ceiling(g.stop_reason):
            g.continuation_ended = ContinuationEnd.DISABLED
            if res.policy.continuation.standing == "bounded" and rounds is None:  # never after tool rounds
                # on disk before any continuation call
                await until_written(f"attempt {final.id} settled", self.ledger.finish_attempt, final)
                unsettled = None
                await self._continue(g, res, superseded, max_new=res.policy.continuation.max_segments or 0)
        await self._settle(g, res, previous_output=None, last_attempt=unsettled, rounds=rounds)
        self.runner.observer.generation_settled(g, new=True, stumps=g.stumps, continuations=len(g.segments) - 1)
        return g

    async def continue_on_request(
        self, g: Generation, res: Residence, superseded: Callable[[], bool] = never
    ) -> ContinueResult:
        """A moderator's request: at most one more segment for a cut output, where the standing allows."""
        cont = res.policy.continuation
        refused = truth.standing_refusal(cont.standing, res.name, g.id)
        if refused:
            return ContinueResult(g, "", refused)
        if g.status != "truncated" or not truth.is_ceiling(g.stop_reason):
            return ContinueResult(g, "", truth.Declined("not-cut", res.name, g.id, g.status))
        if g.request is None:
            return ContinueResult(g, "", truth.Declined("no-request", res.name, g.id))
        if await tool_calls_of(self.ledger, g.id):
            return ContinueResult(g, "", truth.Declined("tool-calls", res.name, g.id))
        await self._use_default_access(res)
        observe.set_ids(generation=g.id)
        before, stumps_before, segments_before = len(g.text), len(g.stumps), len(g.segments)
        previous = next((s for s in reversed(g.stumps) if s.scope == "output" and s.replaced_by is None), None)
        await self._continue(g, res, superseded, max_new=1)
        added = g.text[before:]
        await self._settle(g, res, previous_output=previous if added else None)
        self.runner.observer.generation_settled(
            g, new=False, stumps=g.stumps[stumps_before:], continuations=len(g.segments) - segments_before
        )
        if not added and g.continuation_ended in (
            ContinuationEnd.SEGMENT_LIMIT,
            ContinuationEnd.TOKEN_LIMIT,
            ContinuationEnd.SUPERSEDED,
        ):
            return ContinueResult(g, "", truth.Declined("stopped", res.name, g.id, g.continuation_ended))
        return ContinueResult(g, added)

    async def _continue(self, g: Generation, res: Residence, superseded: Callable[[], bool], max_new: int) -> None:
        cont = res.policy.continuation
        assert g.request is not None
        calls = 0
        ended = g.continuation_ended
        while truth.is_ceiling(g.stop_reason):
            spent = sum(s.output_tokens if s.output_tokens is not None else g.request["max_tokens"] for s in g.segments)
            if len(g.segments) - 1 >= (cont.max_segments or 0):
                ended = ContinuationEnd.SEGMENT_LIMIT
                break
            if spent >= (cont.max_output_tokens or 0):
                ended = ContinuationEnd.TOKEN_LIMIT
                break
            if calls >= max_new:
                break
            if superseded():
                ended = ContinuationEnd.SUPERSEDED
                break
            # A request read back from the ledger holds images as references: each becomes a line saying so.
            request, stripped = continuation_request(
                without_image_refs(without_tools(g.request)),
                g.text,
                (cont.max_output_tokens or 0) - spent,
                prefill_allowed=REGISTRY[res.provider].prefill,  # else the user-turn method
            )
            final = await self.runner.run_segment(g, len(g.segments) + 1, request, res.policy.retries)
            calls += 1
            if final.outcome not in ("completed", "truncated"):
                ended = ContinuationEnd.ERROR
                self._set_aside(g, final, truth.stump_cause(truth.status_of_outcome(final.outcome), final.stop_reason))
                break
            d = judge_segment(
                g.text,
                final.text,
                min_overlap=cont.min_overlap_chars,
                min_progress=cont.min_progress_chars or 1,
                similarity_abort=cont.similarity_abort if cont.similarity_abort is not None else 1.0,
                stripped_tail=stripped,
            )
            if d.verdict != "append":
                ended = ContinuationEnd(d.verdict)
                self._set_aside(g, final, d.verdict)
                log.info(
                    "continuation of %s ended: %s (overlap %d, %d new chars)", g.id, d.verdict, d.overlap, len(d.added)
                )
                break
            g.segments.append(
                Segment(len(g.segments) + 1, final.id, final.stop_reason, len(d.added), final.output_tokens, d.overlap)
            )
            g.text += d.added
            g.stop_reason = final.stop_reason
            g.status = truth.status_of_outcome(final.outcome)
            if g.status == "completed":
                ended = ContinuationEnd.COMPLETED
        else:
            if g.status == "truncated":
                ended = ContinuationEnd.ERROR  # cut for a reason continuation cannot address (a full context window)
        g.continuation_ended = ended

    @staticmethod
    def _set_aside(g: Generation, a: Attempt, cause: str | None) -> None:
        """A continuation segment that is not appended is kept, unpublished, as a stump."""
        if a.text and cause:
            g.stumps.append(make_stump(g, a, cause, StumpScope.ATTEMPT))
        g.stumps += block_stumps(g, a, cause)

    async def _settle(
        self,
        g: Generation,
        res: Residence,
        previous_output: Stump | None,
        last_attempt: Attempt | None = None,
        rounds: list[Attempt] | None = None,
    ) -> None:
        """`rounds`: a tool loop's last attempt of each round, whose tokens add up to the generation's."""
        g.output_tokens = provider_tokens(a.output_tokens for a in rounds) if rounds else g.segments_tokens()
        g.finished_at = time.time()
        new = [s for s in g.stumps if not s.stored]
        cause = truth.stump_cause(g.status, g.stop_reason)
        replaced = None
        if previous_output is not None:
            last = g.segments[-1].attempt_id
            previous_output.replaced_by = last
            replaced = (previous_output.id, last)
        final = next((a for a in g.attempts if g.segments and a.id == g.segments[-1].attempt_id), None)
        if (
            cause
            and g.text
            and final is not None
            and (previous_output is not None or not any(s.scope == "output" for s in g.stumps))
        ):
            out = make_stump(g, final, cause, StumpScope.OUTPUT)
            g.stumps.append(out)
            new.append(out)
        if final is not None:  # a reasoning or tool-input block the output stopped in
            cut = block_stumps(g, final, cause)
            g.stumps += cut
            new += cut
        await until_written(
            f"generation {g.id} ({g.residence}) settled", self.ledger.finish_generation, g, new, replaced, last_attempt
        )
