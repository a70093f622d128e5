"""Section 5: time from a person's message to the first visible text of the reply, live and not.

Through the whole thing a person waits on: the local room (REST and gateway over real sockets), a real
discord.py bot started by `run_bots`, the real SDK against the local provider streaming a reply at a
steady pace (`TOKENS` tokens at `PACE` tokens/s, about four characters a token), and the ledger. The
clock starts when the room stores the person's message and stops when the room stores the bot's first
message (live: its first live message; otherwise the first post of the settled reply) and, for the
whole reply, when its last post is stored.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from residents.config import build_residence
from residents.discord.localapi import point_at_local
from residents.discord.run import Deployment, run_bots
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.localservers.room import RoomServer

from .common import ROOT, median, scratch

log = logging.getLogger(__name__)

TOKENS = 400
PACE = 64.0  # tokens per second, a fast model's steady rate
CHARS_PER_TOKEN = 4


def _text(chars: int) -> str:
    words = "harbour granary trellis meadow cloister terrace bellwether lantern quay mooring".split()
    out, i = [], 0
    while sum(map(len, out)) + len(out) < chars:
        out.append(words[i % len(words)])
        i += 1
    return " ".join(out)[:chars]


def _call(tokens: int, pace: float) -> Call:
    body = sse.stream(_text(tokens * CHARS_PER_TOKEN), "end_turn", tokens)
    seconds = tokens / pace
    chunk = max(200, int(len(body) / (seconds * 10)))  # ten pieces a second
    return Call(sse=body, chunk_bytes=chunk, chunk_delay=seconds / max(1, len(body) // chunk))


async def _rounds(live: bool, rounds: int, tokens: int, pace: float, folder: Path) -> dict[str, list[float]]:
    res = build_residence(
        {
            "name": "cairn",
            "model": "claude-3-opus-20240229",
            "max_tokens": 4096,
            "system": "You are Cairn.",
            "policy": {"floor": {"cooldown_seconds": 0}, "delivery": {"live": live}},
            "discord": {"token_env": "CAIRN_DISCORD_TOKEN", "channels": ["general"]},
        },
        "<bench>",
        None,
        Path(ROOT),
    )
    room = RoomServer(["general"])
    await room.start()
    point_at_local(room.url)
    provider = ProviderServer(lambda _body: _call(tokens, pace))
    await provider.start()
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_bots(
            Deployment([res], {"cairn": "local-cairn"}),
            str(folder / f"live-{live}.db"),
            {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "k"},
            guild_ready_timeout=0.05,
            stop=stop,
        )
    )
    first: list[float] = []
    whole: list[float] = []
    try:
        await room.wait_until(
            lambda: True if any(b["connected"] and b["synced"] for b in room.snapshot()["bots"]) else None, timeout=20
        )
        for _ in range(rounds):
            before = {m["id"] for m in room.messages("general")}
            asked = time.monotonic()
            room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])

            def mine() -> list[dict[str, Any]]:
                return [m for m in room.messages("general") if m["bot"] and m["id"] not in before]

            await room.wait_until(lambda: mine() or None, timeout=60)
            first.append(time.monotonic() - asked)
            expected = _text(tokens * CHARS_PER_TOKEN)
            await room.wait_until(
                lambda: (
                    True
                    if "".join(m["content"] for m in mine()).replace(" ", "") == expected.replace(" ", "")
                    else None
                ),
                timeout=60,
            )
            whole.append(time.monotonic() - asked)
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=20)
        await provider.stop()
        await room.stop()
    return {"first_s": first, "whole_s": whole}


async def run(rounds: int = 3, tokens: int = TOKENS, pace: float = PACE) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": tokens, "pace_tokens_per_s": pace, "rounds": rounds, "stream_s": tokens / pace}
    folder = Path(scratch("live"))
    try:
        for live in (False, True):
            r = await _rounds(live, rounds, tokens, pace, folder)
            key = "live" if live else "settled"
            out[key] = {
                "first_visible_s": median(r["first_s"]),
                "whole_reply_s": median(r["whole_s"]),
                "samples_first_s": r["first_s"],
            }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


if __name__ == "__main__":  # python -m bench.live
    import json

    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(asyncio.run(run()), indent=1))
