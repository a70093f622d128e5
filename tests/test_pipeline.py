"""Whole turns on the real path: the anthropic SDK over loopback, the ledger, delivery planning."""

from __future__ import annotations

from conftest import Room, residence, specimen

from residents.localservers import sse
from residents.localservers.provider import Call

CEILING_TEXT = sse.text_of(specimen("ceiling-1024.sse"))
END_TEXT = sse.text_of(specimen("end-turn.sse"))
FRAGMENT = sse.text_of(specimen("overloaded-after-257.sse"))
FIRST = sse.text_of(specimen("cont-first.sse"))
REST = sse.text_of(specimen("cont-rest-with-overlap.sse"))

BOUNDED = {
    "continuation": {
        "standing": "bounded",
        "max_segments": 2,
        "max_output_tokens": 12288,
        "min_progress_chars": 16,
        "similarity_abort": 0.92,
    },
    "retries": {"max_attempts": 3, "backoff_seconds": 0},
}


async def test_end_turn_is_speech_only_and_unchanged(pipeline):
    reply, posts = await pipeline.turn(
        pipeline.resident(residence()), Room(), "Sum it up.", [Call(sse=specimen("end-turn.sse"))]
    )
    g = reply.generation
    assert (g.status, g.stop_reason, g.text, g.output_tokens) == ("completed", "end_turn", END_TEXT, 221)
    assert [p.kind for p in posts] == ["speech"] and posts[0].content == END_TEXT
    assert g.stumps == [] and len(pipeline.server.requests) == 1


async def test_max_tokens_keeps_the_bytes_and_posts_one_receipt(pipeline):
    reply, posts = await pipeline.turn(
        pipeline.resident(residence(max_tokens=1024)),
        Room(),
        "Describe the harbour.",
        [Call(sse=specimen("ceiling-1024.sse"))],
    )
    g = reply.generation
    assert (g.status, g.stop_reason, g.output_tokens, g.chars) == ("truncated", "max_tokens", 1024, len(CEILING_TEXT))
    assert g.text == CEILING_TEXT and g.text.endswith("bellwethe")  # mid-word, exactly as generated
    kinds = [p.kind for p in posts]
    assert kinds.count("receipt") == 1 and kinds[-1] == "receipt" and "speech" not in kinds
    assert set(kinds[:-1]) == {"partial"}
    assert "".join(p.content for p in posts[:-1]).replace("\n", "").replace(" ", "") == CEILING_TEXT.replace(
        "\n", ""
    ).replace(" ", "")
    assert posts[-1].content == "-# Output ceiling reached at 1,024 tokens; the remainder was not generated."
    assert all(p.message_id for p in posts)  # every post mapped to its room message
    (stump,) = g.stumps
    assert (stump.cause, stump.text, stump.scope) == ("max_tokens", CEILING_TEXT, "output")
    stored = await pipeline.ledger.get_stump(stump.id)
    assert stored.published  # its text reached the room as a partial


async def test_a_mid_word_cut_is_never_an_authored_ending_in_the_next_request(pipeline):
    res = pipeline.resident(residence(max_tokens=1024))
    room = Room()
    await pipeline.turn(res, room, "Describe the harbour.", [Call(sse=specimen("ceiling-1024.sse"))])
    reply, _ = await pipeline.turn(res, room, "And then?", [Call(sse=specimen("end-turn.sse"))])
    msgs = pipeline.server.requests[0]["messages"]
    assert msgs[-1]["role"] == "user"
    owner = [m for m in msgs if CEILING_TEXT in m["content"]]
    assert len(owner) == 1 and owner[0]["role"] == "assistant" and owner[0]["content"] == CEILING_TEXT
    after = msgs[msgs.index(owner[0]) + 1]
    assert after["role"] == "user" and "cut off" in after["content"] and "1,024" in after["content"]
    assert not any("Output ceiling reached" in m["content"] for m in msgs if m["role"] == "assistant")


