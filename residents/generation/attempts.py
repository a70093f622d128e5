"""Attempts: the provider calls for one segment, with retries the policy allows.

Each call is its own attempt with its own id. A failed attempt's text is never thrown away and
never carried into the next attempt: it is settled as `abandoned`, kept as a `retry-abandoned`
stump, and linked to the attempt that replaced it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .. import observe, truth
from ..config import Retries
from ..ledger import Ledger, LedgerWriteError, Superseded
from ..ledger.retry import until_written
from ..observe import UNOBSERVED, Observer
from ..provider import BlockSink, Provider
from ..records import Attempt, Generation, Outcome, Stump, StumpScope, join_text, make_stump, new_id

log = logging.getLogger(__name__)

# Streaming content reaches the ledger at least every FLUSH_CHARS characters, and content is on disk
# FLUSH_SECONDS after it arrived even when no further delta arrives: together, what a crash can lose.
# The timer hands it to the ledger after FLUSH_TIMER, leaving the rest of the bound for the commit it
# joins (one group commit for every stream of the process: bench/concurrency.py measures it under load).
FLUSH_CHARS = 2048
FLUSH_SECONDS = 0.25
FLUSH_TIMER = 0.15

Sleep = Callable[[float], Awaitable[Any]]


class LedgerSink(BlockSink):
    """Collects an attempt's content blocks and writes them to the ledger in bounded pieces.

    By size: when FLUSH_CHARS characters are unwritten the stream waits for the write. By time: the
    first piece after a write arms one timer (no clock read per delta); when it fires, whatever is
    pending is written by a small task, so a stalled provider cannot keep text off disk. Writes of
    one attempt run one at a time, in order.
    """

    def __init__(self, ledger: Ledger, attempt_id: str) -> None:
        super().__init__()
        self.ledger = ledger
        self.attempt_id = attempt_id
        self._pending = 0  # characters not yet handed to a write
        self._inflight = 0  # characters in a write not yet committed
        self._new_block = False  # a block started that has not reached a write yet
        self._seq = 0
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._failing = False  # the last write failed: its retries are not logged again, nor asked per delta
        self.first_content: float | None = None  # time.monotonic() when the first content block began

    def start(self, index: int, btype: str, content: str, start: dict[str, Any] | None) -> bool:
        self._new_block = True
        if self.first_content is None:
            self.first_content = time.monotonic()
        due = super().start(index, btype, content, start)
        if self._timer is None:
            self._timer = self._loop.call_later(FLUSH_TIMER, self._due)
        return due

    def add(self, text: str) -> bool:
        """Keep a piece of the current block; True when a flush is due by size."""
        self._cur.parts.append(text)  # type: ignore[union-attr]
        self._pending += len(text)
        if self._pending + self._inflight >= FLUSH_CHARS and not self._failing:
            return True
        if self._timer is None:
            self._timer = self._loop.call_later(FLUSH_TIMER, self._due)
        return False

    def _due(self) -> None:
        """The timer: what has waited FLUSH_TIMER is written now, by a task of its own."""
        self._timer = None
        if self._pending or self._new_block:
            task = self._loop.create_task(self.flush())
            self._tasks.add(task)
            task.add_done_callback(self._timed_done)

    def _timed_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        if not self._failing:
            self._failing = True
            log.warning(
                "attempt %s: a timed ledger write failed (the text stays pending; tried again in %.2fs, "
                "and written when the attempt settles): %s",
                self.attempt_id,
                FLUSH_TIMER,
                task.exception(),
            )
        if self._timer is None and not self._closed:  # a stalled provider sends no delta to re-arm it
            self._timer = self._loop.call_later(FLUSH_TIMER, self._due)

    def _take(self) -> list[tuple[int, int, str, str, str | None]]:
        """The pending pieces as chunk rows (seq, block, type, text, start of a block's first chunk)."""
        rows = []
        for b in self._open:
            n = len(b.parts)
            if b.written < n or not b.on_disk:
                start = json.dumps(b.start, ensure_ascii=False) if b.start and not b.on_disk else None
                text = "".join(b.parts[b.written : n])
                rows.append((self._seq, b.index, b.type, text, start))
                self._seq += 1
                # The written deltas are kept as the one string just written (the same object as the row's):
                # a long reply is a few chunks in memory, not thousands of 4-character strings.
                b.parts[b.written : n] = [text]
                b.written, b.on_disk = b.written + 1, True
        return rows

    async def flush(self) -> None:
        await self.on_disk()

    async def on_disk(self) -> bool:
        """Write what is pending (`flush`); True when everything the sink was given is on disk.

        After `close` nothing is written: the attempt's settlement writes its whole content and removes
        its chunks, so a chunk landing after it would outlive the attempt. A write the ledger refuses (a
        full disk) does not stop the stream: its text stays pending, in order, the timer tries again
        (not every delta), and settlement writes the whole attempt."""
        try:
            return await self._write()
        except Superseded as e:
            # Another process settled this attempt (its bot moved while this one was stopped): nothing more
            # of it is written; the attempt's settlement says so to the turn.
            if not self._closed:
                self._closed = True
                log.warning("attempt %s: streamed text no longer written: %s", self.attempt_id, e)
            return False
        except LedgerWriteError as e:
            if not self._failing:
                self._failing = True
                log.warning(
                    "attempt %s: the ledger refused streamed text (%s); it is kept in memory, written when the "
                    "ledger takes writes again",
                    self.attempt_id,
                    e,
                )
            if self._timer is None and not self._closed:  # a stalled provider sends no delta to re-arm it
                self._timer = self._loop.call_later(FLUSH_TIMER, self._due)
            return False

    async def _write(self) -> bool:
        async with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._closed:
                return False
            if not self._pending and not self._new_block:
                return True
            before = [(b, b.written, b.on_disk) for b in self._open]
            rows, n, new_block = self._take(), self._pending, self._new_block
            self._pending, self._new_block, self._inflight = 0, False, self._inflight + n
            try:
                await self.ledger.add_chunks(self.attempt_id, rows)
                self._failing = False
                return True
            except Exception:
                # Not on disk: its pieces are pending again (joined into one), so the next write carries
                # them and the disk holds a prefix of the stream, never the stream with a hole in it.
                # (Cancelled, the shielded write still runs to its commit: nothing to give back.)
                for b, written, on_disk in before:
                    b.written, b.on_disk = written, on_disk
                self._pending, self._new_block = self._pending + n, self._new_block or new_block
                raise
            finally:
                self._inflight -= n

    async def close(self) -> None:
        """The last step before settlement: stop the timer, wait for a timed write in flight, and write
        nothing more, whoever asks (`flush`: a live view's step may still be running). Nothing lands after
        settlement: every chunk write of the attempt is queued to the ledger before its settling is."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._tasks:
            await asyncio.wait(list(self._tasks))


class AttemptWatch(Protocol):
    """Who watches attempts as they stream (a live reply). Only a resident with live delivery has one,
    so the plain sink's hot path is untouched when live is off."""

    def started(self, a: Attempt, sink: LiveLedgerSink) -> None: ...

    def grew(self) -> None:
        """The attempt's reply text grew: called once per text delta, so it only takes note."""

    async def set_aside(self, a: Attempt, stumps: list[Stump]) -> None:
        """The attempt was abandoned for a retry (its stumps already in the ledger)."""

    async def halt(self) -> None:
        """The attempt's stream ended: stop showing it, and wait for the step in flight (which may flush
        the sink), before the sink closes. What was shown is then on disk before the attempt settles."""


class LiveLedgerSink(LedgerSink):
    """The ledger's sink that also tells a watcher when reply text arrives."""

    def __init__(self, ledger: Ledger, attempt_id: str, watch: AttemptWatch) -> None:
        super().__init__(ledger, attempt_id)
        self.watch = watch

    def add(self, text: str) -> bool:
        due = super().add(text)
        if self._cur.type == "text":  # type: ignore[union-attr]
            self.watch.grew()
        return due


def block_stumps(g: Generation, a: Attempt, cause: str | None) -> list[Stump]:
    """The stump of the non-text block an attempt stopped in, where `residents.truth` gives it a cause.

    Not twice: a block already held as a stump of this generation gets none.
    """
    b = a.cut_block()
    why = truth.block_stump_cause(cause, b.type) if b is not None else None
    if b is None or why is None or any(s.attempt_id == a.id and s.block == b.index for s in g.stumps):
        return []
    return [make_stump(g, a, why, StumpScope.BLOCK, b)]


def backoff(index: int, retry_after: float | None, policy: Retries) -> float:
    """Exponential backoff with a little jitter; the provider's retry-after wins when it asks for longer."""
    base = policy.backoff_seconds * (2 ** (index - 1))
    if base:
        base *= 1 + random.random() * 0.1
    wait = max(base, retry_after or 0.0)
    return min(wait, max(policy.max_backoff_seconds, retry_after or 0.0))


@dataclass
class AttemptRunner:
    # One provider for every residence, or each residence's own by name (`residents.provider.connect_all`).
    provider: Provider | Mapping[str, Provider]
    ledger: Ledger
    sleep: Sleep = asyncio.sleep
    observer: Observer = UNOBSERVED  # told each attempt's end (`residents.metrics`)

    def provider_of(self, residence: str) -> Provider:
        p = self.provider
        return p[residence] if isinstance(p, Mapping) else p

    async def run_segment(
        self,
        g: Generation,
        segment: int,
        request: dict[str, Any],
        policy: Retries,
        *,
        new_generation: bool = False,
        settle_last: bool = True,
        tools: bool = False,
        watch: AttemptWatch | None = None,
    ) -> Attempt:
        """Call the provider until an attempt settles, or the policy's attempts run out; returns the last.

        `new_generation`: the generation is written with the first attempt. `settle_last=False`: the
        caller writes the last attempt together with the outcome it decides (`finish_generation`).
        `tools`: the request offers tools, so a `tool_use` stop completes the attempt (a round of the tool loop).
        `watch`: told of each attempt's text as it streams (a live reply).
        """
        prev: Attempt | None = None
        for index in range(1, policy.max_attempts + 1):
            a = Attempt(id=new_id("a-"), generation_id=g.id, segment=segment, index=index)
            g.attempts.append(a)
            observe.set_ids(attempt=a.id)  # the turn's scope (`observe.working_on`) restores it
            if prev is not None:
                prev.replaced_by = a.id
                for s in g.stumps:
                    if s.attempt_id == prev.id and s.scope == "attempt":
                        s.replaced_by = a.id
            await until_written(
                f"attempt {a.id} of generation {g.id} ({g.residence})",
                self.ledger.start_attempt,
                a,
                g if new_generation and prev is None else None,
                prev,
            )
            sink = LedgerSink(self.ledger, a.id) if watch is None else LiveLedgerSink(self.ledger, a.id, watch)
            if watch is not None:
                watch.started(a, sink)  # type: ignore[arg-type]
            called = time.monotonic()
            try:
                end = await self.provider_of(g.residence).stream(request, sink, timeout=policy.timeout_seconds)
            finally:
                if watch is not None:
                    await watch.halt()
                await sink.close()
            seconds = time.monotonic() - called
            first = sink.first_content - called if sink.first_content is not None else None
            a.blocks = sink.blocks()
            a.text, a.stop_reason, a.output_tokens = join_text(a.blocks), end.stop_reason, end.output_tokens
            a.request_id, a.ended_at, a.stop_details = end.request_id, time.time(), end.stop_details
            a.request_replacements = end.request_replacements
            a.input_tokens, a.cache_write_tokens = end.input_tokens, end.cache_write_tokens
            a.cache_read_tokens = end.cache_read_tokens
            f = end.failure
            if f is not None:
                a.error = f.kind
                a.stop_reason = None  # a failed stream did not stop for a reason of the model's
                if f.retryable and index < policy.max_attempts:
                    a.outcome, a.discard_reason = Outcome.ABANDONED, truth.RETRY_ABANDONED
                    stumps = [make_stump(g, a, truth.RETRY_ABANDONED, StumpScope.ATTEMPT)] if a.text else []
                    stumps += block_stumps(g, a, truth.RETRY_ABANDONED)
                    g.stumps += stumps
                    await until_written(f"attempt {a.id} set aside", self.ledger.finish_attempt, a, stumps)
                    self.observer.attempt_ended(g, a, seconds, first)
                    if watch is not None:
                        await watch.set_aside(a, stumps)
                    wait = backoff(index, f.retry_after, policy)
                    log.info(
                        "attempt %s (%s) abandoned after %d chars: %s; retrying in %.2fs",
                        a.id,
                        g.residence,
                        a.chars,
                        f.kind,
                        wait,
                    )
                    if wait > 0:
                        await self.sleep(wait)
                    prev = a
                    continue
                a.outcome = Outcome.FAILED
                log.warning("attempt %s (%s) failed: %s: %s", a.id, g.residence, f.kind, f.message)
            else:
                a.outcome = truth.outcome_of_stop(end.stop_reason, has_tools=tools)
            self.observer.attempt_ended(g, a, seconds, first)
            if settle_last:
                await until_written(f"attempt {a.id} settled", self.ledger.finish_attempt, a)
            return a
        raise AssertionError("max_attempts is at least 1")  # pragma: no cover - config guarantees it
