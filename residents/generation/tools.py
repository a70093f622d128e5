"""The tool loop: a reply made of rounds, each a provider request whose answer may call tools.

A round's answer that stops at `tool_use` has its tool calls run, recorded in the ledger as part
of the generation (round, position, the attempt that made the call, the input, the result) and sent
back as `tool_result` blocks in the next request; the answer that stops for any other reason ends
the loop. Each round is one segment of attempts (`Attempt.segment` is the round), retried under the
policy like any segment, so provider calls stay within `tools.max_rounds × retries.max_attempts`.
The reply's text is every round's text, joined by a paragraph break, posted once at the end.
Asking for one more round than `tools.max_rounds` allows ends the generation `incomplete`
(`truth.TOOL_ROUND_LIMIT`), the last call not run. Continuation never carries tools.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from .. import truth
from ..config import Retries
from ..ledger import Ledger
from ..ledger.access import add_tool_calls
from ..ledger.retry import until_written
from ..provider import caching
from ..records import TEXT_JOIN, Attempt, Block, Generation, Outcome, ToolCall
from .attempts import AttemptRunner, AttemptWatch

log = logging.getLogger(__name__)

FAILED = "the tool failed on the bot's side; the error is in the operator's log"


class Toolbox(Protocol):
    """The tools a resident is given for one turn."""

    def definitions(self) -> list[dict[str, Any]]:
        """The request's `tools`: name, description and input schema of each."""
        ...

    async def call(self, g: Generation, round_: int, name: str, value: Any) -> tuple[dict[str, Any], bool]:
        """Run one call; returns the result object and whether it is an error. Never raises for bad input."""
        ...


def with_tools(request: dict[str, Any], toolbox: Toolbox) -> dict[str, Any]:
    """`request` with the toolbox's tools. A request marked for a provider that caches only where it is
    told (a top-level `cache_control`, `residents.context.compile.with_breakpoints`) gets its last tool
    marked too, where the tools alone can be cached and a mark is left of the four."""
    tools = toolbox.definitions()
    if (
        tools
        and "cache_control" in request
        and caching.estimated_tokens(tools) >= caching.MIN_CACHEABLE_TOKENS
        and caching.breakpoints(request) < caching.MAX_BREAKPOINTS
    ):
        tools = [*tools[:-1], {**tools[-1], "cache_control": dict(caching.BREAKPOINT)}]
    return {**request, "tools": tools}


def without_tools(request: dict[str, Any]) -> dict[str, Any]:
    """A request as continuation sends it: continuation and the tool loop never mix in one request."""
    return {k: v for k, v in request.items() if k != "tools"}


def tool_uses(a: Attempt) -> list[Block]:
    return [b for b in a.blocks if b.type == "tool_use"]


def parse_input(b: Block) -> tuple[Any, str | None]:
    """A tool call's input from its JSON as streamed; an empty input is `{}`. (value, problem)."""
    if not b.content.strip():
        return {}, None
    try:
        value = json.loads(b.content)
    except ValueError as e:
        return None, f"the input is not valid JSON ({e})"
    if not isinstance(value, dict):
        return value, "the input must be a JSON object"
    return value, None


def assistant_turn(a: Attempt) -> dict[str, Any]:
    """A round's answer as the next request carries it back: its text, reasoning and tool calls."""
    content: list[dict[str, Any]] = []
    for b in a.blocks:
        start = b.start or {}
        if b.type == "text" and b.content:
            content.append({"type": "text", "text": b.content})
        elif b.type == "thinking":
            sig = next(
                (x.get("signature") for x in b.extras if x.get("type") == "signature_delta"), start.get("signature")
            )
            content.append({"type": "thinking", "thinking": b.content, **({"signature": sig} if sig else {})})
        elif b.type == "redacted_thinking":
            content.append({"type": "redacted_thinking", "data": b.content})
        elif b.type == "tool_use":
            value, problem = parse_input(b)
            content.append(
                {
                    "type": "tool_use",
                    "id": start.get("id", ""),
                    "name": start.get("name", ""),
                    "input": value if problem is None else {},
                    # A chat-completions server's own data on the call (Gemini's thought signature), sent back as given.
                    **({"extra_content": start["extra_content"]} if "extra_content" in start else {}),
                }
            )
    return {"role": "assistant", "content": content}


