"""Prompt caching end to end: a real discord.py bot (`run_bots`) on the local room over real sockets,
the real anthropic SDK against the local provider, which reports cache writes and reads by
Anthropic's rules, a real SQLite ledger.

Forty scripted turns in one channel, each a person's mention answered by the resident: from the
third turn on at least 80% of the input tokens the provider counted are cache reads, no request
carries more than four breakpoints (the provider would refuse it), and no request shows more than
the policy's `history_limit` room messages.
"""

from __future__ import annotations

from discordkit import deployed
from test_discord_e2e import res

from residents.context.compile import START_NOTE
from residents.demo.script import prose
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.provider import caching

MODEL = "claude-sonnet-4-5"
TURNS = 40


def answer(body: dict) -> Call:
    """A scripted reply of a few sentences, different each turn."""
    return Call(sse=sse.stream(prose(len(body["messages"]), 500), "end_turn", 120, model=MODEL))


async def test_forty_turns_in_one_discord_channel_read_most_of_their_input_from_the_cache(tmp_path):
    cairn = res("cairn", model=MODEL, max_tokens=1024, system="You are Cairn, of this harbour room. " + prose(3, 2_000))
    async with deployed(tmp_path, [cairn], responder=answer) as d:
        for turn in range(1, TURNS + 1):
            who = "alice" if turn % 2 else "bob"
            d.room.post("general", who, f"@cairn {prose(200 + turn, 250)}", mentions=["cairn"])
            await d.wait_bot_messages(turn, timeout=15.0)
        await d.quiet(0.1)
        usages = d.provider.usage
        requests = d.provider.requests
    assert len(requests) == TURNS and len(usages) == TURNS
    later = [u for u in usages[2:] if u is not None]
    read = sum(u["cache_read_input_tokens"] for u in later)
    whole = sum(u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"] for u in later)
    assert read / whole >= 0.80, f"{read:,} of {whole:,} input tokens read from the cache"
    assert all(caching.breakpoints(r) <= caching.MAX_BREAKPOINTS for r in requests)
    limit = cairn.policy.floor.history_limit
    for r in requests:
        texts = [m["content"] if isinstance(m["content"], str) else m["content"][-1]["text"] for m in r["messages"]]
        assert len([t for t in texts if t != START_NOTE]) <= limit