async def test_retry_keeps_the_fragment_as_an_unpublished_stump_never_spliced(pipeline):
    reply, posts = await pipeline.turn(
        pipeline.resident(residence()),
        Room(),
        "Again.",
        [
            Call(sse=specimen("overloaded-after-257.sse")),
            Call(status=529, headers={"retry-after": "2"}),
            Call(sse=specimen("end-turn.sse")),
        ],
    )
    g = reply.generation
    assert g.status == "completed" and g.text == END_TEXT
    assert [a.outcome for a in g.attempts] == ["abandoned", "abandoned", "completed"]
    assert g.attempts[0].text == FRAGMENT and len(FRAGMENT) == 257
    assert g.attempts[0].discard_reason == "retry-abandoned" and g.attempts[0].replaced_by == g.attempts[1].id
    assert pipeline.sleeps == [2.0]  # no backoff configured; the 529's retry-after honoured
    (stump,) = g.stumps
    assert (stump.cause, stump.text, stump.published, stump.replaced_by) == (
        "retry-abandoned",
        FRAGMENT,
        False,
        g.attempts[1].id,
    )
    assert [p.kind for p in posts] == ["speech"]
    assert FRAGMENT[40:90] not in "".join(p.content for p in posts)


async def test_refusal_is_distinct_from_retry_and_failure(pipeline):
    res = pipeline.resident(residence(model="claude-sonnet-4-5", max_tokens=8192))
    reply, posts = await pipeline.turn(
        res, Room(), "Do the thing.", [Call(sse=specimen("refusal.sse")), Call(sse=specimen("end-turn.sse"))]
    )
    g = reply.generation
    assert g.status == "refused" and len(pipeline.server.requests) == 1  # not retried
    assert [p.kind for p in posts] == ["notice"] and "refusal" in posts[0].content
    assert [(s.cause, s.published) for s in g.stumps] == [("refusal", False)]
    stored = await pipeline.ledger.get_generation(g.id)
    assert stored.attempts[0].stop_details["category"] == "other"  # the provider's provenance kept


async def test_retries_exhausted_is_failed_with_the_last_text_as_partial(pipeline):
    frag = specimen("overloaded-after-257.sse")
    reply, posts = await pipeline.turn(
        pipeline.resident(residence()), Room(), "x", [Call(sse=frag), Call(sse=frag), Call(sse=frag)]
    )
    g = reply.generation
    assert g.status == "failed" and len(pipeline.server.requests) == 3 and g.text == FRAGMENT
    assert [p.kind for p in posts][-1] == "receipt" and "overloaded_error" in posts[-1].content
    assert sorted(s.cause for s in g.stumps) == ["provider-error", "retry-abandoned", "retry-abandoned"]


async def test_disabled_continuation_makes_zero_further_calls(pipeline):
    reply, _ = await pipeline.turn(
        pipeline.resident(residence(max_tokens=600)),
        Room(),
        "Write it all.",
        [Call(sse=specimen("cont-first.sse")), Call(sse=specimen("cont-rest-with-overlap.sse"))],
    )
    assert len(pipeline.server.requests) == 1
    assert reply.generation.continuation_ended == "disabled"


async def test_bounded_continuation_removes_the_overlap_once(pipeline):
    res = pipeline.resident(residence(max_tokens=600, policy=BOUNDED))
    reply, posts = await pipeline.turn(
        res,
        Room(),
        "Write it all.",
        [Call(sse=specimen("cont-first.sse")), Call(sse=specimen("cont-rest-with-overlap.sse"))],
    )
    g = reply.generation
    assert g.text == FIRST + REST[48:]
    assert (g.status, g.continuation_ended) == ("completed", "completed")
    assert [(s.index, s.overlap_removed, s.chars) for s in g.segments] == [(1, 0, len(FIRST)), (2, 48, len(REST) - 48)]
    assert g.output_tokens == 730
    second = pipeline.server.requests[1]["messages"]
    assert second[-1] == {"role": "assistant", "content": FIRST.rstrip()}  # prefill, the partial once
    assert sum(m["content"].count(FIRST[1000:1100]) for m in second) == 1
    text_posts = [p.content for p in posts if p.kind in ("speech", "partial")]
    assert "".join(text_posts).replace("\n", "").replace(" ", "") == g.text.replace("\n", "").replace(" ", "")
    assert [p.kind for p in posts][-1] == "receipt" and "2 segments" in posts[-1].content


async def test_continuation_for_a_no_prefill_model_uses_a_user_turn(pipeline):
    res = pipeline.resident(residence(model="claude-opus-4-6", max_tokens=600, policy=BOUNDED))
    reply, _ = await pipeline.turn(
        res,
        Room(),
        "Write it all.",
        [Call(sse=specimen("cont-first.sse")), Call(sse=specimen("cont-rest-with-overlap.sse"))],
    )
    second = pipeline.server.requests[1]["messages"]
    assert [m["role"] for m in second[-2:]] == ["assistant", "user"]
    assert second[-2]["content"] == FIRST
    assert reply.generation.text == FIRST + REST[48:]