def results_turn(calls: list[ToolCall]) -> dict[str, Any]:
    """The user turn with one `tool_result` block per call, each a JSON object."""
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": c.tool_use_id,
                "content": json.dumps(c.result, ensure_ascii=False),
                **({"is_error": True} if c.is_error else {}),
            }
            for c in calls
        ],
    }


def joined(finals: list[Attempt]) -> str:
    """The reply's text: each round's text, in order, joined by a paragraph break (empty ones add nothing)."""
    return TEXT_JOIN.join(a.text for a in finals if a.text)


class ToolLoop:
    """Runs one generation's rounds; afterwards `finals` holds each round's last attempt."""

    def __init__(self, runner: AttemptRunner, toolbox: Toolbox, max_rounds: int) -> None:
        self.runner, self.toolbox, self.max_rounds = runner, toolbox, max_rounds
        self.ledger: Ledger = runner.ledger
        self.finals: list[Attempt] = []
        self.calls: list[ToolCall] = []
        self.limit_reached = False

    @property
    def text(self) -> str:
        return joined(self.finals)

    async def run(
        self, g: Generation, request: dict[str, Any], retries: Retries, watch: AttemptWatch | None = None
    ) -> Attempt:
        """The rounds, until an answer stops for a reason other than a tool call; returns the last
        round's last attempt, not yet settled (the generation's settlement writes it). `watch` sees
        the first round stream (a live reply)."""
        final = await self.runner.run_segment(
            g, 1, request, retries, new_generation=True, settle_last=False, tools=True, watch=watch
        )
        self.finals = [final]
        while final.outcome == "completed" and truth.is_tool_round(final.stop_reason):
            uses = tool_uses(final)
            if not uses:  # a tool stop with no call in it: nothing to run, nothing to go on with
                final.outcome = Outcome.INCOMPLETE
                break
            rnd = len(self.finals)
            if rnd >= self.max_rounds:
                self.limit_reached = True
                log.info(
                    "generation %s (%s): tool round limit %d reached; %d call(s) not run",
                    g.id,
                    g.residence,
                    self.max_rounds,
                    len(uses),
                )
                break
            # on disk before its calls run
            await until_written(f"attempt {final.id} settled", self.ledger.finish_attempt, final)
            calls = [await self._call(g, rnd, pos, final, b) for pos, b in enumerate(uses)]
            await until_written(f"tool calls of generation {g.id}", add_tool_calls, self.ledger, g.id, calls)
            self.calls += calls
            request = {**request, "messages": list(request["messages"]) + [assistant_turn(final), results_turn(calls)]}
            final = await self.runner.run_segment(g, rnd + 1, request, retries, settle_last=False, tools=True)
            self.finals.append(final)
        return final

    async def _call(self, g: Generation, rnd: int, pos: int, a: Attempt, b: Block) -> ToolCall:
        start = b.start or {}
        name, tool_use_id = str(start.get("name", "")), str(start.get("id", ""))
        value, problem = parse_input(b)
        if problem is not None:
            result, is_error = {"error": problem}, True
        else:
            try:
                result, is_error = await self.toolbox.call(g, rnd, name, value)
            except Exception as e:  # a fault of this process, never the model's: an error result, logged once
                log.error("generation %s: tool %s failed: %s: %s", g.id, name, type(e).__name__, e, exc_info=e)
                result, is_error = {"error": FAILED}, True
        return ToolCall(
            round=rnd,
            pos=pos,
            attempt_id=a.id,
            tool_use_id=tool_use_id,
            name=name,
            input=value,
            result=result,
            is_error=is_error,
        )
