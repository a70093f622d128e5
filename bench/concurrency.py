"""Section 3: many generations streaming at once in one process, as a busy bot would run them.

Runs as its own process (`python -m bench.concurrency N TOKENS [PACE [STALL]]`, JSON on stdout) so its peak memory is
its own. The delay from a delta's arrival to its flush is measured by a LedgerSink subclass put in
place of the real one for this process only (the bot's code is unchanged): arrival is when the SDK
hands the delta to the sink; flushed is when the ledger write holding it has committed, whether that
is a streaming chunk or, for the tail after the last chunk, the attempt's settlement. The commit's
moment is the one the ledger's thread read as the COMMIT returned (`Ledger.committed_at`), not when the
event loop got round to resuming the writer: on a busy loop those differ, and only the first is disk.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

import residents.generation.attempts as attempts_mod
from residents.config import Residence
from residents.generation.attempts import AttemptRunner, LedgerSink
from residents.generation.run import Generator
from residents.ledger import Ledger
from residents.provider.anthropic_messages import AnthropicProvider, make_client
from residents.records import Attempt, Stump

from .common import percentile, scratch
from .overhead import MODEL, request
from .server import ServerProcess

DELAYS: list[float] = []
SINKS: dict[str, TimedSink] = {}


class TimedSink(LedgerSink):
    """A LedgerSink that notes when each delta arrived and when the write holding it committed."""

    def __init__(self, ledger: Ledger, attempt_id: str) -> None:
        super().__init__(ledger, attempt_id)
        self.arrivals: list[float] = []
        self.settled = 0  # arrivals whose write has committed
        self._upto = 0  # arrivals taken by the write in progress
        SINKS[attempt_id] = self

    def add(self, text: str) -> bool:
        self.arrivals.append(time.perf_counter())
        return super().add(text)

    def _take(self) -> list[Any]:
        self._upto = len(self.arrivals)  # a write takes every piece pending, of every block
        return super()._take()

    async def flush(self) -> None:
        await super().flush()
        # No other task ran between the write's commit and here: `_upto` is this flush's own.
        self.settle(self.settled, max(self.settled, self._upto))

    def settle(self, start: int, end: int) -> None:
        now = self.ledger.committed_at  # the commit that just returned to this writer
        DELAYS.extend(now - t for t in self.arrivals[start:end])
        self.settled = end


class TimedLedger(Ledger):
    """Settlement writes an attempt's whole text: the tail after its last chunk reaches disk here."""

    async def finish_attempt(self, a: Attempt, stumps: list[Stump] = ()) -> None:  # type: ignore[assignment]
        await super().finish_attempt(a, stumps)
        sink = SINKS.pop(a.id, None)
        if sink is not None:
            sink.settle(sink.settled, len(sink.arrivals))


def _status_kib(field_name: str) -> int:
    """VmRSS or VmHWM (peak) of this process. Not ru_maxrss: Linux carries that over from the parent
    across fork and exec, so a child would report the bench runner's own peak."""
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


async def run(n: int, tokens: int, pace: float | None, stall: float = 0.0) -> dict[str, Any]:
    server = ServerProcess([tokens], pace, stall)
    folder = scratch("concurrency")
    async with TimedLedger.open(os.path.join(folder, "ledger.db")) as ledger:
        client = make_client(server.url, "bench")
        attempts_mod.LedgerSink = TimedSink  # type: ignore[misc]  # this process only
        try:
            gen = Generator(AttemptRunner(AnthropicProvider(client), ledger))
            res = Residence(name="bench", model=MODEL, max_tokens=tokens)
            req = request(tokens)
            await gen.generate(res, "warm-up", request(64))  # connections, imports and caches warm before the clock
            DELAYS.clear()
            base_rss = _status_kib("VmRSS")
            w, c = time.perf_counter(), time.process_time()
            gens = await asyncio.gather(*(gen.generate(res, f"c{i}", req) for i in range(n)))
            wall, cpu = time.perf_counter() - w, time.process_time() - c
            peak = _status_kib("VmHWM")
        finally:
            attempts_mod.LedgerSink = LedgerSink  # type: ignore[misc]
            await client.close()
            server.close()
    chars = sum(g.chars for g in gens)
    if any(g.status != "truncated" for g in gens):
        raise AssertionError(f"unexpected statuses: {sorted({g.status for g in gens})}")
    return {
        "generations": n,
        "tokens_each": tokens,
        "pace_tokens_per_s": pace,
        "stall_max_s": stall,
        "chars_total": chars,
        "deltas_total": len(DELAYS),
        "wall_s": wall,
        "cpu_s": cpu,
        "generations_per_s": n / wall,
        "chars_per_s": chars / wall,
        "deltas_per_s": len(DELAYS) / wall,
        "flush_delay_p50_ms": percentile(DELAYS, 50) * 1000,
        "flush_delay_p99_ms": percentile(DELAYS, 99) * 1000,
        "flush_delay_max_ms": max(DELAYS) * 1000,
        "rss_before_mib": base_rss / 1024,
        "peak_rss_mib": peak / 1024,
        "peak_rss_growth_mib": (peak - base_rss) / 1024,
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    pace = float(sys.argv[3]) if len(sys.argv) > 3 else None
    stall = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    json.dump(asyncio.run(run(int(sys.argv[1]), int(sys.argv[2]), pace, stall)), sys.stdout)
