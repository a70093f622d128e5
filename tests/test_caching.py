"""Prompt caching on the real path: the anthropic SDK against the local provider, which accounts for
its prompt cache by Anthropic's rules (tests/test_prompt_cache.py), the ledger, delivery.

A conversation's requests keep a byte-stable prefix (the system prompt, the frozen older part of the
room, moved in steps) marked with at most four breakpoints, so that from the third turn on most of
each request's input is read from the cache, as the provider itself reported it; and the truth rules
hold inside the cached part: a cut output appears once, exactly, with its boundary note.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from conftest import Room, residence

from residents.context import RoomMessage, compile_request
from residents.context.compile import START_NOTE, compile_with_files
from residents.context.window import Window, frozen_count, step
from residents.demo.script import prose
from residents.generation.tools import with_tools
from residents.localservers import sse
from residents.localservers.promptcache import MAX_BREAKPOINTS
from residents.localservers.provider import Call
from residents.provider import caching

MODEL = "claude-sonnet-4-5"
PERSONA = "You are Cairn, a resident of this harbour room. " + prose(3, 2_000)
RETRIES = {"retries": {"max_attempts": 3, "backoff_seconds": 0}}
CUT_NOTE = "cut off"


def cairn(**policy: Any) -> Any:
    return residence(model=MODEL, max_tokens=1024, system=PERSONA, policy={**RETRIES, **policy})


def reply(turn: int) -> Call:
    return Call(sse=sse.stream(prose(100 + turn, 500), "end_turn", 120, model=MODEL))


def said(turn: int) -> str:
    return prose(200 + turn, 250)


def total(usage: dict[str, Any]) -> int:
    return usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]


def text_of(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def unmarked(messages: list[dict[str, Any]]) -> str:
    """Messages as the cache keys them: contents as blocks, marks taken off."""
    return json.dumps(
        [
            {
                "role": m["role"],
                "content": [
                    {k: v for k, v in b.items() if k != "cache_control"} for b in caching.with_breakpoint(m["content"])
                ],
            }
            for m in messages
        ],
        ensure_ascii=False,
    )


def first_shown(request: dict[str, Any]) -> str:
    """The first room message a request shows (after the note saying earlier ones are not shown)."""
    return next(text_of(m["content"]) for m in request["messages"] if text_of(m["content"]) != START_NOTE)


def frozen_end(request: dict[str, Any]) -> int:
    """How many messages the frozen part holds: up to the one whose last block is marked (0: none)."""
    marked = [
        i
        for i, m in enumerate(request["messages"])
        if isinstance(m["content"], list) and m["content"][-1].get("cache_control")
    ]
    assert len(marked) <= 1
    return marked[0] + 1 if marked else 0


async def conversation(pipeline, turns: int, calls=reply, res=None) -> tuple[Room, list[dict], list[dict]]:
    """`turns` turns in one channel, two people taking turns; the requests sent and the usage reported."""
    resident = pipeline.resident(res or cairn())
    room = Room()
    requests, usages = [], []
    for t in range(1, turns + 1):
        await pipeline.turn(resident, room, said(t), [calls(t)], author="alice" if t % 2 else "bob")
        requests += pipeline.server.requests
        usages += pipeline.server.usage
    return room, requests, usages


async def test_forty_turns_in_one_channel_read_most_of_their_input_from_the_cache(pipeline):
    _, requests, usages = await conversation(pipeline, 40)
    assert len(usages) == 40 and all(u is not None for u in usages)
    read = sum(u["cache_read_input_tokens"] for u in usages[2:])
    whole = sum(total(u) for u in usages[2:])
    assert read / whole >= 0.80, f"{read:,} of {whole:,} input tokens read from the cache"
    # the window never showed more than the policy's history_limit, and its start moved in steps
    spoken = [[m for m in r["messages"] if not text_of(m["content"]).startswith("[")] for r in requests]
    assert max(len(s) for s in spoken) <= 50  # people's turns alternate with the resident's: one message each
    firsts = [first_shown(r) for r in requests]
    moves = sum(1 for a, b in zip(firsts, firsts[1:], strict=False) if a != b)
    assert moves <= 4, f"the window's first message changed {moves} times in 40 turns"
    assert all(caching.breakpoints(r) <= MAX_BREAKPOINTS for r in requests)


async def test_without_a_kept_window_the_same_conversation_reads_far_less(pipeline, monkeypatch):
    """What the kept window buys: sliding by one message a turn, the prefix is new each turn."""
    monkeypatch.setattr(Window, "shown", lambda self, history, limit: history[-limit:])
    _, _, usages = await conversation(pipeline, 40)
    read = sum(u["cache_read_input_tokens"] for u in usages[2:])
    assert read / sum(total(u) for u in usages[2:]) < 0.80


async def test_the_frozen_part_stays_byte_for_byte_the_same_between_turns(pipeline):
    _, requests, _ = await conversation(pipeline, 40)
    ends = [frozen_end(r) for r in requests]
    assert max(ends) > 0, "no request had a frozen part"
    compared = 0
    for before, after, end, next_end in zip(requests, requests[1:], ends, ends[1:], strict=False):
        if first_shown(before) != first_shown(after):
            continue  # the window's start moved: a new prefix, written once
        compared += 1
        if end == next_end:  # same freeze point: the very same bytes, mark included
            assert json.dumps(before["messages"][:end]) == json.dumps(after["messages"][:end])
        # whatever moved, what the cache keys on is unchanged: every message of `before` but its tail-end note
        kept = len(before["messages"]) - 1
        assert unmarked(before["messages"][:kept]) == unmarked(after["messages"][:kept])
    assert compared >= 35  # of 39 turns after the first, all but the few where the window's start moved
    assert len({r["system"] for r in requests}) == 1
    # the freeze point moved in steps of whole messages, not one a turn
    assert len({e for e in ends if e}) < len([e for e in ends if e]) / 3


async def test_a_request_marks_at_most_four_breakpoints_with_tools_system_frozen_and_tail():
    history = [RoomMessage(f"m{i}", "alice" if i % 2 else "cairn", i % 2 == 0, prose(i, 400)) for i in range(1, 60)]
    res = residence(model=MODEL, max_tokens=1024, system=prose(3, 5_000))
    request = compile_with_files(res, history, {}, {}, window=Window())[0]
    assert isinstance(request["system"], list) and request["system"][-1]["cache_control"] == caching.BREAKPOINT
    assert frozen_end(request) > 0 and request["cache_control"] == caching.BREAKPOINT
    assert caching.breakpoints(request) == 3

    class Tools:
        def definitions(self) -> list[dict[str, Any]]:
            return [
                {"name": f"t{i}", "description": prose(i, 1_500), "input_schema": {"type": "object"}} for i in range(4)
            ]

    tooled = with_tools(request, Tools())  # type: ignore[arg-type]
    assert tooled["tools"][-1]["cache_control"] == caching.BREAKPOINT
    assert [("cache_control" in t) for t in tooled["tools"]] == [False, False, False, True]
    assert caching.breakpoints(tooled) == MAX_BREAKPOINTS


def test_small_prefixes_and_openai_compatible_residences_carry_no_marks():
    history = [RoomMessage("m1", "alice", False, "Hi")]
    small = compile_request(residence(), history, {}, {})
    assert small["system"] == "You are Cairn, a resident of this room."  # under 1,024 tokens: no mark spent
    assert (
        small["messages"] == [{"role": "user", "content": "alice: Hi"}] and small["cache_control"] == caching.BREAKPOINT
    )
    lumen = residence(
        name="lumen",
        model="gpt-4o-mini",
        max_tokens=1024,
        system=PERSONA,
        provider="openai-compatible",
        base_url="http://127.0.0.1:1/v1",
        api_key_env="LUMEN_KEY",
    )
    long = [RoomMessage(f"m{i}", "alice" if i % 2 else "lumen", i % 2 == 0, prose(i, 400)) for i in range(1, 60)]
    assert "cache_control" not in json.dumps(compile_with_files(lumen, long, {}, {}, window=Window())[0])


def test_the_window_starts_still_and_moves_in_steps_within_the_history_limit():
    window, limit = Window(), 20
    history: list[RoomMessage] = []
    starts, sizes = [], []
    for i in range(1, 101):
        history.append(RoomMessage(f"m{i}", "alice", False, str(i)))
        shown = window.shown(history[-limit:], limit)  # the room is read for `limit` messages, as the cog does
        starts.append(shown[0].id)
        sizes.append(len(shown))
    assert max(sizes) == limit and min(sizes[limit:]) == limit - step(limit)
    runs = [len(list(group)) for _, group in itertools.groupby(starts)]
    assert len(runs) > 3 and min(runs[:-1]) >= step(limit)  # a start kept for a step at least, not one message
    assert [frozen_count(n, limit) for n in (1, 5, 6, 11, 20)] == [0, 0, 5, 10, 15]


async def test_a_cut_output_appears_once_exactly_with_its_note_in_every_later_request(pipeline):
    cut = prose(77, 3_000)[:2_711]

    def calls(t: int) -> Call:
        return Call(sse=sse.stream(cut, "max_tokens", 1024, model=MODEL)) if t == 2 else reply(t)

    room, requests, usages = await conversation(pipeline, 24, calls)  # the cut stays within the window
    assert any(p.kind == "receipt" for p in room.sent)
    later = requests[2:]
    for r in later:
        msgs = r["messages"]
        owners = [i for i, m in enumerate(msgs) if cut in text_of(m["content"])]
        assert len(owners) == 1 and text_of(msgs[owners[0]]["content"]) == cut
        assert msgs[owners[0]]["role"] == "assistant"
        after = text_of(msgs[owners[0] + 1]["content"])
        assert (
            msgs[owners[0] + 1]["role"] == "user" and after.startswith("[") and CUT_NOTE in after and "1,024" in after
        )
        assert sum(text_of(m["content"]).count(cut) for m in msgs) == 1
        assert not any("Output ceiling reached" in text_of(m["content"]) for m in msgs if m["role"] == "assistant")
    assert any(
        frozen_end(r) > 1 + max(i for i, m in enumerate(r["messages"]) if cut in text_of(m["content"])) for r in later
    )
    read = sum(u["cache_read_input_tokens"] for u in usages[2:])
    assert read / sum(total(u) for u in usages[2:]) >= 0.80  # the cut and its note are read from the cache too
