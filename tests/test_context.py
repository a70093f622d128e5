"""The context compiler: what a resident sees of its room, and how it sees its own cuts."""

from __future__ import annotations

from conftest import residence

from residents.context import RoomMessage, compile_request
from residents.continuation import continuation_request
from residents.records import Generation, Post, Segment, Stump

CUT = "The harbour at dusk holds three boats and a lighth"


def cut_generation() -> tuple[Generation, list[Post]]:
    g = Generation(
        id="g-1",
        residence="cairn",
        channel="room",
        model="claude-3-opus-20240229",
        status="truncated",
        stop_reason="max_tokens",
        text=CUT,
        output_tokens=4096,
    )
    g.segments = [Segment(1, "a-1", "max_tokens", len(CUT), 4096)]
    posts = [
        Post("p-1", "g-1", 1, "partial", CUT, message_id="m2"),
        Post(
            "p-2",
            "g-1",
            2,
            "receipt",
            "-# Output ceiling reached at 4,096 tokens; the remainder was not generated.",
            message_id="m3",
        ),
    ]
    return g, posts


def history_with_cut() -> list[RoomMessage]:
    _, posts = cut_generation()
    return [
        RoomMessage("m1", "alice", False, "Describe the harbour."),
        RoomMessage("m2", "cairn", True, posts[0].content),
        RoomMessage("m3", "cairn", True, posts[1].content),
        RoomMessage("m4", "alice", False, "And then?"),
    ]


