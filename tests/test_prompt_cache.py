"""The local provider's prompt-cache accounting, by Anthropic's rules, read through the real anthropic SDK.

A prefix is written only at a breakpoint and only from 1,024 tokens; a later request reads the
longest cached prefix ending at one of its breakpoints or within the 20 blocks before one; more than
four breakpoints is a 400; `cache_control` is no part of a prefix; entries expire after five minutes
unless read. Each figure is what the SDK read from the stream's `message_start` and `message_delta`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from residents.localservers import sse
from residents.localservers.promptcache import MIN_CACHEABLE_TOKENS, block_tokens
from residents.localservers.provider import Call, ProviderServer
from residents.provider.anthropic_messages import make_client

MODEL = "claude-sonnet-4-5"
MARK = {"type": "ephemeral"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def served() -> AsyncIterator[tuple[ProviderServer, anthropic.AsyncAnthropic, Clock]]:
    server = ProviderServer(responder=lambda body: Call(sse=sse.stream("Noted.", "end_turn", 2, model=MODEL)))
    clock = Clock()
    server.cache.clock = clock
    await server.start()
    client = make_client(server.url, "k", timeout=10)
    try:
        yield server, client, clock
    finally:
        await client.close()
        await server.stop()


async def usage(client: anthropic.AsyncAnthropic, body: dict[str, Any]) -> dict[str, int]:
    """The three input figures of one streamed call, as the SDK's final message reports them."""
    async with client.messages.stream(model=MODEL, max_tokens=64, **body) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_message()
    u = final.usage
    return {
        "input": u.input_tokens,
        "created": u.cache_creation_input_tokens or 0,
        "read": u.cache_read_input_tokens or 0,
    }


def text(n: int, seed: str = "x") -> dict[str, Any]:
    """A text block of about `n` tokens."""
    return {"type": "text", "text": (seed + " ") * (2 * n)}


def marked(block: dict[str, Any]) -> dict[str, Any]:
    return {**block, "cache_control": MARK}


def tokens(*blocks: dict[str, Any]) -> int:
    """What the server counts for these message blocks (each in a user message of its own)."""
    return sum(
        block_tokens(("message", i, "user", {k: v for k, v in b.items() if k != "cache_control"}))
        for i, b in enumerate(blocks)
    )


def user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [b]} for b in blocks]


async def test_a_prefix_under_1024_tokens_is_never_cached(served) -> None:
    _, client, _ = served
    small = marked(text(300))
    body = {"messages": user(small, text(50))}
    first = await usage(client, body)
    again = await usage(client, body)
    assert tokens(small) < MIN_CACHEABLE_TOKENS
    assert first == again == {"input": tokens(small, text(50)), "created": 0, "read": 0}


async def test_written_at_a_breakpoint_then_read_and_the_sum_is_the_whole_input(served) -> None:
    server, client, _ = served
    big, tail = marked(text(1500)), text(40, "y")
    first = await usage(client, {"messages": user(big, tail)})
    second = await usage(client, {"messages": user(big, text(70, "z"))})
    assert first == {"input": tokens(big, tail) - tokens(big), "created": tokens(big), "read": 0}
    assert second == {"input": tokens(big, text(70, "z")) - tokens(big), "created": 0, "read": tokens(big)}
    # what the server says it reported is what the SDK read, in message_start and message_delta alike
    assert [u["cache_read_input_tokens"] for u in server.usage] == [0, tokens(big)]


async def test_the_longest_cached_prefix_is_read(served) -> None:
    _, client, _ = served
    a, b, c = text(1200, "a"), text(600, "b"), text(30, "c")
    await usage(client, {"messages": user(marked(a), b)})  # writes [a]
    await usage(client, {"messages": user(a, marked(b), c)})  # reads [a], writes [a b]
    third = await usage(client, {"messages": user(marked(a), marked(b), c)})
    assert third == {"input": tokens(c), "created": 0, "read": tokens(a, b)}


async def test_a_write_is_found_within_20_blocks_before_a_breakpoint_and_not_beyond(served) -> None:
    _, client, _ = served
    head = text(1200, "h")
    small = [text(5, f"s{i}") for i in range(20)]
    other = [text(5, f"t{i}") for i in range(21)]  # not the blocks `near` wrote
    await usage(client, {"messages": user(marked(head))})
    near = await usage(client, {"messages": user(head, *small[:19], marked(small[19]))})
    assert near["read"] == tokens(head)  # 20 blocks after the write: the breakpoint's lookback reaches it
    far = await usage(client, {"messages": user(head, *other[:20], marked(other[20]))})
    assert far["read"] == 0  # the write is 21 blocks back
    assert far["created"] == tokens(head, *other)


async def test_marks_are_no_part_of_a_prefix_and_automatic_caching_marks_the_last_block(served) -> None:
    _, client, _ = served
    a, b = text(1300, "a"), text(20, "b")
    await usage(client, {"messages": user(a), "cache_control": MARK})  # the last block, [a], written
    moved = await usage(client, {"messages": user(a, marked(b))})
    # [a] was written where the top-level mark put it, and is read where no mark stands now
    assert moved == {"input": 0, "created": tokens(a, b) - tokens(a), "read": tokens(a)}


async def test_more_than_four_breakpoints_is_refused(served) -> None:
    server, client, _ = served
    blocks = [marked(text(10, str(i))) for i in range(5)]
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"):
        await usage(client, {"messages": user(*blocks)})
    four = await usage(client, {"messages": user(*blocks[:3]), "cache_control": MARK, "system": "Be brief."})
    assert four["read"] == 0 and "cache_read_input_tokens" in server.usage[-1]


async def test_an_entry_lives_five_minutes_from_its_last_read(served) -> None:
    _, client, clock = served
    body = {"system": [marked(text(1100, "s"))], "messages": user(text(10))}
    await usage(client, body)
    clock.now += 299
    assert (await usage(client, body))["read"] > 0  # read: its five minutes start again
    clock.now += 299
    assert (await usage(client, body))["read"] > 0
    clock.now += 301
    assert (await usage(client, body))["read"] == 0


async def test_a_recorded_streams_own_figures_are_replaced(served) -> None:
    server, client, _ = served
    server.enqueue([Call(sse=sse.head(MODEL, input_tokens=999_999) + sse.delta("Hi") + sse.tail("end_turn", 1))])
    got = await usage(client, {"messages": [{"role": "user", "content": "hello"}]})
    assert got == {
        "input": block_tokens(("message", 0, "user", {"type": "text", "text": "hello"})),
        "created": 0,
        "read": 0,
    }


def test_only_well_formed_usage_events_are_rewritten_and_every_other_byte_kept() -> None:
    usage = {
        "input_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 1_200,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
    }
    broken = b"event: message_start\ndata: {not json\n\n"
    body = sse.delta("Hi") + sse.delta(" there")
    out = sse.with_usage(broken + body + sse.tail("end_turn", 2), usage)
    assert out.startswith(broken + body)  # a malformed event, and the deltas, exactly as recorded
    [delta] = [line for line in out.split(b"\n") if line.startswith(b'data: {"type": "message_delta"')]
    assert json.loads(delta[6:])["usage"] == {
        "output_tokens": 2,
        "input_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 1_200,
    }
    whole = sse.with_usage(sse.head(MODEL, input_tokens=10) + body, usage)
    start = json.loads(whole.split(b"\n")[1][6:])
    assert start["message"]["usage"] == {**usage, "output_tokens": 1} and whole.endswith(body)