async def test_an_echoing_model_stops_boundedly_without_appending(pipeline):
    policy = {**BOUNDED, "continuation": {**BOUNDED["continuation"], "max_segments": 8}}
    res = pipeline.resident(residence(max_tokens=600, policy=policy))
    echo = specimen("cont-echo.sse")
    reply, posts = await pipeline.turn(
        res, Room(), "Write it all.", [Call(sse=specimen("cont-first.sse"))] + [Call(sse=echo)] * 10
    )
    g = reply.generation
    assert len(pipeline.server.requests) == 2
    assert (g.status, g.continuation_ended, g.text) == ("truncated", "no-progress", FIRST)
    assert [s.cause for s in g.stumps if s.scope == "attempt"] == ["no-progress"]
    assert sum(len(p.content) for p in posts if p.kind == "partial") <= len(FIRST)


async def test_a_near_echo_stops_with_repetition(pipeline):
    varied = FIRST.replace("beacon", "Beacon")
    res = pipeline.resident(residence(max_tokens=600, policy=BOUNDED))
    reply, _ = await pipeline.turn(
        res, Room(), "x", [Call(sse=specimen("cont-first.sse")), Call(sse=sse.stream(varied, "max_tokens", 600))]
    )
    assert reply.generation.continuation_ended == "repetition" and reply.generation.text == FIRST


async def test_segment_and_token_limits_bound_the_provider_calls(pipeline):
    words = [" ".join(f"w{i}x{j}" for j in range(200)) for i in range(6)]
    calls = [Call(sse=sse.stream(w, "max_tokens", 600)) for w in words]
    res = pipeline.resident(residence(max_tokens=600, policy=BOUNDED))
    reply, _ = await pipeline.turn(res, Room(), "x", calls)
    assert len(pipeline.server.requests) == 3 and reply.generation.continuation_ended == "segment-limit"
    tight = {**BOUNDED, "continuation": {**BOUNDED["continuation"], "max_segments": 8, "max_output_tokens": 1000}}
    res = pipeline.resident(residence(max_tokens=600, policy=tight))
    reply, _ = await pipeline.turn(res, Room(), "x", calls)
    assert len(pipeline.server.requests) == 2 and reply.generation.continuation_ended == "token-limit"
    assert pipeline.server.requests[1]["max_tokens"] == 400  # the second segment may only spend what is left


async def test_continuation_stops_when_the_room_moves_on(pipeline):
    room = Room()
    res = pipeline.resident(residence(max_tokens=600, policy=BOUNDED), room)
    pipeline.server.reset([Call(sse=specimen("cont-first.sse")), Call(sse=specimen("cont-rest-with-overlap.sse"))])
    m = room.say("alice", "go")
    reply = await res.respond(room, "room", list(room.history), trigger=m.id, superseded=lambda: True)
    assert reply.generation.continuation_ended == "superseded" and len(pipeline.server.requests) == 1


async def test_on_request_adds_one_segment_and_posts_only_the_new_text(pipeline):
    policy = {
        "continuation": {
            "standing": "on-request",
            "max_segments": 3,
            "max_output_tokens": 16000,
            "min_progress_chars": 16,
            "similarity_abort": 0.92,
        }
    }
    res = pipeline.resident(residence(max_tokens=600, policy=policy))
    room = Room()
    first, _ = await pipeline.turn(res, room, "Write it all.", [Call(sse=specimen("cont-first.sse"))])
    assert len(pipeline.server.requests) == 1 and first.generation.continuation_ended == "disabled"
    pipeline.server.reset([Call(sse=specimen("cont-rest-with-overlap.sse"))])
    before = len(room.sent)
    reply = await res.continue_generation(room, "room", first.generation.id)
    posts = room.sent[before:]
    g = reply.generation
    assert len(pipeline.server.requests) == 1 and g.text == FIRST + REST[48:] and g.status == "completed"
    assert "".join(p.content for p in posts if p.kind == "speech").replace("\n", "") == REST[48:].replace("\n", "")
    assert FIRST[-30:] not in "".join(p.content for p in posts)
    old = [s for s in g.stumps if s.scope == "output"]
    assert len(old) == 1 and old[0].replaced_by == g.segments[-1].attempt_id


