"""The resident's own `stumps` tool and the tool loop (issue 12, part A), on the real path: the SDK over
loopback to the local provider, which records every request body (tools, tool_use, tool_result), the
SQLite ledger, delivery planning, and `ledger verify` over what each turn left."""

from __future__ import annotations

import json

import pytest
from conftest import Room, residence, specimen

from residents import truth
from residents.delivery.resume import RoomUnavailable
from residents.ledger import access
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call

END_TEXT = sse.text_of(specimen("end-turn.sse"))
FRAGMENT = sse.text_of(specimen("overloaded-after-257.sse"))
CEILING_TEXT = sse.text_of(specimen("ceiling-1024.sse"))
SAYS = "Let me look at what I set aside."


def use(action: str, text: str = SAYS, n: int = 1, **args: str) -> Call:
    """An answer that says `text`, then calls `stumps` with this action (a round ending in tool_use)."""
    return Call(
        sse=sse.tool_use_stream(text, f"toolu_{action}_{n}", "stumps", json.dumps({"action": action, **args}), 30)
    )


def reply(text: str = "Done.") -> Call:
    return Call(sse=sse.stream(text, "end_turn", 5))


def tool_results(request: dict) -> list[dict]:
    """The tool_result blocks of a request's last user turn."""
    last = request["messages"][-1]
    assert last["role"] == "user" and isinstance(last["content"], list)
    return [b for b in last["content"] if b["type"] == "tool_result"]


def result_of(request: dict) -> tuple[dict, bool]:
    [block] = tool_results(request)
    return json.loads(block["content"]), block.get("is_error", False)


async def a_stump(pipeline, res, room: Room) -> str:
    """A turn whose first attempt fails after 257 characters and is retried: one retry-abandoned stump."""
    r, _ = await pipeline.turn(
        res,
        room,
        "Tell me about the harbour.",
        [Call(sse=specimen("overloaded-after-257.sse")), Call(sse=specimen("end-turn.sse"))],
    )
    [s] = r.generation.stumps
    assert s.cause == truth.RETRY_ABANDONED
    return s.id


async def test_list_is_a_round_whose_result_goes_back_and_the_reply_joins_the_rounds(pipeline):
    res = pipeline.resident(residence())
    room = Room()
    sid = await a_stump(pipeline, res, room)
    r, posts = await pipeline.turn(res, room, "Anything set aside?", [use("list"), reply("One fragment, yes.")])
    g = r.generation
    assert (g.status, g.stop_reason, g.text) == ("completed", "end_turn", SAYS + "\n\nOne fragment, yes.")
    assert [p.kind for p in posts] == ["speech"] and posts[0].content == g.text  # posted once, at the end
    first, second = pipeline.server.requests
    assert [t["name"] for t in first["tools"]] == ["stumps"] and first["tools"][0]["input_schema"]["required"] == [
        "action"
    ]
    assert second["messages"][:-2] == first["messages"]  # the round's answer and its result, appended
    assert second["messages"][-2] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": SAYS},
            {"type": "tool_use", "id": "toolu_list_1", "name": "stumps", "input": {"action": "list"}},
        ],
    }
    result, is_error = result_of(second)
    assert not is_error and result["total"] == 1
    [row] = result["stumps"]
    assert row["id"] == sid and (row["cause"], row["chars"], row["access"], row["channel"]) == (
        "retry-abandoned",
        257,
        "moderators",
        "room",
    )
    assert row["reads"] == [] and row["published"] is False and row["when"].endswith("Z")
    assert FRAGMENT[:40] not in json.dumps(result)  # a list is metadata only
    [call] = await access.tool_calls_of(pipeline.ledger, g.id)
    assert (call.round, call.name, call.input, call.is_error, call.result) == (
        1,
        "stumps",
        {"action": "list"},
        False,
        result,
    )
    assert [(a.segment, a.index, a.outcome, a.stop_reason) for a in g.attempts] == [
        (1, 1, "completed", "tool_use"),
        (2, 1, "completed", "end_turn"),
    ]
    assert call.attempt_id == g.attempts[0].id and g.output_tokens == 35  # both rounds' tokens
    assert await verify(pipeline.ledger) == []


