"""Section 4: how fast the WAL ledger takes the writes of a busy bot, and how big it grows.

Each figure is sustained: a thousand records written one after another through the Ledger's own
methods (one transaction per logical change, as the pipeline does), on a fresh file.
"""

from __future__ import annotations

import os
import time
from typing import Any

from residents.delivery import plan
from residents.generation.attempts import FLUSH_CHARS
from residents.ledger import Ledger
from residents.records import Attempt, Generation, Post, Segment, Stump, new_id

from . import streams
from .common import scratch

REQUEST = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 4096,
    "system": "You are a resident.",
    "messages": [{"role": "user", "content": "ana: what do you think of the river today?"}],
}


async def _generation(ledger: Ledger, text: str, cut: bool) -> int:
    """One generation's whole life in the ledger, as the pipeline writes it; returns the posts written."""
    g = Generation(
        id=new_id("g-"), residence="bench", channel="general", model="claude-sonnet-4-6", request=REQUEST, trigger="m1"
    )
    await ledger.create_generation(g)
    a = Attempt(id=new_id("a-"), generation_id=g.id, segment=1, index=1)
    g.attempts.append(a)
    await ledger.start_attempt(a)
    for seq, i in enumerate(range(0, len(text) - FLUSH_CHARS + 1, FLUSH_CHARS)):
        await ledger.add_chunk(a.id, seq, text[i : i + FLUSH_CHARS])
    a.text, a.stop_reason, a.output_tokens, a.ended_at = (
        text,
        "max_tokens" if cut else "end_turn",
        len(text) // 4,
        time.time(),
    )
    a.outcome = "truncated" if cut else "completed"
    await ledger.finish_attempt(a)
    g.text, g.stop_reason, g.status, g.output_tokens = text, a.stop_reason, a.outcome, a.output_tokens
    g.segments = [Segment(1, a.id, a.stop_reason, len(text), a.output_tokens)]
    stumps = (
        [
            Stump(
                id=new_id("s-"),
                generation_id=g.id,
                attempt_id=a.id,
                cause="max_tokens",
                text=text,
                output_tokens=a.output_tokens,
                scope="output",
                residence="bench",
            )
        ]
        if cut
        else []
    )
    g.finished_at = time.time()
    await ledger.finish_generation(g, stumps)
    posts = [
        Post(id=new_id("p-"), generation_id=g.id, seq=i + 1, kind=p.kind, content=p.content, channel="general")
        for i, p in enumerate(plan(g.ending(), g.text))
    ]
    await ledger.add_posts(posts)
    for i, p in enumerate(posts):
        await ledger.mark_delivered(p, f"{g.id}-{i}")
    return len(posts)


def _size(path: str) -> int:
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


async def generations(n: int, chars: int, cut: bool) -> dict[str, Any]:
    path = os.path.join(scratch("ledger"), "ledger.db")
    async with Ledger.open(path) as ledger:
        text = streams.text(chars, seed=3)
        await ledger.db.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
        empty = _size(path)
        w = time.perf_counter()
        posts = 0
        for _ in range(n):
            posts += await _generation(ledger, text, cut)
        wall = time.perf_counter() - w
        await ledger.db.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
        size = _size(path) - empty
    return {
        "generations": n,
        "chars_each": chars,
        "cut": cut,
        "posts_total": posts,
        "wall_s": wall,
        "generations_per_s": n / wall,
        "db_bytes_per_1000": size * 1000 / n,
        "db_bytes_per_text_byte": size / (n * len(text.encode())),
    }


async def records(n: int) -> dict[str, Any]:
    """Attempts, posts and chunks alone, each a sustained stream of its own kind of write."""
    path = os.path.join(scratch("ledger"), "ledger.db")
    async with Ledger.open(path) as ledger:
        text = streams.text(1500, seed=5)
        chunk = streams.text(FLUSH_CHARS, seed=6)
        out: dict[str, Any] = {}
        g = Generation(id=new_id("g-"), residence="bench", channel="general", model="claude-sonnet-4-6")
        await ledger.create_generation(g)
        w = time.perf_counter()
        for i in range(n):
            a = Attempt(id=new_id("a-"), generation_id=g.id, segment=1, index=i + 1)
            await ledger.start_attempt(a)
            a.text, a.outcome, a.stop_reason, a.ended_at = text, "completed", "end_turn", time.time()
            await ledger.finish_attempt(a)
        out["attempts_per_s"] = n / (time.perf_counter() - w)
        a = Attempt(id=new_id("a-"), generation_id=g.id, segment=1, index=n + 1)
        await ledger.start_attempt(a)
        w = time.perf_counter()
        for i in range(n):
            await ledger.add_chunk(a.id, i, chunk)
        out["chunks_per_s"] = n / (time.perf_counter() - w)
        out["chunk_chars"] = FLUSH_CHARS
        w = time.perf_counter()
        for i in range(n):
            p = Post(id=new_id("p-"), generation_id=g.id, seq=i + 1, kind="speech", content=text, channel="general")
            await ledger.add_posts([p])
            await ledger.mark_delivered(p, f"m{i}")
        out["posts_per_s"] = n / (time.perf_counter() - w)
    return out


async def run(n: int = 1000) -> dict[str, Any]:
    return {
        "records": await records(n),
        "reply_2k": await generations(n, 2000, cut=False),
        "cut_16k": await generations(n // 4, 16384, cut=True),
    }


if __name__ == "__main__":
    import asyncio
    import json

    print(json.dumps(asyncio.run(run()), indent=1))