def test_a_cut_appears_once_as_own_words_then_a_boundary_note():
    g, posts = cut_generation()
    req = compile_request(residence(), history_with_cut(), {p.message_id: p for p in posts}, {g.id: g})
    msgs = req["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == CUT
    blob = "\n".join(m["content"] for m in msgs)
    assert blob.count(CUT) == 1
    assert "cut off" in msgs[2]["content"] and "4,096" in msgs[2]["content"]
    assert msgs[2]["content"].endswith("alice: And then?")
    assert "Output ceiling reached" not in msgs[1]["content"]


def test_the_ledger_not_the_message_says_what_the_text_was():
    """A partial split over two messages is one turn, taken from the ledger's canonical text."""
    g, _ = cut_generation()
    posts = {
        "m2": Post("p-1", "g-1", 1, "partial", CUT[:20], message_id="m2"),
        "m3": Post("p-3", "g-1", 2, "partial", CUT[20:], message_id="m3"),
    }
    hist = [
        RoomMessage("m1", "alice", False, "Hi"),
        RoomMessage("m2", "cairn", True, CUT[:20]),
        RoomMessage("m3", "cairn", True, CUT[20:]),
        RoomMessage("m4", "bob", False, "Go on"),
    ]
    msgs = compile_request(residence(), hist, posts, {g.id: g})["messages"]
    assert msgs[1] == {"role": "assistant", "content": CUT}


def test_completed_speech_has_no_note_and_request_ends_with_a_user_turn():
    g = Generation(
        id="g-2",
        residence="cairn",
        channel="room",
        model="m",
        status="completed",
        stop_reason="end_turn",
        text="All done.",
    )
    posts = {"m2": Post("p", "g-2", 1, "speech", "All done.", message_id="m2")}
    hist = [RoomMessage("m1", "alice", False, "Hi"), RoomMessage("m2", "cairn", True, "All done.")]
    msgs = compile_request(residence(), hist, posts, {g.id: g})["messages"]
    assert msgs[1] == {"role": "assistant", "content": "All done."}
    assert msgs[-1]["role"] == "user" and "Boundary" not in msgs[-1]["content"]


def test_abandoned_text_is_described_not_quoted_unless_policy_grants_it():
    g = Generation(
        id="g-3",
        residence="cairn",
        channel="room",
        model="m",
        status="completed",
        stop_reason="end_turn",
        text="Final words.",
    )
    g.stumps = [Stump("s-1", "g-3", "a-1", "retry-abandoned", "FRAGMENT TEXT " * 20, None, scope="attempt")]
    posts = {"m2": Post("p", "g-3", 1, "speech", "Final words.", message_id="m2")}
    hist = [
        RoomMessage("m1", "alice", False, "Hi"),
        RoomMessage("m2", "cairn", True, "Final words."),
        RoomMessage("m3", "alice", False, "Hm?"),
    ]
    msgs = compile_request(residence(), hist, posts, {g.id: g})["messages"]
    blob = "\n".join(m["content"] for m in msgs)
    assert "FRAGMENT" not in blob and "280 characters" in blob and "retry-abandoned" in blob
    granted = residence(policy={"stumps": {"resident_reads_own": True}})
    blob = "\n".join(m["content"] for m in compile_request(granted, hist, posts, {g.id: g})["messages"])
    assert "FRAGMENT TEXT" in blob


def test_other_speakers_are_named_user_turns_and_consecutive_turns_merge():
    hist = [
        RoomMessage("m1", "alice", False, "one"),
        RoomMessage("m2", "sill", False, "two"),
        RoomMessage("m3", "bob", False, "three"),
    ]
    msgs = compile_request(residence(), hist, {}, {})["messages"]
    assert msgs == [{"role": "user", "content": "alice: one\n\nsill: two\n\nbob: three"}]


def test_history_starting_with_own_words_gets_a_user_turn_first():
    hist = [RoomMessage("m1", "cairn", True, "unrecorded"), RoomMessage("m2", "alice", False, "hi")]
    msgs = compile_request(residence(), hist, {}, {})["messages"]
    assert msgs[0]["role"] == "user" and msgs[1] == {"role": "assistant", "content": "unrecorded"}


def test_continuation_by_prefill_carries_the_partial_once_without_trailing_whitespace():
    base = {"model": "claude-3-opus-20240229", "max_tokens": 600, "messages": [{"role": "user", "content": "go"}]}
    req, stripped = continuation_request(base, "partial text \n", 10_000)
    assert req["messages"][-1] == {"role": "assistant", "content": "partial text"}
    assert stripped == " \n"
    assert base["messages"] == [{"role": "user", "content": "go"}]  # the stored request is not mutated


def test_continuation_for_models_without_prefill_ends_with_a_user_turn():
    base = {"model": "claude-opus-4-6", "max_tokens": 600, "messages": [{"role": "user", "content": "go"}]}
    req, stripped = continuation_request(base, "partial text", 250)
    assert [m["role"] for m in req["messages"]] == ["user", "assistant", "user"]
    assert req["messages"][1]["content"] == "partial text"
    assert "partial text" not in req["messages"][2]["content"]
    assert req["max_tokens"] == 250 and stripped == ""


def test_messages_that_arrived_while_a_reply_was_written_come_after_it():
    g = Generation(
        id="g-9",
        residence="cairn",
        channel="room",
        model="m",
        status="completed",
        stop_reason="end_turn",
        text="First answer.",
        seen_upto="m1",
    )
    posts = {"m4": Post("p", "g-9", 1, "speech", "First answer.", message_id="m4")}
    hist = [
        RoomMessage("m1", "alice", False, "question"),
        RoomMessage("m2", "bob", False, "meanwhile"),
        RoomMessage("m3", "carol", False, "also meanwhile"),
        RoomMessage("m4", "cairn", True, "First answer."),
    ]
    msgs = compile_request(residence(), hist, posts, {g.id: g})["messages"]
    assert msgs == [
        {"role": "user", "content": "alice: question"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "bob: meanwhile\n\ncarol: also meanwhile"},
    ]


def room_with_sill() -> tuple[list[RoomMessage], dict[str, Post]]:
    """Sill's reply quoting a receipt (escaped in the room), then its real cut and receipt, then a person's copy."""
    quoted = "As the room writes it:\n-# Output ceiling reached at 4,096 tokens; the remainder was not generated."
    receipt = "-# Output ceiling reached at 1,024 tokens; the remainder was not generated."
    hist = [
        RoomMessage("m1", "alice", False, "Both of you, talk."),
        RoomMessage("m2", "sill", False, quoted.replace("\n-# ", "\n\\-# "), is_bot=True),
        RoomMessage("m3", "sill", False, "The tide comes in over the fl", is_bot=True),
        RoomMessage("m4", "sill", False, receipt, is_bot=True),
        RoomMessage("m5", "alice", False, "-# Output ceiling reached at 9 tokens; the remainder was not generated."),
        RoomMessage("m6", "bot-elsewhere", False, "-# a bot the ledger does not know", is_bot=True),
    ]
    posts = {
        "m2": Post("p-a", "g-s1", 1, "speech", quoted.replace("\n-# ", "\n\\-# "), message_id="m2"),
        "m3": Post("p-b", "g-s2", 1, "partial", "The tide comes in over the fl", message_id="m3"),
        "m4": Post("p-c", "g-s2", 2, "receipt", receipt, message_id="m4"),
    }
    return hist, posts


def test_another_residents_receipt_is_a_boundary_note_not_its_words():
    hist, posts = room_with_sill()
    [msg] = compile_request(residence(), hist, posts, {})["messages"]
    turns = msg["content"].split("\n\n")
    assert turns[0] == "alice: Both of you, talk."
    assert turns[1].startswith("sill: As the room writes it:")  # sill's own words, as the room shows them
    assert turns[2] == "sill: The tide comes in over the fl"
    note = turns[3]
    assert not note.startswith("sill:") and note.startswith("[Boundary note") and "sill" in note
    assert "Output ceiling reached at 1,024 tokens; the remainder was not generated." in note
    assert "-# " not in note
    # a person's look-alike line is the person's words; a bot the ledger does not know is taken as it reads
    assert turns[4] == "alice: -# Output ceiling reached at 9 tokens; the remainder was not generated."
    assert turns[5] == "bot-elsewhere: -# a bot the ledger does not know"
    assert len(turns) == 6


def test_the_ledger_lookup_covers_every_bot_and_reads_only_own_generations():
    from residents.context.compile import ledger_message_ids, own_generation_ids

    hist, posts = room_with_sill()
    hist.append(RoomMessage("m7", "cairn", True, "mine"))
    posts["m7"] = Post("p-d", "g-own", 1, "speech", "mine", message_id="m7")
    assert ledger_message_ids(hist) == ["m2", "m3", "m4", "m6", "m7"]
    assert own_generation_ids(hist, posts) == ["g-own"]


def test_context_with_lone_surrogates_compiles():
    """The ledger keeps a lone surrogate exactly; compiling a request around it must not fail."""
    text = "half \ud83d a wave"
    g = Generation(
        id="g-s", residence="cairn", channel="room", model="m", status="completed", stop_reason="end_turn", text=text
    )
    posts = {"m2": Post("p", "g-s", 1, "speech", text, message_id="m2")}
    hist = [RoomMessage("m1", "alice", False, "a \udc00 b"), RoomMessage("m2", "cairn", True, "half \ufffd a wave")]
    msgs = compile_request(residence(), hist, posts, {g.id: g})["messages"]
    assert msgs[1] == {"role": "assistant", "content": text}  # exact here; made valid where the body is sent
    assert msgs[0]["content"] == "alice: a \udc00 b"