async def test_read_returns_the_exact_text_and_is_recorded(pipeline):
    res = pipeline.resident(residence())
    room = Room()
    sid = await a_stump(pipeline, res, room)
    r, _ = await pipeline.turn(res, room, "Read it.", [use("read", id=sid), use("list", n=2), reply()])
    g = r.generation
    results = [result_of(req)[0] for req in pipeline.server.requests[1:]]
    assert results[0] == {"action": "read", "id": sid, "cause": "retry-abandoned", "chars": 257, "text": FRAGMENT}
    [read] = results[1]["stumps"][0]["reads"]
    assert (read["reader"], read["kind"]) == ("cairn", "resident")
    assert [c.round for c in await access.tool_calls_of(pipeline.ledger, g.id)] == [1, 2]
    reads = (await access.reads_of(pipeline.ledger, [sid]))[sid]
    assert [(x["reader"], x["kind"]) for x in reads] == [("cairn", "resident")]
    assert FRAGMENT not in "".join(p.content for p in room.sent)  # read into the model, never into the room
    assert await verify(pipeline.ledger) == []


async def test_set_access_is_the_residents_choice_and_the_operator_ceiling_stays(pipeline):
    res = pipeline.resident(residence())
    room = Room()
    sid = await a_stump(pipeline, res, room)
    await pipeline.turn(res, room, "Keep it to yourself.", [use("set_access", id=sid, access="private"), reply()])
    result, is_error = result_of(pipeline.server.requests[1])
    assert not is_error and result == {
        "action": "set_access",
        "id": sid,
        "access": "private",
        "moderators_may_read": False,
    }
    assert await access.access_of(pipeline.ledger, sid) == "private"
    ceiling = pipeline.resident(
        residence(
            policy={"retries": {"max_attempts": 3, "backoff_seconds": 0}, "stumps": {"moderators_read_text": False}}
        )
    )
    await pipeline.turn(ceiling, room, "Let them read it.", [use("set_access", id=sid, access="moderators"), reply()])
    result, is_error = result_of(pipeline.server.requests[1])
    assert not is_error and result["access"] == "moderators" and result["moderators_may_read"] is False
    assert "ceiling" in result
    rows = await pipeline.ledger.db.execute_fetchall(
        "SELECT access, set_by FROM stump_access_changes WHERE stump_id=$1 ORDER BY set_at", (sid,)
    )
    assert [tuple(r) for r in rows] == [("private", "cairn"), ("moderators", "cairn")]


async def test_default_access_is_where_a_new_stump_starts(pipeline):
    res = pipeline.resident(
        residence(
            policy={"retries": {"max_attempts": 3, "backoff_seconds": 0}, "stumps": {"default_access": "private"}}
        )
    )
    sid = await a_stump(pipeline, res, Room())
    assert await access.access_of(pipeline.ledger, sid) == "private"
    other = pipeline.resident(residence(name="sill"))
    sid2 = await a_stump(pipeline, other, Room("sill"))
    assert await access.access_of(pipeline.ledger, sid2) == "moderators"