async def test_continue_without_standing_makes_no_call_and_says_why(pipeline):
    res = pipeline.resident(residence(max_tokens=600))
    room = Room()
    first, _ = await pipeline.turn(res, room, "Write it all.", [Call(sse=specimen("cont-first.sse"))])
    pipeline.server.reset([Call(sse=specimen("cont-rest-with-overlap.sse"))])
    reply = await res.continue_generation(room, "room", first.generation.id)
    assert pipeline.server.requests == [] and reply.declined
    assert [p.kind for p in room.sent[-1:]] == ["notice"] and "standing" in room.sent[-1].content


async def test_a_declined_continue_names_its_reason_as_facts_and_truth_words_it(pipeline):
    """No provider call; the room's notice and the reply's reason are `residents.truth`'s wording of the facts."""
    from residents import truth

    policy = {
        "continuation": {
            "standing": "on-request",
            "max_segments": 2,
            "max_output_tokens": 12288,
            "min_progress_chars": 16,
            "similarity_abort": 0.92,
        }
    }
    res = pipeline.resident(residence(policy=policy))
    room = Room()
    done, _ = await pipeline.turn(res, room, "Hello.", [Call(sse=specimen("end-turn.sse"))])
    gid = done.generation.id
    pipeline.server.reset([Call(sse=specimen("end-turn.sse"))])
    cases = [
        (gid, truth.Declined("not-cut", "cairn", gid, "completed")),
        ("g-000000000000", truth.Declined("unknown-generation", "cairn", "g-000000000000")),
    ]
    for ref, why in cases:
        reply = await res.continue_generation(room, "room", ref)
        assert reply.decline == why and reply.declined == truth.declined_reason(why)
        assert (room.sent[-1].kind, room.sent[-1].content) == ("notice", "-# " + truth.declined_continue(why))
    assert room.sent[-2].content == (
        "-# Continuation not available: generation " + gid + " is completed, not cut at the output ceiling."
    )
    assert pipeline.server.requests == []
    empty = pipeline.resident(residence(name="sill", policy=policy), room)
    reply = await empty.continue_generation(room, "room", None)
    assert reply.decline == truth.Declined("no-generation-here", "sill")
    assert room.sent[-1].content == "-# Continuation not available: sill has no generation here."


async def test_provider_calls_stay_within_the_policy_bound_with_retries_in_continuation(pipeline):
    """Every continuation call obeys the retry policy; the total is at most (1 + max_segments) × max_attempts."""
    policy = {
        "continuation": {**BOUNDED["continuation"], "max_segments": 2},
        "retries": {"max_attempts": 2, "backoff_seconds": 0},
    }
    res = pipeline.resident(residence(max_tokens=600, policy=policy))
    frag = specimen("overloaded-after-257.sse")
    words = [" ".join(f"v{i}y{j}" for j in range(150)) for i in range(4)]
    calls = [Call(sse=sse.stream(words[0], "max_tokens", 600))]
    for w in words[1:3]:
        calls += [Call(sse=frag), Call(sse=sse.stream(w, "max_tokens", 600))]
    reply, posts = await pipeline.turn(res, Room(), "x", calls + [Call(sse=frag)] * 10)
    g = reply.generation
    assert len(pipeline.server.requests) == 5 <= (1 + 2) * 2
    assert g.continuation_ended == "segment-limit" and len(g.segments) == 3
    assert g.text == words[0] + words[1] + words[2]
    assert [s.cause for s in g.stumps if s.scope == "attempt"] == ["retry-abandoned", "retry-abandoned"]
    assert [p.kind for p in posts][-1] == "receipt" and "segment limit" in posts[-1].content

    failing = pipeline.resident(residence(max_tokens=600, policy=policy))
    reply, posts = await pipeline.turn(
        failing, Room(), "y", [Call(sse=sse.stream(words[0], "max_tokens", 600))] + [Call(sse=frag)] * 10
    )
    g = reply.generation
    assert len(pipeline.server.requests) == 3  # the first segment, then one continuation segment's two attempts
    assert (g.status, g.continuation_ended, g.text) == ("truncated", "error", words[0])
    assert sorted(s.cause for s in g.stumps) == ["max_tokens", "provider-error", "retry-abandoned"]
