"""Attempts: the provider calls for one segment, with retries the policy allows.

Each call is its own attempt with its own id. A failed attempt's text is never thrown away and
never carried into the next attempt: it is settled as `abandoned`, kept as a `retry-abandoned`
stump, and linked to the attempt that replaced it.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic

from .. import truth
from ..config import Retries
from ..ledger import Ledger
from ..provider import stream_once
from .records import Attempt, Generation, Stump, new_id

log = logging.getLogger(__name__)

# Streaming text reaches the ledger at least every FLUSH_CHARS characters: the most a crash can lose.
FLUSH_CHARS = 2048
FLUSH_SECONDS = 0.25
CLOCK_EVERY = 4

Sleep = Callable[[float], Awaitable[Any]]


@dataclass
class LedgerSink:
    """Collects an attempt's deltas and writes them to the ledger in bounded pieces."""
    ledger: Ledger
    attempt_id: str
    parts: list[str] = field(default_factory=list)
    _flushed: int = 0
    _pending: int = 0
    _seq: int = 0
    _since_clock: int = 0
    _last: float = field(default_factory=time.monotonic)

    def add(self, text: str) -> bool:
        """Keep a delta; True when a flush is due (by size at once, by time checked every CLOCK_EVERY deltas)."""
        self.parts.append(text)
        self._pending += len(text)
        if self._pending >= FLUSH_CHARS:
            return True
        self._since_clock += 1
        if self._since_clock >= CLOCK_EVERY:  # reading the clock on every delta cost ~2.5% (bench/)
            self._since_clock = 0
            return self._pending > 0 and time.monotonic() - self._last >= FLUSH_SECONDS
        return False

    async def flush(self) -> None:
        if not self._pending:
            return
        chunk = "".join(self.parts[self._flushed:])
        self._flushed, self._pending = len(self.parts), 0
        self._last = time.monotonic()
        await self.ledger.add_chunk(self.attempt_id, self._seq, chunk)
        self._seq += 1

    def text(self) -> str:
        return "".join(self.parts)


def backoff(index: int, retry_after: float | None, policy: Retries) -> float:
    """Exponential backoff with a little jitter; the provider's retry-after wins when it asks for longer."""
    base = policy.backoff_seconds * (2 ** (index - 1))
    if base:
        base *= 1 + random.random() * 0.1
    wait = max(base, retry_after or 0.0)
    return min(wait, max(policy.max_backoff_seconds, retry_after or 0.0))


@dataclass
class AttemptRunner:
    client: anthropic.AsyncAnthropic
    ledger: Ledger
    sleep: Sleep = asyncio.sleep

    async def run_segment(self, g: Generation, segment: int, request: dict[str, Any], policy: Retries, *,
                          new_generation: bool = False, settle_last: bool = True) -> Attempt:
        """Call the provider until an attempt settles, or the policy's attempts run out; returns the last.

        `new_generation`: the generation is written with the first attempt. `settle_last=False`: the
        caller writes the last attempt together with the outcome it decides (`finish_generation`).
        """
        prev: Attempt | None = None
        for index in range(1, policy.max_attempts + 1):
            a = Attempt(id=new_id("a-"), generation_id=g.id, segment=segment, index=index)
            g.attempts.append(a)
            if prev is not None:
                prev.replaced_by = a.id
                for s in g.stumps:
                    if s.attempt_id == prev.id and s.scope == "attempt":
                        s.replaced_by = a.id
            await self.ledger.start_attempt(a, g if new_generation and prev is None else None, prev)
            sink = LedgerSink(self.ledger, a.id)
            end = await stream_once(self.client, request, sink, timeout=policy.timeout_seconds)
            a.text, a.stop_reason, a.output_tokens = sink.text(), end.stop_reason, end.output_tokens
            a.request_id, a.ended_at, a.stop_details = end.request_id, time.time(), end.stop_details
            f = end.failure
            if f is not None:
                a.error = f.kind
                a.stop_reason = None  # a failed stream did not stop for a reason of the model's
                if f.retryable and index < policy.max_attempts:
                    a.outcome, a.discard_reason = "abandoned", truth.RETRY_ABANDONED
                    stumps = [Stump(id=new_id("s-"), generation_id=g.id, attempt_id=a.id, cause=truth.RETRY_ABANDONED,
                                    text=a.text, output_tokens=a.output_tokens, scope="attempt",
                                    residence=g.residence)] if a.text else []
                    g.stumps += stumps
                    await self.ledger.finish_attempt(a, stumps)
                    wait = backoff(index, f.retry_after, policy)
                    log.info("attempt %s (%s) abandoned after %d chars: %s; retrying in %.2fs",
                             a.id, g.residence, a.chars, f.kind, wait)
                    if wait > 0:
                        await self.sleep(wait)
                    prev = a
                    continue
                a.outcome = "failed"
                log.warning("attempt %s (%s) failed: %s: %s", a.id, g.residence, f.kind, f.message)
            else:
                a.outcome = truth.outcome_of_stop(end.stop_reason)
            if settle_last:
                await self.ledger.finish_attempt(a)
            return a
        raise AssertionError("max_attempts is at least 1")  # pragma: no cover - config guarantees it