async def test_publish_posts_the_text_as_recovered_with_one_receipt(pipeline):
    res = pipeline.resident(residence())
    room = Room()
    sid = await a_stump(pipeline, res, room)
    r, posts = await pipeline.turn(res, room, "Publish it.", [use("publish", id=sid), reply("It is above.")])
    g = r.generation
    result, is_error = result_of(pipeline.server.requests[1])
    assert not is_error and result == {
        "action": "publish",
        "id": sid,
        "chars": 257,
        "channel": "room",
        "posts": 2,
        "delivered": True,
    }
    kinds = [p.kind for p in room.sent[-3:]]
    assert kinds == ["recovered", "receipt", "speech"]  # published during the round, the reply after
    rec, receipt, speech = room.sent[-3:]
    assert rec.content == FRAGMENT and rec.stump_id == sid and receipt.stump_id == sid
    assert receipt.content == (
        "-# Recovered fragment of 257 characters from an abandoned attempt, published at the resident's request."
    )
    assert speech.content == SAYS + "\n\nIt is above." and [p.kind for p in r.posts] == ["speech"]
    assert [p.seq for p in g.posts] == [1, 2, 3] and all(p.generation_id == g.id for p in g.posts)
    assert (await pipeline.ledger.get_stump(sid)).published  # its recovered post reached the room
    assert await verify(pipeline.ledger) == []

    # once only; the next request shows the recovered text once, as its own words, with a note
    r2, _ = await pipeline.turn(res, room, "Again?", [use("publish", id=sid), reply()])
    result, is_error = result_of(pipeline.server.requests[1])
    assert is_error and result == {"error": f"stump {sid} is already published"}
    msgs = pipeline.server.requests[0]["messages"]
    blob = json.dumps(msgs)
    assert blob.count(json.dumps(FRAGMENT)[1:-1]) == 1
    at = next(i for i, m in enumerate(msgs) if m["role"] == "assistant" and FRAGMENT in m["content"])
    assert "recovered fragment of 257 characters" in msgs[at + 1]["content"]
    assert "Recovered fragment" not in msgs[at]["content"]  # the receipt is never its words
    assert await verify(pipeline.ledger) == []


async def test_bad_calls_are_error_results_never_exceptions(pipeline):
    res = pipeline.resident(residence())
    room = Room()
    sid = await a_stump(pipeline, res, room)
    other = await a_stump(pipeline, pipeline.resident(residence(name="sill")), Room("sill"))
    bad = [
        ("forget", {}),
        ("read", {"id": "s-000000000000"}),
        ("read", {}),
        ("read", {"id": other}),
        ("set_access", {"id": sid, "access": "everyone"}),
        ("list", {"id": sid}),
        ("publish", {"id": "s-000000000000"}),
    ]
    calls = [use(action, n=i, **args) for i, (action, args) in enumerate(bad)]
    calls.append(Call(sse=sse.tool_use_stream("", "toolu_x", "weather", '{"city": "Oslo"}', 9)))
    calls.append(Call(sse=sse.tool_use_stream("", "toolu_y", "stumps", '{"action": "li', 9)))
    calls.append(reply())
    policy = {"retries": {"max_attempts": 3, "backoff_seconds": 0}, "tools": {"max_rounds": 12}}
    r, posts = await pipeline.turn(pipeline.resident(residence(policy=policy)), room, "Try things.", calls)
    assert r.generation.status == "completed"
    errors = [result_of(req) for req in pipeline.server.requests[1:]]
    assert all(is_error for _, is_error in errors)
    messages = [res_["error"] for res_, _ in errors]
    assert messages[0] == "unknown action 'forget'; the actions are list, read, set_access, publish"
    assert messages[1] == "no stump 's-000000000000' of cairn in this channel"
    assert messages[2] == "read needs `id`, a stump id from `list`"
    assert messages[3] == f"no stump {other!r} of cairn in this channel"  # another resident's: as if none
    assert "'everyone'" in messages[4] and "list takes no 'id'" == messages[5]
    assert messages[7] == "no tool named 'weather'; the one tool here is 'stumps'"
    assert messages[8].startswith("the input is not valid JSON")
    assert await access.access_of(pipeline.ledger, sid) == "moderators"
    assert await verify(pipeline.ledger) == []


async def test_the_round_limit_ends_incomplete_with_a_receipt_and_the_call_not_run(pipeline):
    policy = {"retries": {"max_attempts": 3, "backoff_seconds": 0}, "tools": {"max_rounds": 2}}
    res = pipeline.resident(residence(policy=policy))
    r, posts = await pipeline.turn(res, Room(), "Look.", [use("list"), use("list", "And again.", 2), reply()])
    g = r.generation
    assert (g.status, g.stop_reason, g.text) == ("incomplete", truth.TOOL_ROUND_LIMIT, SAYS + "\n\nAnd again.")
    assert len(pipeline.server.requests) == 2  # max_rounds requests; the third answer never asked for
    assert [p.kind for p in posts] == ["partial", "receipt"]
    assert (
        posts[-1].content
        == "-# Tool round limit reached; a further tool call was not run, and the output may be incomplete."
    )
    assert len(await access.tool_calls_of(pipeline.ledger, g.id)) == 1
    causes = sorted((s.scope, s.cause) for s in g.stumps)
    assert causes == [("block", truth.TOOL_ROUND_LIMIT), ("output", truth.TOOL_ROUND_LIMIT)]  # the unrun call kept
    assert await verify(pipeline.ledger) == []


# A bounded standing: whether continuation and the tool loop ever share a request.
BOUNDED = {
    "retries": {"max_attempts": 3, "backoff_seconds": 0},
    "continuation": {
        "standing": "bounded",
        "max_segments": 2,
        "max_output_tokens": 12288,
        "min_progress_chars": 16,
        "similarity_abort": 0.92,
    },
}


async def test_a_ceiling_in_a_later_round_is_truncated_and_never_continued(pipeline):
    res = pipeline.resident(residence(max_tokens=1024, policy=BOUNDED))
    r, posts = await pipeline.turn(
        res, Room(), "Look, then describe.", [use("list"), Call(sse=specimen("ceiling-1024.sse")), reply()]
    )
    g = r.generation
    assert (g.status, g.stop_reason, g.text) == ("truncated", "max_tokens", SAYS + "\n\n" + CEILING_TEXT)
    assert g.continuation_ended == "disabled" and len(pipeline.server.requests) == 2
    assert posts[-1].content == "-# Output ceiling reached at 1,024 tokens; the remainder was not generated."
    [out] = [s for s in g.stumps if s.scope == "output"]
    assert out.text == g.text and out.cause == "max_tokens"
    assert await verify(pipeline.ledger) == []
    # a moderator's /continue does not mix with the tool loop either
    on_request = {**BOUNDED, "continuation": {**BOUNDED["continuation"], "standing": "on-request"}}
    room = Room()
    cont = await pipeline.resident(residence(max_tokens=1024, policy=on_request), room).continue_generation(
        room, "room", g.id
    )
    assert cont.declined and "tool" in cont.declined and len(pipeline.server.requests) == 2  # no call more


async def test_a_retried_round_keeps_its_fragment_and_calls_stay_within_rounds_times_attempts(pipeline):
    policy = {"retries": {"max_attempts": 2, "backoff_seconds": 0}, "tools": {"max_rounds": 2}}
    res = pipeline.resident(residence(policy=policy))
    r, posts = await pipeline.turn(
        res,
        Room(),
        "Look.",
        [Call(status=529), use("list"), Call(sse=specimen("overloaded-after-257.sse")), use("list", n=2), reply()],
    )
    g = r.generation
    assert len(pipeline.server.requests) == 4 == 2 * 2  # max_rounds × retries.max_attempts
    assert (g.status, g.stop_reason) == ("incomplete", truth.TOOL_ROUND_LIMIT)
    assert [(a.segment, a.index, a.outcome) for a in g.attempts] == [
        (1, 1, "abandoned"),
        (1, 2, "completed"),
        (2, 1, "abandoned"),
        (2, 2, "completed"),
    ]
    [frag] = [s for s in g.stumps if s.cause == truth.RETRY_ABANDONED]
    assert frag.text == FRAGMENT and FRAGMENT not in g.text  # never spliced
    assert pipeline.server.requests[2] == pipeline.server.requests[3]  # the retry resends the same round
    assert await verify(pipeline.ledger) == []


async def test_without_the_tool_no_tools_are_offered(pipeline):
    policy = {"retries": {"max_attempts": 3, "backoff_seconds": 0}, "stumps": {"patient_tool": False}}
    res = pipeline.resident(residence(policy=policy))
    r, posts = await pipeline.turn(res, Room(), "Look.", [use("list"), reply()])
    assert "tools" not in pipeline.server.requests[0] and len(pipeline.server.requests) == 1
    assert (r.generation.status, r.generation.stop_reason) == ("incomplete", "tool_use")
    assert await verify(pipeline.ledger) == []


@pytest.mark.parametrize("bad", [1, 0, 33, "four"])
def test_max_rounds_is_checked(bad):
    from residents.config import ConfigError

    with pytest.raises(ConfigError, match="tools.max_rounds"):
        residence(policy={"tools": {"max_rounds": bad}})


async def test_a_cut_before_any_tool_call_continues_without_tools(pipeline):
    res = pipeline.resident(residence(max_tokens=600, policy=BOUNDED))
    r, _ = await pipeline.turn(
        res,
        Room(),
        "Write it all.",
        [Call(sse=specimen("cont-first.sse")), Call(sse=specimen("cont-rest-with-overlap.sse"))],
    )
    first, cont = pipeline.server.requests
    assert "tools" in first and "tools" not in cont  # continuation and the tool loop never mix in one request
    assert (r.generation.status, r.generation.continuation_ended) == ("completed", "completed")
    assert await verify(pipeline.ledger) == []


class FlakyRoom(Room):
    """A room whose first send of a recovered post fails, as Discord might (`RoomUnavailable`: the outbox's rooms
    say every failure so)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    async def send(self, post):
        if post.kind == "recovered" and not self.failed:
            self.failed = True
            raise RoomUnavailable("the room did not answer")
        return await super().send(post)


async def test_a_publication_the_room_refuses_is_delivered_before_the_reply(pipeline):
    res = pipeline.resident(residence())
    room = FlakyRoom()
    sid = await a_stump(pipeline, res, room)
    r, sent = await pipeline.turn(res, room, "Publish it.", [use("publish", id=sid), reply("It is above.")])
    result, is_error = result_of(pipeline.server.requests[1])
    # recorded, then in the room once the outbox tried again (at once: the test's outbox has no backoff)
    assert not is_error and (result["posts"], result["delivered"]) == (2, True)
    assert room.failed and [p.kind for p in sent] == ["recovered", "receipt", "speech"]  # in order, once each
    assert all(p.message_id for p in r.generation.posts)
    assert await verify(pipeline.ledger) == []


async def test_verify_names_a_recovered_post_or_a_tool_round_that_does_not_hold(pipeline):
    res = pipeline.resident(residence())
    room = Room()
    sid = await a_stump(pipeline, res, room)
    r, _ = await pipeline.turn(res, room, "Publish it.", [use("publish", id=sid), reply()])
    assert await verify(pipeline.ledger) == []
    db = pipeline.ledger.db
    await db.execute("UPDATE posts SET content=$1 WHERE kind='recovered'", (b"a different text",))
    assert any(v.startswith(f"stump {sid}: recovered posts are not its text") for v in await verify(pipeline.ledger))
    await db.execute("UPDATE posts SET content=$1 WHERE kind='recovered'", (FRAGMENT.encode(),))
    await db.execute("UPDATE posts SET kind='speech' WHERE kind='receipt' AND stump_id=$1", (sid,))
    assert any("not recovered posts followed by one receipt" in v for v in await verify(pipeline.ledger))
    await db.execute("UPDATE posts SET kind='receipt' WHERE kind='speech' AND stump_id=$1", (sid,))
    g = r.generation
    await db.execute("UPDATE tool_calls SET attempt_id=$1 WHERE generation_id=$2", (g.attempts[-1].id, g.id))
    problems = await verify(pipeline.ledger)
    assert any("was not made by the last attempt of round 1" in v for v in problems), problems
